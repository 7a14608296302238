#include "framework/engine/engine.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "framework/core/error.h"
#include "framework/engine/device_forward.h"
#include "framework/engine/engine_internal.h"
#include "framework/engine/linear.h"
#include "framework/engine/ops.h"
#include "kernels/cpu/attention.h"

namespace kvlab {

using engine_detail::ProbeShadow;

const char* step_status_name(StepStatus status) {
  switch (status) {
    case StepStatus::kOk: return "ok";
    case StepStatus::kOutOfBlocks: return "out_of_blocks";
    case StepStatus::kContextFull: return "context_full";
  }
  return "?";
}

PolicyModelShape policy_shape(const ModelConfig& c) {
  return PolicyModelShape{c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.max_seq_len};
}

double LayerProbeStats::recall_mean() const {
  return samples > 0 ? recall_sum / double(samples) : std::nan("");
}

double LayerProbeStats::rel_error_mean() const {
  return samples > 0 ? rel_error_sum / double(samples) : std::nan("");
}

namespace {

std::vector<LayerProbeStats> empty_layer_probes(int n_layers) {
  std::vector<LayerProbeStats> v(n_layers);
  for (int l = 0; l < n_layers; ++l) v[l].layer = l;
  return v;
}

RopeConfig rope_config(const ModelConfig& c) {
  RopeConfig r;
  r.layout = c.rope_style == RopeStyle::kNeox ? RopeLayout::kNeox : RopeLayout::kInterleaved;
  r.head_dim = c.head_dim;
  r.theta = c.rope_theta;
  const std::string& t = c.rope_scaling.type;
  if (t == "none" || !c.rope_freq_factors.empty()) r.scaling = RopeScalingKind::kNone;
  else if (t == "linear") r.scaling = RopeScalingKind::kLinear;
  else if (t == "llama3") r.scaling = RopeScalingKind::kLlama3;
  else fail("model ", c.arch, ": unknown rope scaling '", t, "'");
  r.factor = c.rope_scaling.factor;
  r.low_freq_factor = c.rope_scaling.low_freq_factor;
  r.high_freq_factor = c.rope_scaling.high_freq_factor;
  r.original_max_position = c.rope_scaling.original_max_position;
  return r;
}

// K/V bytes an attention call reads (x query rows) below which it runs on one thread.
constexpr size_t kAttentionParallelBytes = size_t{1} << 20;

// Rows of a prefill chunk pushed through the feed-forward block at once.
constexpr int kFfnRows = 128;

// A table for the usual contexts; positions beyond are computed on the fly (identical values).
constexpr int64_t kMaxRopeTablePositions = 32768;

}  // namespace

std::vector<double> model_rope_inv_freq(const ModelConfig& c) {
  std::vector<double> inv_freq = rope_inv_freq(rope_config(c));
  if (!c.rope_freq_factors.empty()) {
    if (static_cast<int>(c.rope_freq_factors.size()) != c.head_dim / 2)
      fail("model: ", c.rope_freq_factors.size(), " RoPE frequency factors, expected head_dim/2 = ", c.head_dim / 2);
    for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] /= c.rope_freq_factors[i];
  }
  return inv_freq;
}

