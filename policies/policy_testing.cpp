#include "policies/policy_testing.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "framework/core/error.h"
#include "framework/core/splitmix.h"
#include "kernels/testing/reference_attention.h"
#include "policies/builtin.h"
#include "policies/duo_heads.h"

namespace kvlab::testing {

FakeLayerCache::FakeLayerCache(int n_kv_heads, int head_dim, bool flat, int block_size_tokens)
    : n_kv_(n_kv_heads), d_(head_dim), flat_(flat), block_(block_size_tokens) {}

int FakeLayerCache::append(int64_t position, const float* k, const float* v) {
  for (int h = 0; h < n_kv_; ++h) {
    pos_.push_back(position);
    valid_.push_back(1);
  }
  k_.insert(k_.end(), k, k + size_t(n_kv_) * d_);
  v_.insert(v_.end(), v, v + size_t(n_kv_) * d_);
  const int slot = n_slots_++;
  if (page_stats_) recompute_page(slot / block_);
  return slot;
}

void FakeLayerCache::load_key(int s, int h, float* out) const {
  if (s < 0 || s >= n_slots_ || h < 0 || h >= n_kv_) fail("FakeLayerCache: slot ", s, " head ", h, " out of range");
  std::copy_n(key(s, h), d_, out);
}

void FakeLayerCache::load_keys(int begin, int end, int h, float* out) const {
  if (begin < 0 || begin > end || end > n_slots_) fail("FakeLayerCache: slots [", begin, ", ", end, ") out of range");
  for (int s = begin; s < end; ++s) load_key(s, h, out + size_t(s - begin) * d_);
}

void FakeLayerCache::set_page_stats(bool on) {
  if (on == page_stats_) return;
  page_stats_ = on;
  page_max_.clear(), page_min_.clear();
  if (on)
    for (int p = 0; p * block_ < n_slots_; ++p) recompute_page(p);
}

// Bounds of one page from its valid keys, by scanning them (no running update).
void FakeLayerCache::recompute_page(int page) {
  const size_t need = size_t(page + 1) * n_kv_ * d_;
  if (page_max_.size() < need) page_max_.resize(need), page_min_.resize(need);
  for (int h = 0; h < n_kv_; ++h)
    for (int f = 0; f < d_; ++f) {
      float mx = -std::numeric_limits<float>::infinity(), mn = std::numeric_limits<float>::infinity();
      for (int s = page * block_; s < std::min(n_slots_, (page + 1) * block_); ++s)
        if (valid_[idx(s, h)]) mx = std::max(mx, key(s, h)[f]), mn = std::min(mn, key(s, h)[f]);
      page_max_[(size_t(page) * n_kv_ + h) * d_ + f] = mx;
      page_min_[(size_t(page) * n_kv_ + h) * d_ + f] = mn;
    }
}

const float* FakeLayerCache::page_key_max(int page, int h) const {
  if (page < 0 || page >= n_pages() || h < 0 || h >= n_kv_) fail("FakeLayerCache: page ", page, " out of range");
  return page_stats_ ? page_max_.data() + (size_t(page) * n_kv_ + h) * d_ : nullptr;
}

const float* FakeLayerCache::page_key_min(int page, int h) const {
  if (page < 0 || page >= n_pages() || h < 0 || h >= n_kv_) fail("FakeLayerCache: page ", page, " out of range");
  return page_stats_ ? page_min_.data() + (size_t(page) * n_kv_ + h) * d_ : nullptr;
}

int64_t FakeLayerCache::resident(int h) const {
  int64_t n = 0;
  for (int s = 0; s < n_slots_; ++s) n += valid_[idx(s, h)];
  return n;
}

void FakeLayerCache::evict(const Evictions& ev) {
  if (int(ev.slots.size()) != n_kv_) fail("evictions for ", ev.slots.size(), " heads, cache has ", n_kv_);
  for (int h = 0; h < n_kv_; ++h) {
    std::vector<int32_t> s = ev.slots[h];
    std::sort(s.begin(), s.end());
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] < 0 || s[i] >= n_slots_) fail("evicted slot ", s[i], " out of range [0, ", n_slots_, ")");
      if (i && s[i] == s[i - 1]) fail("slot ", s[i], " evicted twice (head ", h, ")");
      if (!valid_[idx(s[i], h)]) fail("slot ", s[i], " of head ", h, " is already a hole");
    }
  }
  for (int h = 0; h < n_kv_; ++h)
    for (int32_t s : ev.slots[h]) valid_[idx(s, h)] = 0;
  int64_t max_live = 0;
  for (int h = 0; h < n_kv_; ++h) max_live = std::max(max_live, resident(h));
  if (n_slots_ - max_live > std::max<int64_t>(block_, n_slots_ / 50)) compact();
  if (page_stats_) {  // every page from scratch
    page_max_.clear(), page_min_.clear();
    for (int p = 0; p * block_ < n_slots_; ++p) recompute_page(p);
  }
}

