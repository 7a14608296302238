// Which instruction set the CPU kernels use, chosen at run time so that one binary (built with
// KVLAB_NATIVE=OFF) runs on any x86-64: Zen 3 (AVX2 only), Intel with AVX-512, Zen 4, or an
// older CPU without AVX2.
//   kAvx2     AVX2 + FMA + F16C (and the OS saves the YMM state): the SIMD kernels, compiled
//             with function target attributes so the rest of the program stays baseline x86-64
//   kPortable plain C++ loops compiled for the build's baseline; the same results up to float
//             rounding (the kernels' tests check both paths against the plain references)
// cpu_path() detects once per process. The environment variable KVLAB_CPU_PATH=portable forces
// the portable path (to test it on an AVX2 machine); "auto" or unset detects; anything else is
// an error naming the variable.
#pragma once

#include <cpuid.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace kvlab {

enum class CpuPath { kPortable, kAvx2 };

inline bool cpu_has_avx2_fma_f16c() {
  __builtin_cpu_init();
  // __builtin_cpu_supports checks the OS (XCR0) for the AVX features; F16C is not among the
  // names clang 14 accepts, so it is read from CPUID leaf 1 (ECX bit 29).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
}

inline CpuPath detect_cpu_path() {
  const char* env = std::getenv("KVLAB_CPU_PATH");
  const std::string want = env == nullptr ? "auto" : env;
  if (want == "portable") return CpuPath::kPortable;
  if (want != "auto" && !want.empty())
    throw std::invalid_argument("KVLAB_CPU_PATH='" + want + "': expected 'auto' or 'portable'");
  return cpu_has_avx2_fma_f16c() ? CpuPath::kAvx2 : CpuPath::kPortable;
}

inline CpuPath cpu_path() {
  static const CpuPath path = detect_cpu_path();
  return path;
}

inline const char* to_string(CpuPath p) { return p == CpuPath::kAvx2 ? "avx2" : "portable"; }

}  // namespace kvlab
