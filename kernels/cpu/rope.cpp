// RoPE table and rotation (math in rope.h).
#include "kernels/cpu/rope.h"

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

namespace kvlab {

std::vector<double> rope_inv_freq(const RopeConfig& c) {
  if (c.head_dim <= 0 || c.head_dim % 2 != 0)
    throw std::invalid_argument("RoPE: head_dim must be positive and even, got " +
                                std::to_string(c.head_dim));
  if (c.scaling != RopeScalingKind::kNone && !(c.factor > 0))
    throw std::invalid_argument("RoPE: scaling factor must be > 0");
  const int half = c.head_dim / 2;
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) inv[i] = std::pow(c.theta, -2.0 * i / c.head_dim);
  if (c.scaling == RopeScalingKind::kLinear) {
    for (double& f : inv) f /= c.factor;
  } else if (c.scaling == RopeScalingKind::kLlama3) {
    if (!(c.high_freq_factor > c.low_freq_factor))
      throw std::invalid_argument("RoPE llama3: high_freq_factor must exceed low_freq_factor");
    const double old_len = static_cast<double>(c.original_max_position);
    const double low_freq_wavelen = old_len / c.low_freq_factor;
    const double high_freq_wavelen = old_len / c.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen < high_freq_wavelen) continue;
      if (wavelen > low_freq_wavelen) {
        f /= c.factor;
      } else {
        const double s = (old_len / wavelen - c.low_freq_factor) /
                         (c.high_freq_factor - c.low_freq_factor);
        f = (1.0 - s) * f / c.factor + s * f;
      }
    }
  }
  if (!c.freq_factors.empty()) {
    if (static_cast<int>(c.freq_factors.size()) != half)
      throw std::invalid_argument("RoPE: " + std::to_string(c.freq_factors.size()) +
                                  " frequency factors, expected head_dim/2 = " + std::to_string(half));
    for (int i = 0; i < half; ++i) {
      if (!(c.freq_factors[i] > 0)) throw std::invalid_argument("RoPE: frequency factors must be > 0");
      inv[i] /= c.freq_factors[i];
    }
  }
  return inv;
}

RopeTable::RopeTable(const RopeConfig& config, int64_t n_positions)
    : config_(config), n_positions_(n_positions < 0 ? 0 : n_positions),
      inv_freq_(rope_inv_freq(config)) {
  const int half = config_.head_dim / 2;
  cos_.resize(static_cast<size_t>(n_positions_) * half);
  sin_.resize(cos_.size());
  for (int64_t p = 0; p < n_positions_; ++p) compute_angles(p, &cos_[p * half], &sin_[p * half]);
}

void RopeTable::compute_angles(int64_t pos, float* cos_out, float* sin_out) const {
  const int half = config_.head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double a = static_cast<double>(pos) * inv_freq_[i];
    cos_out[i] = static_cast<float>(std::cos(a));
    sin_out[i] = static_cast<float>(std::sin(a));
  }
}

void RopeTable::angles(int64_t pos, float* cos_out, float* sin_out) const {
  const int half = config_.head_dim / 2;
  if (const float* c = cos_row(pos)) {
    const float* s = sin_row(pos);
    for (int i = 0; i < half; ++i) { cos_out[i] = c[i]; sin_out[i] = s[i]; }
    return;
  }
  compute_angles(pos, cos_out, sin_out);
}

void rope_rotate_head(float* x, int head_dim, RopeLayout layout, const float* c, const float* s) {
  const int half = head_dim / 2;
  if (layout == RopeLayout::kInterleaved) {
    for (int i = 0; i < half; ++i) {
      const float a = x[2 * i], b = x[2 * i + 1];
      x[2 * i] = a * c[i] - b * s[i];
      x[2 * i + 1] = a * s[i] + b * c[i];
    }
  } else {
    for (int i = 0; i < half; ++i) {
      const float a = x[i], b = x[i + half];
      x[i] = a * c[i] - b * s[i];
      x[i + half] = a * s[i] + b * c[i];
    }
  }
}

namespace {

// Rotates n_heads head vectors of x to `pos`: the table's row, or (past the table) the angles
// computed once into stack buffers for head_dim <= 512 (this runs per key in attention).
void rotate_heads(const RopeTable& t, float* x, int n_heads, int64_t pos) {
  const int d = t.head_dim(), half = d / 2;
  const RopeLayout layout = t.config().layout;
  if (const float* c = t.cos_row(pos)) {
    const float* s = t.sin_row(pos);
    for (int h = 0; h < n_heads; ++h) rope_rotate_head(x + static_cast<size_t>(h) * d, d, layout, c, s);
    return;
  }
  constexpr int kStackHalf = 256;
  float c_stack[kStackHalf], s_stack[kStackHalf];
  std::vector<float> c_heap, s_heap;
  float* c = c_stack;
  float* s = s_stack;
  if (half > kStackHalf) {
    c_heap.resize(half);
    s_heap.resize(half);
    c = c_heap.data();
    s = s_heap.data();
  }
  t.angles(pos, c, s);
  for (int h = 0; h < n_heads; ++h) rope_rotate_head(x + static_cast<size_t>(h) * d, d, layout, c, s);
}

}  // namespace

void RopeTable::rotate(float* x, int64_t pos) const { rotate_heads(*this, x, 1, pos); }

void apply_rope(float* x, int n_heads, int head_dim, int64_t pos, const RopeTable& table) {
  if (head_dim != table.head_dim())
    throw std::invalid_argument("apply_rope: head_dim " + std::to_string(head_dim) +
                                " != table head_dim " + std::to_string(table.head_dim()));
  rotate_heads(table, x, n_heads, pos);
}

}  // namespace kvlab
