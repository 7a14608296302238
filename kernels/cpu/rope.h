// Rotary position embedding (RoPE) on the CPU: a cos/sin table and the in-place rotation of
// query/key head vectors, for both pair layouts and the linear and llama3 frequency scalings.
//
// Math. Head dim d, pair index i in [0, d/2), base theta:
//   inv_freq_i = theta^(-2i/d)            (then scaled, below)
//   angle(p, i) = p * inv_freq_i
//   (x_a, x_b) <- (x_a cos - x_b sin,  x_a sin + x_b cos)
// where the pair (a, b) is (2i, 2i+1) for RopeLayout::kInterleaved (GGUF llama, llama2.c, Meta
// checkpoints) and (i, i + d/2) for RopeLayout::kNeox (Hugging Face, GGUF qwen2).
// Scaling of inv_freq (Hugging Face `rope_scaling`):
//   linear: inv_freq_i / factor  (positions divided by `factor`)
//   llama3: wavelen = 2 pi / inv_freq_i, L = original_max_position;
//     wavelen < L / high_freq_factor        -> inv_freq_i            (high frequencies kept)
//     wavelen > L / low_freq_factor         -> inv_freq_i / factor   (low frequencies scaled)
//     otherwise, s = (L / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor):
//                                           -> (1 - s) inv_freq_i / factor + s inv_freq_i
// Per-pair frequency factors (GGUF rope_freqs.weight, Llama 3 style checkpoints): after the
// scaling above, inv_freq_i /= freq_factors[i] (the model then uses scaling "none").
// Angles, cos and sin are computed in double and stored as float, so the table and the direct
// computation used past the table's end give identical values. This is the one host RoPE: the
// engine rotates at insertion and at read with it, the emulated device uses it, and the CUDA
// kernels take its inv_freq (kernels/cuda/rope_table.h) and are tested against it.
//
// kernels/ depends on nothing in framework/: RopeLayout mirrors kvlab::RopeStyle
// (framework/model/model.h) enumerator for enumerator, and RopeScalingKind mirrors
// RopeScaling::type ("none" | "linear" | "llama3"); the engine converts.
#pragma once

#include <cstdint>
#include <vector>

namespace kvlab {

enum class RopeLayout { kInterleaved /* pairs (2i, 2i+1) */, kNeox /* pairs (i, i + d/2) */ };
enum class RopeScalingKind { kNone, kLinear, kLlama3 };

struct RopeConfig {
  RopeLayout layout = RopeLayout::kInterleaved;
  int head_dim = 0;         // rotated dims = head_dim (even)
  double theta = 10000.0;
  RopeScalingKind scaling = RopeScalingKind::kNone;
  double factor = 1.0;      // linear and llama3
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  int64_t original_max_position = 8192;                  // llama3
  std::vector<double> freq_factors;  // empty, or [head_dim / 2] per-pair divisors (all > 0)
};

// Scaled inverse frequencies inv_freq[d/2] of a config (the formulas above).
std::vector<double> rope_inv_freq(const RopeConfig& config);

// cos/sin of every (position, pair) for positions [0, n_positions); positions beyond are
// computed on the fly with the same formula (identical values, slower). Immutable after
// construction, so one table is safely shared by all threads.
class RopeTable {
 public:
  RopeTable() = default;
  // Throws std::invalid_argument for an odd or non-positive head_dim or a bad scaling factor.
  RopeTable(const RopeConfig& config, int64_t n_positions);

  const RopeConfig& config() const { return config_; }
  int head_dim() const { return config_.head_dim; }
  const std::vector<double>& inv_freq() const { return inv_freq_; }  // [d/2], rope_inv_freq
  int64_t n_positions() const { return n_positions_; }

  // cos and sin of the d/2 angles at `pos` into cos_out[d/2], sin_out[d/2].
  void angles(int64_t pos, float* cos_out, float* sin_out) const;
  // Pointers into the table for pos < n_positions(), else nullptr.
  const float* cos_row(int64_t pos) const {
    return pos >= 0 && pos < n_positions_ ? cos_.data() + pos * (config_.head_dim / 2) : nullptr;
  }
  const float* sin_row(int64_t pos) const {
    return pos >= 0 && pos < n_positions_ ? sin_.data() + pos * (config_.head_dim / 2) : nullptr;
  }

  // Rotates one head vector x[head_dim] in place to position `pos`.
  void rotate(float* x, int64_t pos) const;

 private:
  void compute_angles(int64_t pos, float* cos_out, float* sin_out) const;
  RopeConfig config_;
  int64_t n_positions_ = 0;
  std::vector<double> inv_freq_;  // [d/2]
  std::vector<float> cos_, sin_;  // [n_positions, d/2]
};

// Rotates x[n_heads, head_dim] in place: every head to position `pos` (no allocation).
// head_dim must equal table.head_dim() (std::invalid_argument otherwise).
void apply_rope(float* x, int n_heads, int head_dim, int64_t pos, const RopeTable& table);

// Rotates one head vector with explicit cos/sin of its d/2 angles (the inner step of rotate()).
void rope_rotate_head(float* x, int head_dim, RopeLayout layout, const float* cos_row,
                      const float* sin_row);

}  // namespace kvlab
