// Reference attention: for each (row, head) materialise the score row over the candidate slots,
// softmax in double, weighted sum of values. Written for clarity, not speed.
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_common.h"

namespace kvlab {

void attention_naive(const AttentionArgs& a) {
  check_attention_args(a);
  const int D = a.head_dim, G = a.n_heads / a.n_kv_heads, Hkv = a.n_kv_heads;
  const LayerKv& kv = a.kv;
  std::vector<float> key(D);
  std::vector<int> slots;
  std::vector<double> scores;
  for (int r = 0; r < a.n_rows; ++r) {
    for (int h = 0; h < a.n_heads; ++h) {
      const int g = h / G;
      const float* q = a.q + (static_cast<size_t>(r) * a.n_heads + h) * D;
      // Candidate slots: the selection (or all), then valid and causal.
      slots.clear();
      auto consider = [&](int s) {
        if (kv.is_valid(s, g) && kv.position(s, g) <= a.q_positions[r]) slots.push_back(s);
      };
      if (selection_is_all(a)) {
        for (int s = 0; s < kv.n_slots; ++s) consider(s);
      } else {
        for (const SlotRange& range : a.selection->list(r, g))
          for (int s = range.begin; s < range.end; ++s) consider(s);
      }
      // Score row s_j = tau q . k_j (k rotated at read when asked).
      scores.assign(slots.size(), 0.0);
      double m = -std::numeric_limits<double>::infinity();
      for (size_t j = 0; j < slots.size(); ++j) {
        const float* k = kv.key(slots[j], g);
        for (int d = 0; d < D; ++d) key[d] = k[d];
        if (a.rope != nullptr)
          a.rope->rotate(key.data(), a.key_rope_pos[static_cast<size_t>(slots[j]) * Hkv + g]);
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * key[d];
        scores[j] = a.scale * dot;
        m = std::max(m, scores[j]);
      }
      double l = 0;
      for (double& s : scores) l += (s = std::exp(s - m));
      float* out = a.out + (static_cast<size_t>(r) * a.n_heads + h) * D;
      std::vector<double> acc(D, 0.0);
      for (size_t j = 0; j < slots.size(); ++j) {
        const double p = scores[j] / l;
        const float* v = kv.value(slots[j], g);
        for (int d = 0; d < D; ++d) acc[d] += p * v[d];
        if (a.key_mass != nullptr)
          a.key_mass[static_cast<size_t>(g) * kv.n_slots + slots[j]] += static_cast<float>(p);
      }
      for (int d = 0; d < D; ++d) out[d] = static_cast<float>(acc[d]);
      if (a.lse != nullptr)
        a.lse[static_cast<size_t>(r) * a.n_heads + h] =
            slots.empty() ? -std::numeric_limits<float>::infinity()
                          : static_cast<float>(m + std::log(l));
    }
  }
}

void cache_rank_positions(const LayerKv& kv, int32_t* out) {
  const int H = kv.view.num_kv_heads;
  for (int g = 0; g < H; ++g) {
    int32_t rank = 0;
    for (int s = 0; s < kv.n_slots; ++s)
      out[static_cast<size_t>(s) * H + g] = kv.is_valid(s, g) ? rank++ : -1;
  }
}

}  // namespace kvlab