// RoPE at insertion: the kernels' inverse frequencies (rope_inv_freq: none / linear / llama3),
// divided by the model's per-pair factors when it has them (GGUF rope_freqs.weight, which the
// kernels' RopeTable does not take); angle = pos * inv_freq in double, cos/sin stored as float
// (without factors: the same values as RopeTable). Tabled for the usual contexts, computed past.
class Engine::Rope {
 public:
  Rope(const ModelConfig& c, int64_t n_positions)
      : layout_(c.rope_style == RopeStyle::kNeox ? RopeLayout::kNeox : RopeLayout::kInterleaved),
        head_dim_(c.head_dim), inv_freq_(model_rope_inv_freq(c)), n_positions_(n_positions) {
    const int half = head_dim_ / 2;
    cos_.resize(static_cast<size_t>(n_positions_) * half);
    sin_.resize(cos_.size());
    for (int64_t p = 0; p < n_positions_; ++p) angles(p, &cos_[p * half], &sin_[p * half]);
  }
  // Rotates x[n_heads, head_dim] in place to position pos.
  void apply(float* x, int n_heads, int64_t pos) const {
    const int half = head_dim_ / 2;
    const float *co, *si;
    float cbuf[512], sbuf[512];
    if (pos >= 0 && pos < n_positions_) {
      co = &cos_[pos * half];
      si = &sin_[pos * half];
    } else {
      KVLAB_CHECK(half <= 512, "head_dim above 1024");
      angles(pos, cbuf, sbuf);
      co = cbuf;
      si = sbuf;
    }
    for (int h = 0; h < n_heads; ++h) rope_rotate_head(x + static_cast<size_t>(h) * head_dim_, head_dim_, layout_, co, si);
  }

 private:
  void angles(int64_t pos, float* co, float* si) const {
    for (size_t i = 0; i < inv_freq_.size(); ++i) {
      const double a = static_cast<double>(pos) * inv_freq_[i];
      co[i] = static_cast<float>(std::cos(a));
      si[i] = static_cast<float>(std::sin(a));
    }
  }
  RopeLayout layout_;
  int head_dim_;
  std::vector<double> inv_freq_;
  int64_t n_positions_;
  std::vector<float> cos_, sin_;
};

struct Engine::Scratch {
  std::vector<float> x, h, q, k, v, att, tmp, gate, up;
  LinearScratch linear;
  Evictions evictions;
  std::vector<int64_t> resident_before;  // [n_kv_heads]
  void ensure(int rows, const ModelConfig& c) {
    const size_t r = static_cast<size_t>(rows);
    const size_t qd = static_cast<size_t>(c.n_heads) * c.head_dim;
    const size_t kvd = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
    if (x.size() >= r * c.dim) return;
    x.resize(r * c.dim), h.resize(r * c.dim), tmp.resize(r * c.dim);
    q.resize(r * qd), att.resize(r * qd), k.resize(r * kvd), v.resize(r * kvd);
    const size_t ffn_rows = std::min<size_t>(r, kFfnRows);
    gate.resize(ffn_rows * c.hidden_dim), up.resize(ffn_rows * c.hidden_dim);
  }
};

