// Engine: the Llama-family forward pass, in fp32 on the CPU (or on a device), over the paged KV
// store, with a per-sequence attention policy. The Engine is the sequences' lifecycle
// (start, fork, end; prefill in chunks, batched decode) and one layer loop (engine.cpp) over a
// Backend for the dense work and the attention (backend.h: CPU, emulated, CUDA) and the
// attention-step pipeline (attention_step.h) with its observers (probes, budget accounting).
// docs/architecture.md walks through one decode step and one prefill chunk.
//
// Per layer l and call (rows = the new tokens; a prefill chunk has many rows of one sequence,
// a decode step one row for each sequence of the batch):
//   h = RMSNorm(x) * attn_norm
//   q = Wq h (+bq), k = Wk h (+bk), v = Wv h (+bv)       [rows, n_heads|n_kv_heads, head_dim]
//   RoPE(q), RoPE(k) at the text position (rope_style from the model), then, per sequence:
//     append k, v to the store; policy.select; attention over the selection (GQA: query head h
//     reads KV head h / G); policy.after_attention (with key mass when asked); store.evict.
//     With needs().rope_at_cache_position the keys are stored raw and rotated at read time to
//     their rank among the cached tokens, and the query is rotated to the number of cached
//     tokens before it (StreamingLLM); causality still compares text positions.
//   x += Wo attn
//   h = RMSNorm(x) * ffn_norm;  x += W_down (silu(W_gate h) * (W_up h))
// then logits = lm_head RMSNorm(x) * final_norm.
// The dense layers (dense_layers.h, kernels/cpu/linear.h) read the weights once per call for all
// rows: matvec kernels for a few rows (decode), OpenBLAS sgemm for many (prefill). Weights stay
// in their stored dtype.
//
// Contract: a sequence's tokens are fed in order (prefill and decode may alternate); a call that
// would pass EngineOptions::max_tokens (default the model's max_seq_len) returns kContextFull
// and changes nothing; one that finds
// no free KV block returns kOutOfBlocks: decode then changes nothing, prefill keeps the chunks
// fed before the one that found no room (n_tokens() says how far it got). Bad token ids, unknown sequences and a
// batch naming one sequence twice throw kvlab::Error. The Engine keeps a reference to the Model,
// which must outlive it. Not thread-safe (one caller); it uses its own thread pool inside.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "framework/engine/device.h"
#include "framework/kv/kv_store.h"
#include "framework/model/model.h"
#include "framework/policy/policy.h"
#include "framework/engine/layer_rope.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/thread_pool.h"

