#include "framework/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <new>
#include <numbers>
#include <set>
#include <sstream>
#include <thread>

#include "framework/core/error.h"
#include "framework/model/model_loader.h"
#include "kernels/cpu/quant_blocks.h"

namespace kvlab {

const char* rope_style_name(RopeStyle style) {
  return style == RopeStyle::kInterleaved ? "interleaved" : "neox";
}

namespace {

size_t kv_bytes(size_t elements, DType kv_dtype) {
  switch (kv_dtype) {
    case DType::kF32: return elements * 4;
    case DType::kF16: case DType::kBF16: return elements * 2;
    case DType::kQ8_0:  // 34 bytes per 32 elements, rounded up to whole bytes
      return (elements * sizeof(BlockQ8_0) + kQ8_0BlockSize - 1) / kQ8_0BlockSize;
    default:
      fail(dtype_name(kv_dtype), " is a weight type, not a KV-cache dtype");
  }
}

}  // namespace

size_t ModelConfig::kv_bytes_per_token(DType kv_dtype) const {
  // MLA: one row of head_dim = kv_lora_rank + qk_rope_head_dim per layer (values alias keys)
  return kv_bytes((mla() ? 1 : 2) * static_cast<size_t>(n_layers) * n_kv_heads * head_dim, kv_dtype);
}

size_t ModelConfig::mha_kv_bytes_per_token(DType kv_dtype) const {
  if (!mla()) return kv_bytes_per_token(kv_dtype);
  return kv_bytes(static_cast<size_t>(n_layers) * n_heads * (qk_nope_head_dim + qk_rope_head_dim + v_head_dim),
                  kv_dtype);
}

int layer_window(const ModelConfig& c, int layer) {
  const bool local = layer >= 0 && static_cast<size_t>(layer) < c.local_layers.size() && c.local_layers[layer];
  return local ? c.sliding_window : 0;
}

float attention_scale(const ModelConfig& c) {
  return c.query_scale > 0 ? c.query_scale : 1.f / std::sqrt(static_cast<float>(c.head_dim));
}

namespace {

double yarn_m(double scale, double x) { return scale <= 1 ? 1.0 : 0.1 * x * std::log(scale) + 1.0; }

}  // namespace

double yarn_rope_mscale(const ModelConfig& c) {
  const RopeScaling& s = c.rope_scaling;
  return s.type == "yarn" ? yarn_m(s.factor, s.mscale) / yarn_m(s.factor, s.mscale_all_dim) : 1.0;
}

double yarn_attention_mscale(const ModelConfig& c) {
  const RopeScaling& s = c.rope_scaling;
  return s.type == "yarn" ? yarn_m(s.factor, s.mscale_all_dim) : 1.0;
}

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const std::vector<double> inv = rope_inv_freq_f64(c);
  return std::vector<float>(inv.begin(), inv.end());
}

std::vector<double> rope_inv_freq_f64(const ModelConfig& c) {
  const int d = c.rope_dim(), half = d / 2;
  std::vector<double> out(half);
  const RopeScaling& s = c.rope_scaling;
  // yarn: the pairs [low, high] ramp from extrapolated (unscaled) to interpolated frequencies
  double low = 0, high = 0;
  if (s.type == "yarn") {
    const double theta = c.rope_theta;
    auto corr_dim = [&](double n_rot) {
      return d * std::log(s.original_max_position / (n_rot * 2 * std::numbers::pi)) / (2 * std::log(theta));
    };
    low = std::max(std::floor(corr_dim(s.beta_fast)), 0.0);
    high = std::min(std::ceil(corr_dim(s.beta_slow)), double(d - 1));
  }
  for (int i = 0; i < half; ++i) {
    double inv = std::pow(static_cast<double>(c.rope_theta), -2.0 * i / d);
    if (s.type == "yarn") {
      const double ramp = std::clamp((i - low) / std::max(high - low, 0.001), 0.0, 1.0);
      inv = inv / s.factor * ramp + inv * (1 - ramp);
    } else if (!c.rope_freq_factors.empty()) {
      inv /= c.rope_freq_factors[i];
    } else if (s.type == "linear") {
      inv /= s.factor;
    } else if (s.type == "llama3") {
      const double wavelen = 2 * std::numbers::pi / inv;
      const double low_wavelen = s.original_max_position / static_cast<double>(s.low_freq_factor);
      const double high_wavelen = s.original_max_position / static_cast<double>(s.high_freq_factor);
      if (wavelen > low_wavelen) {
        inv /= s.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (s.original_max_position / wavelen - s.low_freq_factor) /
                              (s.high_freq_factor - s.low_freq_factor);
        inv *= (1 - smooth) / s.factor + smooth;
      }
    }
    out[i] = inv;
  }
  return out;
}

