// Budget accounting and attention probes (step_observers.h).
#include "framework/engine/step_observers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "kernels/testing/reference_attention.h"

namespace kvlab::engine_detail {

void BudgetObserver::attended(Group& g, int layer, const LayerKv& kv, const float* out) {
  if (!g.decode) return;
  Sequence& s = *g.seq;
  const KeySelection& sel = s.selection;
  const int nkv = kv.view.num_kv_heads;
  // keys read per KV head (= per query head, averaged) vs the budget
  const int64_t qpos = g.positions[0];
  double achieved = 0;
  for (int kh = 0; kh < nkv; ++kh) {
    auto count_range = [&](int b, int e) {
      int64_t n = 0;
      for (int slot = b; slot < e; ++slot) n += kv.is_valid(slot, kh) && kv.position(slot, kh) <= qpos;
      return n;
    };
    if (sel.all) {
      achieved += count_range(0, kv.n_slots);
    } else {
      for (const SlotRange& rg : sel.list(0, kh)) achieved += count_range(rg.begin, rg.end);
    }
  }
  const int64_t n_seen = s.n_tokens + 1;
  const int64_t budget = s.policy ? s.policy->budget_tokens(layer, n_seen) : -1;
  s.attended.step_achieved += achieved / nkv;
  // The set a query may read: the policy's explicit selection when it made one (landmark,
  // strided: they keep every token but read few), else its residency budget, else every
  // token seen.
  s.attended.step_set += !sel.all    ? achieved / nkv
                         : budget < 0 ? static_cast<double>(n_seen)
                                      : static_cast<double>(std::min(budget, n_seen));
}

void BudgetObserver::end_step(Sequence& s, int n_layers) {
  AttendedCounts& a = s.attended;
  a.set_last = a.step_set / n_layers;
  a.achieved_last = a.step_achieved / n_layers;
  a.set_sum += a.set_last;
  a.achieved_sum += a.achieved_last;
}

void ProbeObserver::start(Sequence& s) const {
  s.probe = ProbeState{};
  s.probe.shadow.resize(c_.n_layers);
  s.probe.layer.resize(c_.n_layers);
  for (int l = 0; l < c_.n_layers; ++l) s.probe.layer[l].layer = l;
}

void ProbeObserver::fork(const Sequence& parent, Sequence& child) const {
  start(child);
  child.probe.shadow = parent.probe.shadow;
}

bool ProbeObserver::keeps_shadow(const Sequence& s, int layer) const {
  return !s.probe.shadow.empty() && std::binary_search(layers_.begin(), layers_.end(), layer);
}

void ProbeObserver::new_rows(Group& g, int layer, const float* q, const float* k, const float* v) {
  Sequence& s = *g.seq;
  if (!keeps_shadow(s, layer)) return;
  const int kvd = c_.n_kv_heads * c_.head_dim;
  if (s.probe.probing_step) {  // the dense reference uses original positions: the query at its text position
    s.probe.q.assign(q, q + static_cast<size_t>(c_.n_heads) * c_.head_dim);
    if (s.needs.rope_at_cache_position) apply_rope(s.probe.q.data(), c_.n_heads, c_.head_dim, g.positions[0], rope_[layer]);
  }
  ProbeShadow& sh = s.probe.shadow[layer];
  sh.k.insert(sh.k.end(), k, k + static_cast<size_t>(g.n_rows) * kvd);
  sh.v.insert(sh.v.end(), v, v + static_cast<size_t>(g.n_rows) * kvd);
  sh.positions.insert(sh.positions.end(), g.positions.begin(), g.positions.end());
}

// Dense attention over the shadow copy of every token seen (decode rows only), compared with
// what the policy's attention produced.
void ProbeObserver::attended(Group& g, int layer, const LayerKv& kv, const float* policy_out) {
  Sequence& s = *g.seq;
  if (!s.probe.probing_step || !keeps_shadow(s, layer)) return;
  const KeySelection& sel = s.selection;
  const ProbeShadow& sh = s.probe.shadow[layer];
  const int hd = c_.head_dim, nh = c_.n_heads, nkv = c_.n_kv_heads, group = nh / nkv;
  const int kvd = nkv * hd;
  const int64_t n_seen = static_cast<int64_t>(sh.positions.size());
  const bool cache_pos = s.needs.rope_at_cache_position;
  const double scale = attention_scale(c_);
  const int64_t window = layer_window(c_, layer);  // dense = what the model reads: its window
  std::vector<float> keys;  // rope-at-cache-position: the shadow's raw keys rotated at their text position
  for (int hq = 0; hq < nh; ++hq) {
    const int kh = hq / group;
    const float* qh = s.probe.q.data() + static_cast<size_t>(hq) * hd;
    // The keys the policy read, as text positions: attended[pos] = true.
    std::unordered_set<int64_t> attended;
    auto take = [&](int b, int e) {
      for (int slot = b; slot < e; ++slot)
        if (kv.is_valid(slot, kh) && kv.position(slot, kh) <= g.positions[0]) attended.insert(kv.position(slot, kh));
    };
    if (sel.all) take(0, kv.n_slots);
    else for (const SlotRange& rg : sel.list(0, kh)) take(rg.begin, rg.end);
    if (cache_pos) {
      keys.resize(static_cast<size_t>(n_seen) * hd);
      for (int64_t j = 0; j < n_seen; ++j) {
        std::memcpy(&keys[j * hd], sh.k.data() + static_cast<size_t>(j) * kvd + kh * hd, hd * sizeof(float));
        apply_rope(&keys[j * hd], 1, hd, sh.positions[j], rope_[layer]);
      }
    }
    const testing::ReferenceRow dense = testing::reference_attention_row(
        qh, hd, n_seen, scale,
        [&](int64_t j) { return cache_pos ? &keys[j * hd] : sh.k.data() + static_cast<size_t>(j) * kvd + kh * hd; },
        [&](int64_t j) { return sh.v.data() + static_cast<size_t>(j) * kvd + kh * hd; },
        [&](int64_t j) { return window <= 0 || g.positions[0] - sh.positions[j] < window; },
        c_.attn_softcap);
    double recall = 0;
    for (int64_t j = 0; j < n_seen; ++j)
      if (attended.count(sh.positions[j])) recall += dense.p[j];
    double num = 0, den = 0;
    const float* po = policy_out + static_cast<size_t>(hq) * hd;
    for (int d = 0; d < hd; ++d) {
      num += (po[d] - dense.out[d]) * (po[d] - dense.out[d]);
      den += dense.out[d] * dense.out[d];
    }
    const double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    ProbeState& p = s.probe;
    p.samples += 1;
    p.recall_sum += recall;
    p.recall_min = std::min(p.recall_min, recall);
    p.err_sum += err;
    p.err_max = std::max(p.err_max, err);
    LayerProbeStats& lp = p.layer[layer];
    lp.samples += 1;
    lp.recall_sum += recall;
    lp.rel_error_sum += err;
  }
}

}  // namespace kvlab::engine_detail
