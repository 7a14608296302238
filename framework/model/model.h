// A Llama-family model loaded from any of the supported files, with weights kept as stored.
//
// Supported inputs (load_model auto-detects):
//   - GGUF v2/v3 (*.gguf): architectures `llama` (Llama 1/2/3, Mistral, TinyLlama, SmolLM),
//     `qwen2`, `qwen3`, `gemma2`, `gemma3` (text only) and `deepseek2` (multi-head latent attention,
//     dense FFN layers only); tensors F32/F16/BF16/Q8_0 and the GGUF block types Q4_0 ... Q6_K (kernels/cpu/quant_blocks.h); hyper-parameters from the `<arch>.*` metadata;
//     Llama-3 RoPE scaling from the `rope_freqs.weight` tensor.
//   - A Hugging Face directory: config.json (LlamaForCausalLM, MistralForCausalLM,
//     Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM,
//     DeepseekV2ForCausalLM / DeepseekV3ForCausalLM with dense FFN layers) + model.safetensors or shards listed in model.safetensors.index.json;
//     dtypes F32/F16/BF16.
//   - llama2.c checkpoints (*.bin, legacy v0 layout: 7 int32 header, float32 weights; a negative
//     vocab_size in the header means an unshared classifier; or a version 1 "ak42" export).
//     tokenizer.bin next to it.
//
// RoPE: weights are never permuted on load. GGUF `llama` converters and llama2.c (Meta layout)
// store Q/K rows so that RoPE rotates pairs (2i, 2i+1) of each head (RopeStyle::kInterleaved);
// HF checkpoints and GGUF `qwen2`/`qwen3` rotate pairs (i, i + head_dim/2) (RopeStyle::kNeox). Within
// each head, interleaved row 2i+h equals rotate-half row h*head_dim/2 + i, so the same model
// gives the same logits from either file as long as the engine honours `rope_style`.
//
// Contract: every tensor's shape is checked against the config; any problem (missing file or
// tensor, wrong shape, unsupported architecture or dtype, truncated data) throws kvlab::Error
// "<file>: <problem>" naming the tensor or key and both shapes where relevant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/dtype.h"
#include "framework/tokenizer/tokenizer.h"

namespace kvlab {

enum class RopeStyle {
  kInterleaved,  // GGUF llama, llama2.c, Meta: rotates pairs (2i, 2i+1) of a head
  kNeox          // HF, GGUF qwen2: rotates pairs (i, i + head_dim/2)
};
const char* rope_style_name(RopeStyle style);  // "interleaved" | "neox"

struct RopeScaling {
  std::string type = "none";  // "none" | "linear" | "llama3" | "yarn" (MLA models only)
  float factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  int original_max_position = 8192;
  // yarn (DeepSeek's: HF modeling_deepseek.py DeepseekV2YarnRotaryEmbedding and softmax_scale;
  // llama.cpp's ggml_rope_yarn_corr_dims / rope_yarn_ramp and build_deepseek2's kq_scale):
  float beta_fast = 32, beta_slow = 1, mscale = 1, mscale_all_dim = 0;
};

// The feed-forward block's gate activation: x = W_down (act(W_gate h) * (W_up h)).
enum class FfnActivation {
  kSilu,     // SwiGLU (Llama, Qwen)
  kGeluTanh  // GeGLU with the tanh approximation of GELU (Gemma: gelu_pytorch_tanh)
};

struct ModelConfig {
  std::string arch;  // "llama" | "qwen2" | "qwen3" | "gemma2" | "gemma3" | "deepseek2"
  int dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, hidden_dim = 0,
      vocab_size = 0, max_seq_len = 0;
  float rope_theta = 10000, rms_eps = 1e-5f;
  RopeScaling rope_scaling;
  RopeStyle rope_style = RopeStyle::kInterleaved;
  bool qkv_bias = false, tied_embeddings = false;
  // Qwen3: each head's q and k RMS-normalised over head_dim (weights q_norm, k_norm, eps rms_eps)
  // after the projection and before RoPE.
  bool qk_norm = false;
  // Per-pair divisors of the RoPE frequencies [head_dim/2] from a GGUF `rope_freqs.weight`
  // (how llama.cpp stores Llama-3 scaling); empty otherwise. rope_inv_freq() applies them.
  std::vector<float> rope_freq_factors;
  // Mistral v0.1's config.json `sliding_window` (informative; 0 = none), or Gemma's window of its
  // local layers (enforced on the layers local_layers marks).
  int sliding_window = 0;

