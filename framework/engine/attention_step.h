// The attention step of one sequence in one layer, as a pipeline the layer loop runs for every
// group of a forward call, whatever the backend:
//   prepare  the query at its cache rank (rope_at_cache_position policies; keys and queries of
//            other policies arrive rotated at their text positions from the backend), append
//            k, v to the store, the policy's selection (on a model's sliding-window layer
//            clipped to the window), the rope-at-read ranks, a zeroed key mass
//   attend   the backend (cpu_backend.cpp: kernels/cpu; device_backend.cpp: launches)
//   finish   the observers (probes, budget accounting), policy.after_attention, plus on a
//            local layer every token no later query can read (the layer keeps its window
//            only), store.evict
// Observers see every step without the pipeline knowing what they compute
// (step_observers.h: ProbeObserver, BudgetObserver).
#pragma once

#include <vector>

#include "framework/engine/sequence.h"
#include "framework/kv/kv_store.h"
#include "framework/engine/layer_rope.h"
#include "kernels/cpu/rope.h"

namespace kvlab::engine_detail {

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // prepare, first: the group's new rows. q [n_rows, n_heads, hd] as the backend left it
  // (rotated at the text position, or raw for rope_at_cache_position policies), k and v
  // [n_rows, n_kv, hd] as they are appended to the store.
  virtual void new_rows(Group& g, int layer, const float* q, const float* k, const float* v) {}
  // finish, before the policy observes: the layer's cache, g.seq->selection and the attention
  // output out [n_rows, n_heads, hd] (host; valid when the observer's wants_output()).
  virtual void attended(Group& g, int layer, const LayerKv& kv, const float* out) {}
  // True when attended() reads `out` for this sequence's current step (the device backend then
  // copies the attention output to the host).
  virtual bool wants_output(const Sequence& s) const { return false; }
};

class AttentionStep {
 public:
  // fp8_from_prompt: EngineOptions::kv_fp8_scale_from_prompt (an fp8 store).
  AttentionStep(const ModelConfig& config, KvStore& store, const LayerRopes& rope, bool fp8_from_prompt = false)
      : c_(config), store_(store), rope_(rope), fp8_from_prompt_(fp8_from_prompt) {}
  void add_observer(StepObserver* observer) { observers_.push_back(observer); }
  bool wants_output(const Sequence& s) const;

  // q [n_rows, n_heads, hd] (rotated in place to the cache rank for rope_at_cache_position
  // policies), k and v [n_rows, n_kv, hd]: the projections of the group's rows.
  void prepare(Group& g, int layer, float* q, const float* k, const float* v);
  // out [n_rows, n_heads, hd]: the attention output of the group's rows. True when something
  // was evicted (the policy's choice or a local layer's out-of-window tokens: the layer's slot
  // metadata changed).
  bool finish(Group& g, int layer, const float* out);

 private:
  // The policy's StepStats (key mass, observation window) and its after_attention into evictions_.
  void observe_and_evict(Group& g, int layer, const LayerKv& kv);

  const ModelConfig& c_;
  KvStore& store_;
  const LayerRopes& rope_;
  const bool fp8_from_prompt_;
  std::vector<float> scale_k_, scale_v_;  // [n_kv_heads] a sequence's fp8 scales (scratch)
  std::vector<StepObserver*> observers_;
  Evictions evictions_;
  std::vector<int64_t> resident_before_;  // [n_kv_heads]
  KeySelection clipped_;                  // a local layer's selection clipped to the window
  std::vector<int32_t> first_in_window_;  // [n_rows, n_kv_heads]
  std::vector<int32_t> listed_;           // a head's policy evictions, sorted (scratch)
};

}  // namespace kvlab::engine_detail
