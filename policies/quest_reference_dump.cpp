// Test helper for tests/reference/quest_ref_test.py: runs the `quest` policy through the
// engine-free simulator (policy_testing.h: pseudo-random q, k, v; the fake cache's pages of 4
// slots) and prints, as JSON on stdout, what the NumPy reference needs to recompute Quest's page
// selection independently: the model shape and page size, every key of every layer (quest never
// evicts, so the cache only grows and a step's cache is a prefix), and per (step, layer) the
// query rows and the slot ranges kvlab selected per KV head ("all" = select_all).
//
//   quest_reference_dump SEED GQA DENSE_LAYERS BUDGET_TOKENS COMPRESSION_RATIO
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/core/tool_main.h"
#include "policies/builtin.h"
#include "policies/policy_testing.h"

namespace kvlab {
namespace {

// Forwards to the policy and records each select() call's inputs and result.
class Recorder final : public AttentionPolicy {
 public:
  explicit Recorder(std::unique_ptr<AttentionPolicy> p) : p_(std::move(p)) {}
  PolicyNeeds needs() const override { return p_->needs(); }
  void select(const LayerStep& step, KeySelection& out) override {
    p_->select(step, out);
    std::string& j = json_;
    j += json_.empty() ? "" : ",\n";
    j += "{\"layer\": " + std::to_string(step.layer) + ", \"n_new\": " + std::to_string(step.n_new) +
         ", \"position\": " + std::to_string(step.positions[0]) +
         ", \"n_slots\": " + std::to_string(step.cache->n_slots()) + ", \"queries\": [";
    for (size_t i = 0; i < step.queries.size(); ++i) j += (i ? "," : "") + num(step.queries[i]);
    j += "], \"selection\": ";
    if (out.all) {
      j += "\"all\"";
    } else {
      j += "[";
      for (int h = 0; h < out.n_kv_heads; ++h) {
        j += h ? ", [" : "[";
        bool first = true;
        for (const SlotRange& r : out.list(0, h)) {
          j += (first ? "[" : ", [") + std::to_string(r.begin) + ", " + std::to_string(r.end) + "]";
          first = false;
        }
        j += "]";
      }
      j += "]";
    }
    j += "}";
  }
  void after_attention(const LayerStep& step, const StepStats& stats, Evictions& out) override {
    p_->after_attention(step, stats, out);
    if (!out.empty()) fail("quest evicted: the dump assumes a cache that only grows");
  }
  void reset() override { p_->reset(); }
  const std::string& json() const { return json_; }

  static std::string num(float x) {
    char b[32];
    std::snprintf(b, sizeof b, "%.9g", double(x));  // 9 significant digits round-trip a float
    return b;
  }

 private:
  std::unique_ptr<AttentionPolicy> p_;
  std::string json_;
};

int run(int argc, char** argv) {
  if (argc != 6) fail("usage: quest_reference_dump SEED GQA DENSE_LAYERS BUDGET_TOKENS COMPRESSION_RATIO");
  const uint64_t seed = std::strtoull(argv[1], nullptr, 10);
  testing::SimOptions o;
  o.n_layers = 3, o.n_heads = 8, o.n_kv_heads = 2, o.head_dim = 16;  // G = 4
  testing::PolicySimulator sim(o, seed);
  PolicyRegistry registry = make_builtin_registry();
  std::map<std::string, ParamValue> params = {{"gqa", std::string(argv[2])},
                                              {"dense_layers", int64_t(std::atoll(argv[3]))},
                                              {"budget_tokens", int64_t(std::atoll(argv[4]))},
                                              {"compression_ratio", std::atof(argv[5])}};
  Recorder rec(registry.create("quest", params, sim.shape()));
  // A prefill chunk, decode, a second chunk (dense too), decode; 13 + 30 + 7 + 30 = 80 tokens.
  sim.step(rec, 13);
  for (int i = 0; i < 30; ++i) sim.step(rec, 1);
  sim.step(rec, 7);
  for (int i = 0; i < 30; ++i) sim.step(rec, 1);
  std::printf("{\"n_layers\": %d, \"n_heads\": %d, \"n_kv_heads\": %d, \"head_dim\": %d, \"page_size\": %d,\n",
              o.n_layers, o.n_heads, o.n_kv_heads, o.head_dim, sim.cache(0).page_size());
  std::printf("\"keys\": [");  // [layer][slot][kv_head][feat]
  for (int l = 0; l < o.n_layers; ++l) {
    const auto& c = sim.cache(l);
    std::string j = l ? ",\n[" : "[";
    std::vector<float> k(size_t(c.n_slots()) * o.head_dim);
    std::vector<std::vector<float>> per_head;
    for (int h = 0; h < o.n_kv_heads; ++h) {
      c.load_keys(0, c.n_slots(), h, k.data());
      per_head.push_back(k);
    }
    for (int s = 0; s < c.n_slots(); ++s) {
      j += s ? ",[" : "[";
      for (int h = 0; h < o.n_kv_heads; ++h) {
        j += h ? ",[" : "[";
        for (int f = 0; f < o.head_dim; ++f) j += (f ? "," : "") + Recorder::num(per_head[h][size_t(s) * o.head_dim + f]);
        j += "]";
      }
      j += "]";
    }
    std::printf("%s]", j.c_str());
  }
  std::printf("],\n\"steps\": [%s]}\n", rec.json().c_str());
  return 0;
}

}  // namespace
}  // namespace kvlab

int main(int argc, char** argv) { return kvlab::tool_main("quest_reference_dump", kvlab::run, argc, argv); }