Engine::Engine(const Model& model, const EngineOptions& opts)
    : model_(model), opts_(opts), pool_(opts.threads), scratch_(std::make_unique<Scratch>()) {
  const ModelConfig& c = model.config;
  if (c.dim <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 ||
      c.n_heads % c.n_kv_heads != 0 || c.vocab_size <= 0 || c.max_seq_len <= 0)
    fail("engine: model config has an invalid shape (dim ", c.dim, ", layers ", c.n_layers,
         ", heads ", c.n_heads, "/", c.n_kv_heads, ", head_dim ", c.head_dim, ")");
  if (static_cast<int>(model.layers.size()) != c.n_layers)
    fail("engine: model has ", model.layers.size(), " layers, config says ", c.n_layers);
  if (opts.block_size_tokens <= 0) fail("engine: block_size_tokens must be > 0");
  if (opts.prefill_chunk_tokens <= 0) fail("engine: prefill_chunk_tokens must be > 0");
  if (opts.max_batch <= 0) fail("engine: max_batch must be > 0");
  if (opts.max_tokens < 0) fail("engine: max_tokens must be >= 0 (0 = the model's max_seq_len)");
  if (opts.max_tokens > INT32_MAX) fail("engine: max_tokens above 2^31 - 1");
  if (opts_.max_tokens == 0) opts_.max_tokens = c.max_seq_len;
  opts_.threads = pool_.size();
  if (opts_.probe && opts_.probe_layers.empty())
    opts_.probe_layers = {0, c.n_layers / 2, c.n_layers - 1};
  std::sort(opts_.probe_layers.begin(), opts_.probe_layers.end());
  opts_.probe_layers.erase(std::unique(opts_.probe_layers.begin(), opts_.probe_layers.end()),
                           opts_.probe_layers.end());
  for (int l : opts_.probe_layers)
    if (l < 0 || l >= c.n_layers) fail("engine: probe layer ", l, " out of range [0, ", c.n_layers, ")");

  KvStoreConfig kc;
  kc.n_layers = c.n_layers;
  kc.n_kv_heads = c.n_kv_heads;
  kc.head_dim = c.head_dim;
  kc.block_size_tokens = opts.block_size_tokens;
  const size_t block_bytes = size_t{2} * opts.block_size_tokens * c.n_kv_heads * c.head_dim * sizeof(float);
  const size_t blocks_per_seq =
      static_cast<size_t>(c.n_layers) * ((opts_.max_tokens + opts.block_size_tokens - 1) / opts.block_size_tokens);
  kc.budget_bytes = opts.kv_budget_bytes ? opts.kv_budget_bytes : blocks_per_seq * opts.max_batch * block_bytes;
  store_ = std::make_unique<KvStore>(kc);
  const int64_t table_positions = std::min<int64_t>(c.max_seq_len, kMaxRopeTablePositions);
  rope_ = std::make_unique<Rope>(c, table_positions);
  // rope-at-read (attention kernels) for policies with rope_at_cache_position; the kernels'
  // table cannot take per-pair frequency factors, so such models refuse those policies
  if (c.rope_freq_factors.empty()) cache_rope_ = RopeTable(rope_config(c), table_positions);
  if (opts_.device == "cuda" || opts_.device == "emulated") {
    device_ = DeviceForward::create(*this);
  } else if (opts_.device != "cpu") {
    fail("engine: device must be cpu or cuda, got '", opts_.device, "'");
  }
}

Engine::~Engine() = default;

Engine::Sequence& Engine::seq_at(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) fail("engine: unknown sequence ", seq);
  return *it->second;
}
const Engine::Sequence& Engine::seq_at(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) fail("engine: unknown sequence ", seq);
  return *it->second;
}

SeqId Engine::start_sequence(std::unique_ptr<AttentionPolicy> policy) {
  if (policy && policy->needs().rope_at_cache_position && !config().rope_freq_factors.empty())
    fail("engine: this model's RoPE has per-pair frequency factors (GGUF rope_freqs.weight), "
         "which rope-at-cache-position policies cannot use yet (kernels/cpu/rope.h)");
  auto s = std::make_unique<Sequence>();
  s->id = store_->create_sequence();
  if (policy) s->needs = policy->needs();
  s->policy = std::move(policy);
  if (opts_.probe) {
    s->shadow.resize(config().n_layers);
    s->layer_probe = empty_layer_probes(config().n_layers);
  }
  const SeqId id = s->id;
  seqs_[id] = std::move(s);
  return id;
}

void Engine::end_sequence(SeqId seq) {
  seq_at(seq);
  if (device_) device_->end_sequence(seq);
  store_->free_sequence(seq);
  seqs_.erase(seq);
}

SeqId Engine::fork(SeqId seq, std::unique_ptr<AttentionPolicy> child_policy) {
  const Sequence& parent = seq_at(seq);
  // The device mirrors pages per block id; a shared block would need per-sequence metadata.
  if (device_) fail("engine: fork is not supported with device ", opts_.device, " yet (use device cpu)");
  if (parent.policy && !child_policy)
    fail("engine: fork of sequence ", seq, " which has an attention policy needs a fresh policy "
         "for the child (policy state cannot be copied)");
  auto s = std::make_unique<Sequence>();
  s->id = store_->fork(seq);
  if (child_policy) s->needs = child_policy->needs();
  if (child_policy && child_policy->needs().rope_at_cache_position && !config().rope_freq_factors.empty())
    fail("engine: rope-at-cache-position policies need a model without RoPE frequency factors");
  if (child_policy && parent.policy &&
      child_policy->needs().rope_at_cache_position != parent.needs.rope_at_cache_position)
    fail("engine: fork: the child's policy stores keys differently (rope_at_cache_position)");
  s->policy = std::move(child_policy);
  s->n_tokens = parent.n_tokens;
  s->shadow = parent.shadow;
  if (opts_.probe) s->layer_probe = empty_layer_probes(config().n_layers);  // counts start at 0
  s->blocks_current = s->blocks_peak = parent.blocks_current;
  const SeqId id = s->id;
  seqs_[id] = std::move(s);
  return id;
}

