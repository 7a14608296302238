// Argument checks shared by the attention reference and fast path (internal to kernels/cpu).
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"

namespace kvlab {

inline bool selection_is_all(const AttentionArgs& a) {
  return a.selection == nullptr || a.selection->all;
}

// The slots row r's query reads for KV head g, in slot order: the selection's (or every slot),
// then only the valid ones at or before the query's position. For the reference paths.
inline void candidate_slots(const AttentionArgs& a, int r, int g, std::vector<int>& slots) {
  const LayerKv& kv = a.kv;
  slots.clear();
  auto consider = [&](int slot) {
    if (kv.is_valid(slot, g) && kv.position(slot, g) <= a.q_positions[r]) slots.push_back(slot);
  };
  if (selection_is_all(a)) {
    for (int slot = 0; slot < kv.n_slots; ++slot) consider(slot);
  } else {
    for (const SlotRange& range : a.selection->list(a.selection_row + r, g))
      for (int slot = range.begin; slot < range.end; ++slot) consider(slot);
  }
}

// Throws std::invalid_argument naming the first inconsistent field.
inline void check_attention_args(const AttentionArgs& a) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("attention: " + what); };
  if (a.n_rows < 0 || a.n_heads <= 0 || a.n_kv_heads <= 0 || a.head_dim <= 0)
    bad("non-positive shape");
  if (a.n_heads % a.n_kv_heads != 0) bad("n_heads is not a multiple of n_kv_heads");
  if (a.kv.view.num_kv_heads != a.n_kv_heads || a.kv.view.head_dim != a.head_dim)
    bad("LayerKv shape differs from the arguments");
  if (a.n_rows > 0 && (a.q == nullptr || a.q_positions == nullptr || a.out == nullptr))
    bad("q, q_positions and out are required");
  if (a.rope == nullptr && a.key_rope_pos != nullptr) bad("key_rope_pos without a rope table");
  if (a.head_mass_first_row < 0 || a.head_mass_first_row > a.n_rows) bad("head_mass_first_row out of [0, n_rows]");
  if (a.rope != nullptr && a.key_rope_pos == nullptr && a.kv.n_slots > 0)
    bad("rope at read needs key_rope_pos");
  if (a.rope != nullptr && a.rope->head_dim() != a.head_dim) bad("rope table head_dim differs");
  if (!selection_is_all(a)) {
    const KeySelection& s = *a.selection;
    if (a.selection_row < 0 || s.n_rows < a.selection_row + a.n_rows || s.n_kv_heads != a.n_kv_heads ||
        static_cast<int64_t>(s.indptr.size()) != static_cast<int64_t>(s.n_rows) * a.n_kv_heads + 1)
      bad("selection shape differs from the arguments (finish every list with close_list())");
    if (s.indptr.back() != static_cast<int32_t>(s.ranges.size())) bad("selection indptr/ranges mismatch");
    const int32_t first = s.indptr[static_cast<size_t>(a.selection_row) * a.n_kv_heads];
    const int32_t last = s.indptr[static_cast<size_t>(a.selection_row + a.n_rows) * a.n_kv_heads];
    for (int32_t i = first; i < last; ++i) {
      const SlotRange& r = s.ranges[i];
      if (r.begin < 0 || r.end > a.kv.n_slots || r.begin > r.end)
        bad("selection range [" + std::to_string(r.begin) + ", " + std::to_string(r.end) +
            ") outside [0, " + std::to_string(a.kv.n_slots) + ")");
    }
  }
}

}  // namespace kvlab
