// SplitMix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA
// 2014): one 64-bit mixing step, a counter-based hash for reproducible per-item random values
// (random eviction scores, synthetic test data, evaluation samples).
#pragma once

#include <cstdint>

namespace kvlab {

constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace kvlab
