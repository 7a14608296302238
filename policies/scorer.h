// ScorerPolicy: the helper base for eviction policies (after kvpress's "scorer press"), and
// KeyScorer, the piece a method really is, so the same scores compose with different budgets.
//
// A method is ONE function, score(): a number per candidate token, higher = keep. The base does
// the rest, identically for every scorer, per layer after a step:
//   when: after every step, or once at the prompt end (LayerStep::prompt_end; kvpress's
//         protocol: decode then appends without further compression);
//   how much: a Retention per (layer, n_seen) -- `total` tokens per KV head, of which the first
//         `sinks` and the `recent` most recent resident tokens are always kept (inside total);
//   which: per KV head the `total - sinks - recent` best-scored candidates (ties: higher score
//         first, then lower position), or, with `across_heads` (AdaKV, POLICIES.md 13), the
//         layer's H_kv * (total - sinks - recent) best across all heads jointly, each head first
//         keeping its top max(0, floor(alpha * total) - sinks - recent) (kvpress's safeguard,
//         where the protected tokens count as the highest scores).
// Everything else is evicted; selection stays "all" (an eviction policy reads all it keeps).
//
// Two ways to write one:
//   * subclass ScorerPolicy and override score() (policies/examples/knorm.cpp, h2o.cpp);
//   * write a KeyScorer and hand it to make_scorer_policy() with a ScorerPlan (snapkv.cpp,
//     tova.cpp); a KeyScorer is what wrappers compose (adakv.cpp takes any registered one).
// Optional hooks: observe() sees every step (accumulate statistics, as h2o does), on_evict()
// drops what a stateful scorer kept about evicted tokens, needs() asks the kernels for
// statistics, reset clears per-sequence state.
//
// Parameters: scorer_param_specs() declares sinks / recent / keep / units (the first budget
// form, h2o's), budget_param_specs() (budget.h) the one convention of POLICIES.md 9.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "framework/policy/params.h"
#include "framework/policy/policy.h"

namespace kvlab {

// The first budget form (h2o): sinks + recent + keep, recent/keep in tokens or as ratios of the
// tokens seen so far (ceil(ratio * n_seen), so a short stream never drops to zero).
struct ScorerBudget {
  int64_t sinks = 0;   // first resident tokens always kept
  double recent = 0;   // most recent tokens always kept (tokens, or ratio of n_seen)
  double keep = 0;     // best-scored tokens kept among the rest (tokens, or ratio of n_seen)
  bool ratio = false;  // recent / keep are ratios of the tokens seen so far
  bool global_layers_only = false;  // budget_layers: global (budget.h); not read by from_params

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

// What one (layer, KV head) keeps when compressed (see the top of this file).
struct Retention {
  int64_t total = -1;   // tokens kept per KV head (across_heads: the layer's mean); -1 = no limit
  int64_t sinks = 0;    // first resident tokens always kept, inside total
  int64_t recent = 0;   // most recent resident tokens always kept, inside total
};

struct ScorerPlan {
  std::function<Retention(int layer, int64_t n_seen)> retention;
  bool at_prompt_end = false;  // compress once, at the prompt end; else after every step
  bool across_heads = false;   // AdaKV allocation across the layer's KV heads
  double alpha = 0.2;          // across_heads: the safeguard fraction
  int n_kv_heads = 1;          // across_heads: the model's (bounds budget_tokens)
  // budget_layers: global (budget.h): a local (sliding-window) layer is never compressed; it
  // keeps what the model's window leaves it.
  bool global_layers_only = false;
};

// The scores of a method, without any budget.
class KeyScorer {
 public:
  virtual ~KeyScorer() = default;
  virtual PolicyNeeds needs() const { return {}; }
  virtual void observe(const LayerStep& step, const StepStats& stats) {}
  // Scores of `candidates` (valid slots of kv_head outside the protected ones, in slot order);
  // one number per candidate into scores (same size). Higher = keep.
  virtual void score(const LayerStep& step, const StepStats& stats, int kv_head,
                     std::span<const ScoredSlot> candidates, std::span<float> scores) = 0;
  virtual void on_evict(int layer, int kv_head, std::span<const int64_t> positions) {}
  virtual void reset() {}
};

// A scorer over StepStats::window_attention (SnapKV's observation window, TOVA's last query):
// asks for `window` rows at the prompt end, or after every step.
class WindowScorer : public KeyScorer {
 public:
  WindowScorer(const char* name, int window, bool every_step)
      : name_(name), window_(window), every_step_(every_step) {}
  PolicyNeeds needs() const override;

