// The Engine (engine.h): sequence lifecycle, prefill in chunks, batched decode, and the one
// layer loop over a Backend (backend.h) with the attention-step pipeline (attention_step.h).
#include "framework/engine/engine.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <unordered_set>
#include <utility>

#include "framework/core/error.h"
#include "framework/engine/attention_step.h"
#include "framework/engine/cpu_backend.h"
#include "framework/engine/device_backend.h"
#include "framework/engine/sequence.h"
#include "framework/engine/step_observers.h"

namespace kvlab {

using engine_detail::BudgetObserver;

const char* step_status_name(StepStatus status) {
  static constexpr const char* kNames[] = {"ok", "out_of_blocks", "context_full"};  // StepStatus order
  return kNames[static_cast<int>(status)];
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

// The model's RoPE as the kernels' config: layout, theta, scaling, and the per-pair frequency
// factors of GGUF rope_freqs.weight (which take precedence over the scaling parameters).
RopeConfig rope_config(const ModelConfig& c) {
  RopeConfig r;
  r.layout = c.rope_style == RopeStyle::kNeox ? RopeLayout::kNeox : RopeLayout::kInterleaved;
  r.head_dim = c.rope_dim();  // MLA: the rope part of a head only
  r.theta = c.rope_theta;
  const std::string& t = c.rope_scaling.type;
  if (t == "yarn") {  // as per-pair divisors of the unscaled frequencies (rope_inv_freq_f64)
    r.scaling = RopeScalingKind::kNone;
    const std::vector<double> inv = rope_inv_freq_f64(c);
    for (size_t i = 0; i < inv.size(); ++i)
      r.freq_factors.push_back(std::pow(double(c.rope_theta), -2.0 * double(i) / c.rope_dim()) / inv[i]);
    return r;
  }
  if (t == "none" || !c.rope_freq_factors.empty()) r.scaling = RopeScalingKind::kNone;
  else if (t == "linear") r.scaling = RopeScalingKind::kLinear;
  else if (t == "llama3") r.scaling = RopeScalingKind::kLlama3;
  else fail("model ", c.arch, ": unknown rope scaling '", t, "'");
  r.factor = c.rope_scaling.factor;
  r.low_freq_factor = c.rope_scaling.low_freq_factor;
  r.high_freq_factor = c.rope_scaling.high_freq_factor;
  r.original_max_position = c.rope_scaling.original_max_position;
  if (!c.rope_freq_factors.empty()) {
    if (static_cast<int>(c.rope_freq_factors.size()) != c.rope_dim() / 2)
      fail("model: ", c.rope_freq_factors.size(), " RoPE frequency factors, expected the RoPE dim / 2 = ", c.rope_dim() / 2);
    r.freq_factors.assign(c.rope_freq_factors.begin(), c.rope_freq_factors.end());
  }
  return r;
}

// A table for the usual contexts; positions beyond are computed on the fly (identical values).
constexpr int64_t kMaxRopeTablePositions = 32768;

KvStoreConfig store_config(const ModelConfig& c, const EngineOptions& o) {
  KvStoreConfig kc;
  kc.n_layers = c.n_layers;
  kc.n_kv_heads = c.n_kv_heads;
  kc.head_dim = c.head_dim;
  kc.block_size_tokens = o.block_size_tokens;
  kc.format = o.kv_format;
  kc.fp8_scale = o.kv_fp8_scale;
  kc.group_size = o.kv_group_size;
  kc.residual = o.kv_residual;
  kc.values_alias_keys = c.mla();  // the latent row [c ; k_rope] is the key and (its first r features) the value
  kc.per_head_tables = o.kv_per_head_tables;
  const size_t block_bytes = kv_block_bytes(kc);  // one head's with per-head tables
  const size_t blocks_per_seq = static_cast<size_t>(c.n_layers) * (kc.per_head_tables ? c.n_kv_heads : 1) *
                                ((o.max_tokens + o.block_size_tokens - 1) / o.block_size_tokens);
  kc.budget_bytes = o.kv_budget_bytes ? o.kv_budget_bytes : blocks_per_seq * o.max_batch * block_bytes;
  return kc;
}

}  // namespace

namespace engine_detail {

LayerRopes::LayerRopes(const ModelConfig& c, int64_t max_table_positions) {
  const int64_t n = std::min<int64_t>(c.max_seq_len, max_table_positions);
  global_ = RopeTable(rope_config(c), n);
  local_ = c.local_layers;
  has_local_ = c.rope_local_theta > 0 && !c.local_layers.empty();
  if (has_local_) {  // the local layers: their own base, no scaling (HF Gemma 3 "default" rope type)
    ModelConfig lc = c;
    lc.rope_theta = c.rope_local_theta;
    lc.rope_scaling = RopeScaling{};
    lc.rope_freq_factors.clear();
    local_table_ = RopeTable(rope_config(lc), n);
  }
}

}  // namespace engine_detail

Engine::Engine(const Model& model, const EngineOptions& opts)
    : model_(model), opts_(opts), pool_(opts.threads) {
  const ModelConfig& c = model.config;
  if (c.dim <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 ||
      c.n_heads % c.n_kv_heads != 0 || c.vocab_size <= 0 || c.max_seq_len <= 0)
    fail("engine: model config has an invalid shape (dim ", c.dim, ", layers ", c.n_layers,
         ", heads ", c.n_heads, "/", c.n_kv_heads, ", head_dim ", c.head_dim, ")");
  if (static_cast<int>(model.layers.size()) != c.n_layers)
    fail("engine: model has ", model.layers.size(), " layers, config says ", c.n_layers);
  if (opts.block_size_tokens <= 0) fail("engine: block_size_tokens must be > 0");
  if (opts.device != Device::kCpu && opts.kv_format != KvFormat::kF32)
    fail("engine: KV format ", kv_format_name(opts.kv_format), " is not available with the ", device_name(opts.device),
         " backend (its kernels read f32 host pages; choose the device pool's precision with the device dtype)");
  if (opts.kv_per_head_tables && opts.device != Device::kCpu)
    fail("engine: per-head block tables (kv.block_tables: per_head) are not available with the ", device_name(opts.device),
         " backend (its KV mirror keeps one block table per layer; use device cpu or kv.block_tables: per_layer)");
  if (c.mla() && opts.device != Device::kCpu)
    fail("engine: multi-head latent attention (", c.arch, ", MLA) is not supported by the ", device_name(opts.device),
         " backend yet (use device cpu)");
  if (c.mla() && kv_format_is_kivi(opts.kv_format))
    fail("engine: KV format ", kv_format_name(opts.kv_format), " cannot hold MLA's latent cache (its values are the "
         "keys' rows; KIVI quantises keys per channel and values per token): choose f32, f16, bf16, int8 or fp8");
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

  store_ = std::make_unique<KvStore>(store_config(c, opts_));
  rope_ = engine_detail::LayerRopes(c, kMaxRopeTablePositions);
  step_ = std::make_unique<engine_detail::AttentionStep>(
      c, *store_, rope_, opts_.kv_fp8_scale_from_prompt && kv_format_has_head_scale(opts_.kv_format));
  budget_ = std::make_unique<BudgetObserver>();
  step_->add_observer(budget_.get());
  if (opts_.probe) {
    probe_ = std::make_unique<engine_detail::ProbeObserver>(c, rope_, opts_.probe_layers);
    step_->add_observer(probe_.get());
  }
  backend_ = opts_.device == Device::kCpu ? engine_detail::make_cpu_backend(model_, pool_, *store_, rope_)
                                          : engine_detail::make_device_backend(model_, opts_, *store_, rope_.global());
}

Engine::~Engine() = default;

const Engine::Sequence& Engine::seq_at(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) fail("engine: unknown sequence ", seq);
  return *it->second;
}
Engine::Sequence& Engine::seq_at(SeqId seq) { return const_cast<Sequence&>(std::as_const(*this).seq_at(seq)); }