int64_t Engine::n_tokens(SeqId seq) const { return seq_at(seq).n_tokens; }

SequenceStats Engine::sequence_stats(SeqId seq) const {
  const Sequence& s = seq_at(seq);
  SequenceStats st;
  st.n_tokens = s.n_tokens;
  st.decode_steps = s.decode_steps;
  st.attended_set_last = s.set_last;
  st.attended_achieved_last = s.achieved_last;
  if (s.decode_steps > 0) {
    st.attended_set_mean = s.set_sum / s.decode_steps;
    st.attended_achieved_mean = s.achieved_sum / s.decode_steps;
  }
  st.blocks_current = s.blocks_current;
  st.blocks_peak = s.blocks_peak;
  st.kv_bytes_current = static_cast<size_t>(s.blocks_current) * store_->block_bytes();
  st.kv_bytes_peak = static_cast<size_t>(s.blocks_peak) * store_->block_bytes();
  st.probe_samples = s.probe_samples;
  if (s.probe_samples > 0) {
    st.probe_recall_mean = s.recall_sum / s.probe_samples;
    st.probe_recall_min = s.recall_min;
    st.probe_rel_error_mean = s.err_sum / s.probe_samples;
    st.probe_rel_error_max = s.err_max;
  }
  if (opts_.probe)
    for (int l : opts_.probe_layers) st.probe_per_layer.push_back(s.layer_probe[l]);
  return st;
}

void Engine::record_kv_usage(Sequence& s) {
  s.blocks_current = store_->sequence_blocks(s.id);
  s.blocks_peak = std::max(s.blocks_peak, s.blocks_current);
}

// ---- the forward pass -------------------------------------------------------------------------

StepStatus Engine::prefill(SeqId seq, std::span<const int32_t> tokens, std::vector<float>& logits,
                           bool all_logits) {
  Sequence& s = seq_at(seq);
  const ModelConfig& c = config();
  if (tokens.empty()) fail("engine: prefill of sequence ", seq, " with no tokens");
  for (int32_t t : tokens)
    if (t < 0 || t >= c.vocab_size) fail("engine: token id ", t, " out of range [0, ", c.vocab_size, ")");
  if (s.n_tokens + static_cast<int64_t>(tokens.size()) > opts_.max_tokens) return StepStatus::kContextFull;
  const int64_t n_total = static_cast<int64_t>(tokens.size());
  logits.resize(static_cast<size_t>(all_logits ? n_total : 1) * c.vocab_size);
  for (int64_t start = 0; start < n_total; start += opts_.prefill_chunk_tokens) {
    const int n = static_cast<int>(std::min<int64_t>(opts_.prefill_chunk_tokens, n_total - start));
    if (store_->reserve(seq, n) != AllocStatus::kOk) return StepStatus::kOutOfBlocks;
    Group g;
    g.seq = &s;
    g.row0 = 0;
    g.n_rows = n;
    g.positions.resize(n);
    for (int r = 0; r < n; ++r) g.positions[r] = s.n_tokens + r;
    std::vector<int> logit_rows;
    float* out = nullptr;
    if (all_logits) {
      for (int r = 0; r < n; ++r) logit_rows.push_back(r);
      out = logits.data() + static_cast<size_t>(start) * c.vocab_size;
    } else if (start + n == n_total) {
      logit_rows.push_back(n - 1);
      out = logits.data();
    }
    forward(std::span<Group>(&g, 1), tokens.subspan(start, n), logit_rows, out);
    s.n_tokens += n;
    record_kv_usage(s);
  }
  return StepStatus::kOk;
}

