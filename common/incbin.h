// Files compiled into a binary: PT_INCBIN(sym, "PATH") at namespace scope
// puts the bytes of the file at PATH (a string literal: an absolute path
// the build passes in, without quotes or backslashes) in .rodata between
// the hidden symbols `sym` and `sym_end`; declare them with
// PT_INCBIN_DECLARE(sym) and read them as PT_INCBIN_VIEW(sym). The source
// file that uses it must rebuild when PATH changes (CMake: OBJECT_DEPENDS).
#ifndef PTRAIN_COMMON_INCBIN_H_
#define PTRAIN_COMMON_INCBIN_H_

#include <string_view>

// clang-format off
#define PT_INCBIN(sym, path)                         \
  __asm__(".pushsection .rodata, \"a\", @progbits\n" \
          ".balign 16\n"                             \
          ".globl " #sym "\n"                        \
          ".hidden " #sym "\n"                       \
          #sym ":\n"                                 \
          ".incbin \"" path "\"\n"                   \
          ".globl " #sym "_end\n"                    \
          ".hidden " #sym "_end\n"                   \
          #sym "_end:\n"                             \
          ".popsection\n")
#define PT_INCBIN_DECLARE(sym)                                         \
  extern "C" __attribute__((visibility("hidden"))) const char sym[], \
      sym##_end[]
#define PT_INCBIN_VIEW(sym) \
  std::string_view(sym, static_cast<size_t>(sym##_end - sym))
// clang-format on

#endif  // PTRAIN_COMMON_INCBIN_H_
