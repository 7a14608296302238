#include "kernels/cpu/attention_stats.h"

#include <cmath>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/attention_common.h"

namespace kvlab {

void window_attention(const AttentionArgs& a, int first_row, float* out) {
  AttentionArgs checked = a;  // out is not written here: the checks need only a non-null one
  if (checked.out == nullptr) checked.out = out;
  check_attention_args(checked);
  if (first_row < 0 || first_row > a.n_rows)
    throw std::invalid_argument("window_attention: first_row out of [0, n_rows]");
  const int D = a.head_dim, G = a.n_heads / a.n_kv_heads, Hkv = a.n_kv_heads;
  const LayerKv& kv = a.kv;
  std::vector<int> slots;
  std::vector<double> s;
  std::vector<float> rotated(static_cast<size_t>(D));
  const bool f32 = kv.format() == KvFormat::kF32;
  for (int r = first_row; r < a.n_rows; ++r) {
    for (int h = 0; h < a.n_heads; ++h) {
      const int g = h / G;
      const float* q = a.q + (static_cast<size_t>(r) * a.n_heads + h) * D;
      candidate_slots(a, r, g, slots);
      if (slots.empty()) continue;
      s.resize(slots.size());
      double m = -INFINITY;
      for (size_t j = 0; j < slots.size(); ++j) {
        // f32: the stored row; other formats: the dequantised one (kv_format.h).
        const float* k = f32 ? kv.key(slots[j], g) : rotated.data();
        if (!f32) kv.load_key(slots[j], g, rotated.data());
        if (a.rope != nullptr) {
          if (f32) for (int d = 0; d < D; ++d) rotated[d] = k[d];
          a.rope->rotate(rotated.data(), a.key_rope_pos[static_cast<size_t>(slots[j]) * Hkv + g]);
          k = rotated.data();
        }
        // Eight independent partial sums (a single chain is latency-bound: one FMA per 4
        // cycles); in double the order changes nothing beyond ~1e-16 relative.
        double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int d = 0;
        for (; d + 8 <= D; d += 8)
          for (int u = 0; u < 8; ++u) part[u] += double(q[d + u]) * double(k[d + u]);
        for (; d < D; ++d) part[0] += double(q[d]) * double(k[d]);
        const double dot = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
        s[j] = dot * a.scale;
        if (a.softcap > 0) s[j] = a.softcap * std::tanh(s[j] / a.softcap);
        m = std::max(m, s[j]);
      }
      double z = 0;
      for (double& x : s) z += (x = std::exp(x - m));
      float* o = out + static_cast<size_t>(h) * kv.n_slots;
      for (size_t j = 0; j < slots.size(); ++j) o[slots[j]] += static_cast<float>(s[j] / z);
    }
  }
}

}  // namespace kvlab