namespace kvlab {

namespace engine_detail {
struct Sequence;  // sequence.h
struct Group;
class AttentionStep;   // attention_step.h
class Backend;         // backend.h
class BudgetObserver;  // step_observers.h
class ProbeObserver;
}  // namespace engine_detail

enum class StepStatus { kOk, kOutOfBlocks, kContextFull };
const char* step_status_name(StepStatus status);  // "ok" | "out_of_blocks" | "context_full"

// The model shape policies are created for (the one conversion: engine, runner, CLI, tests).
PolicyModelShape policy_shape(const ModelConfig& config);

struct EngineOptions {
  int threads = 0;               // 0 = all cores
  int block_size_tokens = 16;
  size_t kv_budget_bytes = 0;    // 0 = room for max_tokens tokens x max_batch
  // How the host store keeps K and V (kernels/common/kv_format.h); f32 is exact. The device
  // backends take f32 only (their pool converts to device_dtype): another format with device !=
  // kCpu is an Error at construction.
  KvFormat kv_format = KvFormat::kF32;
  float kv_fp8_scale = 1.f;      // fp8 formats: the scale of every (layer, KV head)
  // fp8 formats: instead, each sequence's scale of (layer, KV head), K and V apart, is
  // max |x| / the format's largest value over the rows of its first forward call (the prompt's
  // first prefill chunk), as vLLM's calculate_kv_scales takes them from the first forward pass;
  // later rows past that range saturate. A fork keeps its parent's.
  bool kv_fp8_scale_from_prompt = false;
  int kv_group_size = 32;        // int4 / int2 (KIVI): G and R (KvStoreConfig)
  int kv_residual = 128;
  // One block table per KV head (KvStore "Per-head block tables"): per-head budgets (adakv, duo)
  // then differ in bytes resident, not only in tokens; outputs are bit-identical either way.
  // CPU backend only (Error otherwise), not with KIVI formats.
  bool kv_per_head_tables = false;
  int max_batch = 1;             // sizes the default KV budget (decode takes any batch size)
  // Most tokens one sequence may take; 0 = the model's max_seq_len (then options() reports it).
  // Past max_seq_len the model sees RoPE positions it was not trained on -- what a StreamingLLM
  // experiment shows for dense and window attention -- while rope_at_cache_position policies
  // keep every position inside their cache. Sizes the default KV budget with max_batch.
  int64_t max_tokens = 0;
  int prefill_chunk_tokens = 256;
  bool probe = false;            // attention recall / output error probes (below)
  int probe_every = 16;          // probe every N-th decode step of a sequence
  std::vector<int> probe_layers{}; // layers probed; empty = first, middle and last
  // Where the dense layers and attention run (device.h): kCpu (the reference), kCuda (the GPU,
  // device_backend.h; needs a kvlab built with CUDA and a GPU, else Error) or kEmulated (the
  // device path with CPU loops in place of the kernels: tests). Sequences, policies and the
  // paged store's bookkeeping stay on the host either way.
  Device device = Device::kCpu;
  // Device only: bf16 (weights, KV pages and GEMM inputs in bf16, fp32 accumulation: the fast
  // path) or f32 (fp32 throughout: agrees with the CPU path to float tolerance).
  DeviceDtype device_dtype = DeviceDtype::kBf16;
  // cuda: most query rows per decode-kernel launch (prefill chunks that read per-row selections
  // or need key mass run as decode requests, in several launches); bounds its workspace.
  int device_launch_rows = 256;
};

// Per-sequence counters. "Attended" counts, for one decode step, the keys one query head read,
// averaged over layers and query heads; "set" is what the policy allows: its explicit
// selection when it made one (the keys it names that exist and are causal), else its budget
// (budget_tokens(layer, n_seen)), else every token seen; "achieved" what the attention really
// read.
// One probed layer's probe sums (EngineOptions::probe): `samples` (step, query head) pairs of
// that layer, and the sums of their recall and rel_error (defined under SequenceStats). Sums
// rather than means so several sequences pool by adding.
struct LayerProbeStats {
  int layer = 0;
  int64_t samples = 0;
  double recall_sum = 0, rel_error_sum = 0;
  double recall_mean() const;     // recall_sum / samples; NaN without samples
  double rel_error_mean() const;  // rel_error_sum / samples; NaN without samples
};

struct SequenceStats {
  int64_t n_tokens = 0;            // tokens fed so far
  int64_t decode_steps = 0;
  double attended_set_last = 0, attended_achieved_last = 0;
  double attended_set_mean = 0, attended_achieved_mean = 0;   // over decode steps
  int64_t blocks_current = 0, blocks_peak = 0;                // this sequence's block tables
  size_t kv_bytes_current = 0, kv_bytes_peak = 0;             // blocks x block bytes
  // Probe (EngineOptions::probe): over the probed (step, layer, query head) triples,
  //   recall    = sum of dense attention's probabilities of the keys the policy let it read,
  //               dense attention taken over every token of the layer seen so far, evicted
  //               ones included;
  //   rel_error = |o_policy - o_dense|_2 / |o_dense|_2.
  int64_t probe_samples = 0;
  double probe_recall_mean = 0, probe_recall_min = 1, probe_rel_error_mean = 0,
         probe_rel_error_max = 0;
  // The same per probed layer, ascending (EngineOptions::probe_layers after defaulting); empty
  // when probes are off. Pooled: sum of samples = probe_samples, and
  // sum of recall_sum / probe_samples = probe_recall_mean (likewise rel_error).
  std::vector<LayerProbeStats> probe_per_layer;
  // Achieved memory (POLICIES.md 9): tokens resident per (layer, KV head), element
  // l * n_kv_heads + h, right after the prefill that ended the prompt (Engine::prefill
  // prompt_end), i.e. after a prompt-end policy compressed; empty when no prompt end was fed.
  std::vector<int64_t> resident_at_prompt_end;
  // Bytes of the KV pool holding each (layer, KV head)'s rows then (KvStore::head_bytes; they
  // differ per head only with per-head block tables), same order.
  std::vector<int64_t> resident_bytes_at_prompt_end;
  int64_t tokens_at_prompt_end = 0;  // tokens fed when the prompt ended
};

class Engine {
 public:
  Engine(const Model& model, const EngineOptions& opts);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ModelConfig& config() const { return model_.config; }
  const EngineOptions& options() const { return opts_; }
  int threads() const { return pool_.size(); }