void FakeLayerCache::compact() {
  int64_t max_live = 0;
  for (int h = 0; h < n_kv_; ++h) max_live = std::max(max_live, resident(h));
  std::vector<int64_t> pos(size_t(max_live) * n_kv_);
  std::vector<uint8_t> valid(size_t(max_live) * n_kv_, 0);
  std::vector<float> k(size_t(max_live) * n_kv_ * d_, 0.f), v(k.size(), 0.f);
  for (int h = 0; h < n_kv_; ++h) {
    int j = 0;
    for (int s = 0; s < n_slots_; ++s) {
      if (!valid_[idx(s, h)]) continue;
      const size_t o = size_t(j) * n_kv_ + h;
      pos[o] = pos_[idx(s, h)];
      valid[o] = 1;
      std::copy_n(key(s, h), d_, k.data() + o * d_);
      std::copy_n(value(s, h), d_, v.data() + o * d_);
      ++j;
    }
    for (; j < max_live; ++j)  // trailing holes: copy the previous position (non-decreasing)
      pos[size_t(j) * n_kv_ + h] = j ? pos[size_t(j - 1) * n_kv_ + h] : 0;
  }
  pos_ = std::move(pos), valid_ = std::move(valid), k_ = std::move(k), v_ = std::move(v);
  n_slots_ = int(max_live);
  ++compactions_;
}

void generate(const SimOptions& o, uint64_t seed, int layer, int64_t position, int kind, float* out) {
  const int rows = kind == 0 ? o.n_heads : o.n_kv_heads;
  const float scale = kind == 0 ? o.query_scale : 1.f;
  uint64_t st = splitmix64(seed * 1000003ull + uint64_t(layer) * 7919ull + uint64_t(position) * 31ull + uint64_t(kind));
  for (int i = 0; i < rows * o.head_dim; ++i) {
    st = splitmix64(st);
    out[i] = scale * (float(st >> 40) / float(1ull << 24) * 2.f - 1.f);
  }
}

PolicySimulator::PolicySimulator(const SimOptions& o, uint64_t seed) : o_(o), seed_(seed) {
  restart(seed);
}

PolicyModelShape PolicySimulator::shape() const {
  return {o_.n_layers, o_.n_heads, o_.n_kv_heads, o_.head_dim, o_.max_seq_len};
}

void PolicySimulator::restart(uint64_t seed) {
  seed_ = seed;
  n_seen_ = 0;
  caches_.clear();
  for (int l = 0; l < o_.n_layers; ++l) caches_.emplace_back(o_.n_kv_heads, o_.head_dim, o_.flat_view);
}

