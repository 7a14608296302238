// kvlab_bench_policies: decode cost per attention policy on the "110M" shape (12 layers,
// 12 heads = 12 KV heads, head_dim 64), at long contexts, 1 and 2 threads, as a ratio to `full`.
//
// Default mode, "layers": the attention part of a decode step exactly as the engine runs it
// (framework/engine/engine.cpp attend()), on a real KvStore filled with ctx random tokens per
// layer (no model: the weights' matvecs do not depend on the policy), per layer: append the new
// K/V, policy.select, attention() over the selection (tiled AVX2 kernel, key mass, the observation
// window's head mass, rope at read when the policy needs them), policy.after_attention, store.evict. The policy first sees the
// context as prefill chunks of 512 (synthetic attention mass) so its state is built. Reported
// per policy (min over the timed steps, robust to a shared machine):
//   layers_ms     the 12 layers' attention part of one decode step
//   vs_full       layers_ms / full's layers_ms       (target: ~25% read -> <= 0.40)
//   policy_ms     time inside the policy's hooks (select + after_attention)
//   policy_frac   policy_ms / layers_ms (an upper bound of its share of the whole step; target
//                 <= 0.10 of the step)
//   read_frac     keys read per query head / tokens seen
// "--engine" also runs the whole-model mode: a dense prefill through the engine (random fp32
// weights), then each policy on a fork of it; step_ms and the hook share of the real step.
//
// usage: kvlab_bench_policies [--contexts 4096,16384] [--threads 1,2] [--steps 8] [--warmup 2]
//                             [--engine 1] [--prompt-end REPS] [--only POLICY,POLICY]
// "--only" runs just the cases of those policy types (and `full`, the ratios' base).
// "--window-pass host" computes the observation window in layers mode apart from the kernel
// (kernels/cpu/attention_stats.h, as the device paths do; timed as the policy's cost) instead
// of from the kernel (AttentionArgs::head_mass, as the CPU engine does): the two side by side.
// "--prompt-end REPS" runs only the prompt-end mode (run_prompt_end below).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <random>

#include "framework/engine/engine.h"
#include "framework/engine/random_model.h"
#include "framework/kv/kv_store.h"
#include "framework/policy/layer_kv_cache_view.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_stats.h"
#include "kernels/cpu/rope.h"
#include "policies/builtin.h"

namespace kvlab {
namespace {

using Clock = std::chrono::steady_clock;
using Params = std::map<std::string, ParamValue>;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Times the wrapped policy's hooks.
class TimedPolicy final : public AttentionPolicy {
 public:
  TimedPolicy(std::unique_ptr<AttentionPolicy> p, double* ms) : p_(std::move(p)), ms_(ms) {}
  PolicyNeeds needs() const override { return p_->needs(); }
  void select(const LayerStep& s, KeySelection& o) override {
    const auto t0 = Clock::now();
    p_->select(s, o);
    *ms_ += ms_since(t0);
  }
  void after_attention(const LayerStep& s, const StepStats& st, Evictions& o) override {
    const auto t0 = Clock::now();
    p_->after_attention(s, st, o);
    *ms_ += ms_since(t0);
  }
  int64_t budget_tokens(int l, int64_t n) const override { return p_->budget_tokens(l, n); }
  void reset() override { p_->reset(); }