void weight_row_to_float(const WeightView& w, int64_t r, float* out) {
  to_float(w.dtype, w.row(r), out, w.cols);
}

std::vector<float> weight_to_float(const WeightView& w) {
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r) weight_row_to_float(w, r, out.data() + r * w.cols);
  return out;
}

Model::Model() = default;
Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;

const Tokenizer& Model::require_tokenizer() const {
  if (!tokenizer) {
    fail(path.string(), ": no tokenizer found (looked for ", tokenizer_search,
         "); pass a tokenizer file explicitly");
  }
  return *tokenizer;
}

int64_t parameter_count(const Model& m) {
  int64_t n = m.tok_embeddings.rows * m.tok_embeddings.cols + static_cast<int64_t>(m.final_norm.size());
  if (!m.config.tied_embeddings) n += m.lm_head.rows * m.lm_head.cols;
  for (const LayerWeights& l : m.layers) {
    for (const WeightView* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.wq_a, &l.wq_b,
                                &l.wkv_a, &l.wkv_b}) {
      n += w->rows * w->cols;
    }
    n += static_cast<int64_t>(l.attn_norm.size() + l.ffn_norm.size() + l.bq.size() + l.bk.size() +
                              l.bv.size() + l.q_norm.size() + l.k_norm.size() + l.post_attn_norm.size() +
                              l.post_ffn_norm.size() + l.q_a_norm.size() + l.kv_a_norm.size());
  }
  return n;
}

