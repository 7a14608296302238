#include "kernels/cpu/attention_stats.h"

#include <stdexcept>
#include <vector>

namespace kvlab {

void window_attention(const AttentionArgs& a, int first_row, float* out) {
  if (first_row < 0 || first_row > a.n_rows)
    throw std::invalid_argument("window_attention: first_row out of [0, n_rows]");
  // Attention is row by row: the window rows alone, their output discarded.
  const int rows = a.n_rows - first_row;
  std::vector<float> discard(static_cast<size_t>(rows) * a.n_heads * a.head_dim);
  AttentionArgs w = a;
  w.q = a.q == nullptr ? nullptr : a.q + static_cast<size_t>(first_row) * a.n_heads * a.head_dim;
  w.q_positions = a.q_positions == nullptr ? nullptr : a.q_positions + first_row;
  w.n_rows = rows;
  w.selection_row = a.selection_row + first_row;
  w.out = discard.data();
  w.lse = nullptr;
  w.key_mass = nullptr;
  w.head_mass = out;
  w.head_mass_first_row = 0;
  attention_naive(w);
}

}  // namespace kvlab
