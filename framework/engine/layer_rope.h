// The RoPE of each layer. One table for every layer, except for models whose sliding-window
// (local) layers have their own base (Gemma 3: rope_local_base_freq, without rope scaling; the
// global layers keep rope_theta and rope_scaling): then a second table for those layers.
// Immutable after construction; shared by the CPU backend, the attention-step pipeline (queries at
// their cache rank, keys rotated at read) and the probe.
#pragma once

#include <cstdint>
#include <vector>

#include "framework/model/model.h"
#include "kernels/cpu/rope.h"

namespace kvlab::engine_detail {

class LayerRopes {
 public:
  LayerRopes() = default;
  // Tables of min(config.max_seq_len, max_table_positions) positions (beyond: on the fly).
  LayerRopes(const ModelConfig& config, int64_t max_table_positions);
  const RopeTable& operator[](int layer) const {
    return has_local_ && static_cast<size_t>(layer) < local_.size() && local_[layer] ? local_table_ : global_;
  }
  const RopeTable& global() const { return global_; }
  bool per_layer() const { return has_local_; }  // local layers have their own table

 private:
  RopeTable global_, local_table_;
  std::vector<uint8_t> local_;  // [n_layers]
  bool has_local_ = false;
};

}  // namespace kvlab::engine_detail