  // Gemma 2 / 3 (defaults: the Llama family, unchanged).
  // Sliding-window layers [n_layers]: 1 = the query at position i reads key j only if
  // i - j < sliding_window (HF masking_utils' sliding_window_overlay, llama.cpp's n_swa mask);
  // empty = every layer global. Gemma 2: even layers local; Gemma 3: layer i global iff
  // (i + 1) % 6 == 0.
  std::vector<uint8_t> local_layers;
  // Gemma 3: the local layers' RoPE base (rope_local_base_freq), without rope scaling; the global
  // layers use rope_theta and rope_scaling. 0 = every layer uses rope_theta (and the scaling).
  float rope_local_theta = 0;
  bool embed_scale = false;    // x = embedding * sqrt(dim), the factor rounded to float32 (Gemma)
  // Gemma: post_attn_norm on the attention output and post_ffn_norm on the FFN output before each
  // residual add (ffn_norm is then the pre-FFN norm). The norm weights the engine reads are the
  // multipliers: Gemma's (1 + w) is added on load from HF; llama.cpp's converter stores 1 + w.
  bool sandwich_norms = false;
  FfnActivation ffn_activation = FfnActivation::kSilu;
  // Attention scores are s = query_scale * q.k; 0 = 1/sqrt(head_dim). Gemma:
  // query_pre_attn_scalar^-1/2.
  float query_scale = 0;
  // Gemma 2 soft-capping: s <- cap * tanh(s / cap) on attention scores and on the final logits;
  // 0 = none.
  float attn_softcap = 0, final_softcap = 0;

  // Multi-head latent attention (DeepSeek-V2/V3, GGUF `deepseek2`); kv_lora_rank = 0: none.
  // Per layer and token (HF modeling_deepseek.py's DeepseekV2Attention; r = kv_lora_rank):
  //   q = W_qb (RMSNorm(W_qa h) * q_a_norm)  (q_lora_rank = 0: q = W_q h)  [n_heads, nope + rope]
  //   [c_raw ; k_rope] = W_kva h,  c = RMSNorm(c_raw) * kv_a_norm               [r + rope]
  //   per head: K = [W_UK c ; k_rope], V = W_UV c  (W_UK, W_UV: the head's nope and v rows of W_kvb)
  // The engine runs it absorbed, and head_dim / n_kv_heads describe that attention: one KV head
  // of head_dim = r + qk_rope_head_dim features, the cache row [c ; RoPE(k_rope)] (its first r
  // features are also the value row), the query per head [W_UK^T q_nope ; RoPE(q_rope)], the
  // output per head W_UV (sum_j p_j c_j); query_scale = 1/sqrt(qk_nope + qk_rope). RoPE rotates
  // only the last qk_rope_head_dim features (rope_dim()), pairs (2i, 2i+1).
  int q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool mla() const { return kv_lora_rank > 0; }
  // Features RoPE rotates per head: qk_rope_head_dim for MLA, else head_dim.
  int rope_dim() const { return mla() ? qk_rope_head_dim : head_dim; }