std::string check_selection(const KeySelection& sel, const LayerStep& step) {
  if (sel.all) return "";
  const int n_kv = step.shape.n_kv_heads;
  if (sel.n_rows != step.n_new || sel.n_kv_heads != n_kv)
    return str_cat("selection shape ", sel.n_rows, "x", sel.n_kv_heads, " != ", step.n_new, "x", n_kv);
  if (int(sel.indptr.size()) != step.n_new * n_kv + 1) return "indptr has the wrong length";
  const int n_slots = step.cache->n_slots();
  for (int r = 0; r < step.n_new; ++r)
    for (int h = 0; h < n_kv; ++h) {
      int32_t prev_end = -1;
      for (const SlotRange& rg : sel.list(r, h)) {
        if (rg.begin >= rg.end) return str_cat("empty range at row ", r, " head ", h);
        if (rg.begin < 0 || rg.end > n_slots) return str_cat("range out of [0, ", n_slots, ")");
        if (rg.begin <= prev_end) return str_cat("ranges not sorted/disjoint at row ", r, " head ", h);
        prev_end = rg.end;
        for (int s = rg.begin; s < rg.end; ++s)
          if (step.cache->slot_valid(s, h) && step.cache->slot_position(s, h) > step.positions[r])
            return str_cat("non-causal slot ", s, " at row ", r);
      }
    }
  return "";
}

const std::string& duo_test_head_file() {
  static const std::string path = [] {
    const std::string p = (std::filesystem::temp_directory_path() /
                           ("kvlab_duo_test_heads_" + std::to_string(::getpid()) + ".tsv")).string();
    // (layer 1, KV head 1) first, then (0, 1): retrieval_fraction 0.25 makes layer 0 all
    // streaming and layer 1 mixed; 0.5 mixes both layers.
    HeadScores h{2, 2, {0.125, 0.5, 0.25, 1.0}};
    write_head_file(p, h, {"test head file of policies/policy_testing.cpp (2 layers x 2 KV heads)"});
    return p;
  }();
  return path;
}

namespace {
using P = std::map<std::string, ParamValue>;  // the table's spelling
}  // namespace

std::vector<PolicyConfig> acting_policy_configs(const std::vector<std::string>& registered) {
  // COMPAT: one line per entry, {"policy", P{{"param", value}, ...}}. Every built-in's and the
  // example plugin's acting parameters are in their factories (conformance_configs()); put new
  // ones there too, keeping here only what a factory cannot state: a path made at test time.
  // The head file only when duo is asked for (kvlab check-policy calls this too).
  const bool duo = std::find(registered.begin(), registered.end(), "duo") != registered.end();
  const std::string duo_heads = duo ? duo_test_head_file() : std::string();
  std::vector<PolicyConfig> out = {
      {"duo", P{{"heads", duo_heads}, {"retrieval_fraction", 0.25}, {"sinks", int64_t(2)}, {"recent", int64_t(8)}}},
      {"duo", P{{"heads", duo_heads}, {"retrieval_fraction", 0.5}, {"sinks", int64_t(3)}, {"recent", int64_t(5)}}},
      {"duo", P{{"heads", duo_heads}, {"retrieval_fraction", 0.25}, {"sinks", int64_t(2)},
                {"compression_ratio", 0.5}}},
  };
  std::erase_if(out, [&](const PolicyConfig& c) {
    return std::find(registered.begin(), registered.end(), c.policy) == registered.end();
  });
  return out;
}

std::string describe(const PolicyConfig& c) {
  std::string s = c.policy + "{";
  for (const auto& [k, v] : c.params) s += k + "=" + to_string(v) + " ";
  return s + "}";
}

