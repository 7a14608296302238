// The attention-policy interface: the heart of kvlab.
//
// A policy decides, for every layer and step of one sequence, (1) which cached keys each new
// query may read and (2) which cached tokens may be dropped. It turns what it observes into DATA
// — a KeySelection and a list of Evictions — that the paged KV store and the attention kernels
// carry out exactly. It declares what it needs computed (PolicyNeeds) so that kernels compute
// nothing unused.
//
// Lifetime and state: a PolicyFactory (what the registry holds) creates one AttentionPolicy per
// sequence. The instance owns all its per-layer and per-KV-head state, so state can never leak
// between sequences or samples; `reset()` returns it to the freshly created state.
//
// The step, per layer `l` of one forward call over `n_new` tokens of one sequence:
//   1. the engine computes q, k, v of the new tokens and appends k, v to the layer's cache
//      (cache slots [n_slots - n_new, n_slots));
//   2. policy.select(step, selection)           -> which slots each (query row, KV head) reads;
//   3. attention runs exactly over the selection (online softmax, causal by position);
//      if needs().key_attention_mass, it also returns, for every slot and KV head, the sum over
//      the step's query rows and the KV head's G query heads of the probability it received;
//   4. policy.after_attention(step, stats, evictions) -> slots to drop, per KV head;
//   5. the store drops them (frees blocks that become empty, compacts partially empty ones).
//
// Vocabulary: slot = index of a cached token in the layer's cache of this sequence (0-based, in
// insertion order, stable between compactions: see LayerCacheView::slot_position); position =
// the token's position in the text; qo_idx = query row of the step (0..n_new-1); head_idx =
// query head; kv_head = KV head (query head h reads KV head h / G).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "framework/policy/params.h"
#include "kernels/common/selection.h"  // SlotRange, KeySelection, Evictions

namespace kvlab {

// Model shape a policy may scale its defaults by.
struct PolicyModelShape {
  int n_layers = 0;
  int n_heads = 0;      // query heads
  int n_kv_heads = 0;   // KV heads; group size G = n_heads / n_kv_heads
  int head_dim = 0;
  int max_seq_len = 0;  // the model's training context
};

// A position mask of the attention kernels' form (kernels/common/masks.h WindowSinkMask): the
// query at position i reads key position j iff j <= i and (window <= 0 or j < sinks or
// i - j < window).
struct PositionMask {
  int64_t window = 0;
  int64_t sinks = 0;
};

// What the kernels must compute for this policy.
struct PolicyNeeds {
  // StepStats::key_mass: per KV head and slot, sum over the step's rows and the group's query
  // heads of softmax probability (H2O's accumulated attention score).
  bool key_attention_mass = false;
  // Store keys before RoPE and rotate each at read time with its rank among the cached tokens
  // (StreamingLLM's "positions within the cache"); the query gets position = number of cached
  // tokens before it. False: keys are rotated once, at their original text position.
  bool rope_at_cache_position = false;
  // A promise: in a multi-row step (a prefill chunk) every row selects exactly the valid cached
  // keys this mask allows at its position, and nothing else. The GPU then runs the chunk on its
  // tensor-core prefill kernel with the mask instead of per-row lists (framework/engine/
  // device_backend.h); the emulated device executes the mask, so the engine device tests catch
  // a broken promise. Unset: no promise (per-row lists are used).
  std::optional<PositionMask> prefill_mask;
  // The policy reads LayerStep::queries. Unset, the span is empty and the device path does not
  // copy the step's queries back to the host for it.
  bool queries = false;
  // Observation window (SnapKV's, TOVA's last query): StepStats::window_attention, per query
  // head, the attention of the step's last min(observation_window, n_new) rows over every slot.
  // Given at the prompt-end step only (LayerStep::prompt_end), or on every step with
  // observe_every_step. When the prompt end arrives in one prefill call, the engine makes that
  // call's last chunk at least observation_window rows long, so the window never straddles two
  // chunks. 0 = not needed.
  int observation_window = 0;
  bool observe_every_step = false;
  // Per-page key bounds (Quest): LayerCacheView::page_key_max / page_key_min. Unset, the store
  // does not keep them and those return nullptr.
  bool page_stats = false;
};

// Read-only view of one layer's cache of one sequence, as the policy sees it.
// Order contract: for each KV head, slot_position(s, h) is non-decreasing in s and strictly
// increasing over valid slots (slots are filled in text order; a hole keeps the position of the
// token it held, or after compaction a copy of the previous slot's). Policies rely on it to map
// a position range [a, b) to the slot range [first slot with position >= a, ... >= b).
class LayerCacheView {
 public:
  virtual ~LayerCacheView() = default;
  virtual int n_slots() const = 0;  // slots in use, including evicted holes not yet compacted
  virtual bool slot_valid(int slot, int kv_head) const = 0;
  virtual int64_t slot_position(int slot, int kv_head) const = 0;  // text position of the token
  // Optional fast path (may return nullptr): the same metadata as flat arrays laid out
  // [n_slots, n_kv_heads] (element s * n_kv_heads + h), valid until the store next changes.
  virtual const int64_t* positions_data() const { return nullptr; }
  virtual const uint8_t* valid_data() const { return nullptr; }
  // Writes the key (as used by attention: after RoPE at the original position, except with
  // rope_at_cache_position where it is the raw key) as fp32 into out[head_dim].
  virtual void load_key(int slot, int kv_head, float* out) const = 0;
  // Bulk form: keys of slots [slot_begin, slot_end) into out[(s - slot_begin) * head_dim + d]
  // (holes included, with whatever their row holds: check slot_valid).
  virtual void load_keys(int slot_begin, int slot_end, int kv_head, float* out) const = 0;

