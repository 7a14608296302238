// GGUF -> Model. Hyper-parameters come from `<arch>.*` metadata (llama.cpp's key names):
//   <arch>.context_length, .embedding_length, .block_count, .feed_forward_length,
//   .attention.head_count, .attention.head_count_kv (default: head_count),
//   .attention.key_length (head dim; default embedding_length / head_count),
//   .attention.layer_norm_rms_epsilon, .rope.freq_base, .rope.dimension_count (must be the head dim),
//   .rope.scaling.type / .factor / .original_context_length (linear only), .vocab_size (optional).
// Llama-3 scaling is the tensor rope_freqs.weight [head_dim/2] (per-pair frequency divisors).
// Tensor names: token_embd, output_norm, output (absent = tied), blk.N.{attn_norm, attn_q, attn_k,
// attn_v, attn_output, attn_{q,k,v}.bias, ffn_norm, ffn_gate, ffn_up, ffn_down}; `qwen3` adds
// blk.N.attn_q_norm / attn_k_norm [head_dim] (the names later llama.cpp writes for it; the anchor
// at c392e50 predates qwen3). qwen2 and qwen3 rotate pairs (i, i + head_dim/2).
// Gemma (`gemma2`, `gemma3`; llama.cpp's llama-model.cpp / llama.cpp build_gemma2 and later
// build_gemma3 are the reference): NeoX RoPE, tied embeddings scaled by sqrt(dim), GeGLU (tanh
// GELU), blk.N.post_attention_norm and blk.N.post_ffw_norm after attention and FFN (ffn_norm is
// the pre-FFN norm). Norm weights are stored as 1 + w (convert_hf_to_gguf.py's Gemma2Model adds 1
// to every "norm.weight"; Gemma3Model inherits that), so they are used as they are. Keys:
// <arch>.attention.sliding_window (gemma2 default 4096 as llama.cpp), gemma2's
// attn_logit_softcapping / final_logit_softcapping (defaults 50 / 30 as llama.cpp's hparams).
// The layer pattern and the query scale are not in the file; as llama.cpp: gemma2 layer i is local
// iff i % 2 == 0, gemma3 iff (i + 1) % 6 != 0 (or <arch>.attention.sliding_window_pattern when
// present); the score scale is 1/sqrt(head_dim), except for the 27B shapes (gemma2 46 layers,
// gemma3 62 layers) where it is 1/sqrt(dim / head_count) (query_pre_attn_scalar of their HF
// configs). gemma3: attn_q_norm / attn_k_norm per head, local layers' RoPE base 10000
// (<arch>.rope.freq_base_swa when present), rope.freq_base and linear scaling on global layers.
// deepseek2 (multi-head latent attention; llama.cpp c392e50's llm_load_hparams / build_deepseek2):
// attention.kv_lora_rank, attention.q_lora_rank (absent: one attn_q, V2-Lite's form),
// attention.key_length = qk_nope + qk_rope, attention.value_length = v_head_dim,
// rope.dimension_count = qk_rope; tensors blk.N.attn_q_a / attn_q_a_norm / attn_q_b (or attn_q),
// attn_kv_a_mqa, attn_kv_a_norm, attn_kv_b (one [n_heads * (nope + v), kv_lora_rank] tensor),
// attn_output; interleaved RoPE on the rope parts. Only dense FFN layers: leading_dense_block_count
// must cover every block (MoE layers and experts are refused naming the key).
#include <cmath>
#include <cstring>
#include <vector>

#include "framework/core/error.h"
#include "framework/model/gguf.h"
#include "framework/model/model_loader.h"