namespace detail {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

void TensorTable::add(const std::string& name, RawTensor t) {
  auto it = tensors_.find(name);
  if (it != tensors_.end()) {
    fail(t.file.string(), ": tensor '", name, "' appears twice (also in ", it->second.file.string(), ")");
  }
  tensors_.emplace(name, std::move(t));
}

const RawTensor* TensorTable::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::string gguf_tensor_name(int layer, std::string_view part) {
  static const std::map<std::string, std::string, std::less<>> kParts = {
      {"attn_norm", "attn_norm.weight"}, {"wq", "attn_q.weight"},       {"wk", "attn_k.weight"},
      {"wv", "attn_v.weight"},           {"wo", "attn_output.weight"},  {"bq", "attn_q.bias"},
      {"bk", "attn_k.bias"},             {"bv", "attn_v.bias"},         {"ffn_norm", "ffn_norm.weight"},
      {"w_gate", "ffn_gate.weight"},     {"w_up", "ffn_up.weight"},     {"w_down", "ffn_down.weight"},
      {"q_norm", "attn_q_norm.weight"},  {"k_norm", "attn_k_norm.weight"},
      {"post_attn_norm", "post_attention_norm.weight"},
      {"post_ffn_norm", "post_ffw_norm.weight"},
      // deepseek2 (gguf-py constants.py ATTN_Q_A ... ATTN_KV_B)
      {"wq_a", "attn_q_a.weight"},       {"q_a_norm", "attn_q_a_norm.weight"}, {"wq_b", "attn_q_b.weight"},
      {"wkv_a", "attn_kv_a_mqa.weight"}, {"kv_a_norm", "attn_kv_a_norm.weight"},
      {"wkv_b", "attn_kv_b.weight"}};
  return str_cat("blk.", layer, ".", kParts.find(part)->second);
}

std::string hf_tensor_name(int layer, std::string_view part) {
  static const std::map<std::string, std::string, std::less<>> kParts = {
      {"attn_norm", "input_layernorm.weight"},
      {"wq", "self_attn.q_proj.weight"},
      {"wk", "self_attn.k_proj.weight"},
      {"wv", "self_attn.v_proj.weight"},
      {"wo", "self_attn.o_proj.weight"},
      {"bq", "self_attn.q_proj.bias"},
      {"bk", "self_attn.k_proj.bias"},
      {"bv", "self_attn.v_proj.bias"},
      {"ffn_norm", "post_attention_layernorm.weight"},
      {"w_gate", "mlp.gate_proj.weight"},
      {"w_up", "mlp.up_proj.weight"},
      {"w_down", "mlp.down_proj.weight"},
      {"q_norm", "self_attn.q_norm.weight"},
      {"k_norm", "self_attn.k_norm.weight"}};
  return str_cat("model.layers.", layer, ".", kParts.find(part)->second);
}

std::string hf_mla_tensor_name(int layer, std::string_view part) {
  // HF modeling_deepseek.py's DeepseekV2Attention (convert_hf_to_gguf.py maps them to attn_q_a ...)
  static const std::map<std::string, std::string, std::less<>> kParts = {
      {"wq_a", "self_attn.q_a_proj.weight"},           {"q_a_norm", "self_attn.q_a_layernorm.weight"},
      {"wq_b", "self_attn.q_b_proj.weight"},           {"wkv_a", "self_attn.kv_a_proj_with_mqa.weight"},
      {"kv_a_norm", "self_attn.kv_a_layernorm.weight"}, {"wkv_b", "self_attn.kv_b_proj.weight"}};
  if (auto it = kParts.find(part); it != kParts.end()) return str_cat("model.layers.", layer, ".", it->second);
  return hf_tensor_name(layer, part);
}

std::string hf_gemma_tensor_name(int layer, std::string_view part) {
  // HF modeling_gemma2.py / modeling_gemma3.py: post_attention_layernorm is the norm of the
  // attention OUTPUT; the pre-FFN norm is pre_feedforward_layernorm.
  if (part == "ffn_norm") return str_cat("model.layers.", layer, ".pre_feedforward_layernorm.weight");
  if (part == "post_attn_norm") return str_cat("model.layers.", layer, ".post_attention_layernorm.weight");
  if (part == "post_ffn_norm") return str_cat("model.layers.", layer, ".post_feedforward_layernorm.weight");
  return hf_tensor_name(layer, part);
}

void validate_config(const ModelConfig& c, const std::filesystem::path& file) {
  auto positive = [&](const char* what, int64_t v) {
    if (v <= 0) fail(file.string(), ": ", what, " must be positive, got ", v);
  };
  positive("dim", c.dim);
  positive("n_layers", c.n_layers);
  positive("n_heads", c.n_heads);
  positive("n_kv_heads", c.n_kv_heads);
  positive("head_dim", c.head_dim);
  positive("hidden_dim", c.hidden_dim);
  positive("vocab_size", c.vocab_size);
  positive("max_seq_len", c.max_seq_len);
  if (c.n_heads % c.n_kv_heads != 0) {
    fail(file.string(), ": n_heads ", c.n_heads, " is not a multiple of n_kv_heads ", c.n_kv_heads);
  }
  if (c.mla()) {
    positive("qk_nope_head_dim", c.qk_nope_head_dim);
    positive("qk_rope_head_dim", c.qk_rope_head_dim);
    positive("v_head_dim", c.v_head_dim);
    if (c.q_lora_rank < 0) fail(file.string(), ": q_lora_rank must be >= 0, got ", c.q_lora_rank);
    if (c.n_kv_heads != 1 || c.head_dim != c.kv_lora_rank + c.qk_rope_head_dim)
      fail(file.string(), ": MLA runs one latent KV head of kv_lora_rank + qk_rope_head_dim = ",
           c.kv_lora_rank + c.qk_rope_head_dim, " features, got ", c.n_kv_heads, " heads of ", c.head_dim);
  } else if (c.kv_lora_rank < 0 || c.q_lora_rank != 0) {
    fail(file.string(), ": q_lora_rank without kv_lora_rank (MLA needs kv_lora_rank > 0)");
  }
  if (c.rope_dim() % 2 != 0) fail(file.string(), ": the RoPE dimension ", c.rope_dim(), " must be even");
  if (!(c.rms_eps > 0) || !std::isfinite(c.rms_eps))
    fail(file.string(), ": rms epsilon must be positive and finite, got ", c.rms_eps);
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
    fail(file.string(), ": rope theta must be positive and finite, got ", c.rope_theta);
  const RopeScaling& s = c.rope_scaling;
  if (s.type != "none" && s.type != "linear" && s.type != "llama3" && s.type != "yarn") {
    fail(file.string(), ": unsupported rope scaling type '", s.type, "' (supported: none, linear, llama3, yarn)");
  }
  if (s.type == "yarn") {
    if (!c.mla()) fail(file.string(), ": yarn rope scaling is supported for MLA (deepseek2) models only");
    if (s.original_max_position <= 0)
      fail(file.string(), ": yarn needs a positive original context length, got ", s.original_max_position);
    for (float v : {s.beta_fast, s.beta_slow})
      if (!(v > 0) || !std::isfinite(v)) fail(file.string(), ": yarn beta_fast / beta_slow must be positive and finite, got ", v);
    for (float v : {s.mscale, s.mscale_all_dim})
      if (!(v >= 0) || !std::isfinite(v)) fail(file.string(), ": yarn mscale / mscale_all_dim must be finite and >= 0, got ", v);
    // llama.cpp's form (GGUF's yarn_log_multiplier): the rotated features keep their magnitude
    if (yarn_rope_mscale(c) != 1.0)
      fail(file.string(), ": yarn with mscale ", s.mscale, " != mscale_all_dim ", s.mscale_all_dim,
           " (a cos/sin magnitude) is not supported");
  }
  if (s.type != "none" && (!(s.factor > 0) || !std::isfinite(s.factor)))
    fail(file.string(), ": rope scaling factor must be positive and finite, got ", s.factor);
  if (s.type == "llama3" && c.rope_freq_factors.empty()) {
    if (!(s.high_freq_factor > s.low_freq_factor))
      fail(file.string(), ": llama3 rope scaling needs high_freq_factor > low_freq_factor");
    if (!(s.low_freq_factor > 0) || !std::isfinite(s.high_freq_factor))
      fail(file.string(), ": llama3 rope scaling needs finite low_freq_factor > 0 and high_freq_factor, got ",
           s.low_freq_factor, " and ", s.high_freq_factor);
    if (s.original_max_position <= 0)
      fail(file.string(), ": rope scaling original_max_position_embeddings must be positive, got ",
           s.original_max_position);
  }
  if (!c.local_layers.empty()) {
    if (static_cast<int>(c.local_layers.size()) != c.n_layers)
      fail(file.string(), ": ", c.local_layers.size(), " layer kinds for ", c.n_layers, " layers");
    if (c.sliding_window <= 0)
      fail(file.string(), ": sliding-window layers need a positive sliding_window, got ", c.sliding_window);
  }
  auto non_negative = [&](const char* what, float v) {
    if (!(v >= 0) || !std::isfinite(v)) fail(file.string(), ": ", what, " must be finite and >= 0, got ", v);
  };
  non_negative("rope_local_base_freq", c.rope_local_theta);
  non_negative("query scale (query_pre_attn_scalar^-1/2)", c.query_scale);
  non_negative("attn_logit_softcapping", c.attn_softcap);
  non_negative("final_logit_softcapping", c.final_softcap);
  for (float f : c.rope_freq_factors) {
    if (!(f > 0) || !std::isfinite(f)) fail(file.string(), ": rope_freqs holds ", f, " (expected positive, finite factors)");
  }
  if (!c.rope_freq_factors.empty() && static_cast<int>(c.rope_freq_factors.size()) != c.rope_dim() / 2) {
    fail(file.string(), ": rope_freqs has ", c.rope_freq_factors.size(), " entries, expected the RoPE dim / 2 = ",
         c.rope_dim() / 2);
  }
}

namespace {

// Shared state of one build: the target dtype and a record of the stored dtypes.
struct Builder {
  Model& model;
  const TensorTable& table;
  const LoadOptions& opts;
  bool keep = true;
  DType target = DType::kF32;
  std::set<std::string> stored;