SeqId Engine::start_sequence(std::unique_ptr<AttentionPolicy> policy, uint64_t seed) {
  if (policy && policy->needs().rope_at_cache_position && config().mla())
    fail("engine: the policy rotates keys at their cache position (rope_at_cache_position), "
         "which multi-head latent attention (", config().arch, ") does not support: its cache rows rotate only their "
         "last ", config().qk_rope_head_dim, " features");
  auto s = std::make_unique<Sequence>();
  s->id = store_->create_sequence();
  s->seed = seed;
  if (policy) s->needs = policy->needs();
  if (s->needs.page_stats) store_->set_page_stats(s->id, true);
  s->policy = std::move(policy);
  if (probe_) probe_->start(*s);
  const SeqId id = s->id;
  seqs_[id] = std::move(s);
  return id;
}

void Engine::end_sequence(SeqId seq) {
  seq_at(seq);
  backend_->end_sequence(seq);
  store_->free_sequence(seq);
  seqs_.erase(seq);
}

SeqId Engine::fork(SeqId seq, std::unique_ptr<AttentionPolicy> child_policy) {
  const Sequence& parent = seq_at(seq);
  // The device mirrors pages per block id; a shared block would need per-sequence metadata.
  if (opts_.device != Device::kCpu)
    fail("engine: fork is not supported with device ", device_name(opts_.device), " yet (use device cpu)");
  if (parent.policy && !child_policy)
    fail("engine: fork of sequence ", seq, " which has an attention policy needs a fresh policy "
         "for the child (policy state cannot be copied)");
  if (child_policy && child_policy->needs().rope_at_cache_position && config().mla())
    fail("engine: fork: the child's policy needs rope_at_cache_position, which multi-head latent "
         "attention does not support");
  if (child_policy && parent.policy &&
      child_policy->needs().rope_at_cache_position != parent.needs.rope_at_cache_position)
    fail("engine: fork: the child's policy stores keys differently (rope_at_cache_position)");
  auto s = std::make_unique<Sequence>();
  s->id = store_->fork(seq);
  if (child_policy) s->needs = child_policy->needs();
  store_->set_page_stats(s->id, s->needs.page_stats);  // the fork copied the parent's setting
  s->policy = std::move(child_policy);
  s->seed = parent.seed;
  s->n_tokens = parent.n_tokens;
  if (probe_) probe_->fork(parent, *s);  // the parent's shadow copies; counts start at 0
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
  st.attended_set_last = s.attended.set_last;
  st.attended_achieved_last = s.attended.achieved_last;
  if (s.decode_steps > 0) {
    st.attended_set_mean = s.attended.set_sum / s.decode_steps;
    st.attended_achieved_mean = s.attended.achieved_sum / s.decode_steps;
  }
  st.resident_at_prompt_end = s.resident_at_prompt_end;
  st.resident_bytes_at_prompt_end = s.resident_bytes_at_prompt_end;
  st.tokens_at_prompt_end = s.tokens_at_prompt_end;
  st.blocks_current = s.blocks_current;
  st.blocks_peak = s.blocks_peak;
  st.kv_bytes_current = static_cast<size_t>(s.blocks_current) * store_->block_bytes();
  st.kv_bytes_peak = static_cast<size_t>(s.blocks_peak) * store_->block_bytes();
  const engine_detail::ProbeState& p = s.probe;
  st.probe_samples = p.samples;
  if (p.samples > 0) {
    st.probe_recall_mean = p.recall_sum / p.samples;
    st.probe_recall_min = p.recall_min;
    st.probe_rel_error_mean = p.err_sum / p.samples;
    st.probe_rel_error_max = p.err_max;
  }
  if (opts_.probe)
    for (int l : opts_.probe_layers) st.probe_per_layer.push_back(p.layer[l]);
  return st;
}

