// Prefill attention over the paged KV store on tensor cores (FlashAttention-2 style).
//
// Many query rows per request (a prefill chunk whose K/V are already appended). For row r of
// request b (position q_pos[r]) and query head h (KV head kv = h / G) over the selected keys n
// of list b * H_kv + kv (KeySelectionView; all() = every slot):
//   allowed(r, n) = pos_n >= 0 (not a hole) and mask(q_pos[r], pos_n)     (causal always)
//   out[r, h] = softmax_n(scale q[r,h] . K[slot_n] | allowed) V;  lse[r, h] = log-sum-exp
// Fully masked rows give out = 0, lse = -inf. The selection is the block-sparse pattern: one key
// set per (request, KV head) for every row of the chunk (sinks, selected chunks, local region),
// intersected with the causal/window mask.
//
// Contract on positions (the store's): within a request, q_pos grows with the row; a valid
// slot's position is >= the slot and grows with it. The kernel stops at the first selected key
// whose slot exceeds the CTA's last query position (keys_up_to_slot).
//
// Tiles: a CTA (4 warps) computes 64 query rows of one head; each warp 16 rows with mma.sync
// m16n8k16 (bf16 or fp16 in, fp32 accumulate), S and P stay in registers; K/V tiles of 64 keys
// stream through shared memory with cp.async (2 stages).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/key_selection.h"
#include "kernels/common/masks.h"
#include "kernels/common/paged_kv.h"
#include "kernels/cuda/rope_table.h"

namespace kvlab::cuda {

template <class T>
struct PrefillParams {
  PagedKvView<const T> kv;            // batch of `batch` requests (device pointers)
  const T* q = nullptr;               // [total_rows, num_qo_heads, head_dim] after RoPE
  const int32_t* qo_indptr = nullptr; // [batch + 1] rows of request b: [qo_indptr[b], qo_indptr[b+1])
  int batch = 0;
  int num_qo_heads = 0;
  int max_rows = 0;                   // most rows of any request (sizes the grid)
  const int32_t* q_pos = nullptr;     // [total_rows]; null = length(b) - n_rows(b) + row (bottom-right)
  const int32_t* kv_pos = nullptr;    // [num_pages, num_kv_heads, page_size] or null (= slot)
  KeySelectionView sel;               // lists b * num_kv_heads + kv
  WindowSinkMask mask;                // window 0 = causal only
  float scale = 1.f;
  float* out = nullptr;               // [total_rows, num_qo_heads, head_dim]
  float* lse = nullptr;               // optional [total_rows, num_qo_heads]
  // Rope at read (rope_at_cache_position policies): raw keys rotated to key_rope_pos (paged like
  // kv_pos) in fp32 when the tile lands in shared memory, then rounded to T for the MMA.
  const int32_t* key_rope_pos = nullptr;  // [num_pages, num_kv_heads, page_size]; null = off
  RopeTableView rope;
};

// T = __half or __nv_bfloat16; head_dim 64 or 128. Throws kvlab::Error for other shapes.
template <class T>
void prefill_attention(const PrefillParams<T>& params, cudaStream_t stream = nullptr);

}  // namespace kvlab::cuda
