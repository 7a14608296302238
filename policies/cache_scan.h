// Small helpers every built-in policy uses to read a LayerCacheView quickly and to turn sorted
// position ranges into slot ranges of a KeySelection.
//
// They rely on the order contract of LayerCacheView (policy.h): per KV head, slot positions are
// non-decreasing in slot (strictly increasing over valid slots), so a position range [a, b) is the slot range
// [first_slot_at_or_after(a), first_slot_at_or_after(b)) (holes inside are skipped by attention).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "framework/policy/policy.h"

namespace kvlab {

// Reads slot metadata through the flat arrays when the view offers them, else virtually.
class CacheScan {
 public:
  CacheScan(const LayerCacheView& view, int n_kv_heads)
      : view_(view), n_kv_(n_kv_heads), n_slots_(view.n_slots()),
        pos_(view.positions_data()), valid_(view.valid_data()) {}
  int n_slots() const { return n_slots_; }
  int64_t position(int slot, int h) const {
    return pos_ ? pos_[int64_t(slot) * n_kv_ + h] : view_.slot_position(slot, h);
  }
  bool valid(int slot, int h) const {
    return valid_ ? valid_[int64_t(slot) * n_kv_ + h] != 0 : view_.slot_valid(slot, h);
  }
  // Smallest slot whose position is >= pos (n_slots when none). O(1) when slots are dense
  // (slot = position - position(0)), else binary search.
  int first_slot_at_or_after(int h, int64_t pos) const;
  // Valid slots of head h in order, with their positions.
  void valid_slots(int h, std::vector<int32_t>& slots, std::vector<int64_t>* positions = nullptr) const;
  int64_t count_valid(int h) const;
  const LayerCacheView& view() const { return view_; }

 private:
  const LayerCacheView& view_;
  int n_kv_;
  int n_slots_;
  const int64_t* pos_;
  const uint8_t* valid_;
};

// Half-open position range [begin, end).
struct PosRange {
  int64_t begin = 0;
  int64_t end = 0;
};

// Sorts, clips to [0, limit) and merges overlapping/adjacent ranges in place.
void normalize_ranges(std::vector<PosRange>& ranges, int64_t limit);

// Appends the slot ranges covering the normalized position ranges to `out`'s open list.
void add_position_ranges(const CacheScan& scan, int h, std::span<const PosRange> ranges,
                         KeySelection& out);

// Fills `out` with one list per (new query row, KV head): the slots of the normalized position
// ranges ranges_for(i, h) gives (a span of PosRange) for the query at text position i on head h.
template <class RangesFor>
void select_position_ranges(const LayerStep& step, int n_kv_heads, KeySelection& out, RangesFor&& ranges_for) {
  const CacheScan scan(*step.cache, n_kv_heads);
  out.begin(step.n_new, n_kv_heads);
  for (int r = 0; r < step.n_new; ++r) {
    const int64_t i = step.positions[r];
    for (int h = 0; h < n_kv_heads; ++h) {
      add_position_ranges(scan, h, ranges_for(i, h), out);
      out.close_list();
    }
  }
}

// Text positions seen so far after this step: last new position + 1.
inline int64_t tokens_seen(const LayerStep& step) {
  return step.positions.empty() ? 0 : step.positions.back() + 1;
}

}  // namespace kvlab
