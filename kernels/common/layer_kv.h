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
// Blocks: view.page_id(0, page, h) and view.head_in_block(h) (per-layer or per-head block tables,
// paged_kv.h); `layout` is one block's (num_kv_heads = view.block_heads()).
//
// Storage format (kernels/common/kv_format.h, KvStoreConfig::format). f32: view.k_data / v_data
// are the fp32 rows above (key() / value()). Any other format: view.k_data = v_data = nullptr
// and a row is read through its codes: load_key() / load_value() decode one row (what every
// reader that wants floats calls; they also work for f32), key_codes() / key_scale() give the
// stored bytes and the scale their decoded codes are multiplied by (the kernels' inner loops).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/common/kv_format.h"
#include "kernels/common/paged_kv.h"

namespace kvlab {

struct LayerKv {
  PagedKvView<const float> view;    // batch of 1 (indptr {0, n_blocks}); fp32 rows only for f32
  int n_slots = 0;                  // slots in use (valid or evicted holes) = view.length(0)
  const int64_t* positions = nullptr;  // [n_slots, num_kv_heads]
  const uint8_t* valid = nullptr;      // [n_slots, num_kv_heads]
  const float* page_key_max = nullptr;  // [n_pages, num_kv_heads, head_dim] or nullptr
  const float* page_key_min = nullptr;  // [n_pages, num_kv_heads, head_dim] or nullptr
  // The stored rows (any format; the store sets them, hand-built f32 views may leave them null).
  KvBlockLayout layout;                 // format and layout of one arena of a block
  const uint8_t* k_bytes = nullptr;     // K arena: block b at k_bytes + b * layout.block_bytes()
  const uint8_t* v_bytes = nullptr;     // V arena, likewise
  const float* k_head_scale = nullptr;  // fp8: [num_kv_heads] this layer's scales; else nullptr
  const float* v_head_scale = nullptr;
  // KIVI (int4 / int2): slots [0, kivi_q_slots) are codes; slot s >= kivi_q_slots is fp32 at
  // res_k / res_v + ((s - kivi_q_slots) * num_kv_heads + h) * head_dim (KvStore "KIVI").
  int kivi_q_slots = 0;
  const float* res_k = nullptr;
  const float* res_v = nullptr;
  bool kivi() const { return kv_format_is_kivi(layout.format); }
  const float* residual_key(int slot, int kv_head) const {
    return res_k + (static_cast<size_t>(slot - kivi_q_slots) * view.num_kv_heads + kv_head) * view.head_dim;
  }
  const float* residual_value(int slot, int kv_head) const {
    return res_v + (static_cast<size_t>(slot - kivi_q_slots) * view.num_kv_heads + kv_head) * view.head_dim;
  }
  // KIVI: the key group's s[D], z[D] and a value row's (s, z) pairs of a quantised slot.
  const float* key_group_meta(int slot, int kv_head) const {
    return reinterpret_cast<const float*>(k_bytes + block_byte_offset(slot, kv_head) +
                                          layout.key_group_meta_offset(view.head_in_block(kv_head), slot % view.page_size));
  }
  const float* value_meta(int slot, int kv_head) const {
    return reinterpret_cast<const float*>(v_bytes + block_byte_offset(slot, kv_head) +
                                          layout.value_meta_offset(view.head_in_block(kv_head), slot % view.page_size));
  }

  KvFormat format() const { return layout.format; }
  // Byte offset from k_bytes / v_bytes of the block holding (slot, head) (with per-head block
  // tables each head has its own: paged_kv.h), and of the row in it.
  size_t block_byte_offset(int slot, int kv_head) const {
    return static_cast<size_t>(view.page_id(0, slot / view.page_size, kv_head)) * layout.block_bytes();
  }
  const uint8_t* key_codes(int slot, int kv_head) const {
    return k_bytes + block_byte_offset(slot, kv_head) + layout.row_offset(view.head_in_block(kv_head), slot % view.page_size);
  }
  const uint8_t* value_codes(int slot, int kv_head) const {
    return v_bytes + block_byte_offset(slot, kv_head) + layout.row_offset(view.head_in_block(kv_head), slot % view.page_size);
  }
  // What a decoded code of the row is multiplied by (kv_format.h): int8 the row's scale, fp8
  // the head's, otherwise 1.
  float key_scale(int slot, int kv_head) const { return row_scale(k_bytes, k_head_scale, slot, kv_head); }
  float value_scale(int slot, int kv_head) const { return row_scale(v_bytes, v_head_scale, slot, kv_head); }
  // The row as floats: the stored values (f32) or the dequantised ones.
  void load_key(int slot, int kv_head, float* out) const {
    if (format() == KvFormat::kF32) {
      std::memcpy(out, key(slot, kv_head), sizeof(float) * view.head_dim);
      return;
    }
    if (kivi()) {
      if (slot >= kivi_q_slots) {
        std::memcpy(out, residual_key(slot, kv_head), sizeof(float) * view.head_dim);
        return;
      }
      const float* m = key_group_meta(slot, kv_head);
      kv_kivi_decode_key(key_codes(slot, kv_head), view.head_dim, kv_format_bits(format()), m, m + view.head_dim, out);
      return;
    }
    kv_decode_row(format(), key_codes(slot, kv_head), view.head_dim, key_scale(slot, kv_head), out);
  }
  void load_value(int slot, int kv_head, float* out) const {
    if (format() == KvFormat::kF32) {
      std::memcpy(out, value(slot, kv_head), sizeof(float) * view.head_dim);
      return;
    }
    if (kivi()) {
      if (slot >= kivi_q_slots) {
        std::memcpy(out, residual_value(slot, kv_head), sizeof(float) * view.head_dim);
        return;
      }
      kv_kivi_decode_value(value_codes(slot, kv_head), view.head_dim, layout.group_size, kv_format_bits(format()),
                           value_meta(slot, kv_head), out);
      return;
    }
    kv_decode_row(format(), value_codes(slot, kv_head), view.head_dim, value_scale(slot, kv_head), out);
  }

  // f32 only: the stored fp32 row.
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

 private:
  float row_scale(const uint8_t* base, const float* head_scale, int slot, int kv_head) const {
    if (format() == KvFormat::kInt8) {
      float s;
      std::memcpy(&s, base + block_byte_offset(slot, kv_head) +
                          layout.meta_offset(view.head_in_block(kv_head), slot % view.page_size), 4);
      return s;
    }
    return head_scale != nullptr ? head_scale[kv_head] : 1.f;
  }
};

}  // namespace kvlab
