#include "policies/conformance.h"

#include <array>
#include <cmath>
#include <cstring>
#include <random>

#include "framework/core/error.h"
#include "framework/engine/logit_bound.h"
#include "framework/engine/random_model.h"
#include "kernels/common/masks.h"
#include "kernels/testing/reference_attention.h"
#include "kernels/testing/reference_dense.h"
#include "policies/policy_testing.h"

namespace kvlab::conformance {

std::string Case::describe() const {
  return testing::describe({policy, config.params});
}

std::vector<Case> cases(const PolicyRegistry& registry, const std::vector<std::string>& names) {
  std::vector<Case> out;
  const std::vector<testing::PolicyConfig> compat = testing::acting_policy_configs(names);
  for (const std::string& name : names) {
    const PolicyFactory& f = registry.at(name);
    const auto declared = f.conformance_configs();
    for (const auto& c : declared) out.push_back({name, c, true});
    // COMPAT: the central table's entries run as well, flags not asserted; their sinks parameter
    // is the factory's (its first configuration), else (no configuration) a parameter named
    // "sinks", as the suite inferred before API v4.
    std::string sinks;
    if (!declared.empty()) {
      sinks = declared.front().sinks_param;
    } else {
      for (const ParamSpec& p : f.params())
        if (p.name == "sinks") sinks = "sinks";
    }
    bool any = !declared.empty();
    for (const auto& c : compat)
      if (c.policy == name) out.push_back({name, {.params = c.params, .sinks_param = sinks}, false}), any = true;
    if (!any) out.push_back({name, {.sinks_param = sinks}, false});  // nothing given: the defaults
  }
  return out;
}

namespace {

using testing::PolicySimulator;
using testing::SimOptions;
using Trace = std::vector<PolicySimulator::Step>;

// A prefill chunk (the prompt's end: prompt-end policies compress there), decode, a second
// chunk, decode.
const std::vector<int>& schedule() {
  static const std::vector<int> s = [] {
    std::vector<int> s = {13};
    for (int i = 0; i < 30; ++i) s.push_back(1);
    s.push_back(11);
    for (int i = 0; i < 30; ++i) s.push_back(1);
    return s;
  }();
  return s;
}

SimOptions sim_options() {
  SimOptions o;
  o.n_layers = 2, o.n_heads = 6, o.n_kv_heads = 2, o.head_dim = 8;  // G = 3
  return o;
}

Trace run(AttentionPolicy& p, const SimOptions& o, uint64_t seed, const std::vector<int>& sched) {
  PolicySimulator sim(o, seed);
  Trace t;
  for (size_t i = 0; i < sched.size(); ++i) t.push_back(sim.step(p, sched[i], i == 0));  // the first chunk ends the prompt
  return t;
}

float trace_diff(const Trace& a, const Trace& b) {
  if (a.size() != b.size()) return INFINITY;
  float m = 0.f;
  for (size_t s = 0; s < a.size(); ++s) {
    if (a[s].out.size() != b[s].out.size()) return INFINITY;
    for (size_t l = 0; l < a[s].out.size(); ++l) m = std::max(m, testing::max_abs_diff(a[s].out[l], b[s].out[l]));
  }
  return m;
}

std::string first_violation(const Trace& t) {
  for (size_t s = 0; s < t.size(); ++s)
    if (!t[s].violations.empty()) return str_cat("step ", s, ": ", t[s].violations[0]);
  return "";
}

std::unique_ptr<AttentionPolicy> make_sim(const PolicyRegistry& r, const Case& c) {
  return r.create(c.policy, c.config.params, PolicySimulator(sim_options(), 1).shape(), "conformance.params");
}

// A mask claim that contradicts the declared flag fails; no claim (and none declared) skips.
std::optional<Verdict> mask_flag(const Case& c, const std::optional<ClaimedMask>& mask) {
  if (c.declared && c.config.mask_based && !mask)
    return Verdict::fail("declared mask_based but claimed_mask() is empty");
  if (c.declared && !c.config.mask_based && mask)
    return Verdict::fail("claimed_mask() is set but the configuration is not declared mask_based");
  if (!mask) return Verdict::skip("not mask-based");
  return std::nullopt;
}

// ---- simulator ------------------------------------------------------------------------------

Verdict sim_unlimited_equals_full(const PolicyRegistry& r, const Case& c) {
  const SimOptions o = sim_options();
  PolicySimulator shape_sim(o, 1);
  auto unlimited = r.at(c.policy).unlimited_params();
  if (!unlimited) return Verdict::fail("declares no unlimited parameters (PolicyFactory::unlimited_params)");
  auto full = r.create("full", {}, shape_sim.shape());
  for (const std::vector<int>& sched : {schedule(), std::vector<int>(40, 1)}) {
    const Trace want = run(*full, o, 11, sched);
    auto p = r.create(c.policy, *unlimited, shape_sim.shape(), "unlimited_params");
    const Trace got = run(*p, o, 11, sched);
    if (const float d = trace_diff(got, want); !(d <= 1e-5f))
      return Verdict::fail(str_cat("max |output - full| = ", d, " > 1e-5 (schedule of ", sched.size(), " steps)"));
    if (std::string v = first_violation(got); !v.empty()) return Verdict::fail(v);
  }
  return Verdict::pass();
}

Verdict sim_mask_equals_dense(const PolicyRegistry& r, const Case& c) {
  const SimOptions o = sim_options();
  auto p = make_sim(r, c);
  const auto mask = p->claimed_mask();
  if (auto v = mask_flag(c, mask)) return *v;
  // Independent statements for the built-in patterns (kernels/common/masks.h).
  if (r.origin(c.policy) == "built-in") {
    const ParamValues v = validate_params(c.policy, r.at(c.policy).params(), c.config.params, "conformance");
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
    if (independent)
      for (int layer = 0; layer < 2; ++layer)
        for (int h = 0; h < 2; ++h)
          for (int64_t i = 0; i < 80; ++i)
            for (int64_t j = 0; j <= i + 1; ++j)
              if (mask->allow(layer, h, i, j) != independent(layer, h, i, j))
                return Verdict::fail(str_cat("claimed mask differs from kernels/common/masks.h at layer ", layer,
                                             " head ", h, " (", i, ", ", j, ")"));
  }
  PolicySimulator sim(o, 21);
  int64_t pos = 0;
  size_t step_index = 0;
  for (int n : schedule()) {
    auto st = sim.step(*p, n, step_index++ == 0);  // the first chunk ends the prompt
    if (!st.violations.empty()) return Verdict::fail(st.violations[0]);
    if (!(mask->decode_only && n > 1))
      for (int layer = 0; layer < o.n_layers; ++layer)
        for (int row = 0; row < n; ++row) {
          const int64_t i = pos + row;
          auto ref = testing::dense_reference(o, 21, layer, i, [&](int h, int64_t j) {
            return mask->allow(layer, h, i, j);
          });
          std::vector<float> got(st.out[layer].begin() + size_t(row) * o.n_heads * o.head_dim,
                                 st.out[layer].begin() + size_t(row + 1) * o.n_heads * o.head_dim);
          if (const float d = testing::max_abs_diff(got, ref); !(d <= 2e-5f))
            return Verdict::fail(str_cat("layer ", layer, " query ", i, ": max |output - dense masked| = ", d,
                                         " > 2e-5"));
        }
    pos += n;
  }
  return Verdict::pass();
}

Verdict sim_invariants(const PolicyRegistry& r, const Case& c) {
  const SimOptions o = sim_options();
  PolicySimulator sim(o, 5);
  auto p = make_sim(r, c);
  const ParamValues v = validate_params(c.policy, r.at(c.policy).params(), c.config.params, "conformance");
  const std::string& sp = c.config.sinks_param;
  if (!sp.empty() && !v.all().count(sp)) return Verdict::fail(str_cat("sinks_param '", sp, "' is not a parameter"));
  const int64_t sinks = sp.empty() ? 0 : v.get_int(sp);
  bool evicted = false;
  size_t step_index = 0;
  for (int n : schedule()) {
    auto st = sim.step(*p, n, step_index++ == 0);  // the first chunk ends the prompt
    if (!st.violations.empty()) return Verdict::fail(st.violations[0]);
    for (int layer = 0; layer < o.n_layers; ++layer) {
      const int64_t budget = p->budget_tokens(layer, sim.n_seen());
      for (int h = 0; h < o.n_kv_heads; ++h) {
        if (budget >= 0 && st.resident[layer][h] > budget)
          return Verdict::fail(str_cat("layer ", layer, " head ", h, ": ", st.resident[layer][h],
                                       " tokens resident > budget ", budget, " at n_seen ", sim.n_seen()));
        evicted |= st.resident[layer][h] < sim.n_seen();
        // Sinks kept: positions [0, sinks) resident.
        const auto& cache = sim.cache(layer);
        int64_t kept = 0;
        for (int s = 0; s < cache.n_slots(); ++s) kept += cache.slot_valid(s, h) && cache.slot_position(s, h) < sinks;
        if (kept != std::min(sinks, sim.n_seen()))
          return Verdict::fail(str_cat("layer ", layer, " head ", h, ": ", kept, " of the first ", sinks,
                                       " positions resident at n_seen ", sim.n_seen()));
      }
    }
  }
  if (c.declared && c.config.evicts && !evicted)
    return Verdict::fail(str_cat("declared evicts, but every token stayed resident (", sim.n_seen(), " tokens)"));
  return Verdict::pass();
}

Verdict sim_deterministic_batched_reset(const PolicyRegistry& r, const Case& c) {
  const SimOptions o = sim_options();
  auto make = [&] { return make_sim(r, c); };
  const auto& sched = schedule();
  auto a1 = make();
  const Trace alone_a = run(*a1, o, 31, sched);
  if (std::string v = first_violation(alone_a); !v.empty()) return Verdict::fail(v);
  auto a2 = make();
  if (const float d = trace_diff(run(*a2, o, 31, sched), alone_a); d != 0.f)
    return Verdict::fail(str_cat("not deterministic: a second run differs by ", d));
  auto b1 = make();
  const Trace alone_b = run(*b1, o, 32, sched);
  // Two sequences stepped in lockstep (one batch): each equals its solo run.
  auto pa = make(), pb = make();
  PolicySimulator sa(o, 31), sb(o, 32);
  Trace ta, tb;
  for (size_t i = 0; i < sched.size(); ++i) {
    ta.push_back(sa.step(*pa, sched[i], i == 0));
    tb.push_back(sb.step(*pb, sched[i], i == 0));
  }
  if (const float d = trace_diff(ta, alone_a); d != 0.f) return Verdict::fail(str_cat("batched != alone (a) by ", d));
  if (const float d = trace_diff(tb, alone_b); d != 0.f) return Verdict::fail(str_cat("batched != alone (b) by ", d));
  // A policy reset after one sample behaves like a new one on the next.
  auto pr = make();
  run(*pr, o, 31, sched);
  pr->reset();
  if (const float d = trace_diff(run(*pr, o, 32, sched), alone_b); d != 0.f)
    return Verdict::fail(str_cat("reset != new by ", d));
  return Verdict::pass();
}

// ---- engine ---------------------------------------------------------------------------------

constexpr int kTokens = 110;
using engine::kPrefill;

std::unique_ptr<AttentionPolicy> make_engine_policy(const PolicyRegistry& r, const std::string& name,
                                                    const std::map<std::string, ParamValue>& params) {
  return r.create(name, params, policy_shape(engine::tiny_model().config), "conformance.params");
}

// Passes when every logit is within `bound` of `want`; the failure names what `want` is.
Verdict logits_within(const std::vector<float>& got, const std::vector<float>& want, double bound,
                      const char* want_name) {
  if (const float d = testing::max_abs_diff(got, want); !(d <= bound))
    return Verdict::fail(str_cat("max |logit - ", want_name, "| = ", d, " > ", bound));
  return Verdict::pass();
}

Verdict engine_unlimited_equals_full(const PolicyRegistry& r, const Case& c) {
  const Model& m = engine::tiny_model();
  Engine e(m, engine::engine_options());
  const auto tokens = engine::random_tokens(kTokens, 1);
  const auto full = engine::run_logits(e, nullptr, tokens);
  auto params = r.at(c.policy).unlimited_params();
  if (!params) return Verdict::fail("declares no unlimited parameters (PolicyFactory::unlimited_params)");
  const auto got = engine::run_logits(e, make_engine_policy(r, c.policy, *params), tokens);
  // the policy's path (explicit selections, eviction bookkeeping) may sum in another order:
  // two differently rounded passes (logit_bound.h)
  const double bound = 2 * logit_bound(m, tokens.size());
  return logits_within(got, full, bound, "full");
}

Verdict engine_mask_equals_dense(const PolicyRegistry& r, const Case& c) {
  const Model& m = engine::tiny_model();
  Engine e(m, engine::engine_options());
  const auto tokens = engine::random_tokens(kTokens, 2);
  auto p = make_engine_policy(r, c.policy, c.config.params);
  const auto mask = p->claimed_mask();
  if (auto v = mask_flag(c, mask)) return *v;
  const auto want = engine::masked_reference(m, tokens, mask->allow);
  const auto got = engine::run_logits(e, std::move(p), tokens);
  // against the double-precision masked reference: one fp32 pass (logit_bound.h)
  const double bound = logit_bound(m, tokens.size());
  return logits_within(got, want, bound, "dense masked reference");
}

Verdict engine_resident_within_budget(const PolicyRegistry& r, const Case& c) {
  const Model& m = engine::tiny_model();
  Engine e(m, engine::engine_options());
  const auto tokens = engine::random_tokens(kTokens, 3);
  const int n_layers = m.config.n_layers, n_kv = m.config.n_kv_heads;
  size_t full_bytes = 0;
  engine::run_logits(e, nullptr, tokens, [&](SeqId s, int64_t) { full_bytes = e.sequence_stats(s).kv_bytes_current; });
  auto budget_of = make_engine_policy(r, c.policy, c.config.params);  // budget_tokens is a function of the parameters
  size_t bytes = 0;
  bool bounded = true, evicted = false;
  std::string failure;
  engine::run_logits(e, make_engine_policy(r, c.policy, c.config.params), tokens, [&](SeqId s, int64_t n_seen) {
    for (int l = 0; l < n_layers; ++l) {
      const int64_t budget = budget_of->budget_tokens(l, n_seen);
      bounded &= budget >= 0;
      for (int h = 0; h < n_kv; ++h) {
        const int64_t resident = e.kv().resident_tokens(s, l, h);
        evicted |= resident < n_seen;
        if (budget >= 0 && resident > budget && failure.empty())
          failure = str_cat("layer ", l, " head ", h, ": ", resident, " tokens resident > budget ", budget,
                            " at n_seen ", n_seen);
      }
    }
    bytes = e.sequence_stats(s).kv_bytes_current;
  });
  if (!failure.empty()) return Verdict::fail(failure);
  // A policy with a token budget below the length holds fewer blocks than full attention:
  // evicted tokens are really freed, not just masked.
  if (bounded && budget_of->budget_tokens(0, kTokens) * 2 < kTokens && !(bytes < full_bytes))
    return Verdict::fail(str_cat(bytes, " KV bytes resident vs full attention's ", full_bytes,
                                 " although the budget is under half the length"));
  if (c.declared && c.config.evicts && !evicted)
    return Verdict::fail(str_cat("declared evicts, but every token stayed resident in the KV store (", kTokens,
                                 " tokens)"));
  return Verdict::pass();
}

// Per-head block tables (KvStore "Per-head block tables") change where rows live, not which
// slots attention reads or in what order: the logits equal the per-layer tables' bit for bit,
// the same tokens stay resident, and each head holds a block only for the pages where it has a
// live token (so never more bytes than per-layer tables).
Verdict engine_per_head_tables(const PolicyRegistry& r, const Case& c) {
  const Model& m = engine::tiny_model();
  const auto tokens = engine::random_tokens(kTokens, 4);
  const int n_layers = m.config.n_layers, n_kv = m.config.n_kv_heads;
  Engine layer_tables(m, engine::engine_options());
  EngineOptions o = engine::engine_options();
  o.kv_per_head_tables = true;
  Engine head_tables(m, o);
  std::vector<std::vector<int64_t>> resident;  // per step: [layer * n_kv + h]
  std::vector<size_t> layer_bytes;
  const auto want = engine::run_logits(layer_tables, make_engine_policy(r, c.policy, c.config.params), tokens,
                                       [&](SeqId s, int64_t) {
                                         std::vector<int64_t> rs;
                                         for (int l = 0; l < n_layers; ++l)
                                           for (int h = 0; h < n_kv; ++h) rs.push_back(layer_tables.kv().resident_tokens(s, l, h));
                                         resident.push_back(rs);
                                         layer_bytes.push_back(layer_tables.sequence_stats(s).kv_bytes_current);
                                       });
  std::string failure;
  size_t step = 0;
  const auto got = engine::run_logits(head_tables, make_engine_policy(r, c.policy, c.config.params), tokens,
                                      [&](SeqId s, int64_t n_seen) {
    const KvStore& kv = head_tables.kv();
    const int bs = kv.config().block_size_tokens;
    for (int l = 0; l < n_layers && failure.empty(); ++l) {
      const LayerKv lk = kv.layer(s, l);
      for (int h = 0; h < n_kv && failure.empty(); ++h) {
        if (kv.resident_tokens(s, l, h) != resident[step][l * n_kv + h])
          failure = str_cat("layer ", l, " head ", h, ": ", kv.resident_tokens(s, l, h), " tokens resident vs ",
                            resident[step][l * n_kv + h], " with per-layer tables at n_seen ", n_seen);
        int64_t pages_with_live = 0;
        for (int p = 0; p * bs < lk.n_slots; ++p) {
          bool live = false;
          for (int slot = p * bs; slot < std::min(lk.n_slots, (p + 1) * bs); ++slot) live = live || lk.is_valid(slot, h);
          pages_with_live += live ? 1 : 0;
        }
        if (kv.head_blocks(s, l, h) != pages_with_live && failure.empty())
          failure = str_cat("layer ", l, " head ", h, ": ", kv.head_blocks(s, l, h), " blocks held for ",
                            pages_with_live, " pages with a live token at n_seen ", n_seen);
      }
    }
    if (head_tables.sequence_stats(s).kv_bytes_current > layer_bytes[step] && failure.empty())
      failure = str_cat(head_tables.sequence_stats(s).kv_bytes_current, " KV bytes with per-head tables > ",
                        layer_bytes[step], " with per-layer tables at n_seen ", n_seen);
    ++step;
  });
  if (!failure.empty()) return Verdict::fail(failure);
  if (got.size() != want.size()) return Verdict::fail("a different number of logits with per-head tables");
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
      return Verdict::fail(str_cat("logit ", i, ": ", got[i], " with per-head tables vs ", want[i],
                                   " with per-layer tables (must be equal bit for bit)"));
  return Verdict::pass();
}

Verdict engine_batched_reset(const PolicyRegistry& r, const Case& c) {
  const Model& m = engine::tiny_model();
  const auto ta = engine::random_tokens(kTokens, 5), tb = engine::random_tokens(kTokens, 6);
  auto make = [&] { return make_engine_policy(r, c.policy, c.config.params); };
  Engine solo(m, engine::engine_options());
  const auto alone_a = engine::run_logits(solo, make(), ta);
  const auto alone_b = engine::run_logits(solo, make(), tb);
  Engine batch(m, engine::engine_options(2));
  const SeqId sa = batch.start_sequence(make()), sb = batch.start_sequence(make());
  std::vector<float> la, lb, lg;
  if (batch.prefill(sa, std::span(ta.data(), kPrefill), la, true, /*prompt_end=*/true) != StepStatus::kOk ||
      batch.prefill(sb, std::span(tb.data(), kPrefill), lb, true, /*prompt_end=*/true) != StepStatus::kOk)
    return Verdict::fail("batched prefill did not return kOk");
  const std::vector<SeqId> both = {sa, sb};
  const size_t vocab = size_t(m.config.vocab_size);
  for (int i = kPrefill; i < kTokens; ++i) {
    const std::vector<int32_t> tok = {ta[i], tb[i]};
    if (batch.decode(both, tok, lg) != StepStatus::kOk) return Verdict::fail(str_cat("batched decode step ", i, " failed"));
    la.insert(la.end(), lg.begin(), lg.begin() + vocab);
    lb.insert(lb.end(), lg.begin() + vocab, lg.end());
  }
  if (const float d = testing::max_abs_diff(la, alone_a); !(d <= 1e-5f))
    return Verdict::fail(str_cat("batched a != alone by ", d));
  if (const float d = testing::max_abs_diff(lb, alone_b); !(d <= 1e-5f))
    return Verdict::fail(str_cat("batched b != alone by ", d));

  // Reset: one policy object serves sequence a, is reset, then serves b (through a thin
  // forwarding wrapper, since the engine owns what it is given).
  struct Forward final : AttentionPolicy {
    AttentionPolicy* p;
    explicit Forward(AttentionPolicy* x) : p(x) {}
    PolicyNeeds needs() const override { return p->needs(); }
    void select(const LayerStep& s, KeySelection& o) override { p->select(s, o); }
    void after_attention(const LayerStep& s, const StepStats& st, Evictions& o) override { p->after_attention(s, st, o); }
    int64_t budget_tokens(int l, int64_t n) const override { return p->budget_tokens(l, n); }
    void reset() override { p->reset(); }
  };
  auto shared = make();
  engine::run_logits(solo, std::make_unique<Forward>(shared.get()), ta);
  shared->reset();
  if (const float d = testing::max_abs_diff(engine::run_logits(solo, std::make_unique<Forward>(shared.get()), tb), alone_b);
      !(d <= 0.f))
    return Verdict::fail(str_cat("reset != new by ", d));
  return Verdict::pass();
}

}  // namespace

const std::vector<Check>& simulator_checks() {
  static const std::vector<Check> checks = {
      {"sim.unlimited_equals_full", false, sim_unlimited_equals_full},
      {"sim.mask_equals_dense", true, sim_mask_equals_dense},
      {"sim.invariants", true, sim_invariants},
      {"sim.deterministic_batched_reset", true, sim_deterministic_batched_reset},
  };
  return checks;
}

const std::vector<Check>& engine_checks() {
  static const std::vector<Check> checks = {
      {"engine.unlimited_equals_full", false, engine_unlimited_equals_full},
      {"engine.mask_equals_dense", true, engine_mask_equals_dense},
      {"engine.resident_within_budget", true, engine_resident_within_budget},
      {"engine.batched_reset", true, engine_batched_reset},
      {"engine.per_head_tables", true, engine_per_head_tables},
  };
  return checks;
}

const Check& check_named(const std::string& name) {
  for (const auto* list : {&simulator_checks(), &engine_checks()})
    for (const Check& c : *list)
      if (c.name == name) return c;
  fail("unknown conformance check '", name, "'");
}

Verdict run_check(const Check& check, const PolicyRegistry& registry, const Case& c) {
  try {
    return check.run(registry, c);
  } catch (const std::exception& e) {
    return Verdict::fail(str_cat("threw: ", e.what()));
  }
}

std::vector<Outcome> run_all(const PolicyRegistry& registry, const std::vector<std::string>& names,
                             const std::function<void(const Outcome&)>& each) {
  std::vector<Outcome> out;
  std::vector<Case> all;
  try {
    all = cases(registry, names);
  } catch (const std::exception& e) {
    out.push_back({"cases", "", Verdict::fail(e.what())});
    if (each) each(out.back());
    return out;
  }
  for (const auto* list : {&simulator_checks(), &engine_checks()})
    for (const Check& check : *list) {
      std::vector<Outcome> o = run_check_over(check, registry, names, all, each);
      out.insert(out.end(), o.begin(), o.end());
    }
  return out;
}

std::vector<Outcome> run_check_over(const Check& check, const PolicyRegistry& registry,
                                    const std::vector<std::string>& names, const std::vector<Case>& all,
                                    const std::function<void(const Outcome&)>& each) {
  std::vector<Outcome> out;
  auto add = [&](std::string subject, const Case& c) {
    out.push_back({check.name, std::move(subject), run_check(check, registry, c)});
    if (each) each(out.back());
  };
  if (check.per_config) {
    for (const Case& c : all) add(c.describe(), c);
  } else {
    for (const std::string& n : names) add(n, Case{n, {}, false});
  }
  return out;
}


}  // namespace kvlab::conformance
