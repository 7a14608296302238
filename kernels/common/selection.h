// The host side of a policy's output, as data: a KeySelection (which slots each query row and
// KV head reads, in the CSR form of key_selection.h) and Evictions (which (slot, KV head) cells
// to drop). Policies fill them (framework/policy/policy.h), the CPU attention reads the
// selection (kernels/cpu/attention.h), the KV store carries out the evictions
// (framework/kv/kv_store.h) and the device planner flattens selections into launches
// (framework/engine/device_plan.h). Host only (C++20); the kernels' view is KeySelectionView.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/common/key_selection.h"

namespace kvlab {

// Which slots each (query row, KV head) may read. Attention always also applies causality by
// position (key position <= query position) and skips evicted slots, so `all` means "every
// valid, causal slot" (full attention). Otherwise the ranges of row r and KV head h are
// ranges[indptr[r * n_kv_heads + h] .. indptr[r * n_kv_heads + h + 1]), sorted, disjoint.
struct KeySelection {
  bool all = true;
  int n_rows = 0;
  int n_kv_heads = 0;
  std::vector<int32_t> indptr;  // [n_rows * n_kv_heads + 1]
  std::vector<SlotRange> ranges;

  void select_all() { all = true; indptr.clear(); ranges.clear(); }
  // Starts an explicit selection for n_rows x n_kv_heads lists; then call add() in (row, head)
  // order and close_list() after each list.
  void begin(int rows, int kv_heads) {
    all = false; n_rows = rows; n_kv_heads = kv_heads;
    indptr.assign(1, 0); ranges.clear();
  }
  void add(int32_t begin_slot, int32_t end_slot) {
    if (begin_slot >= end_slot) return;
    const bool list_open = static_cast<int32_t>(ranges.size()) > indptr.back();
    if (list_open && ranges.back().end == begin_slot) {
      ranges.back().end = end_slot;  // merge adjacent ranges of the same list
      return;
    }
    ranges.push_back({begin_slot, end_slot});
  }
  void close_list() { indptr.push_back(static_cast<int32_t>(ranges.size())); }
  std::span<const SlotRange> list(int row, int kv_head) const {
    const int i = row * n_kv_heads + kv_head;
    return {ranges.data() + indptr[i], ranges.data() + indptr[i + 1]};
  }
};

// Slots to drop, per KV head: slots[h] (any order; duplicates and already-evicted slots are
// errors). Evicting the same slots for every head is the common case (use evict_all_heads).
struct Evictions {
  std::vector<std::vector<int32_t>> slots;  // [n_kv_heads][...]
  void clear(int n_kv_heads) { slots.assign(n_kv_heads, {}); }
  void evict_all_heads(int32_t slot) { for (auto& s : slots) s.push_back(slot); }
  bool empty() const { for (auto& s : slots) if (!s.empty()) return false; return true; }
};

}  // namespace kvlab