 protected:
  // Query head h's window probabilities [n_slots]; an Error naming the scorer when the step
  // has none.
  const float* window_of(const StepStats& stats, int h) const;

 private:
  const char* name_;
  int window_;
  bool every_step_;
};

class ScorerPolicy : public AttentionPolicy {
 public:
  // The first form: after every step, per KV head, sinks + recent + keep (scaled per layer by
  // layer_budget_scale).
  explicit ScorerPolicy(const ScorerBudget& budget);
  explicit ScorerPolicy(ScorerPlan plan);

  void after_attention(const LayerStep& step, const StepStats& stats, Evictions& out) final;
  // Most tokens one KV head holds after a step that brought the sequence to n_seen: the
  // retention's total (across_heads: what one head can take when the others keep only their
  // safeguard); for at_prompt_end plans -1 until the prompt end, then the prompt's retention
  // plus the tokens appended since. With global_layers_only, -1 on a layer seen to be local (as
  // full attention: the model's window, not the policy, bounds it).
  int64_t budget_tokens(int layer, int64_t n_seen) const override;
  void reset() override;

 protected:
  // See KeyScorer.
  virtual void score(const LayerStep& step, const StepStats& stats, int kv_head,
                     std::span<const ScoredSlot> candidates, std::span<float> scores) = 0;
  virtual void observe(const LayerStep& step, const StepStats& stats) {}
  // First form only: per-layer budgets (recent and keep of `layer` are multiplied by this).
  virtual double layer_budget_scale(int layer) const { return 1.0; }
  virtual void on_evict(int layer, int kv_head, std::span<const int64_t> positions) {}
  virtual void on_reset() {}

 private:
  Retention retention(int layer, int64_t n_seen) const;
  void evict_per_head(const LayerStep& step, const StepStats& stats, const Retention& r, Evictions& out);
  void evict_across_heads(const LayerStep& step, const StepStats& stats, const Retention& r, Evictions& out);

  bool first_form_;
  ScorerBudget budget_;
  ScorerPlan plan_;
  bool global_layers_only_ = false;
  // [layer]: 1 once a step showed the layer local (LayerStep::sliding_window > 0). A property of
  // the model, so reset() keeps it.
  std::vector<char> local_layer_;
  int64_t prompt_tokens_ = -1;  // at_prompt_end: tokens seen at the prompt end; -1 before
  // Scratch reused across steps (not state: overwritten every call).
  std::vector<int32_t> slots_;
  std::vector<int64_t> positions_;
  std::vector<ScoredSlot> candidates_;
  std::vector<float> scores_;
  std::vector<int32_t> order_;
  std::vector<int64_t> evicted_positions_;
};

// A ScorerPolicy whose score() and hooks are `scorer`'s.
std::unique_ptr<AttentionPolicy> make_scorer_policy(std::unique_ptr<KeyScorer> scorer, ScorerPlan plan);

// The plan of the one budget convention (budget.h): total = kept(n), where n is the prompt's
// length for at_prompt_end plans and the tokens seen so far otherwise; `sinks` first tokens and
// `recent` last ones protected inside it (cut to fit a smaller total: sinks first).
ScorerPlan uniform_plan(double compression_ratio, int64_t budget_tokens, int64_t sinks,
                        int64_t recent, bool at_prompt_end);

}  // namespace kvlab
