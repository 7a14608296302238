// Reference attention: for each (row, head) the candidate slots (selection, valid, causal), then
// the one fp64 dense reference (kernels/testing/reference_attention.h) over them. Written for
// clarity, not speed. A quantised store's rows are decoded one at a time as the reference reads
// them (LayerKv::load_key / load_value), never into a copy of the cache.
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_common.h"
#include "kernels/testing/reference_attention.h"

namespace kvlab {

void attention_naive(const AttentionArgs& a) {
  check_attention_args(a);
  const int D = a.head_dim, G = a.n_heads / a.n_kv_heads, Hkv = a.n_kv_heads;
  const LayerKv& kv = a.kv;
  std::vector<float> keys;  // rope at read: the candidates' rotated keys [slots, D]
  std::vector<int> slots;
  const bool f32 = kv.format() == KvFormat::kF32;
  std::vector<float> krow(static_cast<size_t>(D)), vrow(static_cast<size_t>(D));  // decoded rows
  for (int r = 0; r < a.n_rows; ++r) {
    for (int h = 0; h < a.n_heads; ++h) {
      const int g = h / G;
      const float* q = a.q + (static_cast<size_t>(r) * a.n_heads + h) * D;
      candidate_slots(a, r, g, slots);
      // The fp64 dense reference over the candidates (keys rotated at read when asked).
      if (a.rope != nullptr) {
        keys.resize(slots.size() * D);
        for (size_t j = 0; j < slots.size(); ++j) {
          kv.load_key(slots[j], g, &keys[j * D]);
          a.rope->rotate(&keys[j * D], a.key_rope_pos[static_cast<size_t>(slots[j]) * Hkv + g]);
        }
      }
      const testing::ReferenceRow ref = testing::reference_attention_row(
          q, D, static_cast<int64_t>(slots.size()), a.scale,
          [&](int64_t j) {
            if (a.rope != nullptr) return static_cast<const float*>(&keys[j * D]);
            if (f32) return kv.key(slots[j], g);
            kv.load_key(slots[j], g, krow.data());  // read at once (reference_attention.h)
            return static_cast<const float*>(krow.data());
          },
          [&](int64_t j) {
            if (f32) return kv.value(slots[j], g);
            kv.load_value(slots[j], g, vrow.data());
            return static_cast<const float*>(vrow.data());
          },
          [](int64_t) { return true; }, a.softcap);
      float* out = a.out + (static_cast<size_t>(r) * a.n_heads + h) * D;
      for (int d = 0; d < D; ++d) out[d] = static_cast<float>(ref.out[d]);
      if (a.key_mass != nullptr)
        for (size_t j = 0; j < slots.size(); ++j)
          a.key_mass[static_cast<size_t>(g) * kv.n_slots + slots[j]] += static_cast<float>(ref.p[j]);
      if (a.head_mass != nullptr && r >= a.head_mass_first_row)
        for (size_t j = 0; j < slots.size(); ++j)
          a.head_mass[static_cast<size_t>(h) * kv.n_slots + slots[j]] += static_cast<float>(ref.p[j]);
      if (a.lse != nullptr)
        a.lse[static_cast<size_t>(r) * a.n_heads + h] =
            slots.empty() ? -std::numeric_limits<float>::infinity() : static_cast<float>(ref.lse);
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