  const RawTensor& get(const std::string& name) const {
    const RawTensor* t = table.find(name);
    if (t == nullptr) {
      fail(model.path.string(), ": missing tensor '", name, "' (", model.config.arch, ", ",
           model.config.n_layers, " layers)");
    }
    return *t;
  }

  void check_shape(const std::string& name, const RawTensor& t, const std::vector<int64_t>& want) const {
    if (t.shape != want) {
      fail(t.file.string(), ": tensor '", name, "' has shape ", shape_string(t.shape), ", expected ",
           shape_string(want));
    }
  }

  // The tensor's data, or an aligned copy of it: a file may place a tensor at any byte offset
  // (a safetensors header of odd length, GGUF general.alignment = 1), and the kernels load
  // float / uint16 values directly.
  const void* aligned_data(const RawTensor& t, int64_t n_elements) {
    const size_t align = t.dtype == DType::kF32 ? alignof(float) : alignof(uint16_t);
    if (reinterpret_cast<uintptr_t>(t.data) % align == 0) return t.data;
    const size_t bytes = dtype_bytes(t.dtype, n_elements);
    auto copy = std::shared_ptr<std::byte[]>(new std::byte[bytes]);  // new[] aligns for any scalar
    std::memcpy(copy.get(), t.data, bytes);
    model.storage.push_back(std::shared_ptr<const void>(copy, copy.get()));
    return copy.get();
  }