void Engine::record_kv_usage(Sequence& s) {
  s.blocks_current = store_->sequence_blocks(s.id);
  s.blocks_peak = std::max(s.blocks_peak, s.blocks_current);
}

// ---- the forward pass -------------------------------------------------------------------------

// Chunk lengths of a prefill of n tokens: chunk_tokens each, the last one lengthened to
// min(n, window) rows when the call ends the prompt and the policy observes a window.
static std::vector<int64_t> prefill_chunks(int64_t n, int64_t chunk_tokens, int64_t window) {
  int64_t last = n % chunk_tokens == 0 ? std::min(n, chunk_tokens) : n % chunk_tokens;
  last = std::max(last, std::min(n, window));
  std::vector<int64_t> chunks;
  for (int64_t start = 0; start < n - last; start += chunk_tokens)
    chunks.push_back(std::min(chunk_tokens, n - last - start));
  chunks.push_back(last);
  return chunks;
}

StepStatus Engine::prefill(SeqId seq, std::span<const int32_t> tokens, std::vector<float>& logits,
                           bool all_logits, bool prompt_end) {
  Sequence& s = seq_at(seq);
  const ModelConfig& c = config();
  if (tokens.empty()) fail("engine: prefill of sequence ", seq, " with no tokens");
  for (int32_t t : tokens)
    if (t < 0 || t >= c.vocab_size) fail("engine: token id ", t, " out of range [0, ", c.vocab_size, ")");
  if (s.n_tokens + static_cast<int64_t>(tokens.size()) > opts_.max_tokens) return StepStatus::kContextFull;
  const int64_t n_total = static_cast<int64_t>(tokens.size());
  logits.resize(static_cast<size_t>(all_logits ? n_total : 1) * c.vocab_size);
  const std::vector<int64_t> chunks =
      prefill_chunks(n_total, opts_.prefill_chunk_tokens, prompt_end ? s.needs.observation_window : 0);
  int64_t start = 0;
  for (const int64_t chunk : chunks) {
    const int n = static_cast<int>(chunk);
    if (store_->reserve(seq, n) != AllocStatus::kOk) return StepStatus::kOutOfBlocks;
    Group g;
    g.seq = &s;
    g.row0 = 0;
    g.n_rows = n;
    g.prompt_end = prompt_end && start + n == n_total;
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
    start += n;
  }
  if (prompt_end) {
    s.resident_at_prompt_end.clear();
    s.resident_bytes_at_prompt_end.clear();
    s.tokens_at_prompt_end = s.n_tokens;
    for (int l = 0; l < c.n_layers; ++l)
      for (int h = 0; h < c.n_kv_heads; ++h) {
        s.resident_at_prompt_end.push_back(store_->resident_tokens(seq, l, h));
        s.resident_bytes_at_prompt_end.push_back(static_cast<int64_t>(store_->head_bytes(seq, l, h)));
      }
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
    BudgetObserver::begin_step(s);
    s.probe.probing_step = opts_.probe && s.decode_steps % std::max(1, opts_.probe_every) == 0;
  }
  logits.resize(static_cast<size_t>(n) * c.vocab_size);
  forward(groups, tokens, logit_rows, logits.data());
  for (Group& g : groups) {
    Sequence& s = *g.seq;
    s.n_tokens += 1;
    s.decode_steps += 1;
    BudgetObserver::end_step(s, c.n_layers);
    s.probe.probing_step = false;
    record_kv_usage(s);
  }
  return StepStatus::kOk;
}

