// Compiles the functions between a BEGIN and its END for an instruction set the build does not
// assume (KVLAB_NATIVE=OFF stays baseline x86-64); the caller runs them only where cpu_path() or
// the ISA detection says the CPU has it. GCC takes push_options/target pragmas, clang an
// attribute push. The AVX-512 form also silences GCC 12's -Wmaybe-uninitialized inside its own
// AVX-512 intrinsic headers (the _mm512_undefined_* operands, GCC bug 105593): nothing in kvlab
// reads an uninitialised value there.
#pragma once

#define KVLAB_PRAGMA(text) _Pragma(#text)

#if defined(__clang__)
#define KVLAB_TARGET_BEGIN(isa) KVLAB_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define KVLAB_TARGET_END KVLAB_PRAGMA(clang attribute pop)
#define KVLAB_TARGET_AVX512_BEGIN(isa) KVLAB_TARGET_BEGIN(isa)
#define KVLAB_TARGET_AVX512_END KVLAB_TARGET_END
#else
#define KVLAB_TARGET_BEGIN(isa) KVLAB_PRAGMA(GCC push_options) KVLAB_PRAGMA(GCC target(isa))
#define KVLAB_TARGET_END KVLAB_PRAGMA(GCC pop_options)
#define KVLAB_TARGET_AVX512_BEGIN(isa) \
  KVLAB_TARGET_BEGIN(isa) KVLAB_PRAGMA(GCC diagnostic push) KVLAB_PRAGMA(GCC diagnostic ignored "-Wmaybe-uninitialized")
#define KVLAB_TARGET_AVX512_END KVLAB_PRAGMA(GCC diagnostic pop) KVLAB_TARGET_END
#endif
