// Test support for policies, independent of the engine: a fake per-sequence cache with the KV
// store's semantics (holes, per-head eviction, order-preserving compaction) and a simulator that
// drives any AttentionPolicy through the step protocol of policy.h, attending through the fp64
// reference attention (kernels/testing/reference_attention.h; outputs and key mass in float).
//
// The simulator's "model" gives every (layer, position) deterministic pseudo-random q, k, v
// (queries [n_heads, d], keys/values [n_kv_heads, d]) that do not depend on earlier outputs, so
// the output of each (layer, query) is a pure function of which keys it read: exactly what the
// conformance tests compare (unlimited budget == full; mask policies == dense masked reference,
// computed from the generator, never from the cache).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "framework/policy/policy.h"
#include "framework/policy/registry.h"

namespace kvlab::testing {

class FakeLayerCache final : public LayerCacheView {
 public:
  // flat = expose positions_data()/valid_data() (the fast path) or only the virtual accessors.
  FakeLayerCache(int n_kv_heads, int head_dim, bool flat, int block_size_tokens = 4);
  int append(int64_t position, const float* k, const float* v);  // k, v: [n_kv_heads, head_dim]
  // Throws kvlab::Error on an out-of-range, duplicate or already-evicted slot (before changing
  // anything). Frees nothing (no blocks) but compacts like the store: when
  // n_slots - max_h live(h) > max(block, 2% n_slots), live slots move down per head.
  void evict(const Evictions& ev);
  // Keep per-page key bounds (PolicyNeeds::page_stats), recomputed from scratch from the valid
  // keys of each page the cache changes (the reference for the store's incremental bookkeeping).
  void set_page_stats(bool on);

  int n_slots() const override { return n_slots_; }
  bool slot_valid(int s, int h) const override { return valid_[idx(s, h)] != 0; }
  int64_t slot_position(int s, int h) const override { return pos_[idx(s, h)]; }
  void load_key(int s, int h, float* out) const override;
  void load_keys(int begin, int end, int h, float* out) const override;
  int page_size() const override { return block_; }
  const float* page_key_max(int page, int h) const override;
  const float* page_key_min(int page, int h) const override;
  const int64_t* positions_data() const override { return flat_ ? pos_.data() : nullptr; }
  const uint8_t* valid_data() const override { return flat_ ? valid_.data() : nullptr; }

  const float* key(int s, int h) const { return k_.data() + idx(s, h) * d_; }
  const float* value(int s, int h) const { return v_.data() + idx(s, h) * d_; }
  int64_t resident(int h) const;
  int64_t compactions() const { return compactions_; }

 private:
  size_t idx(int s, int h) const { return size_t(s) * n_kv_ + h; }
  void compact();
  void recompute_page(int page);
  int n_kv_, d_;
  bool flat_;
  int block_;
  int n_slots_ = 0;
  std::vector<int64_t> pos_;   // [n_slots, n_kv]
  std::vector<uint8_t> valid_; // [n_slots, n_kv]
  std::vector<float> k_, v_;   // [n_slots, n_kv, d]
  bool page_stats_ = false;
  std::vector<float> page_max_, page_min_;  // [n_pages, n_kv, d] when page_stats_
  int64_t compactions_ = 0;
};

struct SimOptions {
  int n_layers = 2, n_heads = 4, n_kv_heads = 2, head_dim = 8;
  int max_seq_len = 512;
  bool flat_view = true;
  float query_scale = 3.f;  // larger = peakier attention
};

// Deterministic generator: q (kind 0, n_heads rows), k (1), v (2) of (seed, layer, position).
void generate(const SimOptions& o, uint64_t seed, int layer, int64_t position, int kind, float* out);

class PolicySimulator {
 public:
  PolicySimulator(const SimOptions& o, uint64_t seed);
  PolicyModelShape shape() const;
  struct Step {
    std::vector<std::vector<float>> out;        // [layer][n_new * n_heads * head_dim]
    std::vector<std::vector<int64_t>> resident; // [layer][kv_head] after evictions
    std::vector<std::vector<int64_t>> reads;    // [layer][row * n_kv_heads + kv_head] keys read
    std::vector<std::string> violations;        // selection/eviction contract breaches
  };
  // Feeds n_new tokens (positions n_seen ..) as one step through every layer; prompt_end marks
  // the step as the prompt's end (LayerStep::prompt_end). Queries reach the policy only when
  // its needs() ask (as in the engine); the observation window (PolicyNeeds) comes from the
  // same fp64 reference rows as the outputs.
  Step step(AttentionPolicy& policy, int n_new, bool prompt_end = false);
  // A new sample: fresh cache and seed, position 0 (the policy is reset by the caller).
  void restart(uint64_t seed);
  int64_t n_seen() const { return n_seen_; }
  const FakeLayerCache& cache(int layer) const { return caches_[layer]; }
  const SimOptions& options() const { return o_; }

 private:
  SimOptions o_;
  uint64_t seed_;
  int64_t n_seen_ = 0;
  std::vector<FakeLayerCache> caches_;
};

// Output [n_heads * head_dim] of query position i in `layer`, attending exactly to the keys
// j <= i with allow(kv_head, j), straight from the generator.
std::vector<float> dense_reference(const SimOptions& o, uint64_t seed, int layer, int64_t i,
                                   const std::function<bool(int kv_head, int64_t j)>& allow);

// "" when `sel` is well formed for `step` (explicit lists sorted, disjoint, non-empty ranges in
// [0, n_slots), every selected slot causal for its row); else a description.
std::string check_selection(const KeySelection& sel, const LayerStep& step);
// "" unless needs.prefill_mask is set and a row of this multi-row step reads a valid causal key
// the mask forbids, or skips one it allows (the promise of policy.h PolicyNeeds::prefill_mask).
std::string check_prefill_mask(const PolicyNeeds& needs, const KeySelection& sel, const LayerStep& step);

// The built-in registry with the plugin at `plugin_path` loaded, made once per process (the
// conformance suites run every registered policy, the example plugin included).
PolicyRegistry& builtins_and_plugin(const std::string& plugin_path);

// A policy and raw parameters.
struct PolicyConfig {
  std::string policy;
  std::map<std::string, ParamValue> params;
};
// COMPAT (policy API < 4), extra conformance cases: acting parameters kept in one central table
// (restricted to `registered`), run by the conformance suite (policies/conformance.h) besides
// each factory's own PolicyFactory::conformance_configs(), with no flag asserted (mask checked
// when claimed; sinks from the factory's own configurations, else a parameter named "sinks").
std::vector<PolicyConfig> acting_policy_configs(const std::vector<std::string>& registered);
// A `duo` head file for the suites' shape (2 layers x 2 KV heads), written once per process
// into the temporary directory; scores (layer, kv_head): (0,0) 0.125, (0,1) 0.5, (1,0) 0.25,
// (1,1) 1.
const std::string& duo_test_head_file();
std::string describe(const PolicyConfig& c);  // "policy{key=value ...}"

// max |a - b|; infinity for a size mismatch or any NaN.
float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace kvlab::testing
