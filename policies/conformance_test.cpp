// Conformance of every registered policy (built-ins and the example plugin, loaded through the
// plugin loader), on the engine-free simulator (policy_testing.h):
//   1. with its unlimited parameters every policy equals `full` (same outputs to fp tolerance);
//   2. every mask-based policy equals dense attention under the mask it claims, the reference
//      built from the generator (for the union patterns, from kernels/common/masks.h functors);
//   3. invariants each step: contract-valid selections and evictions, resident <= budget,
//      sinks kept, deterministic, two interleaved sequences == each alone, reset == new.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/common/masks.h"
#include "policies/builtin.h"
#include "policies/policy_testing.h"

namespace kvlab {
namespace {

using testing::PolicySimulator;
using testing::SimOptions;

PolicyRegistry& registry() { return testing::builtins_and_plugin(KVLAB_EXAMPLE_PLUGIN); }

using Config = testing::PolicyConfig;
using testing::describe;
std::vector<Config> configs() { return testing::acting_policy_configs(registry().names()); }

// Prefill chunk (the prompt's end: prompt-end policies compress there), then decode steps.
const std::vector<int> kSchedule = [] {  // a prefill chunk, decode, a second chunk, decode
  std::vector<int> s = {13};
  for (int i = 0; i < 30; ++i) s.push_back(1);
  s.push_back(11);
  for (int i = 0; i < 30; ++i) s.push_back(1);
  return s;
}();

using Trace = std::vector<PolicySimulator::Step>;

Trace run(AttentionPolicy& p, const SimOptions& o, uint64_t seed, const std::vector<int>& sched) {
  PolicySimulator sim(o, seed);
  Trace t;
  for (size_t i = 0; i < sched.size(); ++i) t.push_back(sim.step(p, sched[i], i == 0));
  return t;
}

float trace_diff(const Trace& a, const Trace& b) {
  if (a.size() != b.size()) return INFINITY;
  float m = 0.f;
  for (size_t s = 0; s < a.size(); ++s)
    for (size_t l = 0; l < a[s].out.size(); ++l) m = std::max(m, testing::max_abs_diff(a[s].out[l], b[s].out[l]));
  return m;
}

SimOptions sim_options() {
  SimOptions o;
  o.n_layers = 2, o.n_heads = 6, o.n_kv_heads = 2, o.head_dim = 8;  // G = 3
  return o;
}

TEST(PolicyConformance, RegistryHoldsBuiltinsAndPlugin) {
  EXPECT_EQ(registry().names().size(), make_builtin_registry().names().size() + 1);
  EXPECT_NE(registry().find("knorm_plugin"), nullptr);
  EXPECT_EQ(registry().origin("knorm_plugin"), KVLAB_EXAMPLE_PLUGIN);
}

TEST(PolicyConformance, UnlimitedBudgetEqualsFull) {
  const SimOptions o = sim_options();
  PolicySimulator shape_sim(o, 1);
  auto full = registry().create("full", {}, shape_sim.shape());
  for (const std::vector<int>& sched : {kSchedule, std::vector<int>(40, 1)}) {
    const Trace want = run(*full, o, 11, sched);
    for (const std::string& name : registry().names()) {
      auto unlimited = registry().at(name).unlimited_params();
      ASSERT_TRUE(unlimited.has_value()) << name << " declares no unlimited parameters";
      auto p = registry().create(name, *unlimited, shape_sim.shape());
      const Trace got = run(*p, o, 11, sched);
      EXPECT_LE(trace_diff(got, want), 1e-5f) << name;
      for (const auto& st : got) ASSERT_TRUE(st.violations.empty()) << name << ": " << st.violations[0];
    }
  }
}

// The mask a policy claims, checked against an independent statement where one exists.
TEST(PolicyConformance, MaskPoliciesEqualDenseMaskedReference) {
  const SimOptions o = sim_options();
  PolicySimulator shape_sim(o, 1);
  int checked = 0;
  for (const Config& c : configs()) {
    auto p = registry().create(c.policy, c.params, shape_sim.shape());
    auto mask = p->claimed_mask();
    if (!mask) continue;
    SCOPED_TRACE(describe(c));
    ++checked;
    // Independent statements for the built-in patterns (kernels/common/masks.h).
    const ParamValues v = validate_params(c.policy, registry().at(c.policy).params(), c.params, "t");
    std::function<bool(int, int, int64_t, int64_t)> independent;
    if (c.policy == "sliding_window") {
      SlidingWindowMask m{v.get_int("window"), v.get_bool("plus_one")};
      independent = [m](int, int, int64_t i, int64_t j) { return m(i, j); };
    } else if (c.policy == "strided" && v.get_string("combine") == "union") {
      if (v.get_string("pattern") == "strided") {
        StridedMask m{v.get_int("stride"), v.get_int("global")};
        independent = [m](int, int, int64_t i, int64_t j) { return m(i, j); };
      } else {
        FixedMask m{v.get_int("stride"), v.get_int("summary"), v.get_int("global")};
        independent = [m](int, int, int64_t i, int64_t j) { return m(i, j); };
      }
    } else if (c.policy == "full") {
      independent = [](int, int, int64_t i, int64_t j) { return CausalMask{}(i, j); };
    }
    if (independent) {
      for (int layer = 0; layer < 2; ++layer)
        for (int h = 0; h < 2; ++h)
          for (int64_t i = 0; i < 80; ++i)
            for (int64_t j = 0; j <= i + 1; ++j) {
              ASSERT_EQ(mask->allow(layer, h, i, j), independent(layer, h, i, j)) << i << "," << j;
            }
    }
    PolicySimulator sim(o, 21);
    int64_t pos = 0;
    size_t step_index = 0;
    for (int n : kSchedule) {
      auto st = sim.step(*p, n, step_index++ == 0);  // the first chunk ends the prompt
      ASSERT_TRUE(st.violations.empty()) << st.violations[0];
      if (!(mask->decode_only && n > 1))
        for (int layer = 0; layer < o.n_layers; ++layer)
          for (int r = 0; r < n; ++r) {
            const int64_t i = pos + r;
            auto ref = testing::dense_reference(o, 21, layer, i, [&](int h, int64_t j) {
              return mask->allow(layer, h, i, j);
            });
            std::vector<float> got(st.out[layer].begin() + size_t(r) * o.n_heads * o.head_dim,
                                   st.out[layer].begin() + size_t(r + 1) * o.n_heads * o.head_dim);
            ASSERT_LE(testing::max_abs_diff(got, ref), 2e-5f) << "layer " << layer << " query " << i;
          }
      pos += n;
    }
  }
  EXPECT_GE(checked, 8);
}

TEST(PolicyConformance, InvariantsEachStep) {
  const SimOptions o = sim_options();
  for (const Config& c : configs()) {
    SCOPED_TRACE(describe(c));
    PolicySimulator sim(o, 5);
    auto p = registry().create(c.policy, c.params, sim.shape());
    const ParamValues v = validate_params(c.policy, registry().at(c.policy).params(), c.params, "t");
    const bool has_sinks = v.all().count("sinks") && c.policy != "landmark";  // landmark: read-only sinks
    const int64_t sinks = has_sinks ? v.get_int("sinks") : 0;
    size_t step_index = 0;
    for (int n : kSchedule) {
      auto st = sim.step(*p, n, step_index++ == 0);  // the first chunk ends the prompt
      ASSERT_TRUE(st.violations.empty()) << st.violations[0];
      for (int layer = 0; layer < o.n_layers; ++layer) {
        const int64_t budget = p->budget_tokens(layer, sim.n_seen());
        for (int h = 0; h < o.n_kv_heads; ++h) {
          if (budget >= 0) {
            ASSERT_LE(st.resident[layer][h], budget) << "n_seen " << sim.n_seen();
          }
          // Sinks kept: positions [0, sinks) resident.
          const auto& cache = sim.cache(layer);
          int64_t kept = 0;
          for (int s = 0; s < cache.n_slots(); ++s)
            kept += cache.slot_valid(s, h) && cache.slot_position(s, h) < sinks;
          ASSERT_EQ(kept, std::min(sinks, sim.n_seen()));
        }
      }
    }
  }
}

TEST(PolicyConformance, DeterministicBatchedAndReset) {
  const SimOptions o = sim_options();
  for (const Config& c : configs()) {
    SCOPED_TRACE(describe(c));
    PolicySimulator shape_sim(o, 1);
    auto make = [&] { return registry().create(c.policy, c.params, shape_sim.shape()); };
    auto a1 = make();
    const Trace alone_a = run(*a1, o, 31, kSchedule);
    auto a2 = make();
    EXPECT_EQ(trace_diff(run(*a2, o, 31, kSchedule), alone_a), 0.f) << "not deterministic";
    auto b1 = make();
    const Trace alone_b = run(*b1, o, 32, kSchedule);
    // Two sequences stepped in lockstep (one batch): each equals its solo run.
    auto pa = make(), pb = make();
    PolicySimulator sa(o, 31), sb(o, 32);
    Trace ta, tb;
    for (size_t i = 0; i < kSchedule.size(); ++i) {
      ta.push_back(sa.step(*pa, kSchedule[i], i == 0));
      tb.push_back(sb.step(*pb, kSchedule[i], i == 0));
    }
    EXPECT_EQ(trace_diff(ta, alone_a), 0.f) << "batched != alone (a)";
    EXPECT_EQ(trace_diff(tb, alone_b), 0.f) << "batched != alone (b)";
    // A policy reset after one sample behaves like a new one on the next.
    auto pr = make();
    run(*pr, o, 31, kSchedule);
    pr->reset();
    EXPECT_EQ(trace_diff(run(*pr, o, 32, kSchedule), alone_b), 0.f) << "reset != new";
  }
}

}  // namespace
}  // namespace kvlab
