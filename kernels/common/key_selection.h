// Which keys a query reads, as data the policies, the CPU kernels and the CUDA kernels share:
// per list (one list per (query row, KV head) of a step; per (request, KV head) of a device
// launch) a sorted set of disjoint slot ranges, in the indptr (CSR) form of the page table
// (FlashInfer's paged_kv_t). A page selection is the special case where every range is a whole
// page ([p * page_size, (p + 1) * page_size)).
//
//   KeySelection      the host-side owner (selection.h): what a policy fills (policy.h), what
//                     the CPU attention reads, what a device launch uploads.
//   KeySelectionView  the same lists as plain pointers, plus the key_offset prefix the kernels
//                     binary-search; host and device (this header, C++17 for nvcc).
//
// Kernels walk the n-th selected key of a list: `slot_of(list, n)`, n in [0, count(list)).
// key_offset[r] = number of selected keys in the ranges before r in the same list (exclusive
// prefix sum, built once per step by `build_key_offsets`), so finding the range of key n is a
// binary search: the last r in the list with key_offset[r] <= n.
//
// The split (FlashDecoding) of a list's selected keys into pieces of keys_per_split keys:
// split s reads selected keys [s * keys_per_split, min(count, (s + 1) * keys_per_split)).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/common/host_device.h"

namespace kvlab {

// A half-open range of slots [begin, end) (two int32: the device kernels read it as is).
struct SlotRange {
  int32_t begin = 0;
  int32_t end = 0;
};

struct KeySelectionView {
  const int32_t* indptr = nullptr;      // [n_lists + 1] into ranges; nullptr = every slot
  const SlotRange* ranges = nullptr;    // [indptr[n_lists]] sorted, disjoint per list
  const int32_t* key_offset = nullptr;  // [indptr[n_lists]] exclusive prefix of range lengths

  KVLAB_HD bool all() const { return indptr == nullptr; }

  // Selected keys of `list`; `n_slots` is the list's slot count, used when all().
  KVLAB_HD int count(int list, int n_slots) const {
    if (all()) return n_slots;
    const int r0 = indptr[list], r1 = indptr[list + 1];
    if (r0 == r1) return 0;
    return key_offset[r1 - 1] + (ranges[r1 - 1].end - ranges[r1 - 1].begin);
  }

  // Index of the range of `list` that holds its n-th selected key (0 <= n < count; not all()).
  KVLAB_HD int range_of(int list, int n) const {
    int lo = indptr[list], hi = indptr[list + 1] - 1;  // invariant: key_offset[lo] <= n
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (key_offset[mid] <= n) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  }
  // Walks forward from range r (key_offset[r] <= n) to the range holding key n: cheaper than a
  // new search when a thread visits increasing n (the kernels' tiles).
  KVLAB_HD int advance(int r, int n) const {
    while (n - key_offset[r] >= ranges[r].end - ranges[r].begin) ++r;
    return r;
  }
  KVLAB_HD int slot_in_range(int r, int n) const { return ranges[r].begin + (n - key_offset[r]); }

  // Slot of the n-th selected key of `list` (0 <= n < count).
  KVLAB_HD int slot_of(int list, int n) const {
    if (all()) return n;
    return slot_in_range(range_of(list, n), n);
  }
};

// Number of selected keys of `list` whose slot is <= max_slot (slots grow with n, so this is a
// binary search). Causal kernels stop there: a valid slot's position is >= the slot (slots are
// filled in position order and compaction only moves them down), so keys past it are masked for
// every query at position <= max_slot.
KVLAB_HD int keys_up_to_slot(const KeySelectionView& sel, int list, int count, int64_t max_slot) {
  int lo = 0, hi = count;  // answer in [lo, hi]: first n with slot_of(n) > max_slot
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (sel.slot_of(list, mid) <= max_slot) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Host: key_offset for every range (restarting at 0 at each list).
inline std::vector<int32_t> build_key_offsets(const std::vector<int32_t>& indptr,
                                              const std::vector<SlotRange>& ranges) {
  std::vector<int32_t> offsets(ranges.size(), 0);
  for (size_t list = 0; list + 1 < indptr.size(); ++list) {
    int32_t acc = 0;
    for (int32_t r = indptr[list]; r < indptr[list + 1]; ++r) {
      offsets[r] = acc;
      acc += ranges[r].end - ranges[r].begin;
    }
  }
  return offsets;
}

// Host: a page selection in the page-table form (per list l: logical page numbers
// pages[page_indptr[l] .. page_indptr[l + 1]), sorted and unique; the list's request holds
// list_slots[l] slots) -> slot ranges, adjacent pages merged, the last page cut at the length.
inline void pages_to_ranges(const std::vector<int32_t>& page_indptr,
                            const std::vector<int32_t>& pages, int page_size,
                            const std::vector<int32_t>& list_slots, std::vector<int32_t>& indptr,
                            std::vector<SlotRange>& ranges) {
  indptr.assign(1, 0);
  ranges.clear();
  for (size_t l = 0; l + 1 < page_indptr.size(); ++l) {
    const size_t first = ranges.size();
    for (int32_t i = page_indptr[l]; i < page_indptr[l + 1]; ++i) {
      const int32_t b = pages[i] * page_size;
      const int32_t e = b + page_size < list_slots[l] ? b + page_size : list_slots[l];
      if (b >= e) continue;
      if (ranges.size() > first && ranges.back().end == b) {
        ranges.back().end = e;
      } else {
        ranges.push_back({b, e});
      }
    }
    indptr.push_back(static_cast<int32_t>(ranges.size()));
  }
}

// [begin, end) of the selected keys that split `split` reads; empty when past the end.
struct KeySpan {
  int begin = 0;
  int end = 0;
};
KVLAB_HD KeySpan split_span(int count, int keys_per_split, int split) {
  const int b = split * keys_per_split;
  const int e = b + keys_per_split;
  KeySpan s;
  s.begin = b < count ? b : count;
  s.end = e < count ? e : count;
  return s;
}

// Host plan of a split-K launch: enough pieces to fill the device (at least `min_ctas` work
// items over n_lists lists), each a multiple of `tile_keys` and at least `min_keys_per_split`
// keys long, so the merge stays cheap. Returns keys_per_split (>= tile_keys).
inline int choose_keys_per_split(int max_count, int n_lists, int min_ctas, int tile_keys,
                                 int min_keys_per_split) {
  if (max_count <= 0 || n_lists <= 0) return tile_keys;
  const int splits_wanted = (min_ctas + n_lists - 1) / n_lists;
  int per = (max_count + splits_wanted - 1) / splits_wanted;
  if (per < min_keys_per_split) per = min_keys_per_split;
  per = (per + tile_keys - 1) / tile_keys * tile_keys;
  return per;
}

inline int num_splits_for(int max_count, int keys_per_split) {
  return max_count <= 0 ? 1 : (max_count + keys_per_split - 1) / keys_per_split;
}

}  // namespace kvlab