  // Pages = the store's blocks: slot s is entry s % page_size() of page s / page_size().
  virtual int page_size() const = 0;
  int page_of(int slot) const { return slot / page_size(); }
  int n_pages() const { return (n_slots() + page_size() - 1) / page_size(); }
  // With PolicyNeeds::page_stats (else nullptr): [head_dim] elementwise max / min of the keys
  // (as load_key gives them) of the page's valid cells of kv_head; -inf / +inf when it has none.
  // Valid until the store next changes.
  virtual const float* page_key_max(int page, int kv_head) const { return nullptr; }
  virtual const float* page_key_min(int page, int kv_head) const { return nullptr; }
};

// One layer of one forward call, for one sequence.
struct LayerStep {
  int layer = 0;
  bool is_prefill = false;                 // more than one new token (a prefill chunk)
  int n_new = 0;                           // new tokens (query rows) in this call
  std::span<const int64_t> positions;      // [n_new] text positions of the new tokens
  // [n_new, n_heads, head_dim] queries after RoPE (with rope_at_cache_position: at the cache
  // position), fp32, unscaled.
  std::span<const float> queries;
  const LayerCacheView* cache = nullptr;   // includes the new tokens' slots
  PolicyModelShape shape;
  // The step's last row is the prompt's last token (Engine::prefill(..., prompt_end = true)):
  // where methods that compress once per prompt (SnapKV, PyramidKV, AdaKV, kvpress's protocol)
  // act. Decode steps and plain prefill chunks have it false.
  bool prompt_end = false;
  // The sample's seed (Engine::start_sequence), for randomised policies; the same seed gives the
  // same decisions.
  uint64_t seed = 0;
  // The layer's kind: 0 for a global layer; W > 0 for a model's sliding-window (local) layer
  // (Gemma 2/3), whose query at position i reads key position j only if i - j < W whatever the
  // selection (the engine clips the policy's selection to it). A policy may budget per kind.
  int64_t sliding_window = 0;
};

// What attention observed, when PolicyNeeds asked for it.
struct StepStats {
  // [n_kv_heads, n_slots]: key_mass[h * n_slots + s]; empty unless key_attention_mass.
  std::span<const float> key_mass;
  int n_slots = 0;
  // [n_heads, n_slots]: window_attention[hq * n_slots + s] = sum over the step's last
  // window_rows rows of the softmax probability query head hq gave slot s (0 for slots it did
  // not read); empty unless PolicyNeeds::observation_window asked for it at this step.
  std::span<const float> window_attention;
  int window_rows = 0;
};

// The reads of a mask-based policy as a pure function of (layer, KV head, query position i,
// key position j), causality included. The conformance tests build the dense masked reference
// from it, independently of the policy's selections and evictions.
struct ClaimedMask {
  std::function<bool(int layer, int kv_head, int64_t i, int64_t j)> allow;
  // True when the claim holds only for one-token decode steps (eviction-based policies whose
  // prefill chunk reads more than the mask, e.g. none today; kept for plugins).
  bool decode_only = false;
};

class AttentionPolicy {
 public:
  virtual ~AttentionPolicy() = default;
  virtual PolicyNeeds needs() const { return {}; }
  // Before attention: fill `out` (it arrives as select_all()).
  virtual void select(const LayerStep& step, KeySelection& out) {}
  // After attention: append evictions (it arrives cleared for n_kv_heads).
  virtual void after_attention(const LayerStep& step, const StepStats& stats, Evictions& out) {}
  // Most tokens resident per (layer, KV head) after a step that brought the sequence to
  // n_seen tokens; -1 = unbounded. Used by invariant tests and reported as "budget set".
  virtual int64_t budget_tokens(int layer, int64_t n_seen) const { return -1; }
  // Back to the freshly created state (a new sample).
  virtual void reset() = 0;
  // Mask-based policies (sliding_window, strided, sinks with original positions) return the
  // mask their reads equal; others nullopt.
  virtual std::optional<ClaimedMask> claimed_mask() const { return std::nullopt; }
};

// What the registry holds: a named, documented maker of per-sequence policies. It also says how
// the conformance suite (policies/conformance.h, `kvlab check-policy`) exercises its policies, so
// a plugin extends the suite with its own acting parameters exactly as a built-in does.
class PolicyFactory {
 public:
  // One parameter set under which the policy acts (evicts or selects) within the suite's few
  // dozen tokens, and what the suite then asserts beyond its common checks.
  struct ConformanceConfig {
    std::map<std::string, ParamValue> params = {};  // raw, validated like a run's
    // The policy drops tokens: the suite requires resident < seen tokens by the end of its run.
    bool evicts = false;
    // claimed_mask() is set: the suite requires it and compares the outputs with dense
    // attention under that mask; unset, it requires claimed_mask() to be empty.
    bool mask_based = false;
    // The parameter counting the first positions that stay resident (the suite checks they do);
    // "" = none (e.g. landmark's sinks are only read, not protected from eviction).
    std::string sinks_param = "";
  };
  virtual ~PolicyFactory() = default;
  virtual std::string name() const = 0;
  virtual std::string doc() const = 0;          // one line
  virtual const ParamSpecs& params() const = 0; // typed parameters with defaults and docs
  // `params` has already been validated against params() (defaults filled in).
  virtual std::unique_ptr<AttentionPolicy> create(const ParamValues& params,
                                                  const PolicyModelShape& shape) const = 0;
  // Raw parameters under which the policy reads and keeps every causal key, so it must equal
  // `full` exactly (the conformance tests run every registered policy with them); nullopt when
  // the policy has no such setting.
  virtual std::optional<std::map<std::string, ParamValue>> unlimited_params() const {
    return std::nullopt;
  }
  // The parameters the policy made by create(params, shape) really runs with: `params` with
  // every default filled in and every "auto" value (e.g. landmark's 0) resolved for `shape`.
  // Recorded in results files, so a cell says what ran and not only what was written.
  virtual std::map<std::string, ParamValue> effective_params(const ParamValues& params,
                                                             const PolicyModelShape& shape) const {
    (void)shape;
    return params.all();
  }
  // The parameter sets the conformance suite runs (besides unlimited_params()). Empty: the suite
  // runs the defaults and asserts no flag (a compat path for factories written before API v4).
  virtual std::vector<ConformanceConfig> conformance_configs() const { return {}; }
};

}  // namespace kvlab