  WeightView matrix(const std::string& name, int64_t rows, int64_t cols) {
    const RawTensor& t = get(name);
    check_shape(name, t, {rows, cols});
    stored.insert(dtype_name(t.dtype));
    WeightView w{t.dtype, rows, cols, aligned_data(t, rows * cols)};
    if (keep || t.dtype == target) return w;
    if (target == DType::kQ8_0 && cols % kQ8_0BlockSize != 0) {
      fail(t.file.string(), ": tensor '", name, "' has ", cols,
           " columns, not a multiple of 32: cannot convert to q8_0");
    }
    if (is_block_quant(target) && !has_quantiser(target)) {
      fail(t.file.string(), ": tensor '", name, "': kvlab cannot convert to ", dtype_name(target),
           " (it quantises to q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k and q6_k)");
    }
    if (is_block_quant(target) && cols % quant_block_values(target) != 0) {
      fail(t.file.string(), ": tensor '", name, "' has ", cols, " columns, not a multiple of ",
           quant_block_values(target), ": cannot convert to ", dtype_name(target));
    }
    auto buffer = std::shared_ptr<std::byte[]>(new std::byte[dtype_bytes(target, rows * cols)]);
    const size_t out_row_bytes = dtype_bytes(target, cols);
    // Rows are independent: convert them in parallel (a 7B model is ~7e9 values).
    auto convert = [&](int64_t begin, int64_t end) {
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = begin; r < end; ++r) {
        weight_row_to_float(w, r, row.data());
        from_float(target, row.data(), buffer.get() + r * out_row_bytes, cols);
      }
    };
    const int64_t n_threads = std::clamp<int64_t>(rows * cols / (1 << 20), 1,
                                                  std::max(1u, std::thread::hardware_concurrency()));
    std::vector<std::thread> threads;
    for (int64_t t = 1; t < n_threads; ++t) {
      threads.emplace_back(convert, rows * t / n_threads, rows * (t + 1) / n_threads);
    }
    convert(0, rows / n_threads);
    for (std::thread& th : threads) th.join();
    model.storage.push_back(std::shared_ptr<const void>(buffer, buffer.get()));
    return WeightView{target, rows, cols, buffer.get()};
  }

  std::vector<float> vector(const std::string& name, int64_t n) {
    const RawTensor& t = get(name);
    check_shape(name, t, {n});
    std::vector<float> out(static_cast<size_t>(n));
    to_float(t.dtype, aligned_data(t, n), out.data(), n);
    return out;
  }
};

}  // namespace

