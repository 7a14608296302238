#include "policies/cache_scan.h"

#include <algorithm>

namespace kvlab {

int CacheScan::first_slot_at_or_after(int h, int64_t pos) const {
  if (n_slots_ == 0) return 0;
  const int64_t p0 = position(0, h);
  if (pos <= p0) return 0;
  // Dense guess: no holes were compacted away before this slot.
  const int64_t guess = pos - p0;
  if (guess < n_slots_ && position(int(guess), h) == pos && position(int(guess) - 1, h) < pos)
    return int(guess);
  int lo = 0, hi = n_slots_;  // invariant: position(lo) < pos (lo = 0 checked above)
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (position(mid, h) < pos) lo = mid; else hi = mid;
  }
  return hi;
}

void CacheScan::valid_slots(int h, std::vector<int32_t>& slots,
                            std::vector<int64_t>* positions) const {
  slots.clear();
  if (positions) positions->clear();
  for (int s = 0; s < n_slots_; ++s)
    if (valid(s, h)) {
      slots.push_back(s);
      if (positions) positions->push_back(position(s, h));
    }
}

int64_t CacheScan::count_valid(int h) const {
  int64_t n = 0;
  for (int s = 0; s < n_slots_; ++s) n += valid(s, h);
  return n;
}

void normalize_ranges(std::vector<PosRange>& ranges, int64_t limit) {
  for (auto& r : ranges) {
    r.begin = std::max<int64_t>(r.begin, 0);
    r.end = std::min(r.end, limit);
  }
  std::erase_if(ranges, [](const PosRange& r) { return r.begin >= r.end; });
  std::sort(ranges.begin(), ranges.end(),
            [](const PosRange& a, const PosRange& b) { return a.begin < b.begin; });
  size_t w = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (w > 0 && ranges[i].begin <= ranges[w - 1].end)
      ranges[w - 1].end = std::max(ranges[w - 1].end, ranges[i].end);
    else
      ranges[w++] = ranges[i];
  }
  ranges.resize(w);
}

void add_position_ranges(const CacheScan& scan, int h, std::span<const PosRange> ranges,
                         KeySelection& out) {
  for (const PosRange& r : ranges) {
    const int b = scan.first_slot_at_or_after(h, r.begin);
    const int e = scan.first_slot_at_or_after(h, r.end);
    out.add(b, e);
  }
}

}  // namespace kvlab