StepStatus Engine::decode(std::span<const SeqId> seqs, std::span<const int32_t> tokens,
                          std::vector<float>& logits) {
  const ModelConfig& c = config();
  if (seqs.size() != tokens.size())
    fail("engine: decode with ", seqs.size(), " sequences but ", tokens.size(), " tokens");
  if (seqs.empty()) fail("engine: decode of an empty batch");
  std::unordered_set<SeqId> seen;
  int64_t blocks_needed = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence& s = seq_at(seqs[i]);
    if (!seen.insert(seqs[i]).second) fail("engine: sequence ", seqs[i], " appears twice in one decode batch");
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      fail("engine: token id ", tokens[i], " out of range [0, ", c.vocab_size, ")");
    if (s.n_tokens + 1 > opts_.max_tokens) return StepStatus::kContextFull;
    blocks_needed += store_->blocks_needed(seqs[i], 1);
  }
  if (blocks_needed > store_->free_blocks()) return StepStatus::kOutOfBlocks;
  for (SeqId id : seqs)
    if (store_->reserve(id, 1) != AllocStatus::kOk) return StepStatus::kOutOfBlocks;

  const int n = static_cast<int>(seqs.size());
  std::vector<Group> groups(n);
  std::vector<int> logit_rows(n);
  for (int i = 0; i < n; ++i) {
    Sequence& s = seq_at(seqs[i]);
    groups[i].seq = &s;
    groups[i].row0 = i;
    groups[i].n_rows = 1;
    groups[i].decode = true;
    groups[i].positions = {s.n_tokens};
    logit_rows[i] = i;
    s.step_set = s.step_achieved = 0;
    s.probing_step = opts_.probe && s.decode_steps % std::max(1, opts_.probe_every) == 0;
  }
  logits.resize(static_cast<size_t>(n) * c.vocab_size);
  forward(groups, tokens, logit_rows, logits.data());
  for (Group& g : groups) {
    Sequence& s = *g.seq;
    s.n_tokens += 1;
    s.decode_steps += 1;
    s.set_last = s.step_set / c.n_layers;
    s.achieved_last = s.step_achieved / c.n_layers;
    s.set_sum += s.set_last;
    s.achieved_sum += s.achieved_last;
    s.probing_step = false;
    record_kv_usage(s);
  }
  return StepStatus::kOk;
}

