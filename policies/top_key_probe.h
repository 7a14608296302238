// TopKeyProbe: an instrument, not a registered policy. It attends like `full` (selects every
// causal key, evicts nothing) and, after each layer's attention, records for the step's LAST
// query row and every query head the text position of the key with the largest attention score
// q . k over the cached keys (argmax of the softmax: the scale 1/sqrt(d) and the normalisation
// do not move it; ties go to the earlier position). The retrieval-head calibration
// (evals/retrieval_heads.h, `kvlab calibrate-heads`) reads it after every model call.
//
// Why a policy and not the engine's probe observers (framework/engine/step_observers.h): those
// return pooled recall / output-error statistics, not per-head argmax positions, and the engine
// stays unchanged; a policy sees exactly what attention used — the step's queries after RoPE
// (PolicyNeeds::queries) and the cached keys through LayerCacheView::load_key — so the argmax is
// the attention's own, on CPU and device alike. Cost: one dot product per (query head, cached
// key) per layer and step, for the last row only.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "framework/policy/policy.h"

namespace kvlab {

// Shared between the probe of the current sequence and its reader.
struct TopKeyRecord {
  int n_layers = 0, n_heads = 0;
  // [n_layers * n_heads]: top[layer * n_heads + head_idx] = text position of the top key of the
  // last row of the latest step in that layer; -1 before any step.
  std::vector<int64_t> top;
  // [n_layers]: text position of the row `top` was computed for (the step's last new token).
  std::vector<int64_t> row_position;
  void clear();
};

class TopKeyProbe final : public AttentionPolicy {
 public:
  // `record` is sized for `shape` and cleared.
  TopKeyProbe(std::shared_ptr<TopKeyRecord> record, const PolicyModelShape& shape);
  PolicyNeeds needs() const override;
  void after_attention(const LayerStep& step, const StepStats& stats, Evictions& out) override;
  void reset() override { record_->clear(); }

 private:
  std::shared_ptr<TopKeyRecord> record_;
  std::vector<float> key_;  // scratch [head_dim]
};

}  // namespace kvlab
