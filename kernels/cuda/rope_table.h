// RoPE cos/sin for the GPU, with the CPU's exact values: angles pos * inv_freq_i are computed in
// double and cos/sin stored as float (as kernels/cpu/rope.h's RopeTable), so a key rotated on
// the device equals the CPU's rotation. inv_freq carries theta, any scaling and the per-pair
// frequency factors: it is the one host RoPE's (kernels/cpu/rope.h RopeTable::inv_freq()).
//
// RopeTableView is what kernels read for rope at read time (policies with
// rope_at_cache_position: keys stored raw, rotated to their cache rank when attention reads
// them). Contract: the table covers every position a kernel is asked for (the engine builds it
// for the model's context; cache ranks never exceed the cache); positions past it are clamped to
// the last row (never an out-of-bounds read, but wrong angles).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <vector>

namespace kvlab::cuda {

struct RopeTableView {
  const float2* cos_sin = nullptr;   // [n_positions, half] (cos, sin)
  int n_positions = 0;
  int half = 0;                      // head_dim / 2
  bool neox = false;                 // pairs (i, i + half); else (2i, 2i + 1)

#if defined(__CUDACC__)
  __device__ __forceinline__ float2 at(int pos, int i) const {
    pos = pos < n_positions ? pos : n_positions - 1;
    return cos_sin[size_t(pos) * half + i];
  }
#endif
};

// Host: the table [n_positions, half] of (cos, sin) as interleaved floats.
inline std::vector<float> rope_cos_sin_table(const std::vector<double>& inv_freq, int n_positions) {
  const size_t half = inv_freq.size();
  std::vector<float> t(size_t(n_positions) * half * 2);
  for (int p = 0; p < n_positions; ++p)
    for (size_t i = 0; i < half; ++i) {
      const double a = double(p) * inv_freq[i];
      t[(p * half + i) * 2] = static_cast<float>(std::cos(a));
      t[(p * half + i) * 2 + 1] = static_cast<float>(std::sin(a));
    }
  return t;
}

}  // namespace kvlab::cuda
