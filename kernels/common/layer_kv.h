// LayerKv: read access to one layer of one sequence's paged KV cache, with per-slot metadata.
// The input every attention kernel (CPU reference, CPU fast path, CUDA) reads; produced by
// kvlab::KvStore::layer() (framework/kv/kv_store.h). Non-owning: valid until the store next
// changes that sequence (append, reserve, evict, free).
//
// Slot s (0 <= s < n_slots) of KV head h:
//   key   = view.k_data + view.slot_offset(0, s, h)   [head_dim] fp32
//   value = view.v_data + view.slot_offset(0, s, h)   [head_dim] fp32
//   positions[s * num_kv_heads + h]  text position of the token held there
//   valid[s * num_kv_heads + h]      1 = live token, 0 = evicted hole (never read by attention)
// Page p = slot / view.page_size (the block table's p-th page, not the pool's block id), when the
// store keeps page statistics (KvStore::set_page_stats; nullptr otherwise):
//   page_key_max + (p * num_kv_heads + h) * head_dim   [head_dim] elementwise max over the page's
//   page_key_min + (p * num_kv_heads + h) * head_dim   valid keys of head h (-inf / +inf if none)
// Under per-head eviction (H2O) the same slot may hold different tokens for different heads.
#pragma once

#include <cstdint>

#include "kernels/common/paged_kv.h"

namespace kvlab {

struct LayerKv {
  PagedKvView<const float> view;    // batch of 1 (indptr {0, n_blocks}), fp32, on the CPU
  int n_slots = 0;                  // slots in use (valid or evicted holes) = view.length(0)
  const int64_t* positions = nullptr;  // [n_slots, num_kv_heads]
  const uint8_t* valid = nullptr;      // [n_slots, num_kv_heads]
  const float* page_key_max = nullptr;  // [n_pages, num_kv_heads, head_dim] or nullptr
  const float* page_key_min = nullptr;  // [n_pages, num_kv_heads, head_dim] or nullptr

  KVLAB_HD const float* key(int slot, int kv_head) const {
    return view.k_data + view.slot_offset(0, slot, kv_head);
  }
  KVLAB_HD const float* value(int slot, int kv_head) const {
    return view.v_data + view.slot_offset(0, slot, kv_head);
  }
  KVLAB_HD int64_t position(int slot, int kv_head) const {
    return positions[static_cast<int64_t>(slot) * view.num_kv_heads + kv_head];
  }
  KVLAB_HD bool is_valid(int slot, int kv_head) const {
    return valid[static_cast<int64_t>(slot) * view.num_kv_heads + kv_head] != 0;
  }
};

}  // namespace kvlab