  // nullptr policy = full attention. The engine owns the policy for the sequence's lifetime.
  // `seed`: the sample's seed, handed to the policy in every LayerStep (randomised policies).
  SeqId start_sequence(std::unique_ptr<AttentionPolicy> policy = nullptr, uint64_t seed = 0);
  void end_sequence(SeqId seq);
  // A copy of `seq` sharing its KV blocks (copy-on-write). A policy's state cannot be copied,
  // so a sequence with a policy needs `child_policy` (a fresh one) and throws Error without it.
  SeqId fork(SeqId seq, std::unique_ptr<AttentionPolicy> child_policy = nullptr);
  int64_t n_tokens(SeqId seq) const;  // tokens fed so far (text position of the next token)

  // Feeds tokens through the model in chunks of prefill_chunk_tokens. logits: [vocab] of the
  // last token, or [tokens.size(), vocab] when all_logits. An empty span is an Error.
  // prompt_end: the last of these tokens ends the prompt; the policy sees LayerStep::prompt_end
  // on the last chunk, which is made at least PolicyNeeds::observation_window rows long (the
  // chunk before it shrinks) so an observation window lies inside one chunk.
  StepStatus prefill(SeqId seq, std::span<const int32_t> tokens, std::vector<float>& logits,
                     bool all_logits = false, bool prompt_end = false);
  // One token for each sequence of the batch (distinct sequences); logits [batch, vocab]. The
  // dense layers read each weight once for the whole batch.
  StepStatus decode(std::span<const SeqId> seqs, std::span<const int32_t> tokens,
                    std::vector<float>& logits);

  const KvStore& kv() const { return *store_; }
  SequenceStats sequence_stats(SeqId seq) const;

 private:
  using Sequence = engine_detail::Sequence;
  using Group = engine_detail::Group;  // rows of one forward call that belong to one sequence

  Sequence& seq_at(SeqId seq);
  const Sequence& seq_at(SeqId seq) const;
  // The layer loop: one row per token (tokens [n_rows]) grouped by sequence; writes logits of
  // the rows listed in `logit_rows` into logits [logit_rows.size(), vocab].
  void forward(std::span<Group> groups, std::span<const int32_t> tokens,
               std::span<const int> logit_rows, float* logits);
  void record_kv_usage(Sequence& s);

  const Model& model_;
  EngineOptions opts_;
  ThreadPool pool_;
  std::unique_ptr<KvStore> store_;
  // RoPE at insertion, of queries at their cache rank, and at read (per layer: Gemma 3)
  engine_detail::LayerRopes rope_;
  std::unordered_map<SeqId, std::unique_ptr<Sequence>> seqs_;
  std::unique_ptr<engine_detail::AttentionStep> step_;
  std::unique_ptr<engine_detail::BudgetObserver> budget_;
  std::unique_ptr<engine_detail::ProbeObserver> probe_;  // set when opts.probe
  std::unique_ptr<engine_detail::Backend> backend_;
};

}  // namespace kvlab