void Engine::forward(std::span<Group> groups, std::span<const int32_t> tokens,
                     std::span<const int> logit_rows, float* logits) {
  if (device_) {
    device_->forward(groups, tokens, logit_rows, logits);
    return;
  }
  const ModelConfig& c = config();
  const int n_rows = static_cast<int>(tokens.size());
  Scratch& sc = *scratch_;
  sc.ensure(n_rows, c);
  for (int r = 0; r < n_rows; ++r)
    to_float(model_.tok_embeddings.dtype, model_.tok_embeddings.row(tokens[r]),
             sc.x.data() + static_cast<size_t>(r) * c.dim, c.dim);
  const int dim = c.dim, hd = c.head_dim;
  const int qd = c.n_heads * hd, kvd = c.n_kv_heads * hd;
  float* x = sc.x.data();
  float* h = sc.h.data();
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = model_.layers[l];
    // attention block
    for (int r = 0; r < n_rows; ++r) rms_norm(x + r * dim, w.attn_norm.data(), dim, c.rms_eps, h + r * dim);
    linear(pool_, h, n_rows,
           {{w.wq, sc.q.data(), w.bq.empty() ? nullptr : w.bq.data()},
            {w.wk, sc.k.data(), w.bk.empty() ? nullptr : w.bk.data()},
            {w.wv, sc.v.data(), w.bv.empty() ? nullptr : w.bv.data()}},
           sc.linear);
    for (Group& g : groups) {
      const size_t qo = static_cast<size_t>(g.row0) * qd, kvo = static_cast<size_t>(g.row0) * kvd;
      begin_attention(g, l, sc.q.data() + qo, sc.k.data() + kvo, sc.v.data() + kvo, false);
      cpu_attention(g, l, sc.q.data() + qo, sc.att.data() + qo);
      end_attention(g, l, sc.att.data() + qo);
    }
    linear(pool_, sc.att.data(), n_rows, {{w.wo, sc.tmp.data(), nullptr}}, sc.linear);
    add_inplace(x, sc.tmp.data(), static_cast<int64_t>(n_rows) * dim);
    // feed-forward block, kFfnRows rows at a time (bounds the [rows, hidden] buffers)
    for (int r0 = 0; r0 < n_rows; r0 += kFfnRows) {
      const int nr = std::min(kFfnRows, n_rows - r0);
      float* xr = x + static_cast<size_t>(r0) * dim;
      for (int r = 0; r < nr; ++r) rms_norm(xr + r * dim, w.ffn_norm.data(), dim, c.rms_eps, h + r * dim);
      linear(pool_, h, nr,
             {{w.w_gate, sc.gate.data(), nullptr}, {w.w_up, sc.up.data(), nullptr}},
             sc.linear);
      swiglu(sc.gate.data(), sc.up.data(), static_cast<int64_t>(nr) * c.hidden_dim);
      linear(pool_, sc.gate.data(), nr, {{w.w_down, sc.tmp.data(), nullptr}}, sc.linear);
      add_inplace(xr, sc.tmp.data(), static_cast<int64_t>(nr) * dim);
    }
  }
  if (logit_rows.empty()) return;
  const int n_out = static_cast<int>(logit_rows.size());
  for (int i = 0; i < n_out; ++i)
    rms_norm(x + static_cast<size_t>(logit_rows[i]) * dim, model_.final_norm.data(), dim, c.rms_eps,
             h + static_cast<size_t>(i) * dim);
  linear(pool_, h, n_out, {{model_.lm_head, logits, nullptr}}, sc.linear);
}

// Phase 1 of one sequence's attention in one layer (engine.h). q: [n_rows, n_heads, hd] and
// k, v: [n_rows, n_kv_heads, hd], the projections of the group's rows.
void Engine::begin_attention(Group& g, int layer, float* q, float* k, const float* v,
                             bool text_rope_done) {
  const ModelConfig& c = config();
  Scratch& sc = *scratch_;
  Sequence& s = *g.seq;
  const int hd = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads, group = nh / nkv;
  const int qd = nh * hd, kvd = nkv * hd;
  const bool cache_pos = s.needs.rope_at_cache_position;

  g.probe_layer =
      !s.shadow.empty() &&
      std::find(opts_.probe_layers.begin(), opts_.probe_layers.end(), layer) != opts_.probe_layers.end();
  g.probing = s.probing_step && g.probe_layer;
  if (g.probing) {  // the dense reference uses original positions: the query at its text position
    g.seq->q_probe.assign(q, q + qd);
    if (cache_pos || !text_rope_done) rope_->apply(g.seq->q_probe.data(), nh, g.positions[0]);
  }
  if (cache_pos) {
    // query of row r, head h: rotated to (live tokens of its KV head before this call) + r
    sc.resident_before.resize(nkv);
    for (int kh = 0; kh < nkv; ++kh) sc.resident_before[kh] = store_->resident_tokens(s.id, layer, kh);
    for (int r = 0; r < g.n_rows; ++r)
      for (int hq = 0; hq < nh; ++hq)
        cache_rope_.rotate(q + static_cast<size_t>(r) * qd + hq * hd, sc.resident_before[hq / group] + r);
  } else if (!text_rope_done) {
    for (int r = 0; r < g.n_rows; ++r) {
      rope_->apply(q + static_cast<size_t>(r) * qd, nh, g.positions[r]);
      rope_->apply(k + static_cast<size_t>(r) * kvd, nkv, g.positions[r]);
    }
  }
  for (int r = 0; r < g.n_rows; ++r)
    store_->append(s.id, layer, g.positions[r], k + static_cast<size_t>(r) * kvd, v + static_cast<size_t>(r) * kvd);
  if (g.probe_layer) {
    ProbeShadow& sh = s.shadow[layer];
    sh.k.insert(sh.k.end(), k, k + static_cast<size_t>(g.n_rows) * kvd);
    sh.v.insert(sh.v.end(), v, v + static_cast<size_t>(g.n_rows) * kvd);
    sh.positions.insert(sh.positions.end(), g.positions.begin(), g.positions.end());
  }

  LayerStep& step = g.step;
  step.layer = layer;
  step.is_prefill = g.n_rows > 1;
  step.n_new = g.n_rows;
  step.positions = g.positions;
  step.queries = std::span<const float>(q, static_cast<size_t>(g.n_rows) * qd);
  step.cache = &store_->cache_view(s.id, layer);
  step.shape = policy_shape(c);
  g.seq->selection.select_all();
  if (s.policy) s.policy->select(step, g.seq->selection);

  const LayerKv kv = store_->layer(s.id, layer);
  if (cache_pos) {
    g.seq->key_rope_pos.resize(static_cast<size_t>(kv.n_slots) * nkv);
    cache_rank_positions(kv, g.seq->key_rope_pos.data());
  }
  if (s.needs.key_attention_mass) g.seq->key_mass.assign(static_cast<size_t>(nkv) * kv.n_slots, 0.f);
}

