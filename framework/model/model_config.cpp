// A model's configuration (model.h): KV bytes per token, layer windows, attention and RoPE scales,
// and the checks every loader runs on a configuration before building weights (model_loader.h).
#include <algorithm>
#include <cmath>
#include <numbers>

#include "framework/core/error.h"
#include "framework/model/model.h"
#include "framework/model/model_loader.h"

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

namespace detail {

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

}  // namespace detail
}  // namespace kvlab
