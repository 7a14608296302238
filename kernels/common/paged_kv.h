// A paged KV cache as a plain, non-owning view (after FlashInfer's paged_kv_t): the CPU
// reference, the CPU fast path and the CUDA kernels all read this same struct.
//
// Memory layout of one page (a "block" of page_size token slots) for one layer:
//   k_data[page][kv_head][entry][feat]   (head-major inside the page: the keys of one head are
//   v_data[page][kv_head][entry][feat]    contiguous, which measured 2x faster than token-major
//                                         on the CPU, MACHINE.md)
// Request b owns pages indices[indptr[b] .. indptr[b+1]); all but its last page are full; its
// last page holds last_page_len[b] entries. Slot s of request b is entry s % page_size of page
// indices[indptr[b] + s / page_size].
//
// Per-head block tables (table_heads == num_kv_heads; kvlab's KvStore "Per-head block
// tables"): a block holds ONE KV head's page_size rows, and every page of a request has one
// block per KV head, page-major: head h's block of page p is indices[(indptr[b] + p) *
// num_kv_heads + h]. So KV heads that keep different numbers of tokens hold different numbers
// of blocks. table_heads == 1 (the default): one block per page holding every KV head, as above.
// Readers address blocks only through page_id() and head_in_block(), which cover both.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/host_device.h"

namespace kvlab {

template <class T>
struct PagedKvView {
  int page_size = 16;
  int num_kv_heads = 0;
  int head_dim = 0;
  T* k_data = nullptr;                    // [num_pages, num_kv_heads, page_size, head_dim]
  T* v_data = nullptr;                    // [num_pages, num_kv_heads, page_size, head_dim]
  const int32_t* indptr = nullptr;        // [batch + 1]
  const int32_t* indices = nullptr;       // [indptr[batch]] page ids
  const int32_t* last_page_len = nullptr; // [batch]
  int table_heads = 1;                    // 1, or num_kv_heads for per-head block tables

  // The block holding (page `page` of request b, KV head `head`).
  KVLAB_HD int32_t page_id(int b, int page, int head) const {
    return table_heads == 1 ? indices[indptr[b] + page]
                            : indices[(static_cast<size_t>(indptr[b]) + page) * table_heads + head];
  }
  KVLAB_HD int block_heads() const { return table_heads == 1 ? num_kv_heads : 1; }  // KV heads per block
  KVLAB_HD int head_in_block(int head) const { return table_heads == 1 ? head : 0; }

  // Number of slots of request b.
  KVLAB_HD int length(int b) const {
    const int pages = indptr[b + 1] - indptr[b];
    return pages == 0 ? 0 : (pages - 1) * page_size + last_page_len[b];
  }
  // Element offset of (block id, head inside the block = head_in_block(head), entry, feat)
  // from k_data / v_data.
  KVLAB_HD size_t offset(int page_idx, int head_idx, int entry_idx, int feat_idx) const {
    return ((static_cast<size_t>(page_idx) * block_heads() + head_idx) * page_size + entry_idx) *
               head_dim + feat_idx;
  }
  // Offset of slot `slot` of request b for a head (the row of head_dim features starts there).
  KVLAB_HD size_t slot_offset(int b, int slot, int head_idx) const {
    return offset(page_id(b, slot / page_size, head_idx), head_in_block(head_idx), slot % page_size, 0);
  }
  // Offset of (page, head, entry) in per-slot metadata paged like the keys but without the
  // feature axis (positions, key statistics): [num_pages, num_kv_heads, page_size]. The device
  // mirrors' layout: per-layer block tables only (table_heads == 1).
  KVLAB_HD size_t meta_offset(int page_idx, int head_idx, int entry_idx) const {
    return (static_cast<size_t>(page_idx) * num_kv_heads + head_idx) * page_size + entry_idx;
  }
  KVLAB_HD size_t slot_meta_offset(int b, int slot, int head_idx) const {
    return meta_offset(indices[indptr[b] + slot / page_size], head_idx, slot % page_size);
  }
  // The same view, read-only (what the attention kernels take).
  KVLAB_HD PagedKvView<const T> as_const() const {
    return {page_size, num_kv_heads, head_dim, k_data, v_data, indptr, indices, last_page_len, table_heads};
  }
  KVLAB_HD size_t page_elems() const {  // elements of one block
    return static_cast<size_t>(block_heads()) * page_size * head_dim;
  }
};

}  // namespace kvlab
