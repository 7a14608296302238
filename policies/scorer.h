// ScorerPolicy: the helper base for eviction policies (after kvpress's "scorer press").
//
// A subclass implements ONE hook, score(): a number per candidate token, higher = keep. The base
// does the rest, identically for every scorer, after each forward step and per (layer, KV head):
//   n = resident tokens; budget = sinks + recent + keep (recent/keep in tokens, or as ratios of
//   the tokens seen so far: ceil(ratio * n_seen), so a short stream never drops to zero);
//   if n > budget: keep the first `sinks` resident tokens, the `recent` most recent ones, and the
//   `keep` best-scored among the rest (ties: higher score first, then lower position); evict the
//   others. Selection stays "all" (an eviction policy reads everything it keeps).
// Optional hooks: observe() sees every step (to accumulate statistics, e.g. H2O's attention
// mass), layer_budget_scale() gives layers different budgets, on_evict() lets stateful scorers drop what they kept about evicted tokens, needs()
// asks the kernels for statistics, on_reset() clears per-sequence state.
//
// Parameters: scorer_param_specs() declares sinks / recent / keep (named as you like, e.g.
// "heavy") / units; ScorerBudget::from_params() reads them back.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "framework/policy/params.h"
#include "framework/policy/policy.h"

namespace kvlab {

struct ScorerBudget {
  int64_t sinks = 0;   // first resident tokens always kept
  double recent = 0;   // most recent tokens always kept (tokens, or ratio of n_seen)
  double keep = 0;     // best-scored tokens kept among the rest (tokens, or ratio of n_seen)
  bool ratio = false;  // recent / keep are ratios of the tokens seen so far

  int64_t recent_tokens(int64_t n_seen) const;
  int64_t keep_tokens(int64_t n_seen) const;
  int64_t total_tokens(int64_t n_seen) const { return sinks + recent_tokens(n_seen) + keep_tokens(n_seen); }

  // Reads the parameters declared by scorer_param_specs (keep_name = the name used there).
  static ScorerBudget from_params(const ParamValues& p, const std::string& keep_name = "keep");
};

struct ScorerDefaults {
  std::string keep_name = "keep";
  std::string keep_doc = "best-scored tokens kept besides sinks and recent";
  int64_t sinks = 0;
  double recent = 0.1;
  double keep = 0.1;
  std::string units = "ratio";  // "ratio" | "tokens"
};
ParamSpecs scorer_param_specs(const ScorerDefaults& d = {});

// A candidate token for eviction: its slot and text position (KV head given separately).
struct ScoredSlot {
  int32_t slot;
  int64_t position;
};

class ScorerPolicy : public AttentionPolicy {
 public:
  explicit ScorerPolicy(const ScorerBudget& budget) : budget_(budget) {}

  void after_attention(const LayerStep& step, const StepStats& stats, Evictions& out) final;
  // sinks + (recent + keep) scaled by layer_budget_scale(layer).
  int64_t budget_tokens(int layer, int64_t n_seen) const override;
  void reset() override { on_reset(); }
  const ScorerBudget& budget() const { return budget_; }

 protected:
  // Scores of `candidates` (valid slots of kv_head outside sinks and recent, in slot order);
  // write one number per candidate into scores (same size). Higher = keep.
  virtual void score(const LayerStep& step, const StepStats& stats, int kv_head,
                     std::span<const ScoredSlot> candidates, std::span<float> scores) = 0;
  virtual void observe(const LayerStep& step, const StepStats& stats) {}
  // Per-layer budgets (e.g. a pyramid): recent and keep of `layer` are multiplied by this.
  virtual double layer_budget_scale(int layer) const { return 1.0; }
  virtual void on_evict(int layer, int kv_head, std::span<const int64_t> positions) {}
  virtual void on_reset() {}

 private:
  ScorerBudget budget_;
  // Scratch reused across steps (not state: overwritten every call).
  std::vector<int32_t> slots_;
  std::vector<int64_t> positions_;
  std::vector<ScoredSlot> candidates_;
  std::vector<float> scores_;
  std::vector<int32_t> order_;
  std::vector<int64_t> evicted_positions_;
};

}  // namespace kvlab
