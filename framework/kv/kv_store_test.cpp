// KvStore and BlockPool: allocation, reference counts, out-of-blocks as a status (nothing
// half-allocated), fork + copy-on-write exactness, eviction frees blocks, compaction keeps data
// and positions exact (per-head evictions, shared blocks), waste < 5% on a mixed-length batch,
// and the views every reader uses agree with a mirror of the tokens (kv_format_test.cpp: the
// formats and attention over the store).
#include "framework/kv/kv_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "framework/core/error.h"
#include "framework/kv/kv_store_test_util.h"
#include "framework/policy/layer_kv_cache_view.h"

namespace kvlab {
namespace {

using kv_test::expect_head_blocks_follow_live_cells;
using kv_test::expect_matches;
using kv_test::Fixture;
using kv_test::HeadTokens;
using kv_test::live_slots;
using kv_test::RandomStoreWalk;
using kv_test::referenced_blocks;
using kv_test::Token;

TEST(BlockPool, AllocateReleaseRefCount) {
  BlockPool pool(3, 8);
  EXPECT_EQ(pool.n_free(), 3);
  const int32_t a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  EXPECT_EQ(pool.allocate(), -1);  // exhausted: a value, not a crash
  EXPECT_EQ(pool.n_in_use(), 3);
  EXPECT_EQ(pool.peak_in_use(), 3);
  pool.retain(b);
  EXPECT_EQ(pool.ref_count(b), 2);
  EXPECT_EQ(pool.n_shared(), 1);
  pool.release(b);
  EXPECT_EQ(pool.n_free(), 0);
  pool.release(b);
  EXPECT_EQ(pool.n_free(), 1);
  EXPECT_EQ(pool.allocate(), b);  // LIFO reuse
  pool.release(a);
  pool.release(b);
  pool.release(c);
  EXPECT_EQ(pool.n_free(), 3);
  EXPECT_EQ(pool.n_shared(), 0);
  EXPECT_THROW(pool.release(a), Error);
}

TEST(KvStore, AppendAndReadBack) {
  Fixture f(2, 3, 8, 4, 64);
  KvStore store(f.cfg);
  auto model = f.empty_model();
  const SeqId s = f.filled_sequence(store, 11, model, 100);
  if (HasFatalFailure()) return;
  expect_matches(store, s, model);
  EXPECT_EQ(store.stats().blocks_in_use, 2 * 3);  // ceil(11/4) blocks per layer
  EXPECT_THROW(store.append(s, 0, 111, model[0][0][0].k.data(), model[0][0][0].v.data()), Error);
  ASSERT_EQ(store.reserve(s, 1), AllocStatus::kOk);
  std::vector<float> kv_row(3 * 8, 0.f);
  EXPECT_THROW(store.append(s, 0, 110, kv_row.data(), kv_row.data()), Error);  // not increasing
  EXPECT_EQ(store.append(s, 0, 111, kv_row.data(), kv_row.data()), 11);
  EXPECT_THROW(store.layer(s, 2), Error);
  EXPECT_THROW(store.layer(s + 7, 0), Error);
}

TEST(KvStore, OutOfBlocksIsAStatusAndAllOrNothing) {
  Fixture f(3, 2, 8, 4, 10);  // 10 blocks; a 3-layer token needs 3 blocks per 4 tokens
  KvStore store(f.cfg);
  const SeqId a = store.create_sequence();
  ASSERT_EQ(store.reserve(a, 12), AllocStatus::kOk);  // 9 blocks
  EXPECT_EQ(store.free_blocks(), 1);
  const SeqId b = store.create_sequence();
  EXPECT_EQ(store.blocks_needed(b, 1), 3);
  EXPECT_EQ(store.reserve(b, 1), AllocStatus::kOutOfBlocks);
  EXPECT_EQ(store.free_blocks(), 1);  // nothing half-allocated
  EXPECT_EQ(store.sequence_blocks(b), 0);
  EXPECT_EQ(store.reserve(a, 1), AllocStatus::kOutOfBlocks);
  EXPECT_EQ(store.sequence_blocks(a), 9);
  store.free_sequence(a);
  EXPECT_EQ(store.free_blocks(), 10);
  EXPECT_EQ(store.reserve(b, 1), AllocStatus::kOk);
  // A budget below one block: every reserve reports kOutOfBlocks.
  KvStoreConfig tiny = f.cfg;
  tiny.budget_bytes = 100;
  KvStore empty(tiny);
  EXPECT_EQ(empty.stats().blocks_total, 0);
  EXPECT_EQ(empty.reserve(empty.create_sequence(), 1), AllocStatus::kOutOfBlocks);
}

TEST(KvStore, ForkSharesPrefixAndCopiesOnWrite) {
  Fixture f(2, 2, 16, 16, 64);
  KvStore store(f.cfg);
  auto pm = f.empty_model();
  const SeqId parent = f.filled_sequence(store, 37, pm);
  if (HasFatalFailure()) return;
  const int64_t before = store.stats().blocks_in_use;  // 3 per layer
  EXPECT_EQ(before, 6);
  const SeqId child = store.fork(parent);
  auto cm = pm;
  EXPECT_EQ(store.stats().blocks_in_use, before);  // everything shared
  expect_matches(store, child, cm);
  // Both write different tokens: the shared partly filled last block is copied, full ones stay.
  ASSERT_EQ(store.reserve(child, 5), AllocStatus::kOk);
  EXPECT_EQ(store.stats().blocks_in_use, before + 2);  // one copy per layer
  for (int t = 37; t < 42; ++t) f.append(store, child, t, cm);
  ASSERT_EQ(store.reserve(parent, 20), AllocStatus::kOk);
  for (int t = 37; t < 57; ++t) f.append(store, parent, t, pm);
  expect_matches(store, parent, pm);
  expect_matches(store, child, cm);
  // Physical cells shared by both count once: the 32 shared slots + 5 + 25 private ones... per
  // layer: shared blocks 0-1 (32 live), child's copy (37-32+5 = 10 live), parent's last block
  // (41..56: 16 + 9).
  const KvStats st = store.stats();
  EXPECT_EQ(st.slots_valid, 2 * (32 + 10 + 25));
  // A cell of a shared block stays live while either sequence holds it.
  Evictions ev;
  ev.clear(2);
  ev.evict_all_heads(0);
  store.evict(child, 0, ev);
  cm[0][0].erase(cm[0][0].begin());
  cm[0][1].erase(cm[0][1].begin());
  EXPECT_EQ(store.stats().slots_valid, 2 * (32 + 10 + 25));
  store.evict(parent, 0, ev);
  pm[0][0].erase(pm[0][0].begin());
  pm[0][1].erase(pm[0][1].begin());
  EXPECT_EQ(store.stats().slots_valid, 2 * (32 + 10 + 25) - 1);
  expect_matches(store, parent, pm);
  expect_matches(store, child, cm);
  store.free_sequence(parent);
  expect_matches(store, child, cm);
  store.free_sequence(child);
  EXPECT_EQ(store.stats().blocks_in_use, 0);
  EXPECT_EQ(store.free_blocks(), store.stats().blocks_total);
}

TEST(KvStore, ForkWithPendingReservationIsRejected) {
  Fixture f(1, 1, 8, 4, 8);
  KvStore store(f.cfg);
  const SeqId s = store.create_sequence();
  ASSERT_EQ(store.reserve(s, 3), AllocStatus::kOk);
  EXPECT_THROW(store.fork(s), Error);
}

TEST(KvStore, SlidingEvictionFreesBlocks) {
  Fixture f(1, 2, 8, 16, 1000);
  KvStore store(f.cfg);
  const SeqId s = store.create_sequence();
  auto model = f.empty_model();
  const int window = 40;
  int64_t versions = 0;
  for (int t = 0; t < 500; ++t) {
    ASSERT_EQ(store.reserve(s, 1), AllocStatus::kOk);
    f.append(store, s, t, model);
    if (static_cast<int>(model[0][0].size()) > window) {
      // Evict the oldest live token (slot 0 after earlier removals? find it).
      const LayerCacheView& view = LayerKvCacheView(store.layer(s, 0));
      int oldest = 0;
      while (!view.slot_valid(oldest, 0)) ++oldest;
      Evictions ev;
      ev.clear(2);
      ev.evict_all_heads(oldest);
      const int64_t v0 = store.layout_version(s, 0);
      store.evict(s, 0, ev);
      versions += store.layout_version(s, 0) - v0;
      for (auto& head : model[0]) head.erase(head.begin());
    }
    // Resident memory stays bounded by the window: at most ceil(40/16) + 1 blocks.
    ASSERT_LE(store.stats().blocks_in_use, 4);
  }
  EXPECT_GT(versions, 0);
  // Only whole emptied blocks left the table: no block's contents changed (a mirror of the
  // blocks, the device pool, stays valid by appending).
  EXPECT_EQ(store.data_version(s, 0), 0);
  expect_matches(store, s, model);
  EXPECT_LE(store.n_slots(s, 0), window + 16);
}

TEST(KvStore, EvictionRejectsBadInputWithoutChanges) {
  Fixture f(1, 2, 8, 4, 16);
  KvStore store(f.cfg);
  auto model = f.empty_model();
  const SeqId s = f.filled_sequence(store, 6, model);
  if (HasFatalFailure()) return;
  Evictions ev;
  ev.clear(2);
  ev.slots[0] = {1, 9};
  EXPECT_THROW(store.evict(s, 0, ev), Error);
  ev.slots[0] = {1, 1};
  EXPECT_THROW(store.evict(s, 0, ev), Error);
  expect_matches(store, s, model);
  ev.slots[0] = {1};
  store.evict(s, 0, ev);
  EXPECT_THROW(store.evict(s, 0, ev), Error);  // already a hole
  model[0][0].erase(model[0][0].begin() + 1);
  expect_matches(store, s, model);
}

// H2O-like: equal counts per head, different tokens, random; with a fork sharing blocks.
TEST(KvStore, PerHeadEvictionAndCompactionKeepDataExact) {
  for (int bs : {1, 3, 7, 16}) {
    Fixture f(2, 3, 8, bs, 4000);
    KvStore store(f.cfg);
    const SeqId s = store.create_sequence();
    auto model = f.empty_model();
    const int budget = 30;
    SeqId other = -1;
    std::vector<HeadTokens> other_model;
    for (int t = 0; t < 300; ++t) {
      ASSERT_EQ(store.reserve(s, 1), AllocStatus::kOk);
      f.append(store, s, t, model);
      if (t == 150) {  // a fork sharing everything; compaction of s must not disturb it
        other = store.fork(s);
        other_model = model;
      }
      for (int l = 0; l < 2; ++l) {
        const int n_live = static_cast<int>(model[l][0].size());
        if (n_live <= budget) continue;
        const int n_drop = 1 + static_cast<int>(f.rng() % 3);
        const LayerCacheView& view = LayerKvCacheView(store.layer(s, l));
        Evictions ev;
        ev.clear(3);
        for (int h = 0; h < 3; ++h) {
          std::vector<int32_t> live = live_slots(view, h);
          live.pop_back();  // keep the newest
          std::shuffle(live.begin(), live.end(), f.rng);
          live.resize(n_drop);
          ev.slots[h] = live;
          // Mirror into the model: the i-th live slot is model[l][h][i].
          const std::vector<int32_t> all_live = live_slots(view, h);
          std::vector<Token> kept;
          for (size_t i = 0; i < all_live.size(); ++i)
            if (std::find(live.begin(), live.end(), all_live[i]) == live.end())
              kept.push_back(model[l][h][i]);
          model[l][h] = kept;
        }
        store.evict(s, l, ev);
        // Compaction bounds the slots: n_slots <= live + max(bs, 2%) + a block of slack.
        ASSERT_LE(store.n_slots(s, l), budget + std::max(bs, store.n_slots(s, l) / 50) + bs);
      }
      expect_matches(store, s, model);
      if (HasFatalFailure()) return;
    }
    expect_matches(store, other, other_model);
    for (int l = 0; l < 2; ++l) EXPECT_GT(store.data_version(s, l), 0) << "compaction moved rows";
    store.free_sequence(s);
    store.free_sequence(other);
    EXPECT_EQ(store.stats().blocks_in_use, 0) << "bs " << bs;
  }
}

TEST(KvStore, EvictionUnderAPendingReservationDefersBlockRelease) {
  // reserve(8) with 5 slots written: evicting slot 4 (alone in the 2nd block) must not take the
  // reserved room away from the pending appends; blocks are released by a later eviction.
  Fixture f(1, 2, 8, 4, 4);
  KvStore store(f.cfg);
  const SeqId s = store.create_sequence();
  auto model = f.empty_model();
  ASSERT_EQ(store.reserve(s, 8), AllocStatus::kOk);  // 2 blocks
  for (int t = 0; t < 5; ++t) f.append(store, s, t, model);
  Evictions ev;
  ev.clear(2);
  ev.evict_all_heads(4);
  store.evict(s, 0, ev);
  for (auto& head : model[0]) head.pop_back();
  EXPECT_EQ(store.n_slots(s, 0), 5);  // a hole, nothing moved
  EXPECT_EQ(store.sequence_blocks(s), 2);
  for (int t = 5; t < 8; ++t) f.append(store, s, t, model);
  expect_matches(store, s, model);
  EXPECT_EQ(store.free_blocks(), 2);
  // Evicting slots 0-3 (the whole first block) now frees it: with the deferred rescan.
  ev.clear(2);
  for (int slot = 0; slot < 4; ++slot) ev.evict_all_heads(slot);
  store.evict(s, 0, ev);
  for (auto& head : model[0]) head.erase(head.begin(), head.begin() + 4);
  EXPECT_EQ(store.n_slots(s, 0), 4);
  EXPECT_EQ(store.free_blocks(), 3);
  expect_matches(store, s, model);
  // Evicting everything returns every block.
  ev.clear(2);
  for (int slot = 0; slot < store.n_slots(s, 0); ++slot)
    if (LayerKvCacheView(store.layer(s, 0)).slot_valid(slot, 0)) ev.evict_all_heads(slot);
  store.evict(s, 0, ev);
  EXPECT_EQ(store.n_slots(s, 0), 0);
  EXPECT_EQ(store.free_blocks(), 4);
  EXPECT_EQ(store.stats().waste_fraction, 0.0);
}

TEST(KvStore, ForkAtABlockBoundaryNeedsNoCopy) {
  Fixture f(2, 1, 8, 4, 16);
  KvStore store(f.cfg);
  auto pm = f.empty_model();
  const SeqId p = f.filled_sequence(store, 8, pm);
  if (HasFatalFailure()) return;
  const SeqId c = store.fork(p);
  EXPECT_EQ(store.blocks_needed(c, 1), 2);  // one fresh block per layer, no copy
  EXPECT_EQ(store.blocks_needed(c, 0), 0);
  // A partly filled shared last block costs one copy per layer on top.
  auto cm = pm;
  ASSERT_EQ(store.reserve(c, 1), AllocStatus::kOk);
  f.append(store, c, 8, cm);
  const SeqId c2 = store.fork(c);
  EXPECT_EQ(store.blocks_needed(c2, 1), 2);  // copy of the shared, partly filled block
  EXPECT_EQ(store.blocks_needed(c2, 4), 4);  // ... plus a fresh block per layer
  expect_matches(store, c2, cm);
  expect_matches(store, p, pm);
}

TEST(KvStore, CompactionSkippedWhenSharedBlocksCannotBeCopied) {
  // Pool exactly full: a forked sequence's compaction would need fresh blocks for the shared
  // ones it rewrites, so it is skipped; the data stays exact either way.
  Fixture f(1, 1, 8, 4, 10);
  KvStore store(f.cfg);
  const SeqId p = store.create_sequence();
  auto pm = f.empty_model();
  ASSERT_EQ(store.reserve(p, 40), AllocStatus::kOk);  // all 10 blocks
  for (int t = 0; t < 40; ++t) f.append(store, p, t, pm);
  const SeqId c = store.fork(p);
  auto cm = pm;
  Evictions ev;
  ev.clear(1);
  // Every other slot: no block becomes empty, 20 holes > max(4, 2% of 40): compaction wanted.
  std::vector<Token> kept;
  for (int slot = 0; slot < 40; ++slot) {
    if (slot % 2 == 0) ev.slots[0].push_back(slot); else kept.push_back(cm[0][0][slot]);
  }
  cm[0][0] = kept;
  store.evict(c, 0, ev);
  EXPECT_EQ(store.n_slots(c, 0), 40);  // skipped: no free block for the copies
  expect_matches(store, c, cm);
  expect_matches(store, p, pm);
  // Once the parent is gone the child's blocks are private, and the next eviction compacts.
  store.free_sequence(p);
  ev.clear(1);
  ev.slots[0] = {1};
  cm[0][0].erase(cm[0][0].begin());
  store.evict(c, 0, ev);
  EXPECT_EQ(store.n_slots(c, 0), 19);
  EXPECT_EQ(store.free_blocks(), 5);
  expect_matches(store, c, cm);
}

// Random mix of create / fork / reserve+append / per-head evictions / free against the model,
// checking after every operation that the data is exact and that the blocks in use are exactly
// the blocks the sequences' tables reference (no leak, no double use).
TEST(KvStore, RandomOperationsKeepDataAndAccounting) {
  for (bool per_head : {false, true})
  for (KvFormat format : kRowKvFormats)
  for (int bs : {1, 4, 16}) {
    SCOPED_TRACE(std::string("format ") + kv_format_name(format) + (per_head ? ", per-head tables" : ""));
    Fixture f(2, 2, 4, bs, bs == 1 ? 200 : (bs == 4 ? 60 : 20), format, per_head);
    KvStore store(f.cfg);
    std::mt19937 rng(bs);
    RandomStoreWalk<std::vector<HeadTokens>> walk(600, 6, 6, 9);
    auto& models = walk.models;
    walk.run(
        store, rng, [&] { return f.empty_model(); },
        [&](SeqId s, int64_t pos) { f.append(store, s, pos, models[s]); },
        [&](SeqId s) {
          for (int l = 0; l < 2; ++l) {
            const LayerCacheView& view = LayerKvCacheView(store.layer(s, l));
            Evictions ev;
            ev.clear(2);
            for (int h = 0; h < 2; ++h) {
              const std::vector<int32_t> live = live_slots(view, h);
              std::vector<Token> kept;
              for (size_t i = 0; i < live.size(); ++i) {
                if (rng() % 3 == 0) ev.slots[h].push_back(live[i]); else kept.push_back(models[s][l][h][i]);
              }
              models[s][l][h] = kept;
            }
            store.evict(s, l, ev);
          }
        },
        [&](int op, int kind, SeqId s) {
          SCOPED_TRACE("op " + std::to_string(op) + " kind " + std::to_string(kind) + " seq " + std::to_string(s));
          for (const auto& [id, model] : models) {
            expect_matches(store, id, model);
            expect_head_blocks_follow_live_cells(store, id);
          }
          if (HasFatalFailure()) return;
          ASSERT_EQ(store.stats().blocks_in_use, referenced_blocks(store, models)) << "op " << op;
        });
    if (HasFatalFailure()) return;
    EXPECT_GT(walk.refused_reservations, 0) << "bs " << bs << ": the pool never filled up";
    for (const auto& [id, model] : models) store.free_sequence(id);
    EXPECT_EQ(store.stats().blocks_in_use, 0);
  }
}

// Page statistics (kv_store.h): for every (layer, page, head), the bounds the store kept equal a
// brute-force max / min over the page's valid keys read back from the store; nullptr when off.
// Also the view's page layout and bulk key reads.
void expect_page_bounds(const KvStore& store, SeqId seq) {
  const KvStoreConfig& cfg = store.config();
  const int H = cfg.n_kv_heads, D = cfg.head_dim, bs = cfg.block_size_tokens;
  for (int l = 0; l < cfg.n_layers; ++l) {
    const LayerKv kv = store.layer(seq, l);
    const LayerKvCacheView view(kv);
    ASSERT_EQ(view.page_size(), bs);
    const int n_pages = (kv.n_slots + bs - 1) / bs;
    ASSERT_EQ(view.n_pages(), n_pages);
    for (int s = 0; s < kv.n_slots; ++s) ASSERT_EQ(view.page_of(s), s / bs);
    for (int h = 0; h < H; ++h) {
      std::vector<float> bulk(static_cast<size_t>(kv.n_slots) * D), one(D);
      view.load_keys(0, kv.n_slots, h, bulk.data());
      for (int s = 0; s < kv.n_slots; ++s) {
        view.load_key(s, h, one.data());
        ASSERT_TRUE(std::equal(one.begin(), one.end(), bulk.begin() + static_cast<ptrdiff_t>(s) * D)) << s;
      }
    }
    if (!store.page_stats(seq)) {
      ASSERT_EQ(kv.page_key_max, nullptr);
      if (n_pages > 0) {
        ASSERT_EQ(view.page_key_min(0, 0), nullptr);
      }
      continue;
    }
    for (int p = 0; p < n_pages; ++p)
      for (int h = 0; h < H; ++h) {
        const float* mx = view.page_key_max(p, h);
        const float* mn = view.page_key_min(p, h);
        ASSERT_NE(mx, nullptr);
        ASSERT_NE(mn, nullptr);
        for (int d = 0; d < D; ++d) {
          float want_max = -INFINITY, want_min = INFINITY;
          std::vector<float> key(D);
          for (int s = p * bs; s < std::min(kv.n_slots, (p + 1) * bs); ++s)
            if (kv.is_valid(s, h)) {
              kv.load_key(s, h, key.data());  // dequantised: what Quest's bounds must cover
              want_max = std::max(want_max, key[d]);
              want_min = std::min(want_min, key[d]);
            }
          // max / min are exact, so the incremental bounds equal the recomputation bit for bit.
          ASSERT_EQ(mx[d], want_max) << "layer " << l << " page " << p << " head " << h << " feat " << d;
          ASSERT_EQ(mn[d], want_min) << "layer " << l << " page " << p << " head " << h << " feat " << d;
        }
      }
  }
}

TEST(KvStore, PageBoundsEqualBruteForceUnderRandomOperations) {
  for (bool per_head : {false, true})
  for (KvFormat format : {KvFormat::kF32, KvFormat::kBf16, KvFormat::kInt8, KvFormat::kFp8E4m3})
  for (int bs : {1, 3, 7, 16}) {
    SCOPED_TRACE("block size " + std::to_string(bs) + " format " + kv_format_name(format) +
                 (per_head ? ", per-head tables" : ""));
    Fixture f(2, 2, 5, bs, 4000 / bs + 40, format, per_head);
    KvStore store(f.cfg);
    std::map<SeqId, std::vector<HeadTokens>> models;
    std::map<SeqId, int64_t> next_pos;
    std::mt19937 rng(100 + bs);
    int64_t renumberings = 0, forks = 0, pending_evictions = 0;
    // Drops a random set of live cells of one layer: the same slots for every head (whole
    // blocks can empty) or per head, scattered, as a run of slots, or sparse.
    auto evict_random = [&](SeqId s, int l, bool same_for_all_heads) {
      const LayerCacheView& view = LayerKvCacheView(store.layer(s, l));
      const int n = view.n_slots();
      const int mode = static_cast<int>(rng() % 3);
      const int run_begin = n ? static_cast<int>(rng() % n) : 0;
      const int run_len = 1 + static_cast<int>(rng() % (2 * bs + 2));
      auto draw = [&](int slot) {
        return mode == 0 ? rng() % 3 == 0 : mode == 1 ? slot >= run_begin && slot < run_begin + run_len : rng() % 11 == 0;
      };
      std::vector<char> drop_slot(n);
      for (int slot = 0; slot < n; ++slot) drop_slot[slot] = draw(slot);
      Evictions ev;
      ev.clear(2);
      for (int h = 0; h < 2; ++h) {
        std::vector<Token> kept;
        size_t i = 0;
        for (int slot = 0; slot < n; ++slot) {
          if (!view.slot_valid(slot, h)) continue;
          if (same_for_all_heads ? drop_slot[slot] : draw(slot)) {
            ev.slots[h].push_back(slot);
          } else {
            kept.push_back(models[s][l][h][i]);
          }
          ++i;
        }
        models[s][l][h] = kept;
      }
      store.evict(s, l, ev);
    };
    for (int op = 0; op < 500; ++op) {
      const int kind = static_cast<int>(rng() % 12);
      if (models.empty() || kind == 0) {
        const SeqId s = store.create_sequence();
        store.set_page_stats(s, rng() % 4 != 0);
        models[s] = f.empty_model();
        next_pos[s] = 0;
        continue;
      }
      auto it = models.begin();
      std::advance(it, rng() % models.size());
      const SeqId s = it->first;
      int64_t versions_before = store.layout_version(s, 0) + store.layout_version(s, 1);
      if (kind == 1 && models.size() < 6) {
        const SeqId c = store.fork(s);  // shares the blocks; the bounds are copied
        ASSERT_EQ(store.page_stats(c), store.page_stats(s));
        if (rng() % 2) store.set_page_stats(c, !store.page_stats(c));  // the engine's fork
        models[c] = models[s];
        next_pos[c] = next_pos[s];
        ++forks;
      } else if (kind == 2 && models.size() > 2) {
        store.free_sequence(s);
        models.erase(s);
        continue;
      } else if (kind == 3) {
        store.set_page_stats(s, !store.page_stats(s));
      } else if (kind <= 7) {
        // Lengths not a multiple of the block: 1..2*bs+3 tokens at a time.
        const int n = 1 + static_cast<int>(rng() % (2 * bs + 3));
        if (store.reserve(s, n) != AllocStatus::kOk) continue;
        int appended = 0;
        for (; appended < n / 2; ++appended) f.append(store, s, next_pos[s]++, models[s]);
        if (rng() % 3 == 0) {  // an eviction while slots are reserved (only marks holes)
          evict_random(s, static_cast<int>(rng() % 2), false);
          ++pending_evictions;
          expect_page_bounds(store, s);
        }
        for (; appended < n; ++appended) f.append(store, s, next_pos[s]++, models[s]);
      } else {
        for (int l = 0; l < 2; ++l) evict_random(s, l, kind == 8);
      }
      renumberings += store.layout_version(s, 0) + store.layout_version(s, 1) - versions_before;
      SCOPED_TRACE("op " + std::to_string(op) + " kind " + std::to_string(kind));
      for (const auto& [id, model] : models) {
        expect_matches(store, id, model);
        expect_page_bounds(store, id);
        expect_head_blocks_follow_live_cells(store, id, /*exact=*/false);
        if (HasFatalFailure()) return;
      }
    }
    EXPECT_GT(renumberings, 0) << "no block removal or compaction happened";
    EXPECT_GT(forks, 0);
    EXPECT_GT(pending_evictions, 0);
  }
}

TEST(KvStore, WasteUnderFivePercentOnMixedBatch) {
  Fixture f(4, 4, 16, 16, 100000);
  KvStore store(f.cfg);
  std::vector<SeqId> seqs;
  std::vector<float> k(4 * 16, 0.5f), v(4 * 16, 0.25f);
  for (int len : {513, 300, 1111, 777, 1999, 421, 1025, 650}) {
    const SeqId s = store.create_sequence();
    seqs.push_back(s);
    ASSERT_EQ(store.reserve(s, len), AllocStatus::kOk);
    for (int t = 0; t < len; ++t)
      for (int l = 0; l < 4; ++l) store.append(s, l, t, k.data(), v.data());
  }
  const KvStats st = store.stats();
  EXPECT_LT(st.waste_fraction, 0.05);
  EXPECT_GT(st.waste_fraction, 0.0);
  EXPECT_EQ(st.slots_valid, 4 * (513 + 300 + 1111 + 777 + 1999 + 421 + 1025 + 650));
  EXPECT_EQ(st.bytes_in_use, static_cast<size_t>(st.blocks_in_use) * store.block_bytes());
  EXPECT_EQ(st.bytes_peak, st.bytes_in_use);
  for (SeqId s : seqs) store.free_sequence(s);
  const KvStats after = store.stats();
  EXPECT_EQ(after.blocks_in_use, 0);
  EXPECT_EQ(after.bytes_in_use, 0u);
  EXPECT_EQ(after.bytes_peak, st.bytes_peak);
}

}  // namespace
}  // namespace kvlab