// Phase 2 on the CPU: attention of the group's rows over its selection.
void Engine::cpu_attention(Group& g, int layer, const float* q, float* out) {
  const ModelConfig& c = config();
  const Sequence& s = *g.seq;
  const int hd = c.head_dim, nkv = c.n_kv_heads;
  const LayerKv kv = store_->layer(s.id, layer);
  AttentionArgs a;
  a.q = q;
  a.n_rows = g.n_rows;
  a.n_heads = c.n_heads;
  a.n_kv_heads = nkv;
  a.head_dim = hd;
  a.q_positions = g.positions.data();
  a.kv = kv;
  a.selection = g.seq->selection.all ? nullptr : &g.seq->selection;
  a.scale = 1.f / std::sqrt(static_cast<float>(hd));
  if (s.needs.rope_at_cache_position) {
    a.key_rope_pos = g.seq->key_rope_pos.data();
    a.rope = &cache_rope_;
  }
  if (s.needs.key_attention_mass) a.key_mass = g.seq->key_mass.data();
  a.out = out;
  // The attention kernels thread with OpenMP (its own team, outside our pool's jobs). Short
  // attention (decode at short contexts, tiny models) stays on this thread: a fork-join costs
  // more than it saves there, and far more when the cores are shared.
  const size_t kv_bytes_read =
      size_t{2} * kv.n_slots * nkv * hd * sizeof(float) * static_cast<size_t>(g.n_rows);
  attention(a, kv_bytes_read < kAttentionParallelBytes ? 1 : pool_.size());
}

// Phase 3: what the attention read (decode), probes, the policy's observation and evictions.
// out: [n_rows, n_heads, hd] the attention output of the group's rows.
bool Engine::end_attention(Group& g, int layer, const float* out) {
  const ModelConfig& c = config();
  Scratch& sc = *scratch_;
  Sequence& s = *g.seq;
  const int nkv = c.n_kv_heads;
  const KeySelection& sel = g.seq->selection;
  const LayerKv kv = store_->layer(s.id, layer);
  if (g.decode) {
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
    s.step_achieved += achieved / nkv;
    // The set a query may read: the policy's explicit selection when it made one (landmark,
    // strided: they keep every token but read few), else its residency budget, else every
    // token seen.
    s.step_set += !sel.all  ? achieved / nkv
                  : budget < 0 ? static_cast<double>(n_seen)
                               : static_cast<double>(std::min(budget, n_seen));
  }
  if (g.probing) probe_layer(g, layer, g.seq->q_probe.data(), sel, out);

  if (s.policy) {
    StepStats stats;
    stats.n_slots = kv.n_slots;
    if (s.needs.key_attention_mass) stats.key_mass = g.seq->key_mass;
    sc.evictions.clear(nkv);
    s.policy->after_attention(g.step, stats, sc.evictions);
    if (!sc.evictions.empty()) {
      store_->evict(s.id, layer, sc.evictions);
      return true;
    }
  }
  return false;
}