// One layer loop for every backend (backend.h): the dense work and the attention on the
// backend, the attention step's host phases (attention_step.h) around it.
void Engine::forward(std::span<Group> groups, std::span<const int32_t> tokens,
                     std::span<const int> logit_rows, float* logits) {
  const ModelConfig& c = config();
  const size_t qd = size_t(c.n_heads) * c.head_dim, kvd = size_t(c.n_kv_heads) * c.head_dim;
  // RoPE positions of the rows: the text position, or -1 (left raw: the query is rotated at its
  // cache rank by the pipeline, keys at read time) for policies with rope_at_cache_position.
  std::vector<int32_t> rope_pos(tokens.size());
  bool need_q = false, need_out = false;
  for (const Group& g : groups) {
    const bool cache_pos = g.seq->needs.rope_at_cache_position;
    for (int r = 0; r < g.n_rows; ++r) {
      if (g.positions[r] > INT32_MAX) fail("engine: text position ", g.positions[r], " exceeds int32");
      rope_pos[g.row0 + r] = cache_pos ? -1 : static_cast<int32_t>(g.positions[r]);
    }
    const PolicyNeeds& needs = g.seq->needs;
    need_q = need_q || needs.queries || needs.observation_window > 0 || g.seq->probe.probing_step ||
             cache_pos;
    need_out = need_out || step_->wants_output(*g.seq);
  }
  backend_->begin_call(groups, tokens);
  for (int l = 0; l < c.n_layers; ++l) {
    const engine_detail::HostRows rows = backend_->qkv(l, rope_pos, need_q);
    for (Group& g : groups) step_->prepare(g, l, rows.q + g.row0 * qd, rows.k + g.row0 * kvd, rows.v + g.row0 * kvd);
    backend_->attend(groups, l);
    const float* out = backend_->attention_output(need_out);
    for (Group& g : groups)
      if (step_->finish(g, l, out + g.row0 * qd)) backend_->evicted(g, l);
    backend_->finish_layer(l);
  }
  if (!logit_rows.empty()) backend_->logits(logit_rows, logits);
}

}  // namespace kvlab