std::string check_prefill_mask(const PolicyNeeds& needs, const KeySelection& sel, const LayerStep& step) {
  if (!needs.prefill_mask || step.n_new < 2) return "";
  const PositionMask m = *needs.prefill_mask;
  const LayerCacheView& c = *step.cache;
  for (int r = 0; r < step.n_new; ++r) {
    const int64_t i = step.positions[r];
    for (int h = 0; h < step.shape.n_kv_heads; ++h) {
      std::vector<uint8_t> selected(c.n_slots(), sel.all ? 1 : 0);
      if (!sel.all)
        for (const SlotRange& rg : sel.list(r, h))
          for (int s = rg.begin; s < rg.end; ++s) selected[s] = 1;
      for (int s = 0; s < c.n_slots(); ++s) {
        if (!c.slot_valid(s, h)) continue;
        const int64_t j = c.slot_position(s, h);
        const bool reads = selected[s] && j <= i;
        const bool allowed = j <= i && (m.window <= 0 || j < m.sinks || i - j < m.window);
        if (reads != allowed)
          return str_cat("prefill_mask {window ", m.window, ", sinks ", m.sinks, "} promised, but row ", r,
                         " (position ", i, ") head ", h, (reads ? " reads" : " skips"), " key position ", j);
      }
    }
  }
  return "";
}

PolicySimulator::Step PolicySimulator::step(AttentionPolicy& policy, int n_new, bool prompt_end) {
  const PolicyModelShape sh = shape();
  const int H = o_.n_heads, Hkv = o_.n_kv_heads, d = o_.head_dim, G = H / Hkv;
  const float tau = 1.f / std::sqrt(float(d));
  const PolicyNeeds needs = policy.needs();
  Step res;
  std::vector<int64_t> positions(n_new);
  for (int r = 0; r < n_new; ++r) positions[r] = n_seen_ + r;
  for (int layer = 0; layer < o_.n_layers; ++layer) {
    FakeLayerCache& cache = caches_[layer];
    std::vector<float> q(size_t(n_new) * H * d), k(size_t(Hkv) * d), v(size_t(Hkv) * d);
    for (int r = 0; r < n_new; ++r) {
      generate(o_, seed_, layer, positions[r], 0, q.data() + size_t(r) * H * d);
      generate(o_, seed_, layer, positions[r], 1, k.data());
      generate(o_, seed_, layer, positions[r], 2, v.data());
      cache.append(positions[r], k.data(), v.data());
    }
    cache.set_page_stats(needs.page_stats);  // as the engine: kept only when asked
    LayerStep ls{.layer = layer, .is_prefill = n_new > 1, .n_new = n_new, .positions = positions,
                 .queries = needs.queries ? std::span<const float>(q) : std::span<const float>(),
                 .cache = &cache, .shape = sh, .prompt_end = prompt_end, .seed = seed_};
    KeySelection sel;
    sel.select_all();
    policy.select(ls, sel);
    if (std::string e = check_selection(sel, ls); !e.empty())
      res.violations.push_back(str_cat("layer ", layer, ": ", e));
    if (std::string e = check_prefill_mask(needs, sel, ls); !e.empty())
      res.violations.push_back(str_cat("layer ", layer, ": ", e));
    // Attention over the selection (valid, causal) by the fp64 reference, with key mass: a
    // slot is read when a selected range holds it, its head's cell is valid and its position
    // is not after the query's.
    const int n_slots = cache.n_slots();
    std::vector<float> mass(needs.key_attention_mass ? size_t(Hkv) * n_slots : 0, 0.f);
    const bool window = needs.observation_window > 0 && (prompt_end || needs.observe_every_step);
    const int window_rows = window ? std::min(needs.observation_window, n_new) : 0;
    std::vector<float> window_att(window ? size_t(H) * n_slots : 0, 0.f);
    std::vector<float> out(size_t(n_new) * H * d, 0.f);
    std::vector<char> selected(n_slots);
    std::vector<int64_t> reads(size_t(n_new) * Hkv, 0);
    for (int r = 0; r < n_new; ++r)
      for (int qh = 0; qh < H; ++qh) {
        const int h = qh / G;
        if (sel.all || !sel.n_rows) {
          selected.assign(n_slots, 1);
        } else {
          selected.assign(n_slots, 0);
          for (const SlotRange& rg : sel.list(r, h))
            for (int s = std::max(0, rg.begin); s < std::min(rg.end, n_slots); ++s) selected[s] = 1;
        }
        const ReferenceRow ref = reference_attention_row(
            q.data() + (size_t(r) * H + qh) * d, d, n_slots, tau,
            [&](int64_t s) { return cache.key(int(s), h); }, [&](int64_t s) { return cache.value(int(s), h); },
            [&](int64_t s) {
              return selected[s] && cache.slot_valid(int(s), h) && cache.slot_position(int(s), h) <= positions[r];
            });
        float* o = out.data() + (size_t(r) * H + qh) * d;
        for (int f = 0; f < d; ++f) o[f] = float(ref.out[f]);
        if (qh % G == 0)
          for (int s = 0; s < n_slots; ++s)
            reads[size_t(r) * Hkv + h] +=
                selected[s] && cache.slot_valid(s, h) && cache.slot_position(s, h) <= positions[r];
        if (!mass.empty())
          for (int s = 0; s < n_slots; ++s) mass[size_t(h) * n_slots + s] += float(ref.p[s]);
        if (window && r >= n_new - window_rows)
          for (int s = 0; s < n_slots; ++s) window_att[size_t(qh) * n_slots + s] += float(ref.p[s]);
      }
    StepStats stats;
    stats.key_mass = mass;
    stats.n_slots = n_slots;
    stats.window_attention = window_att;
    stats.window_rows = window_rows;
    Evictions ev;
    ev.clear(Hkv);
    policy.after_attention(ls, stats, ev);
    try {
      cache.evict(ev);
    } catch (const Error& e) {
      res.violations.push_back(str_cat("layer ", layer, ": bad evictions: ", e.what()));
    }
    res.out.push_back(std::move(out));
    res.reads.push_back(std::move(reads));
    std::vector<int64_t> resident(Hkv);
    for (int h = 0; h < Hkv; ++h) resident[h] = cache.resident(h);
    res.resident.push_back(std::move(resident));
  }
  n_seen_ += n_new;
  return res;
}

