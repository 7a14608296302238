// The attention-step pipeline (attention_step.h).
#include "framework/engine/attention_step.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_stats.h"

namespace kvlab::engine_detail {

namespace {

// A local layer's window W (ModelConfig::local_layers): the query at position i reads key j only
// if i - j < W. Applied to whatever the policy selected by clipping each (row, KV head) list to
// the slots at or after the first one with position > i - W (positions are non-decreasing in the
// slot for each head: policy.h's order contract), so every policy composes with the model's
// window and the kernels need no mask. Leaves `sel` untouched when the window clips nothing.
void clip_to_window(const LayerKv& kv, std::span<const int64_t> positions, int64_t window,
                    KeySelection& sel, KeySelection& scratch, std::vector<int32_t>& first) {
  const int nkv = kv.view.num_kv_heads, n_rows = static_cast<int>(positions.size());
  first.resize(static_cast<size_t>(n_rows) * nkv);
  bool clips = false;
  for (int r = 0; r < n_rows; ++r) {
    const int64_t lo = positions[r] - window + 1;  // the oldest position the row may read
    for (int h = 0; h < nkv; ++h) {
      int32_t a = 0, b = kv.n_slots;  // first slot with position >= lo
      while (a < b) {
        const int32_t m = a + (b - a) / 2;
        if (kv.position(m, h) < lo) a = m + 1; else b = m;
      }
      first[static_cast<size_t>(r) * nkv + h] = a;
      clips = clips || a > 0;
    }
  }
  if (!clips) return;
  scratch.begin(n_rows, nkv);
  for (int r = 0; r < n_rows; ++r) {
    for (int h = 0; h < nkv; ++h) {
      const int32_t lo = first[static_cast<size_t>(r) * nkv + h];
      if (sel.all) {
        scratch.add(lo, kv.n_slots);
      } else {
        for (const SlotRange& rg : sel.list(r, h)) scratch.add(std::max(rg.begin, lo), rg.end);
      }
      scratch.close_list();
    }
  }
  std::swap(sel, scratch);
}


// After a step of a local layer (window W) whose last row sits at position p, no later query
// (position p + 1 or beyond) reads a key at position <= p + 1 - W: such tokens leave the store,
// so a local layer holds at most W tokens per KV head whatever the policy keeps (Gemma 2/3's
// rolling window, as llama.cpp's and vLLM's hybrid caches do). Appended to `ev` (the policy's
// own evictions), every slot at most once: the out-of-window slots of a head are a prefix in
// slot order (positions are non-decreasing in the slot: policy.h's order contract).
void evict_out_of_window(const LayerKv& kv, int64_t last_position, int64_t window, Evictions& ev,
                         std::vector<int32_t>& listed) {
  const int nkv = kv.view.num_kv_heads;
  const int64_t oldest_needed = last_position + 2 - window;
  for (int h = 0; h < nkv; ++h) {
    std::vector<int32_t>& out = ev.slots[static_cast<size_t>(h)];
    listed.assign(out.begin(), out.end());
    std::sort(listed.begin(), listed.end());
    for (int32_t slot = 0; slot < kv.n_slots; ++slot) {
      const size_t cell = static_cast<size_t>(slot) * nkv + h;
      if (kv.positions[cell] >= oldest_needed) break;
      if (kv.valid[cell] && !std::binary_search(listed.begin(), listed.end(), slot)) out.push_back(slot);
    }
  }
}

// x [n_rows, n_kv, hd]: per KV head max |x| / fp8_max, or 1 where the rows are all zero.
void fp8_scales_of_rows(const float* x, int n_rows, int n_kv, int hd, float fp8_max, float* scales) {
  for (int h = 0; h < n_kv; ++h) {
    float amax = 0.f;
    for (int r = 0; r < n_rows; ++r) {
      const float* row = x + (static_cast<size_t>(r) * n_kv + h) * hd;
      for (int d = 0; d < hd; ++d) amax = std::max(amax, std::fabs(row[d]));
    }
    scales[h] = amax > 0.f && std::isfinite(amax) ? amax / fp8_max : 1.f;  // inf: append names it
  }
}

}  // namespace

bool AttentionStep::wants_output(const Sequence& s) const {
  for (const StepObserver* o : observers_)
    if (o->wants_output(s)) return true;
  return false;
}

void AttentionStep::prepare(Group& g, int layer, float* q, const float* k, const float* v) {
  Sequence& s = *g.seq;
  const int hd = c_.head_dim, nh = c_.n_heads, nkv = c_.n_kv_heads, group = nh / nkv;
  const int qd = nh * hd, kvd = nkv * hd;
  for (StepObserver* o : observers_) o->new_rows(g, layer, q, k, v);
  if (s.needs.rope_at_cache_position) {
    // query of row r, head h: rotated to (live tokens of its KV head before this call) + r
    resident_before_.resize(nkv);
    for (int kh = 0; kh < nkv; ++kh) resident_before_[kh] = store_.resident_tokens(s.id, layer, kh);
    for (int r = 0; r < g.n_rows; ++r)
      for (int hq = 0; hq < nh; ++hq)
        rope_[layer].rotate(q + static_cast<size_t>(r) * qd + hq * hd, resident_before_[hq / group] + r);
  }
  if (fp8_from_prompt_ && store_.n_slots(s.id, layer) == 0) {  // the sequence's first rows
    const float fp8_max = kv_fp8_max(store_.config().format);
    scale_k_.resize(nkv);
    scale_v_.resize(nkv);
    fp8_scales_of_rows(k, g.n_rows, nkv, hd, fp8_max, scale_k_.data());
    fp8_scales_of_rows(v, g.n_rows, nkv, hd, fp8_max, scale_v_.data());
    store_.set_sequence_fp8_scales(s.id, layer, scale_k_.data(), scale_v_.data());
  }
  for (int r = 0; r < g.n_rows; ++r)
    store_.append(s.id, layer, g.positions[r], k + static_cast<size_t>(r) * kvd, v + static_cast<size_t>(r) * kvd);

  LayerStep& step = g.step;
  step.layer = layer;
  step.is_prefill = g.n_rows > 1;
  step.n_new = g.n_rows;
  step.positions = g.positions;
  step.prompt_end = g.prompt_end;
  step.seed = s.seed;
  g.q = q;
  // Only a policy that declares it reads the queries gets them (the device path copies them
  // back for it alone).
  step.queries = s.needs.queries ? std::span<const float>(q, static_cast<size_t>(g.n_rows) * qd)
                                 : std::span<const float>();
  const LayerKv kv = store_.layer(s.id, layer);
  s.cache_view = LayerKvCacheView(kv);
  step.cache = &s.cache_view;
  step.shape = policy_shape(c_);
  step.sliding_window = layer_window(c_, layer);
  s.selection.select_all();
  if (s.policy) s.policy->select(step, s.selection);
  if (step.sliding_window > 0)
    clip_to_window(kv, g.positions, step.sliding_window, s.selection, clipped_, first_in_window_);

  if (s.needs.rope_at_cache_position) {
    s.key_rope_pos.resize(static_cast<size_t>(kv.n_slots) * nkv);
    cache_rank_positions(kv, s.key_rope_pos.data());
  }
  if (s.needs.key_attention_mass) s.key_mass.assign(static_cast<size_t>(nkv) * kv.n_slots, 0.f);
  // The observation window: the backend's attention fills it (AttentionArgs::head_mass) when it
  // can, else finish() computes it.
  const int window = s.needs.observation_window;
  s.window_rows = window > 0 && (g.prompt_end || s.needs.observe_every_step) ? std::min(window, g.n_rows) : 0;
  s.window_by_kernel = false;
  if (s.window_rows > 0) s.window_attention.assign(static_cast<size_t>(nh) * kv.n_slots, 0.f);
}

bool AttentionStep::finish(Group& g, int layer, const float* out) {
  Sequence& s = *g.seq;
  const LayerKv kv = store_.layer(s.id, layer);
  for (StepObserver* o : observers_) o->attended(g, layer, kv, out);
  evictions_.clear(c_.n_kv_heads);
  if (s.policy) observe_and_evict(g, layer, kv);
  if (g.step.sliding_window > 0)
    evict_out_of_window(kv, g.positions.back(), g.step.sliding_window, evictions_, listed_);
  if (evictions_.empty()) return false;
  store_.evict(s.id, layer, evictions_);
  return true;
}

void AttentionStep::observe_and_evict(Group& g, int layer, const LayerKv& kv) {
  Sequence& s = *g.seq;
  StepStats stats;
  stats.n_slots = kv.n_slots;
  if (s.needs.key_attention_mass) stats.key_mass = s.key_mass;
  if (s.window_rows > 0) {
    if (!s.window_by_kernel) {
      AttentionArgs a = attention_args(g.q, g.n_rows, c_.n_heads, c_.n_kv_heads, c_.head_dim,
                                       g.positions.data(), kv, attention_scale(c_));
      a.softcap = c_.attn_softcap;
      a.selection = &s.selection;
      if (s.needs.rope_at_cache_position) {
        a.key_rope_pos = s.key_rope_pos.data();
        a.rope = &rope_[layer];
      }
      window_attention(a, g.n_rows - s.window_rows, s.window_attention.data());
    }
    stats.window_attention = s.window_attention;
    stats.window_rows = s.window_rows;
  }
  s.policy->after_attention(g.step, stats, evictions_);
}

}  // namespace kvlab::engine_detail
