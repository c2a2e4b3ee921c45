// llm.c's token file, as the data loader (data.h) reads it and `ptworker
// prepare` writes it: 256 int32 (magic, version, token count), then the
// tokens: uint16 in version 1 (llm.c's, vocabularies of at most 65536
// tokens), uint32 in version 2 (larger vocabularies: Llama 3's 128256).
#ifndef PTRAIN_WORKER_ENGINE_DATA_TOKEN_FILE_H_
#define PTRAIN_WORKER_ENGINE_DATA_TOKEN_FILE_H_

#include <cstdint>

namespace ptrain {

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;    // uint16 tokens
inline constexpr int32_t kTokenFileVersion32 = 2;  // uint32 tokens
inline constexpr int kTokenFileHeaderInts = 256;
inline constexpr int64_t kTokenFileHeaderBytes =
    kTokenFileHeaderInts * int64_t{sizeof(int32_t)};
// The most tokens a vocabulary of version 1 files has.
inline constexpr int64_t kTokenFile16Vocab = 65536;

// The version files of a vocabulary of `vocab_size` tokens are written in.
constexpr int32_t TokenFileVersionFor(int64_t vocab_size) {
  return vocab_size > kTokenFile16Vocab ? kTokenFileVersion32
                                        : kTokenFileVersion;
}

// The bytes of one token in a file of `version` (1 or 2).
constexpr int TokenFileTokenBytes(int32_t version) {
  return version == kTokenFileVersion32 ? 4 : 2;
}

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_DATA_TOKEN_FILE_H_