void build_weights(Model& model, const TensorTable& table, const TensorNames& names,
                   const LoadOptions& opts) {
  const ModelConfig& c = model.config;
  validate_config(c, model.path);
  Builder b{model, table, opts, true, DType::kF32, {}};
  if (opts.weight_dtype != "keep") {
    b.keep = false;
    b.target = parse_dtype(opts.weight_dtype);
  }
  const int64_t q_dim = static_cast<int64_t>(c.n_heads) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  // First every tensor the config names is looked up and its shape checked, allocating nothing:
  // a corrupt count (block_count = 67,108,865 from one flipped bit) fails at its first missing
  // tensor instead of sizing per-layer tables (and converted copies) from the header.
  auto expect = [&](const std::string& name, const std::vector<int64_t>& shape) {
    b.check_shape(name, b.get(name), shape);
  };
  expect(names.tok_embeddings, {c.vocab_size, c.dim});
  // MLA: the query [n_heads, nope + rope], W_kvb's [n_heads, nope + v] rows, Wo over n_heads * v
  const int64_t mla_q = int64_t{c.n_heads} * (c.qk_nope_head_dim + c.qk_rope_head_dim);
  const int64_t mla_kvb = int64_t{c.n_heads} * (c.qk_nope_head_dim + c.v_head_dim);
  const int64_t mla_o = int64_t{c.n_heads} * c.v_head_dim;
  for (int i = 0; i < c.n_layers; ++i) {
    auto name = [&](const char* part) { return names.layer(i, part); };
    expect(name("attn_norm"), {c.dim});
    if (c.mla()) {
      if (c.q_lora_rank > 0) {
        expect(name("wq_a"), {c.q_lora_rank, c.dim});
        expect(name("q_a_norm"), {c.q_lora_rank});
        expect(name("wq_b"), {mla_q, c.q_lora_rank});
      } else {
        expect(name("wq"), {mla_q, c.dim});
      }
      expect(name("wkv_a"), {c.kv_lora_rank + c.qk_rope_head_dim, c.dim});
      expect(name("kv_a_norm"), {c.kv_lora_rank});
      expect(name("wkv_b"), {mla_kvb, c.kv_lora_rank});
      expect(name("wo"), {c.dim, mla_o});
    } else {
      expect(name("wq"), {q_dim, c.dim});
      expect(name("wk"), {kv_dim, c.dim});
      expect(name("wv"), {kv_dim, c.dim});
      expect(name("wo"), {c.dim, q_dim});
    }
    if (c.qkv_bias) {
      expect(name("bq"), {q_dim});
      expect(name("bk"), {kv_dim});
      expect(name("bv"), {kv_dim});
    }
    if (c.qk_norm) {
      expect(name("q_norm"), {c.head_dim});
      expect(name("k_norm"), {c.head_dim});
    }
    expect(name("ffn_norm"), {c.dim});
    if (c.sandwich_norms) {
      expect(name("post_attn_norm"), {c.dim});
      expect(name("post_ffn_norm"), {c.dim});
    }
    expect(name("w_gate"), {c.hidden_dim, c.dim});
    expect(name("w_up"), {c.hidden_dim, c.dim});
    expect(name("w_down"), {c.dim, c.hidden_dim});
  }
  expect(names.final_norm, {c.dim});
  if (!c.tied_embeddings) expect(names.lm_head, {c.vocab_size, c.dim});

  model.tok_embeddings = b.matrix(names.tok_embeddings, c.vocab_size, c.dim);
  model.layers.resize(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = model.layers[i];
    auto name = [&](const char* part) { return names.layer(i, part); };
    l.attn_norm = b.vector(name("attn_norm"), c.dim);
    if (c.mla()) {
      if (c.q_lora_rank > 0) {
        l.wq_a = b.matrix(name("wq_a"), c.q_lora_rank, c.dim);
        l.q_a_norm = b.vector(name("q_a_norm"), c.q_lora_rank);
        l.wq_b = b.matrix(name("wq_b"), mla_q, c.q_lora_rank);
      } else {
        l.wq = b.matrix(name("wq"), mla_q, c.dim);
      }
      l.wkv_a = b.matrix(name("wkv_a"), c.kv_lora_rank + c.qk_rope_head_dim, c.dim);
      l.kv_a_norm = b.vector(name("kv_a_norm"), c.kv_lora_rank);
      l.wkv_b = b.matrix(name("wkv_b"), mla_kvb, c.kv_lora_rank);
      l.wo = b.matrix(name("wo"), c.dim, mla_o);
    } else {
      l.wq = b.matrix(name("wq"), q_dim, c.dim);
      l.wk = b.matrix(name("wk"), kv_dim, c.dim);
      l.wv = b.matrix(name("wv"), kv_dim, c.dim);
      l.wo = b.matrix(name("wo"), c.dim, q_dim);
    }
    if (c.qkv_bias) {
      l.bq = b.vector(name("bq"), q_dim);
      l.bk = b.vector(name("bk"), kv_dim);
      l.bv = b.vector(name("bv"), kv_dim);
    }
    if (c.qk_norm) {
      l.q_norm = b.vector(name("q_norm"), c.head_dim);
      l.k_norm = b.vector(name("k_norm"), c.head_dim);
    }
    l.ffn_norm = b.vector(name("ffn_norm"), c.dim);
    if (c.sandwich_norms) {
      l.post_attn_norm = b.vector(name("post_attn_norm"), c.dim);
      l.post_ffn_norm = b.vector(name("post_ffn_norm"), c.dim);
    }
    l.w_gate = b.matrix(name("w_gate"), c.hidden_dim, c.dim);
    l.w_up = b.matrix(name("w_up"), c.hidden_dim, c.dim);
    l.w_down = b.matrix(name("w_down"), c.dim, c.hidden_dim);
  }
  model.final_norm = b.vector(names.final_norm, c.dim);
  model.lm_head = c.tied_embeddings ? model.tok_embeddings : b.matrix(names.lm_head, c.vocab_size, c.dim);
  std::string stored;
  for (const std::string& s : b.stored) stored += (stored.empty() ? "" : ", ") + s;
  model.stored_dtype = b.stored.size() == 1 ? stored : "mixed (" + stored + ")";
}