namespace kvlab::detail {

namespace {

DType to_dtype(GgmlType t) {
  switch (t) {
    case GgmlType::kF32: return DType::kF32;
    case GgmlType::kF16: return DType::kF16;
    case GgmlType::kBF16: return DType::kBF16;
    case GgmlType::kQ8_0: return DType::kQ8_0;
    case GgmlType::kQ4_0: return DType::kQ4_0;
    case GgmlType::kQ4_1: return DType::kQ4_1;
    case GgmlType::kQ5_0: return DType::kQ5_0;
    case GgmlType::kQ5_1: return DType::kQ5_1;
    case GgmlType::kQ2_K: return DType::kQ2_K;
    case GgmlType::kQ3_K: return DType::kQ3_K;
    case GgmlType::kQ4_K: return DType::kQ4_K;
    case GgmlType::kQ5_K: return DType::kQ5_K;
    case GgmlType::kQ6_K: return DType::kQ6_K;
  }
  return DType::kF32;
}

int get_int(const GgufFile& f, const std::string& key) {
  const GgufValue& v = f.at(key);
  if (v.type() == GgufType::kArray) {
    fail(f.path().string(), ": key '", key, "' is a per-layer array; only one value for all layers is supported");
  }
  const int64_t x = v.as_int();
  if (x <= 0 || x > (int64_t{1} << 31) - 1) fail(f.path().string(), ": key '", key, "' = ", x, " is out of range");
  return static_cast<int>(x);
}

int get_int_or(const GgufFile& f, const std::string& key, int fallback) {
  return f.find(key) ? get_int(f, key) : fallback;
}

float get_float_or(const GgufFile& f, const std::string& key, float fallback) {
  const GgufValue* v = f.find(key);
  return v ? static_cast<float>(v->as_float()) : fallback;
}

}  // namespace

void load_gguf(Model& model, const std::filesystem::path& path, const LoadOptions& opts) {
  auto file = std::make_shared<GgufFile>(GgufFile::open(path));
  const GgufFile& f = *file;
  model.storage.push_back(file);
  model.files = {path};
  const std::string p = path.string();

  const std::string arch = f.at("general.architecture").as_string();
  const bool gemma = arch == "gemma2" || arch == "gemma3";
  const bool mla = arch == "deepseek2";
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && !gemma && !mla) {
    fail(p, ": unsupported architecture '", arch, "' (supported: llama, qwen2, qwen3, gemma2, gemma3, deepseek2)");
  }
  if (const GgufValue* e = f.find(arch + ".expert_count"); e && e->as_int() > 0) {
    fail(p, ": mixture-of-experts models are not supported (", arch, ".expert_count = ", e->as_int(), ")");
  }
  ModelConfig& c = model.config;
  c.arch = arch;
  c.rope_style = arch == "llama" || mla ? RopeStyle::kInterleaved : RopeStyle::kNeox;
  c.qk_norm = arch == "qwen3" || arch == "gemma3";
  c.max_seq_len = get_int(f, arch + ".context_length");
  c.dim = get_int(f, arch + ".embedding_length");
  c.n_layers = get_int(f, arch + ".block_count");
  c.hidden_dim = get_int(f, arch + ".feed_forward_length");
  c.n_heads = get_int(f, arch + ".attention.head_count");
  c.n_kv_heads = get_int_or(f, arch + ".attention.head_count_kv", c.n_heads);
  if (c.dim % c.n_heads != 0 && !f.find(arch + ".attention.key_length")) {
    fail(p, ": embedding_length ", c.dim, " is not a multiple of head_count ", c.n_heads,
         " and there is no ", arch, ".attention.key_length");
  }
  if (mla) {
    // The MoE layers: llama.cpp's layer i is dense iff i < leading_dense_block_count.
    if (const int dense = get_int_or(f, arch + ".leading_dense_block_count", 0); dense < c.n_layers)
      fail(p, ": mixture-of-experts layers are not supported (", arch, ".leading_dense_block_count = ", dense,
           " of ", c.n_layers, " blocks; MLA is supported with dense FFN layers only)");
    auto required = [&](const std::string& key) {
      if (!f.find(key)) fail(p, ": missing key '", key, "'");
      return get_int(f, key);
    };
    c.kv_lora_rank = required(arch + ".attention.kv_lora_rank");
    c.q_lora_rank = get_int_or(f, arch + ".attention.q_lora_rank", 0);
    const int qk_dim = required(arch + ".attention.key_length");
    c.qk_rope_head_dim = required(arch + ".rope.dimension_count");
    c.v_head_dim = required(arch + ".attention.value_length");
    if (qk_dim <= c.qk_rope_head_dim)
      fail(p, ": ", arch, ".attention.key_length ", qk_dim, " must exceed rope.dimension_count ", c.qk_rope_head_dim);
    c.qk_nope_head_dim = qk_dim - c.qk_rope_head_dim;
    c.n_kv_heads = 1;  // the latent cache: one KV head (head_count_kv, the decompressed heads, unused)
    c.head_dim = c.kv_lora_rank + c.qk_rope_head_dim;
    c.query_scale = 1.f / std::sqrt(static_cast<float>(qk_dim));
  }
  if (!mla) c.head_dim = get_int_or(f, arch + ".attention.key_length", c.dim / c.n_heads);
  if (const int v_dim = get_int_or(f, arch + ".attention.value_length", c.head_dim); !mla && v_dim != c.head_dim) {
    fail(p, ": value_length ", v_dim, " differs from key_length ", c.head_dim, " (unsupported)");
  }
  if (const int rot = get_int_or(f, arch + ".rope.dimension_count", c.head_dim); !mla && rot != c.head_dim) {
    fail(p, ": rope.dimension_count ", rot, " differs from the head dim ", c.head_dim,
         " (partial rotary embeddings are not supported)");
  }
  c.rms_eps = get_float_or(f, arch + ".attention.layer_norm_rms_epsilon", 1e-5f);
  c.rope_theta = get_float_or(f, arch + ".rope.freq_base", 10000.f);

