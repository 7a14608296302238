// The one cp.async loader of a K/V tile, shared by the decode (decode_attention.cu) and prefill
// (prefill_attention.cu) kernels. Device-only (included by .cu files).
//
// A tile is kRows = kLoadsPerThread * kThreads / kRowChunks selected keys [n0, n0 + kRows) of one
// list (request b, KV head kv_head) of a KeySelectionView: each key's K and V row (head_dim =
// kRowChunks * kVec elements, 16 bytes per copy) into k_dst / v_dst row `row` (row_stride
// elements apart, the kernel's padded shared-memory layout), its position into pos_dst[row] and,
// for rope at read, its cache rank into rope_pos_dst[row] -- all asynchronous, so no load waits
// on a position. Keys at n >= n_end read as zeros (positions 0); holes and masked keys are copied
// (finite data of a live page) and get -inf scores from the position test at compute time.
// Without kv_pos the position is the slot itself. Scalar equivalent, for each row r < kRows:
//   slot = sel.slot_of(list, n0 + r);  k_dst[r] = K[b, slot, kv_head];  v_dst[r] = V[...];
//   pos_dst[r] = kv_pos ? kv_pos[b, slot, kv_head] : slot
#pragma once

#include <cstddef>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/numeric.cuh"

namespace kvlab::cuda {

template <int kRowChunks, int kVec, int kLoadsPerThread, int kThreads, class T, class Params>
__device__ __forceinline__ void load_kv_tile(const Params& p, int b, int kv_head, int list, int n0,
                                             int n_end, int tid, T* k_dst, T* v_dst, int row_stride,
                                             int* pos_dst, int* rope_pos_dst) {
  static_assert(kLoadsPerThread * kThreads % kRowChunks == 0, "a tile is whole rows");
  int range = -1;  // this thread's cursor in the selection's ranges
#pragma unroll
  for (int i = 0; i < kLoadsPerThread; ++i) {
    const int c = tid + i * kThreads;
    const int row = c / kRowChunks, col = c % kRowChunks;
    const int n = n0 + row;
    const bool in_range = n < n_end;
    int slot = 0;
    if (in_range) {
      slot = n;
      if (!p.sel.all()) {  // rows grow with i: one search, then walk the ranges forward
        range = range < 0 ? p.sel.range_of(list, n) : p.sel.advance(range, n);
        slot = p.sel.slot_in_range(range, n);
      }
    }
    const size_t src = in_range ? p.kv.slot_offset(b, slot, kv_head) + size_t(col) * kVec : 0;
    const size_t dst = size_t(row) * row_stride + size_t(col) * kVec;
    cp_async_16(k_dst + dst, p.kv.k_data + src, in_range);
    cp_async_16(v_dst + dst, p.kv.v_data + src, in_range);
    if (col == 0) {
      const size_t meta = in_range ? p.kv.slot_meta_offset(b, slot, kv_head) : 0;
      if (p.kv_pos != nullptr) {
        cp_async_4(pos_dst + row, p.kv_pos + meta, in_range);
      } else {
        pos_dst[row] = slot;
      }
      if (p.key_rope_pos != nullptr) cp_async_4(rope_pos_dst + row, p.key_rope_pos + meta, in_range);
    }
  }
}

// Host: lets `kernel` use smem_bytes of dynamic shared memory (past the 48 KiB default); the
// attribute is set on the first launch of each instantiation (a function-local static).
template <auto kKernel>
void allow_dynamic_smem_once_for(size_t smem_bytes) {
  static const bool set = [smem_bytes] {
    KVLAB_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem_bytes)));
    return true;
  }();
  (void)set;
}

}  // namespace kvlab::cuda
