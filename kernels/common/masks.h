// Attention masks as small functors over (query position i, key position j), shared by the CPU
// and CUDA paths and by the dense reference the policy tests build independently.
// Definitions: POLICIES.md sections 2-3. All include causality (j <= i).
#pragma once

#include <cstdint>

#include "kernels/common/host_device.h"

namespace kvlab {

struct CausalMask {
  KVLAB_HD bool operator()(int64_t i, int64_t j) const { return j <= i; }
};

// Sliding window of W keys including the current one: i - W < j <= i (kvlab default,
// as Hugging Face); with plus_one (the Mistral paper's wording): i - W <= j <= i.
struct SlidingWindowMask {
  int64_t window = 0;
  bool plus_one = false;
  KVLAB_HD bool operator()(int64_t i, int64_t j) const {
    return j <= i && (plus_one ? i - j <= window : i - j < window);
  }
};

// Sparse Transformer strided pattern, stride l: local {i - l < j <= i} union
// {j <= i : (i - j) mod l == 0}; plus the first `global` positions.
struct StridedMask {
  int64_t stride = 1;
  int64_t global = 0;
  KVLAB_HD bool operator()(int64_t i, int64_t j) const {
    if (j > i) return false;
    return j < global || i - j < stride || (i - j) % stride == 0;
  }
};

// Sparse Transformer fixed pattern: same block {floor(j/l) == floor(i/l)} union summary columns
// {j mod l in [l - c, l - 1]}; plus the first `global` positions.
struct FixedMask {
  int64_t block = 1;
  int64_t summary = 0;
  int64_t global = 0;
  KVLAB_HD bool operator()(int64_t i, int64_t j) const {
    if (j > i) return false;
    return j < global || j / block == i / block || j % block >= block - summary;
  }
};

// Causal mask with an optional sliding window and attention sinks (the decode and prefill
// kernels' one runtime mask): allow(i, j) = j <= i and (window <= 0 or the window test of
// SlidingWindowMask or j < sinks). window = 0 is plain causal attention.
struct WindowSinkMask {
  int64_t window = 0;
  int64_t sinks = 0;
  bool plus_one = false;
  KVLAB_HD bool operator()(int64_t i, int64_t j) const {
    if (j > i) return false;
    if (window <= 0 || j < sinks) return true;
    return plus_one ? i - j <= window : i - j < window;
  }
};

}  // namespace kvlab