// Dense attention over the shadow copy of every token seen (decode rows only), compared with
// what the policy's attention produced.
void Engine::probe_layer(Group& g, int layer, const float* q, const KeySelection& sel,
                         const float* policy_out) {
  const ModelConfig& c = config();
  Sequence& s = *g.seq;
  const ProbeShadow& sh = s.shadow[layer];
  const int hd = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads, group = nh / nkv;
  const int kvd = nkv * hd;
  const int64_t n_seen = static_cast<int64_t>(sh.positions.size());
  const bool cache_pos = s.needs.rope_at_cache_position;
  const LayerKv kv = store_->layer(s.id, layer);
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  std::vector<double> p(n_seen);
  std::vector<float> key(hd);
  std::vector<double> dense(hd);
  for (int hq = 0; hq < nh; ++hq) {
    const int kh = hq / group;
    const float* qh = q + static_cast<size_t>(hq) * hd;
    // The keys the policy read, as text positions: attended[pos] = true.
    std::unordered_set<int64_t> attended;
    auto take = [&](int b, int e) {
      for (int slot = b; slot < e; ++slot)
        if (kv.is_valid(slot, kh) && kv.position(slot, kh) <= g.positions[0]) attended.insert(kv.position(slot, kh));
    };
    if (sel.all) take(0, kv.n_slots);
    else for (const SlotRange& rg : sel.list(0, kh)) take(rg.begin, rg.end);
    // Dense scores over every seen token at original positions (with rope-at-cache-position the
    // shadow holds raw keys: rotate them at their text position, as full attention would).
    double m = -INFINITY;
    for (int64_t j = 0; j < n_seen; ++j) {
      std::memcpy(key.data(), sh.k.data() + static_cast<size_t>(j) * kvd + kh * hd, hd * sizeof(float));
      if (cache_pos) rope_->apply(key.data(), 1, sh.positions[j]);
      double dot = 0;
      for (int d = 0; d < hd; ++d) dot += static_cast<double>(qh[d]) * key[d];
      p[j] = dot * scale;
      m = std::max(m, p[j]);
    }
    double z = 0;
    for (int64_t j = 0; j < n_seen; ++j) z += (p[j] = std::exp(p[j] - m));
    double recall = 0;
    std::fill(dense.begin(), dense.end(), 0.0);
    for (int64_t j = 0; j < n_seen; ++j) {
      const double pj = p[j] / z;
      if (attended.count(sh.positions[j])) recall += pj;
      const float* vj = sh.v.data() + static_cast<size_t>(j) * kvd + kh * hd;
      for (int d = 0; d < hd; ++d) dense[d] += pj * vj[d];
    }
    double num = 0, den = 0;
    const float* po = policy_out + static_cast<size_t>(hq) * hd;
    for (int d = 0; d < hd; ++d) {
      num += (po[d] - dense[d]) * (po[d] - dense[d]);
      den += dense[d] * dense[d];
    }
    const double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    s.probe_samples += 1;
    s.recall_sum += recall;
    s.recall_min = std::min(s.recall_min, recall);
    s.err_sum += err;
    s.err_max = std::max(s.err_max, err);
    LayerProbeStats& lp = s.layer_probe[layer];
    lp.samples += 1;
    lp.recall_sum += recall;
    lp.rel_error_sum += err;
  }
}

}  // namespace kvlab
