// The shapes the CUDA attention kernels are built for, shared with the host code that checks a
// model before it reaches them (framework/engine/device_forward.cpp), so the two never disagree.
#pragma once

namespace kvlab {

// Query heads per KV head (GQA group) the decode kernel holds at once.
inline constexpr int kAttentionMaxQueryGroup = 8;

// head_dim values the decode and prefill kernels are instantiated for.
constexpr bool attention_head_dim_supported(int head_dim) { return head_dim == 64 || head_dim == 128; }

}  // namespace kvlab
