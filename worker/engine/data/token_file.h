// llm.c's token file, as the data loader (data.h) reads it and `ptworker
// prepare` writes it: 256 int32 (magic, version, token count), then the
// tokens as uint16.
#ifndef PTRAIN_WORKER_ENGINE_DATA_TOKEN_FILE_H_
#define PTRAIN_WORKER_ENGINE_DATA_TOKEN_FILE_H_

#include <cstdint>

namespace ptrain {

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int kTokenFileHeaderInts = 256;
inline constexpr int64_t kTokenFileHeaderBytes =
    kTokenFileHeaderInts * int64_t{sizeof(int32_t)};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_DATA_TOKEN_FILE_H_
