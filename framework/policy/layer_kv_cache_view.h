// LayerKvCacheView: the policy-facing LayerCacheView (policy.h) of one layer's LayerKv
// (kernels/common/layer_kv.h) -- what the engine hands a policy for the KV store's cache, and
// what tests read the store through. Non-owning; valid as long as the LayerKv it was made from
// (until the store next changes that sequence). Out-of-range slots and heads throw Error.
#pragma once

#include <algorithm>
#include <cstring>

#include "framework/core/error.h"
#include "framework/policy/policy.h"
#include "kernels/common/layer_kv.h"

namespace kvlab {

class LayerKvCacheView final : public LayerCacheView {
 public:
  LayerKvCacheView() = default;
  explicit LayerKvCacheView(const LayerKv& kv) : kv_(kv) {}

  int n_slots() const override { return kv_.n_slots; }
  bool slot_valid(int slot, int kv_head) const override {
    check(slot, kv_head);
    return kv_.is_valid(slot, kv_head);
  }
  int64_t slot_position(int slot, int kv_head) const override {
    check(slot, kv_head);
    return kv_.position(slot, kv_head);
  }
  const int64_t* positions_data() const override { return kv_.positions; }
  const uint8_t* valid_data() const override { return kv_.valid; }
  void load_key(int slot, int kv_head, float* out) const override {
    check(slot, kv_head);
    kv_.load_key(slot, kv_head, out);  // the stored row, dequantised (kv_format.h)
  }
  void load_keys(int slot_begin, int slot_end, int kv_head, float* out) const override {
    if (slot_begin > slot_end || slot_begin < 0 || slot_end > kv_.n_slots)
      fail("LayerCacheView::load_keys: slots [", slot_begin, ", ", slot_end, ") out of range [0, ",
           kv_.n_slots, ")");
    if (slot_begin == slot_end) return;
    check(slot_begin, kv_head);
    if (kv_.format() != KvFormat::kF32) {  // decoded row by row
      for (int s = slot_begin; s < slot_end; ++s)
        kv_.load_key(s, kv_head, out + static_cast<size_t>(s - slot_begin) * kv_.view.head_dim);
      return;
    }
    // One copy per page run: a head's rows are contiguous inside a block (paged_kv.h).
    const int ps = kv_.view.page_size, d = kv_.view.head_dim;
    for (int s = slot_begin; s < slot_end;) {
      const int run = std::min(slot_end, (s / ps + 1) * ps) - s;
      std::memcpy(out + static_cast<size_t>(s - slot_begin) * d, kv_.key(s, kv_head),
                  sizeof(float) * run * d);
      s += run;
    }
  }
  int page_size() const override { return kv_.view.page_size; }
  const float* page_key_max(int page, int kv_head) const override {
    return page_bounds(kv_.page_key_max, page, kv_head);
  }
  const float* page_key_min(int page, int kv_head) const override {
    return page_bounds(kv_.page_key_min, page, kv_head);
  }

 private:
  const float* page_bounds(const float* base, int page, int kv_head) const {
    if (page < 0 || page >= n_pages() || kv_head < 0 || kv_head >= kv_.view.num_kv_heads)
      fail("LayerCacheView: page ", page, " / kv_head ", kv_head, " out of range (n_pages ",
           n_pages(), ", n_kv_heads ", kv_.view.num_kv_heads, ")");
    if (!base) return nullptr;
    return base + (static_cast<size_t>(page) * kv_.view.num_kv_heads + kv_head) * kv_.view.head_dim;
  }
  void check(int slot, int kv_head) const {
    if (slot < 0 || slot >= kv_.n_slots || kv_head < 0 || kv_head >= kv_.view.num_kv_heads)
      fail("LayerCacheView: slot ", slot, " / kv_head ", kv_head, " out of range (n_slots ",
           kv_.n_slots, ", n_kv_heads ", kv_.view.num_kv_heads, ")");
  }
  LayerKv kv_;
};

}  // namespace kvlab