void attach_tokenizer(Model& model, const LoadOptions& opts,
                      const std::vector<std::filesystem::path>& candidates, const GgufFile* gguf) {
  if (!opts.load_tokenizer && !opts.require_tokenizer) return;
  std::string searched;
  if (!opts.tokenizer_path.empty()) {
    model.tokenizer_search = opts.tokenizer_path.string();
    model.tokenizer = load_tokenizer(opts.tokenizer_path);
    return;
  }
  if (gguf != nullptr) {
    searched = "tokenizer.ggml.* metadata in " + gguf->path().string();
    if (gguf->find("tokenizer.ggml.model") != nullptr) {
      model.tokenizer_search = searched;
      model.tokenizer = tokenizer_from_gguf(*gguf);
      return;
    }
  }
  for (const std::filesystem::path& p : candidates) {
    searched += (searched.empty() ? "" : ", ") + p.string();
    if (std::filesystem::exists(p)) {
      model.tokenizer_search = p.string();
      model.tokenizer = load_tokenizer(p);
      return;
    }
  }
  model.tokenizer_search = searched;
  if (opts.require_tokenizer) model.require_tokenizer();
}

}  // namespace detail

namespace {

bool has_gguf_magic(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace

namespace {

std::unique_ptr<Model> load_model_unguarded(const std::filesystem::path& path, const LoadOptions& opts) {
  namespace fs = std::filesystem;
  auto model = std::make_unique<Model>();
  model->path = path;
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(path.string(), ": no such file or directory");
  if (fs::is_directory(path)) {
    if (!fs::exists(path / "config.json")) {
      fail(path.string(), ": directory has no config.json (expected a Hugging Face model "
           "directory; pass a .gguf or llama2.c .bin file directly)");
    }
    model->format = "hf";
    detail::load_hf(*model, path, opts);
    return model;
  }
  const std::string ext = path.extension().string();
  if (path.filename() == "config.json" || ext == ".safetensors" ||
      path.filename() == "model.safetensors.index.json") {
    const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
    model->path = dir;
    model->format = "hf";
    detail::load_hf(*model, dir, opts);
    return model;
  }
  if (ext == ".gguf" || has_gguf_magic(path)) {
    model->format = "gguf";
    detail::load_gguf(*model, path, opts);
    return model;
  }
  model->format = "llama2c";
  detail::load_llama2c(*model, path, opts);
  return model;
}

}  // namespace

std::unique_ptr<Model> load_model(const std::filesystem::path& path, const LoadOptions& opts) {
  // Sizes are checked against the files before allocating, so running out of memory here means
  // a model too large for this machine (or a bound still missing): one error naming the file.
  try {
    return load_model_unguarded(path, opts);
  } catch (const std::bad_alloc&) {
    fail(path.string(), ": out of memory while loading the model (weight dtype ", opts.weight_dtype, ")");
  } catch (const std::filesystem::filesystem_error& e) {
    fail(path.string(), ": ", e.code().message(), " (", e.path1().string(), ")");
  }
}

}  // namespace kvlab
