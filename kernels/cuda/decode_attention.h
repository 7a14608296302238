// Decode attention over the paged KV store on the GPU (FlashDecoding).
//
// One query row per request (the token being decoded). For request b and query head h (KV head
// kv = h / G, G = num_qo_heads / num_kv_heads) over the selected keys n of list b*H_kv + kv:
//   slot = sel.slot_of(list, n); pos_j = kv_pos[slot] (or the slot when kv_pos is null);
//   allowed = pos_j >= 0 (not an evicted hole) and mask(q_pos[b], pos_j)
//   s_n = scale * q[b,h] . K[slot]  (-inf when not allowed)
//   out[b,h] = sum_n softmax(s)_n V[slot];  lse[b,h] = log sum_n exp(s_n)
// Empty selections or fully masked rows give out = 0, lse = -inf (POLICIES.md section 1).
//
// Work split: the selected keys of each list are cut into pieces of plan.keys_per_split keys;
// one CTA per (piece, KV head, request) loads each K/V row of its piece once (cp.async into
// shared memory) and uses it for all G query heads of the group; pieces are merged by their
// log-sum-exp. Statistics: with key_mass set, each selected slot's probability, summed over
// the G heads of its group, is added to key_mass[(b * H_kv + kv) * key_mass_stride + slot]
// (H2O's accumulated attention score; policy.h StepStats::key_mass per request).
//
// Host-side use, once per step: plan_decode(...) (split size, workspace), then for every layer
// run decode_attention(params, plan, workspace, stream). Pointers in params are device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/attention_limits.h"
#include "kernels/common/key_selection.h"
#include "kernels/common/masks.h"
#include "kernels/common/paged_kv.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/rope_table.h"

namespace kvlab::cuda {

template <class T>
struct DecodeParams {
  PagedKvView<const T> kv;           // batch of `batch` requests (device pointers)
  const float* q = nullptr;          // [batch, num_qo_heads, head_dim] after RoPE, unscaled
  int batch = 0;
  int num_qo_heads = 0;
  const int32_t* q_pos = nullptr;    // [batch] query position; null = length(b) - 1
  const int32_t* kv_pos = nullptr;   // [num_pages, num_kv_heads, page_size] (meta_offset),
                                     //   -1 = evicted hole; null = position is the slot
  KeySelectionView sel;              // lists b * num_kv_heads + kv; all() = every slot
  WindowSinkMask mask;               // window 0 = causal only
  float scale = 1.f;                 // usually 1/sqrt(head_dim)
  float* out = nullptr;              // [batch, num_qo_heads, head_dim]
  float* lse = nullptr;              // optional [batch, num_qo_heads]
  float* key_mass = nullptr;         // optional [batch, num_kv_heads, key_mass_stride], +=
  int key_mass_stride = 0;           // >= every request's slot count
  // Rope at read (policies with rope_at_cache_position): keys are stored raw and the key of a
  // slot is rotated to key_rope_pos (paged like kv_pos; e.g. its rank among the cached tokens)
  // before the dot product, in fp32 with the CPU's cos/sin. Null = keys already rotated.
  const int32_t* key_rope_pos = nullptr;  // [num_pages, num_kv_heads, page_size]
  RopeTableView rope;
};

// Tile of keys a CTA holds in shared memory at once (keys_per_split is a multiple of it).
inline constexpr int kDecodeTileKeys = 32;
inline constexpr int kDecodeMaxGroup = kAttentionMaxQueryGroup;  // G = num_qo_heads / num_kv_heads

struct DecodePlan {
  int max_keys = 0;        // most selected keys of any list this step
  int keys_per_split = kDecodeTileKeys;
  int num_splits = 1;
};

// max_keys: the largest count of selected keys over all lists (the caller knows it from the
// block tables and selection it uploads). num_sms: from the device (0 = ask the device).
DecodePlan plan_decode(int batch, int num_kv_heads, int max_keys, int num_sms = 0);

// Scratch memory of a launch: partial outputs per split, LSEs, and the raw scores kept for the
// key-mass pass. Grows on demand; reuse one per stream.
struct DecodeWorkspace {
  DeviceBuffer<float> partial_out;  // [num_splits, batch, num_qo_heads, head_dim]
  DeviceBuffer<float> partial_lse;  // [num_splits, batch, num_qo_heads]
  DeviceBuffer<float> lse;          // [batch, num_qo_heads]
  DeviceBuffer<float> scores;       // [batch, num_qo_heads, max_keys] when key_mass is wanted
};

// T = float, __half or __nv_bfloat16; head_dim 64 or 128; G <= 8. Throws kvlab::Error for
// unsupported shapes. Asynchronous on `stream`.
template <class T>
void decode_attention(const DecodeParams<T>& params, const DecodePlan& plan,
                      DecodeWorkspace& workspace, cudaStream_t stream = nullptr);

}  // namespace kvlab::cuda
