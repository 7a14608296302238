// The selection walk (n-th selected key -> slot), the split spans and the window/sink mask,
// against plain enumeration.
#include "kernels/common/key_selection.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/common/masks.h"
#include "kernels/common/paged_kv.h"

namespace kvlab {
namespace {

TEST(KeySelection, SlotOfEnumeratesEveryRangeInOrder) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 100; ++trial) {
    const int n_lists = 1 + rng() % 6;
    std::vector<int32_t> indptr{0};
    std::vector<SlotRange> ranges;
    std::vector<std::vector<int>> expected(n_lists);
    for (int l = 0; l < n_lists; ++l) {
      int pos = rng() % 4;
      const int n_ranges = rng() % 5;  // empty lists too
      for (int r = 0; r < n_ranges; ++r) {
        const int len = 1 + rng() % 9;
        ranges.push_back({pos, pos + len});
        for (int s = pos; s < pos + len; ++s) expected[l].push_back(s);
        pos += len + 1 + rng() % 5;
      }
      indptr.push_back(static_cast<int32_t>(ranges.size()));
    }
    const std::vector<int32_t> offsets = build_key_offsets(indptr, ranges);
    const KeySelectionView sel{indptr.data(), ranges.data(), offsets.data()};
    for (int l = 0; l < n_lists; ++l) {
      ASSERT_EQ(sel.count(l, 1000), static_cast<int>(expected[l].size()));
      for (size_t n = 0; n < expected[l].size(); ++n)
        ASSERT_EQ(sel.slot_of(l, static_cast<int>(n)), expected[l][n]) << "list " << l;
      if (!expected[l].empty()) {  // walking forward from the first range finds every key
        int r = sel.range_of(l, 0);
        for (size_t n = 0; n < expected[l].size(); n += 1 + rng() % 3) {
          r = sel.advance(r, static_cast<int>(n));
          ASSERT_EQ(sel.slot_in_range(r, static_cast<int>(n)), expected[l][n]);
        }
      }
      for (int max_slot = -1; max_slot < 60; ++max_slot) {
        int want = 0;
        for (int s : expected[l]) want += s <= max_slot;
        ASSERT_EQ(keys_up_to_slot(sel, l, sel.count(l, 0), max_slot), want);
      }
    }
  }
  const KeySelectionView all{};
  EXPECT_EQ(all.count(0, 37), 37);
  EXPECT_EQ(all.slot_of(0, 12), 12);
}

TEST(KeySelection, PagesToRangesMergesAndCutsTheLastPage) {
  // List 0: pages 0, 1, 3 of a 40-slot request (page 16 -> slots [0,32) and [48,40) = cut to
  // nothing past the length); list 1: page 2 of a 40-slot request -> [32, 40); list 2: none.
  std::vector<int32_t> indptr;
  std::vector<SlotRange> ranges;
  pages_to_ranges({0, 3, 4, 4}, {0, 1, 3, 2}, 16, {40, 40, 40}, indptr, ranges);
  ASSERT_EQ(indptr, (std::vector<int32_t>{0, 1, 2, 2}));
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0].begin, 0);
  EXPECT_EQ(ranges[0].end, 32);
  EXPECT_EQ(ranges[1].begin, 32);
  EXPECT_EQ(ranges[1].end, 40);
}

TEST(KeySelection, SplitsCoverEveryKeyOnce) {
  for (int count : {0, 1, 15, 16, 17, 1000}) {
    for (int per : {16, 64, 256}) {
      const int splits = num_splits_for(count, per);
      int covered = 0;
      for (int s = 0; s < splits + 1; ++s) {  // one past the end must be empty
        const KeySpan span = split_span(count, per, s);
        ASSERT_LE(span.begin, span.end);
        ASSERT_EQ(span.begin, covered < count ? covered : count);
        covered += span.end - span.begin;
      }
      ASSERT_EQ(covered, count);
    }
  }
  // The plan fills the device but never splits below the minimum.
  EXPECT_EQ(choose_keys_per_split(8192, 512, 1056, 32, 256), 2752);  // 3 splits
  EXPECT_EQ(choose_keys_per_split(8192, 1, 1056, 32, 256), 256);
  EXPECT_EQ(choose_keys_per_split(100, 4, 8, 32, 32) % 32, 0);
}

TEST(Masks, WindowSinkMaskMatchesDefinition) {
  for (int64_t window : {0, 1, 5}) {
    for (int64_t sinks : {0, 2}) {
      for (bool plus_one : {false, true}) {
        const WindowSinkMask m{window, sinks, plus_one};
        for (int64_t i = 0; i < 12; ++i) {
          for (int64_t j = 0; j < 14; ++j) {
            bool want = j <= i;
            if (want && window > 0 && j >= sinks) want = i - j < window + (plus_one ? 1 : 0);
            ASSERT_EQ(m(i, j), want) << window << " " << sinks << " " << i << " " << j;
          }
        }
      }
    }
  }
}

TEST(PagedKv, MetaOffsetIsKeyOffsetWithoutFeatures) {
  const int32_t indptr[] = {0, 2};
  const int32_t indices[] = {5, 3};
  const int32_t last[] = {4};
  PagedKvView<float> v;
  v.page_size = 7;
  v.num_kv_heads = 3;
  v.head_dim = 8;
  v.indptr = indptr;
  v.indices = indices;
  v.last_page_len = last;
  EXPECT_EQ(v.length(0), 11);
  for (int slot = 0; slot < 11; ++slot)
    for (int h = 0; h < 3; ++h)
      EXPECT_EQ(v.slot_meta_offset(0, slot, h) * 8, v.slot_offset(0, slot, h));
}

}  // namespace
}  // namespace kvlab