 private:
  std::unique_ptr<AttentionPolicy> p_;
  double* ms_;
};

struct Case {
  std::string label, policy;
  Params params;
};

// Policies sized to read about a quarter of a context of n tokens where they have a budget.
std::vector<Case> cases(int64_t n) {
  const int64_t q = n / 4;
  return {
      {"full", "full", {}},
      {"sliding_window W=n/4", "sliding_window", {{"window", q}}},
      {"sliding_window mask W=n/4", "sliding_window", {{"window", q}, {"mode", std::string("mask")}}},
      {"strided l=128", "strided", {{"stride", int64_t(128)}}},
      {"sinks 4+n/4 (rope cache)", "sinks", {{"sinks", int64_t(4)}, {"recent", q - 4}}},
      {"h2o 12.5%+12.5%", "h2o", {{"heavy", 0.125}, {"recent", 0.125}}},
      {"landmark C64 W512 K=(n/4-W)/C", "landmark",
       {{"chunk_size", int64_t(64)}, {"window", int64_t(512)}, {"top_k", std::max<int64_t>(1, (q - 512) / 64)}}},
      {"quest 25% reads (dense 2 layers)", "quest", {{"compression_ratio", 0.75}}},
      {"tova 25% (every step)", "tova", {{"compression_ratio", 0.75}}},
      {"snapkv 25% (idle in decode)", "snapkv", {{"compression_ratio", 0.75}}},
  };
}

// Policy API v3 policies for the prompt-end mode (they need the engine's window attention and the
// prompt end): 75% compressed, as the NIAH grid.
std::vector<Case> v3_cases() {
  const Params r = {{"compression_ratio", 0.75}};
  Params ada = r;
  ada["scorer"] = std::string("snapkv");
  return {{"full", "full", {}},         {"snapkv 25%", "snapkv", r}, {"pyramidkv 25%", "pyramidkv", r},
          {"adakv(snapkv) 25%", "adakv", ada}, {"knorm 25%", "knorm", r}, {"random 25%", "random", r},
          {"tova 25% (every step)", "tova", r}};
}

std::vector<std::string> g_only;  // --only: policy types to run ("full" always runs)
bool g_window_host = false;       // --window-pass host

bool wanted(const Case& c) {
  return g_only.empty() || c.policy == "full" || std::find(g_only.begin(), g_only.end(), c.policy) != g_only.end();
}

std::vector<std::string> parse_names(const std::string& s) {
  std::vector<std::string> out;
  for (size_t b = 0; b <= s.size();) {
    const size_t e = std::min(s.find(',', b), s.size());
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> out;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    out.push_back(std::strtoll(p, &end, 10));
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p) break;
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int run_engine(const std::vector<int64_t>& contexts, const std::vector<int64_t>& threads, int steps,
               int warmup) {
  ModelConfig cfg = config_110m();
  cfg.max_seq_len = int(*std::max_element(contexts.begin(), contexts.end()) + warmup + steps + 64);
  std::fprintf(stderr, "building random 110M model (max_seq_len %d)...\n", cfg.max_seq_len);
  auto model = make_random_model(cfg, DType::kF32, 7);
  const PolicyRegistry registry = make_builtin_registry();
  const PolicyModelShape shape = policy_shape(cfg);

  std::printf("\nengine mode\n%-30s %6s %3s %9s %8s %12s %11s %9s\n", "policy", "ctx", "thr", "step_ms",
              "vs_full", "attn_vs_full", "policy_frac", "read_frac");
  for (int64_t nthr : threads) {
    EngineOptions eo;
    eo.threads = int(nthr);
    eo.max_batch = 2;  // the prefilled parent + one fork
    eo.prefill_chunk_tokens = 512;
    Engine engine(*model, eo);
    std::vector<float> logits;
    auto decode_times = [&](SeqId s, int n_steps, double* policy_ms, std::vector<double>* step_ms,
                            std::vector<double>* pol_ms) {
      for (int k = 0; k < n_steps; ++k) {
        const int32_t tok = int32_t((k * 7919) % cfg.vocab_size);
        const double before = policy_ms ? *policy_ms : 0;
        const auto t0 = Clock::now();
        if (engine.decode(std::span(&s, 1), std::span(&tok, 1), logits) != StepStatus::kOk) {
          std::fprintf(stderr, "decode failed\n");
          std::exit(1);
        }
        if (step_ms) step_ms->push_back(ms_since(t0));
        if (pol_ms && policy_ms) pol_ms->push_back(*policy_ms - before);
      }
    };
    // Base: the step at a tiny context (weights only, essentially no attention).
    double base_ms;
    {
      const SeqId s = engine.start_sequence();
      std::vector<int32_t> t(64, 1);
      engine.prefill(s, t, logits);
      std::vector<double> st;
      decode_times(s, warmup, nullptr, nullptr, nullptr);
      decode_times(s, steps, nullptr, &st, nullptr);
      base_ms = median(st);
      engine.end_sequence(s);
    }
    for (int64_t ctx : contexts) {
      std::vector<int32_t> prompt(ctx);
      for (int64_t i = 0; i < ctx; ++i) prompt[i] = int32_t((i * 31 + 7) % cfg.vocab_size);
      const auto tp = Clock::now();
      const SeqId parent = engine.start_sequence();
      if (engine.prefill(parent, prompt, logits) != StepStatus::kOk) {
        std::fprintf(stderr, "prefill failed\n");
        return 1;
      }
      std::fprintf(stderr, "prefill %lld tokens, %lld threads: %.1f s\n", (long long)ctx,
                   (long long)nthr, ms_since(tp) / 1000);
      double full_ms = 0;
      std::vector<Case> all = cases(ctx);
      for (const Case& c : all) {
        if (!wanted(c)) continue;
        double policy_ms = 0;
        auto p = std::make_unique<TimedPolicy>(registry.create(c.policy, c.params, shape), &policy_ms);
        const SeqId s = engine.fork(parent, std::move(p));
        std::vector<double> st, pt;
        decode_times(s, warmup, &policy_ms, nullptr, nullptr);
        decode_times(s, steps, &policy_ms, &st, &pt);
        const double step = median(st);
        if (c.policy == "full") full_ms = step;
        double pol_sum = 0, step_sum = 0;
        for (size_t k = 0; k < st.size(); ++k) pol_sum += pt[k], step_sum += st[k];
        const SequenceStats ss = engine.sequence_stats(s);
        const double seen = double(engine.n_tokens(s));
        std::printf("%-30s %6lld %3lld %9.2f %8.3f %12.3f %11.3f %9.3f\n", c.label.c_str(),
                    (long long)ctx, (long long)nthr, step, step / full_ms,
                    (step - base_ms) / (full_ms - base_ms), pol_sum / step_sum,
                    ss.attended_achieved_last / seen);
        std::fflush(stdout);
        engine.end_sequence(s);
      }
      engine.end_sequence(parent);
    }
    std::printf("%-30s %6s %3lld %9.2f   (base: 64-token context)\n", "base", "64", (long long)nthr, base_ms);
  }
  return 0;
}


// What StepStats::window_attention costs at the prompt end when computed apart from the
// attention kernel (kernels/cpu/attention_stats.h, the device backends' path; the CPU path gets
// it from the kernel) over every layer of a prefilled sequence, random queries: w = 64 rows
// (SnapKV's window) and w = 1 (TOVA's last query).
struct WindowCost {
  double w64 = 0, w1 = 0;
};
WindowCost time_window_attention(const Engine& engine, SeqId s, const ModelConfig& cfg, int64_t ctx) {
  WindowCost c;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (int w : {64, 1}) {
    std::vector<float> q(size_t(w) * cfg.n_heads * cfg.head_dim), out(size_t(cfg.n_heads) * ctx);
    for (auto& x : q) x = nd(rng);
    std::vector<int64_t> pos(w);
    for (int r = 0; r < w; ++r) pos[r] = ctx - w + r;
    const auto t0 = Clock::now();
    for (int l = 0; l < cfg.n_layers; ++l) {
      const LayerKv kv = engine.kv().layer(s, l);
      AttentionArgs a = attention_args(q.data(), w, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                                       pos.data(), kv, 1.f / std::sqrt(float(cfg.head_dim)));
      out.assign(size_t(cfg.n_heads) * kv.n_slots, 0.f);
      window_attention(a, 0, out.data());
    }
    (w == 64 ? c.w64 : c.w1) = ms_since(t0);
  }
  return c;
}

// "--prompt-end 1": a whole prompt of ctx tokens prefilled through the engine (random 110M
// weights, chunks of 512) ending with prompt_end, per policy, `reps` times alternating the
// policies (A B C A B C ...; medians), so the cost of compressing at the prompt end is
//   hook_ms      the policy's own hooks over the whole prefill (TimedPolicy)
//   vs_full      prefill time / full's prefill time (hooks + the engine's window attention +
//                the lengthened last chunk; noisy on a shared machine: read with the medians)
int run_prompt_end(const std::vector<int64_t>& contexts, const std::vector<int64_t>& threads, int reps) {
  ModelConfig cfg = config_110m();
  cfg.max_seq_len = int(*std::max_element(contexts.begin(), contexts.end()) + 64);
  std::fprintf(stderr, "building random 110M model (max_seq_len %d)...\n", cfg.max_seq_len);
  auto model = make_random_model(cfg, DType::kF32, 7);
  const PolicyRegistry registry = make_builtin_registry();
  const PolicyModelShape shape = policy_shape(cfg);
  std::printf("\nprompt-end mode (median of %d alternating prefills)\n%-26s %6s %3s %11s %8s %9s %10s %9s\n",
              reps, "policy", "ctx", "thr", "prefill_ms", "vs_full", "hook_ms", "hook_frac", "kept_frac");
  for (int64_t nthr : threads) {
    EngineOptions eo;
    eo.threads = int(nthr);
    eo.prefill_chunk_tokens = 512;
    Engine engine(*model, eo);
    std::vector<float> logits;
    for (int64_t ctx : contexts) {
      std::vector<int32_t> prompt(ctx);
      for (int64_t i = 0; i < ctx; ++i) prompt[i] = int32_t((i * 31 + 7) % cfg.vocab_size);
      const std::vector<Case> cs = v3_cases();
      std::vector<std::vector<double>> prefill(cs.size()), hooks(cs.size());
      std::vector<double> kept(cs.size());
      WindowCost window_ms;
      for (int rep = 0; rep < reps; ++rep)
        for (size_t i = 0; i < cs.size(); ++i) {
          double hook_ms = 0;
          auto p = std::make_unique<TimedPolicy>(registry.create(cs[i].policy, cs[i].params, shape), &hook_ms);
          const SeqId s = engine.start_sequence(std::move(p));
          const auto t0 = Clock::now();
          if (engine.prefill(s, prompt, logits, false, true) != StepStatus::kOk) {
            std::fprintf(stderr, "prefill failed\n");
            return 1;
          }
          prefill[i].push_back(ms_since(t0));
          hooks[i].push_back(hook_ms);
          if (i == 0 && rep == 0) window_ms = time_window_attention(engine, s, cfg, ctx);
          const SequenceStats st = engine.sequence_stats(s);
          double sum = 0;
          for (int64_t r : st.resident_at_prompt_end) sum += double(r);
          kept[i] = sum / (double(ctx) * double(st.resident_at_prompt_end.size()));
          engine.end_sequence(s);
        }
      const double full = median(prefill[0]);
      std::printf("engine window attention over the %lld-token cache, 12 layers: w=64 %.1f ms "
                  "(%.4f of full's prefill), w=1 %.2f ms\n", (long long)ctx, window_ms.w64,
                  window_ms.w64 / full, window_ms.w1);
      for (size_t i = 0; i < cs.size(); ++i)
        std::printf("%-26s %6lld %3lld %11.1f %8.3f %9.2f %10.4f %9.3f\n", cs[i].label.c_str(),
                    (long long)ctx, (long long)nthr, median(prefill[i]), median(prefill[i]) / full,
                    median(hooks[i]), median(hooks[i]) / median(prefill[i]), kept[i]);
      std::fflush(stdout);
    }
  }
  return 0;
}

// The attention part of decode steps over a KvStore, as the engine's attend() runs it.
struct LayerResult {
  double layers_ms = 0, policy_ms = 0, read_frac = 0;
};

LayerResult run_layers_case(const ModelConfig& cfg, const PolicyRegistry& registry, const Case& c,
                            int64_t ctx, int n_threads, int steps, int warmup) {
  const int L = cfg.n_layers, nh = cfg.n_heads, nkv = cfg.n_kv_heads, hd = cfg.head_dim;
  const int kvd = nkv * hd, qd = nh * hd;
  const int64_t total = ctx + warmup + steps + 1;
  KvStoreConfig kc;
  kc.n_layers = L, kc.n_kv_heads = nkv, kc.head_dim = hd, kc.block_size_tokens = 16;
  kc.budget_bytes = size_t(2) * sizeof(float) * kvd * size_t(L) * size_t(total + 64);
  KvStore store(kc);
  const SeqId seq = store.create_sequence();
  auto policy = registry.create(c.policy, c.params, policy_shape(cfg));
  const PolicyNeeds needs = policy->needs();
  store.set_page_stats(seq, needs.page_stats);
  RopeConfig rc;
  rc.head_dim = hd;
  const RopeTable rope(rc, total + 1);
  // A pool of random vectors reused cyclically (the kernels' cost does not depend on values).
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> pool(size_t(997) * qd);
  for (auto& x : pool) x = nd(rng);
  auto vec = [&](int64_t i, int off) { return pool.data() + size_t((i * 7 + off) % 997) * qd; };
  std::uniform_real_distribution<float> ud(0.f, 1.f);

  auto step_layers = [&](int64_t pos0, int n_new, bool timed, double* policy_ms, double* read) {
    std::vector<int64_t> positions(n_new);
    for (int r = 0; r < n_new; ++r) positions[r] = pos0 + r;
    std::vector<float> q(size_t(n_new) * qd), out(size_t(n_new) * qd);
    for (int r = 0; r < n_new; ++r) std::copy_n(vec(pos0 + r, 3), qd, q.data() + size_t(r) * qd);
    if (store.reserve(seq, n_new) != AllocStatus::kOk) { std::fprintf(stderr, "out of blocks\n"); std::exit(1); }
    KeySelection sel;
    std::vector<float> mass;
    std::vector<int32_t> key_rope_pos;
    for (int layer = 0; layer < L; ++layer) {
      for (int r = 0; r < n_new; ++r)
        store.append(seq, layer, positions[r], vec(pos0 + r, layer), vec(pos0 + r, layer + 17));
      const LayerKvCacheView cache(store.layer(seq, layer));
      LayerStep st{.layer = layer, .is_prefill = n_new > 1, .n_new = n_new, .positions = positions,
                   .queries = q, .cache = &cache, .shape = policy_shape(cfg)};
      sel.select_all();
      auto t0 = Clock::now();
      policy->select(st, sel);
      if (policy_ms) *policy_ms += ms_since(t0);
      const LayerKv kv = store.layer(seq, layer);
      StepStats stats;
      stats.n_slots = kv.n_slots;
      // The observation window as the engine computes it (attention_step.cpp, cpu_backend.cpp):
      // from the attention kernel itself (head_mass) in timed steps, part of layers_ms.
      std::vector<float> window;
      const bool want_window = needs.observation_window > 0 && needs.observe_every_step;
      const int rows = std::min(needs.observation_window, n_new);
      if (want_window) window.assign(size_t(nh) * kv.n_slots, 0.f);
      if (timed) {
        AttentionArgs a;
        a.q = q.data(), a.n_rows = n_new, a.n_heads = nh, a.n_kv_heads = nkv, a.head_dim = hd;
        a.q_positions = positions.data();
        a.kv = kv;
        a.selection = sel.all ? nullptr : &sel;
        a.scale = 1.f / std::sqrt(float(hd));
        if (needs.rope_at_cache_position) {
          key_rope_pos.resize(size_t(kv.n_slots) * nkv);
          cache_rank_positions(kv, key_rope_pos.data());
          a.key_rope_pos = key_rope_pos.data();
          a.rope = &rope;
        }
        if (needs.key_attention_mass) {
          mass.assign(size_t(nkv) * kv.n_slots, 0.f);
          a.key_mass = mass.data();
        }
        if (want_window && !g_window_host) {
          a.head_mass = window.data();
          a.head_mass_first_row = n_new - rows;
        }
        a.out = out.data();
        attention(a, n_threads);
        if (read && layer == 0) {  // keys read by query head 0 of the (last) row
          int64_t n = 0;
          const int64_t qp = positions.back();
          if (sel.all) {
            for (int s2 = 0; s2 < kv.n_slots; ++s2) n += kv.is_valid(s2, 0) && kv.position(s2, 0) <= qp;
          } else {
            for (const SlotRange& rg : sel.list(n_new - 1, 0))
              for (int s2 = rg.begin; s2 < rg.end; ++s2) n += kv.is_valid(s2, 0) && kv.position(s2, 0) <= qp;
          }
          *read = double(n) / double(qp + 1);
        }
      } else if (needs.key_attention_mass) {  // prefill: synthetic column sums
        mass.resize(size_t(nkv) * kv.n_slots);
        for (auto& x : mass) x = ud(rng);
      }
      stats.key_mass = needs.key_attention_mass ? std::span<const float>(mass) : std::span<const float>();
      if (want_window && (!timed || g_window_host)) {  // the separate pass (untimed prefill steps)
        AttentionArgs a = attention_args(q.data(), n_new, nh, nkv, hd, positions.data(), kv,
                                         1.f / std::sqrt(float(hd)));
        a.selection = &sel;
        t0 = Clock::now();
        window_attention(a, n_new - rows, window.data());
        if (policy_ms && timed) *policy_ms += ms_since(t0);
      }
      if (want_window) {
        stats.window_attention = window;
        stats.window_rows = rows;
      }
      Evictions ev;
      ev.clear(nkv);
      t0 = Clock::now();
      policy->after_attention(st, stats, ev);
      if (policy_ms) *policy_ms += ms_since(t0);
      store.evict(seq, layer, ev);
    }
  };
  for (int64_t p = 0; p < ctx; p += 512) step_layers(p, int(std::min<int64_t>(512, ctx - p)), false, nullptr, nullptr);
  for (int k = 0; k < warmup; ++k) step_layers(ctx + k, 1, true, nullptr, nullptr);
  LayerResult best;
  best.layers_ms = INFINITY;
  for (int k = 0; k < steps; ++k) {
    double pol = 0, read = 0;
    const auto t0 = Clock::now();
    step_layers(ctx + warmup + k, 1, true, &pol, &read);
    const double ms = ms_since(t0);
    if (ms < best.layers_ms) best = {ms, pol, read};
  }
  return best;
}

int run_layers(const std::vector<int64_t>& contexts, const std::vector<int64_t>& threads, int steps,
               int warmup) {
  ModelConfig cfg = config_110m();
  cfg.max_seq_len = int(*std::max_element(contexts.begin(), contexts.end()) + warmup + steps + 64);
  const PolicyRegistry registry = make_builtin_registry();
  std::printf("layers mode (attention part of a decode step, 12 layers, min over %d steps)\n", steps);
  std::printf("%-30s %6s %3s %10s %8s %10s %11s %9s\n", "policy", "ctx", "thr", "layers_ms",
              "vs_full", "policy_ms", "policy_frac", "read_frac");
  for (int64_t ctx : contexts)
    for (int64_t nthr : threads) {
      double full_ms = 0;
      for (const Case& c : cases(ctx)) {
        if (!wanted(c)) continue;
        const LayerResult r = run_layers_case(cfg, registry, c, ctx, int(nthr), steps, warmup);
        if (c.policy == "full") full_ms = r.layers_ms;
        std::printf("%-30s %6lld %3lld %10.3f %8.3f %10.3f %11.3f %9.3f\n", c.label.c_str(),
                    (long long)ctx, (long long)nthr, r.layers_ms, r.layers_ms / full_ms, r.policy_ms,
                    r.policy_ms / r.layers_ms, r.read_frac);
        std::fflush(stdout);
      }
    }
  return 0;
}

int run(int argc, char** argv) {
  std::vector<int64_t> contexts = {4096, 16384}, threads = {1, 2};
  int steps = 8, warmup = 2;
  bool engine = false;
  int prompt_end = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--contexts") contexts = parse_list(argv[i + 1]);
    else if (a == "--threads") threads = parse_list(argv[i + 1]);
    else if (a == "--steps") steps = std::atoi(argv[i + 1]);
    else if (a == "--warmup") warmup = std::atoi(argv[i + 1]);
    else if (a == "--engine") engine = std::atoi(argv[i + 1]) != 0;
    else if (a == "--prompt-end") prompt_end = std::atoi(argv[i + 1]);
    else if (a == "--only") g_only = parse_names(argv[i + 1]);
    else if (a == "--window-pass") g_window_host = std::string(argv[i + 1]) == "host";
    else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
  }
  if (prompt_end > 0) return run_prompt_end(contexts, threads, prompt_end);
  int rc = run_layers(contexts, threads, steps, warmup);
  if (rc == 0 && engine) rc = run_engine(contexts, threads, steps, warmup);
  return rc;
}

}  // namespace
}  // namespace kvlab

int main(int argc, char** argv) { return kvlab::run(argc, argv); }