  if (const GgufValue* t = f.find(arch + ".rope.scaling.type")) {
    const std::string& type = t->as_string();
    if (type == "linear") {
      c.rope_scaling.type = "linear";
      c.rope_scaling.factor = get_float_or(f, arch + ".rope.scaling.factor", 1.f);
    } else if (type == "yarn" && mla) {
      // llama.cpp: freq_scale = 1 / factor, beta_fast 32 / beta_slow 1 (its defaults: not in the
      // file), cos/sin unscaled (build_deepseek2's attn_factor_scaled cancels ggml's YaRN
      // magnitude) and kq_scale (1 + yarn_log_multiplier ln factor)^2 / sqrt(qk): here mscale =
      // mscale_all_dim = yarn_log_multiplier / 0.1 (convert_hf_to_gguf.py writes 0.1 mscale_all_dim).
      c.rope_scaling.type = "yarn";
      c.rope_scaling.factor = get_float_or(f, arch + ".rope.scaling.factor", 1.f);
      const float m = get_float_or(f, arch + ".rope.scaling.yarn_log_multiplier", 0.f) / 0.1f;
      c.rope_scaling.mscale = c.rope_scaling.mscale_all_dim = m;
    } else if (type != "none") {
      fail(p, ": unsupported rope scaling type '", type, "' (supported: none, linear, llama3 "
           "through rope_freqs.weight, and yarn for deepseek2)");
    }
  } else if (const GgufValue* s = f.find(arch + ".rope.scale_linear")) {
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = static_cast<float>(s->as_float());
  }
  if (const GgufValue* o = f.find(arch + ".rope.scaling.original_context_length")) {
    const int64_t n = o->as_int();
    if (n <= 0 || n > (int64_t{1} << 31) - 1) {
      fail(p, ": key '", arch, ".rope.scaling.original_context_length' = ", n, " is out of range");
    }
    c.rope_scaling.original_max_position = static_cast<int>(n);
  }
  if (mla) c.query_scale *= static_cast<float>(std::pow(yarn_attention_mscale(c), 2));  // 1 without yarn

  if (gemma) {
    c.embed_scale = true;
    c.sandwich_norms = true;
    c.ffn_activation = FfnActivation::kGeluTanh;
    c.sliding_window = f.find(arch + ".attention.sliding_window")
                           ? get_int(f, arch + ".attention.sliding_window")
                           : (arch == "gemma2" ? 4096 : 0);
    if (c.sliding_window <= 0) fail(p, ": missing key '", arch, ".attention.sliding_window'");
    c.local_layers.resize(c.n_layers);
    const std::string pattern_key = arch + ".attention.sliding_window_pattern";
    const GgufValue* pv = f.find(pattern_key);
    if (pv && pv->type() == GgufType::kArray) {  // one flag per layer (1 = sliding window)
      const std::vector<int64_t> flags = pv->as_ints();
      if (static_cast<int>(flags.size()) != c.n_layers)
        fail(p, ": key '", pattern_key, "' has ", flags.size(), " entries for ", c.n_layers, " layers");
      for (int i = 0; i < c.n_layers; ++i) c.local_layers[i] = flags[i] != 0;
    } else {
      const int pattern = get_int_or(f, pattern_key, arch == "gemma2" ? 2 : 6);
      for (int i = 0; i < c.n_layers; ++i) c.local_layers[i] = (i + 1) % pattern != 0;
    }
    const bool big = (arch == "gemma2" && c.n_layers == 46) || (arch == "gemma3" && c.n_layers == 62);
    c.query_scale = 1.f / std::sqrt(big ? static_cast<float>(c.dim / c.n_heads) : static_cast<float>(c.head_dim));
    if (arch == "gemma2") {
      c.attn_softcap = get_float_or(f, arch + ".attn_logit_softcapping", 50.f);
      c.final_softcap = get_float_or(f, arch + ".final_logit_softcapping", 30.f);
    } else {
      c.rope_local_theta = get_float_or(f, arch + ".rope.freq_base_swa", 10000.f);
      c.final_softcap = get_float_or(f, arch + ".final_logit_softcapping", 0.f);
    }
  }