std::vector<float> dense_reference(const SimOptions& o, uint64_t seed, int layer, int64_t i,
                                   const std::function<bool(int, int64_t)>& allow) {
  const int H = o.n_heads, Hkv = o.n_kv_heads, d = o.head_dim, G = H / Hkv;
  const float tau = 1.f / std::sqrt(float(d));
  std::vector<float> q(size_t(H) * d), k(size_t(Hkv) * d), v(size_t(Hkv) * d);
  generate(o, seed, layer, i, 0, q.data());
  std::vector<std::vector<float>> keys, values;
  for (int64_t j = 0; j <= i; ++j) {
    generate(o, seed, layer, j, 1, k.data());
    generate(o, seed, layer, j, 2, v.data());
    keys.push_back(k), values.push_back(v);
  }
  std::vector<float> out(size_t(H) * d, 0.f);
  for (int qh = 0; qh < H; ++qh) {
    const int h = qh / G;
    const ReferenceRow ref = reference_attention_row(
        q.data() + size_t(qh) * d, d, i + 1, tau, [&](int64_t j) { return keys[j].data() + size_t(h) * d; },
        [&](int64_t j) { return values[j].data() + size_t(h) * d; }, [&](int64_t j) { return allow(h, j); });
    for (int f = 0; f < d; ++f) out[size_t(qh) * d + f] = float(ref.out[f]);
  }
  return out;
}

PolicyRegistry& builtins_and_plugin(const std::string& plugin_path) {
  static PolicyRegistry r = [&] {
    PolicyRegistry reg = make_builtin_registry();
    reg.load_plugin(plugin_path);
    return reg;
  }();
  return r;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<float>::infinity();
  float m = 0.f;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<float>::infinity();
    m = std::max(m, std::fabs(a[i] - b[i]));
  }
  return m;
}

}  // namespace kvlab::testing
