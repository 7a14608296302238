// The observers of the attention step (attention_step.h) the Engine installs:
//   BudgetObserver  per decode step and layer, the keys one query head read (achieved) against
//                   what the policy's budget allows (set): SequenceStats "attended";
//   ProbeObserver   on probed steps and layers (EngineOptions::probe), dense attention over a
//                   shadow copy of every token seen, against what the policy's attention
//                   produced: recall and relative output error (SequenceStats "probe").
#pragma once

#include <vector>

#include "framework/engine/attention_step.h"
#include "framework/engine/layer_rope.h"

namespace kvlab::engine_detail {

class BudgetObserver final : public StepObserver {
 public:
  void attended(Group& g, int layer, const LayerKv& kv, const float* out) override;
  // Decode-step bookkeeping around the layers (Engine::decode).
  static void begin_step(Sequence& s) { s.attended.step_set = s.attended.step_achieved = 0; }
  static void end_step(Sequence& s, int n_layers);
};

class ProbeObserver final : public StepObserver {
 public:
  // probe_layers: sorted, unique, in range (EngineOptions after defaulting).
  ProbeObserver(const ModelConfig& config, const LayerRopes& rope, std::vector<int> probe_layers)
      : c_(config), rope_(rope), layers_(std::move(probe_layers)) {}
  void new_rows(Group& g, int layer, const float* q, const float* k, const float* v) override;
  void attended(Group& g, int layer, const LayerKv& kv, const float* out) override;
  bool wants_output(const Sequence& s) const override { return s.probe.probing_step; }
  // A new sequence's probe state (empty when probes are off), and a fork's: the parent's
  // shadow copies, counts from 0.
  void start(Sequence& s) const;
  void fork(const Sequence& parent, Sequence& child) const;

 private:
  bool keeps_shadow(const Sequence& s, int layer) const;
  const ModelConfig& c_;
  const LayerRopes& rope_;
  std::vector<int> layers_;
};

}  // namespace kvlab::engine_detail