  TensorTable table;
  for (const GgufTensorInfo& t : f.tensors()) {
    if (!t.supported()) {
      const auto id = static_cast<uint32_t>(t.type);
      fail(p, ": tensor '", t.name, "': unsupported tensor type ", ggml_type_name(id), " (", id,
           "); supported: ", ggml_supported_types());
    }
    RawTensor raw{to_dtype(t.type), std::vector<int64_t>(t.ne.rbegin(), t.ne.rend()), t.data, path};
    table.add(t.name, std::move(raw));
  }
  if (mla && table.find("blk.0.ffn_gate_inp.weight"))
    fail(p, ": tensor 'blk.0.ffn_gate_inp.weight': mixture-of-experts layers are not supported");
  if (const RawTensor* freqs = table.find("rope_freqs.weight"); freqs && mla) {
    fail(p, ": tensor 'rope_freqs.weight' on a deepseek2 model is not supported");
  } else if (freqs) {
    if (freqs->shape != std::vector<int64_t>{c.head_dim / 2}) {
      fail(p, ": tensor 'rope_freqs.weight' has shape ", shape_string(freqs->shape), ", expected [",
           c.head_dim / 2, "]");
    }
    c.rope_freq_factors.resize(c.head_dim / 2);
    // (copied first: with general.alignment = 1 the tensor may sit at an odd offset)
    std::vector<std::byte> raw(dtype_bytes(freqs->dtype, c.head_dim / 2));
    std::memcpy(raw.data(), freqs->data, raw.size());
    to_float(freqs->dtype, raw.data(), c.rope_freq_factors.data(), c.head_dim / 2);
    c.rope_scaling.type = "llama3";
    float max_factor = 1;
    for (float x : c.rope_freq_factors) max_factor = std::max(max_factor, x);
    c.rope_scaling.factor = max_factor;
  }

  const RawTensor* emb = table.find("token_embd.weight");
  if (emb == nullptr) fail(p, ": missing tensor 'token_embd.weight'");
  if (emb->shape.size() != 2) {
    fail(p, ": tensor 'token_embd.weight' has shape ", shape_string(emb->shape), ", expected [vocab, ", c.dim, "]");
  }
  if (emb->shape[0] > (int64_t{1} << 31) - 1) {
    fail(p, ": tensor 'token_embd.weight' has ", emb->shape[0], " rows, more than a vocabulary can have");
  }
  c.vocab_size = static_cast<int>(emb->shape[0]);
  if (const GgufValue* v = f.find(arch + ".vocab_size"); v && v->as_int() != c.vocab_size) {
    fail(p, ": ", arch, ".vocab_size = ", v->as_int(), " but token_embd.weight has ", c.vocab_size, " rows");
  }
  c.tied_embeddings = table.find("output.weight") == nullptr;
  c.qkv_bias = table.find("blk.0.attn_q.bias") != nullptr;
  if (arch == "qwen2" && !c.qkv_bias) fail(p, ": qwen2 model without blk.0.attn_q.bias");

  build_weights(model, table, TensorNames{"token_embd.weight", "output_norm.weight", "output.weight",
                                          &gguf_tensor_name},
                opts);
  attach_tokenizer(model, opts, {}, &f);
}

}  // namespace kvlab::detail
