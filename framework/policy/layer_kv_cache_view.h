// LayerKvCacheView: the policy-facing LayerCacheView (policy.h) of one layer's LayerKv
// (kernels/common/layer_kv.h) -- what the engine hands a policy for the KV store's cache, and
// what tests read the store through. Non-owning; valid as long as the LayerKv it was made from
// (until the store next changes that sequence). Out-of-range slots and heads throw Error.
#pragma once

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
    std::memcpy(out, kv_.key(slot, kv_head), sizeof(float) * kv_.view.head_dim);
  }

 private:
  void check(int slot, int kv_head) const {
    if (slot < 0 || slot >= kv_.n_slots || kv_head < 0 || kv_head >= kv_.view.num_kv_heads)
      fail("LayerCacheView: slot ", slot, " / kv_head ", kv_head, " out of range (n_slots ",
           kv_.n_slots, ", n_kv_heads ", kv_.view.num_kv_heads, ")");
  }
  LayerKv kv_;
};

}  // namespace kvlab