  // 2 (K and V) * n_layers * n_kv_heads * head_dim * bytes per element (Q8_0: 34/32 bytes,
  // total rounded up to a whole byte); MLA: one row per layer (the values are the keys' first
  // kv_lora_rank features), n_layers * (kv_lora_rank + qk_rope_head_dim) * bytes.
  size_t kv_bytes_per_token(DType kv_dtype) const;
  // What a cache of the model's per-head keys and values would take (the model-info comparison):
  // MLA n_layers * n_heads * (qk_nope + qk_rope + v_head_dim) * bytes, else kv_bytes_per_token.
  size_t mha_kv_bytes_per_token(DType kv_dtype) const;
};

// The attention window of layer `layer`: sliding_window on a local layer, 0 (unbounded) else.
int layer_window(const ModelConfig& config, int layer);
// The score scale: query_scale, or 1/sqrt(head_dim) when it is 0.
float attention_scale(const ModelConfig& config);

// The RoPE inverse frequencies [d/2], d = rope_dim(): the angle of pair i at position p is
// p * inv_freq[i], with inv_freq[i] = rope_theta^(-2i/d), then
//   linear: / factor;   llama3 (HF `_compute_llama3_parameters`, wavelen = 2 pi / inv_freq):
//     wavelen < original_max_position / high_freq_factor -> unchanged,
//     wavelen > original_max_position / low_freq_factor  -> / factor,
//     otherwise s = (original_max_position / wavelen - low) / (high - low):
//       inv_freq * ((1 - s) / factor + s);
//   rope_freq_factors (GGUF): / rope_freq_factors[i] (takes precedence over the parameters).
//   yarn (d = rope_dim(), ln natural): inv_extra = theta^(-2i/d), inv_inter = inv_extra / factor,
//     dim(n) = d ln(original_max_position / (2 pi n)) / (2 ln theta),
//     low = max(floor(dim(beta_fast)), 0), high = min(ceil(dim(beta_slow)), d - 1),
//     ramp = clamp((i - low) / max(high - low, 0.001), 0, 1),
//     inv = inv_inter * ramp + inv_extra * (1 - ramp);
//     the scores are multiplied by yarn_attention_mscale()^2 (folded into query_scale by the
//     loader); a cos/sin magnitude yarn_rope_mscale() != 1 (HF mscale != mscale_all_dim) is
//     refused by validation (GGUF's form has none).
// Computed in double, rounded once to float (rope_inv_freq_f64: not rounded).
std::vector<float> rope_inv_freq(const ModelConfig& config);
std::vector<double> rope_inv_freq_f64(const ModelConfig& config);
// YaRN's magnitudes, m(s, x) = 1 if s <= 1 else 0.1 x ln(s) + 1 (HF yarn_get_mscale):
// the cos/sin multiplier m(factor, mscale) / m(factor, mscale_all_dim), and the attention's
// m(factor, mscale_all_dim) (llama.cpp: 1 + yarn_log_multiplier ln(factor)); 1 without yarn.
double yarn_rope_mscale(const ModelConfig& config);
double yarn_attention_mscale(const ModelConfig& config);

// Row r of w as float32 (out[cols]).
void weight_row_to_float(const WeightView& w, int64_t r, float* out);
// The whole matrix as float32 [rows * cols] (tests, references; not for the hot path).
std::vector<float> weight_to_float(const WeightView& w);

struct LayerWeights {
  std::vector<float> attn_norm;     // [dim]
  WeightView wq, wk, wv, wo;        // [n_heads*hd, dim], [n_kv*hd, dim], [n_kv*hd, dim], [dim, n_heads*hd]
  std::vector<float> bq, bk, bv;    // [n_heads*hd], [n_kv*hd], [n_kv*hd]; empty without QKV bias
  std::vector<float> q_norm, k_norm;  // [hd] each; empty without qk_norm
  std::vector<float> ffn_norm;      // [dim] (Gemma: pre_feedforward_layernorm)
  std::vector<float> post_attn_norm, post_ffn_norm;  // [dim] each; empty without sandwich_norms
  WeightView w_gate, w_up, w_down;  // [hidden, dim], [hidden, dim], [dim, hidden]
  // MLA (ModelConfig::mla(); wk, wv unused; wq [n_heads*(nope+rope), dim] only without q_lora;
  // wo [dim, n_heads*v_head_dim]):
  WeightView wq_a, wq_b;            // [q_lora, dim], [n_heads*(nope+rope), q_lora]; empty without q_lora
  std::vector<float> q_a_norm;      // [q_lora]
  WeightView wkv_a;                 // [kv_lora + rope, dim]: rows c_raw, then k_rope
  std::vector<float> kv_a_norm;     // [kv_lora]
  WeightView wkv_b;                 // [n_heads*(nope+v), kv_lora]: per head W_UK rows, then W_UV rows
};

struct LoadOptions {
  // Convert every weight matrix on load: "keep" (as stored) | "f32" | "f16" | "bf16" | "q8_0" |
  // "q4_0" | "q4_1" | "q5_0" | "q5_1" | "q4_k" | "q5_k" | "q6_k" (kvlab's own quantisers,
  // kernels/cpu/quant_blocks.h; q2_k and q3_k load from files but have no quantiser).
  std::string weight_dtype = "keep";
  // Tokenizer to use instead of the one found with the model (tokenizer.bin, tokenizer.json,
  // tokenizer.model or a file holding GGUF tokenizer metadata). Empty: look next to the model.
  std::filesystem::path tokenizer_path;
  bool load_tokenizer = true;       // false: leave Model::tokenizer null (faster, tests)
  bool require_tokenizer = false;   // throw when no tokenizer is found
};

struct Model {
  ModelConfig config;
  std::filesystem::path path;  // what was loaded (file or HF directory)
  std::string format;          // "gguf" | "hf" | "llama2c"
  WeightView tok_embeddings;   // [vocab, dim]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [dim]
  WeightView lm_head;             // [vocab, dim] (== tok_embeddings when tied)
  std::unique_ptr<Tokenizer> tokenizer;  // may be null when the file carries none
  // For model-info: each source file and the dtype the matrices are stored in.
  std::vector<std::filesystem::path> files;
  std::string stored_dtype;  // e.g. "f32", "bf16", "mixed (f16, q8_0)"

  Model();
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;

  // The tokenizer, or kvlab::Error "<path>: no tokenizer found (...)" naming where it looked.
  const Tokenizer& require_tokenizer() const;

  // Owns what the views point into (mmaps, converted buffers). Not for direct use.
  std::vector<std::shared_ptr<const void>> storage;
  std::string tokenizer_search;  // where a tokenizer was looked for (for the error above)
};

// Number of parameters (weight matrices, norms, biases; tied embeddings counted once).
int64_t parameter_count(const Model& model);

// Auto-detects: *.gguf, a HF directory (config.json + *.safetensors[.index.json]) or its
// config.json / *.safetensors, a llama2.c *.bin. Throws kvlab::Error naming the file and problem.
std::unique_ptr<Model> load_model(const std::filesystem::path& path, const LoadOptions& opts = {});

}  // namespace kvlab
