// KvStore and BlockPool: allocation, reference counts, out-of-blocks as a status (nothing
// half-allocated), fork + copy-on-write exactness, eviction frees blocks, compaction keeps data
// and positions exact (per-head evictions, shared blocks), waste < 5% on a mixed-length batch,
// and attention over the store equals the reference on the same tokens.
#include "framework/kv/kv_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "framework/core/error.h"
#include "framework/policy/layer_kv_cache_view.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_stats.h"
#include "kernels/testing/reference_attention.h"

namespace kvlab {
namespace {

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

// Reference model of one (sequence, layer): the live tokens of each head, in order.
struct Token {
  int64_t pos;
  std::vector<float> k, v;  // [head_dim] as every reader gets them (decoded for non-f32)
  std::vector<uint8_t> kc, vc;  // the stored codes [row_bytes]
  float ks = 1.f, vs = 1.f;     // and the scales they are multiplied by
};
using HeadTokens = std::vector<std::vector<Token>>;  // [n_kv_heads][live tokens]

struct Fixture {
  KvStoreConfig cfg;
  std::mt19937 rng{42};
  std::normal_distribution<float> nd{0.f, 1.f};

  Fixture(int layers, int heads, int dim, int bs, int64_t budget_blocks, KvFormat format = KvFormat::kF32) {
    cfg.n_layers = layers;
    cfg.n_kv_heads = heads;
    cfg.head_dim = dim;
    cfg.block_size_tokens = bs;
    cfg.format = format;
    cfg.fp8_scale = 0.25f;
    cfg.budget_bytes = static_cast<size_t>(budget_blocks) * 2 * KvBlockLayout{format, bs, heads, dim}.block_bytes() + 17;
  }
  // The row as the store must hold it: codes, scale and decoded values (kv_format.h).
  void encode(const float* x, std::vector<float>& dec, std::vector<uint8_t>& codes, float& scale) const {
    const int D = cfg.head_dim;
    codes.resize(KvBlockLayout{cfg.format, cfg.block_size_tokens, 1, D}.row_bytes());
    dec.resize(D);
    scale = kv_format_has_head_scale(cfg.format) ? cfg.fp8_scale : 1.f;
    ASSERT_TRUE(kv_encode_row(cfg.format, x, D, scale, codes.data(), &scale));
    kv_decode_row(cfg.format, codes.data(), D, scale, dec.data());
  }
  // Appends one token to every layer, mirroring it into the models.
  void append(KvStore& store, SeqId seq, int64_t pos, std::vector<HeadTokens>& model) {
    const int H = cfg.n_kv_heads, D = cfg.head_dim;
    for (int l = 0; l < cfg.n_layers; ++l) {
      std::vector<float> k(H * D), v(H * D);
      for (auto& x : k) x = nd(rng);
      for (auto& x : v) x = nd(rng);
      store.append(seq, l, pos, k.data(), v.data());
      for (int h = 0; h < H; ++h) {
        Token t{pos, {}, {}, {}, {}};
        encode(k.data() + h * D, t.k, t.kc, t.ks);
        encode(v.data() + h * D, t.v, t.vc, t.vs);
        model[l][h].push_back(std::move(t));
      }
    }
  }
  std::vector<HeadTokens> empty_model() const {
    return std::vector<HeadTokens>(cfg.n_layers, HeadTokens(cfg.n_kv_heads));
  }
};

// The store's live cells, read through LayerKv and through the policy view, equal the model.
void expect_matches(const KvStore& store_c, SeqId seq, const std::vector<HeadTokens>& model) {
  KvStore& store = const_cast<KvStore&>(store_c);
  const KvStoreConfig& cfg = store.config();
  std::vector<float> key(cfg.head_dim);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const LayerKv kv = store.layer(seq, l);
    const LayerCacheView& view = LayerKvCacheView(store.layer(seq, l));
    ASSERT_EQ(kv.view.length(0), kv.n_slots);
    ASSERT_EQ(view.n_slots(), kv.n_slots);
    for (int h = 0; h < cfg.n_kv_heads; ++h) {
      const auto& want = model[l][h];
      ASSERT_EQ(store.resident_tokens(seq, l, h), static_cast<int64_t>(want.size()));
      size_t i = 0;
      for (int s = 0; s < kv.n_slots; ++s) {
        ASSERT_EQ(kv.is_valid(s, h), view.slot_valid(s, h));
        if (!kv.is_valid(s, h)) continue;
        ASSERT_LT(i, want.size());
        ASSERT_EQ(kv.position(s, h), want[i].pos) << "layer " << l << " head " << h << " slot " << s;
        ASSERT_EQ(view.slot_position(s, h), want[i].pos);
        ASSERT_EQ(view.positions_data()[s * cfg.n_kv_heads + h], want[i].pos);
        ASSERT_EQ(view.valid_data()[s * cfg.n_kv_heads + h], 1);
        if (cfg.format == KvFormat::kF32)
          for (int d = 0; d < cfg.head_dim; ++d) {
            ASSERT_EQ(kv.key(s, h)[d], want[i].k[d]);
            ASSERT_EQ(kv.value(s, h)[d], want[i].v[d]);
          }
        // Codes and scales bit for bit (moved by fork, copy-on-write, compaction), and the rows
        // every reader decodes.
        const size_t rb = kv.layout.row_bytes();
        ASSERT_TRUE(std::equal(want[i].kc.begin(), want[i].kc.end(), kv.key_codes(s, h)) && want[i].kc.size() == rb);
        ASSERT_TRUE(std::equal(want[i].vc.begin(), want[i].vc.end(), kv.value_codes(s, h)));
        ASSERT_EQ(kv.key_scale(s, h), want[i].ks);
        ASSERT_EQ(kv.value_scale(s, h), want[i].vs);
        view.load_key(s, h, key.data());
        ASSERT_EQ(key, want[i].k);
        kv.load_value(s, h, key.data());
        ASSERT_EQ(key, want[i].v);
        ++i;
      }
      ASSERT_EQ(i, want.size()) << "layer " << l << " head " << h;
      // Order contract (policy.h): positions non-decreasing in slot, holes included.
      for (int s = 1; s < kv.n_slots; ++s) ASSERT_LE(kv.position(s - 1, h), kv.position(s, h));
    }
  }
}

TEST(KvStore, AppendAndReadBack) {
  Fixture f(2, 3, 8, 4, 64);
  KvStore store(f.cfg);
  const SeqId s = store.create_sequence();
  auto model = f.empty_model();
  ASSERT_EQ(store.reserve(s, 11), AllocStatus::kOk);
  for (int t = 0; t < 11; ++t) f.append(store, s, 100 + t, model);
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
  const SeqId parent = store.create_sequence();
  auto pm = f.empty_model();
  ASSERT_EQ(store.reserve(parent, 37), AllocStatus::kOk);
  for (int t = 0; t < 37; ++t) f.append(store, parent, t, pm);
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
  const SeqId s = store.create_sequence();
  auto model = f.empty_model();
  ASSERT_EQ(store.reserve(s, 6), AllocStatus::kOk);
  for (int t = 0; t < 6; ++t) f.append(store, s, t, model);
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
          std::vector<int32_t> live;
          for (int slot = 0; slot < view.n_slots(); ++slot)
            if (view.slot_valid(slot, h)) live.push_back(slot);
          live.pop_back();  // keep the newest
          std::shuffle(live.begin(), live.end(), f.rng);
          live.resize(n_drop);
          ev.slots[h] = live;
          // Mirror into the model: the i-th live slot is model[l][h][i].
          std::vector<int32_t> all_live;
          for (int slot = 0; slot < view.n_slots(); ++slot)
            if (view.slot_valid(slot, h)) all_live.push_back(slot);
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
  const SeqId p = store.create_sequence();
  auto pm = f.empty_model();
  ASSERT_EQ(store.reserve(p, 8), AllocStatus::kOk);
  for (int t = 0; t < 8; ++t) f.append(store, p, t, pm);
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
  for (KvFormat format : kRowKvFormats)
  for (int bs : {1, 4, 16}) {
    SCOPED_TRACE(std::string("format ") + kv_format_name(format));
    Fixture f(2, 2, 4, bs, bs == 1 ? 200 : (bs == 4 ? 60 : 20), format);
    KvStore store(f.cfg);
    std::map<SeqId, std::vector<HeadTokens>> models;
    std::map<SeqId, int64_t> next_pos;
    std::mt19937 rng(bs);
    int out_of_blocks = 0;
    for (int op = 0; op < 600; ++op) {
      const int kind = static_cast<int>(rng() % 10);
      if (models.empty() || kind == 0) {
        const SeqId s = store.create_sequence();
        models[s] = f.empty_model();
        next_pos[s] = 0;
        continue;
      }
      auto it = models.begin();
      std::advance(it, rng() % models.size());
      const SeqId s = it->first;
      if (kind == 1 && models.size() < 6) {
        const SeqId c = store.fork(s);
        models[c] = models[s];
        next_pos[c] = next_pos[s];
      } else if (kind == 2 && models.size() > 1) {
        store.free_sequence(s);
        models.erase(s);
      } else if (kind <= 6) {
        const int n = 1 + static_cast<int>(rng() % 9);
        if (store.reserve(s, n) != AllocStatus::kOk) {
          ++out_of_blocks;
          continue;
        }
        for (int t = 0; t < n; ++t) f.append(store, s, next_pos[s]++, models[s]);
      } else {
        for (int l = 0; l < 2; ++l) {
          const LayerCacheView& view = LayerKvCacheView(store.layer(s, l));
          Evictions ev;
          ev.clear(2);
          for (int h = 0; h < 2; ++h) {
            std::vector<int32_t> live;
            for (int slot = 0; slot < view.n_slots(); ++slot)
              if (view.slot_valid(slot, h)) live.push_back(slot);
            std::vector<Token> kept;
            for (size_t i = 0; i < live.size(); ++i) {
              if (rng() % 3 == 0) ev.slots[h].push_back(live[i]); else kept.push_back(models[s][l][h][i]);
            }
            models[s][l][h] = kept;
          }
          store.evict(s, l, ev);
        }
      }
      SCOPED_TRACE("op " + std::to_string(op) + " kind " + std::to_string(kind) + " seq " + std::to_string(s));
      std::set<int32_t> referenced;
      for (const auto& [id, model] : models) {
        expect_matches(store, id, model);
        for (int l = 0; l < 2; ++l) {
          const LayerKv kv = store.layer(id, l);
          for (int b = 0; b < kv.view.indptr[1]; ++b) referenced.insert(kv.view.indices[b]);
        }
      }
      if (HasFatalFailure()) return;
      ASSERT_EQ(store.stats().blocks_in_use, static_cast<int64_t>(referenced.size())) << "op " << op;
    }
    EXPECT_GT(out_of_blocks, 0) << "bs " << bs << ": the pool never filled up";
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
  for (KvFormat format : {KvFormat::kF32, KvFormat::kBf16, KvFormat::kInt8, KvFormat::kFp8E4m3})
  for (int bs : {1, 3, 7, 16}) {
    SCOPED_TRACE("block size " + std::to_string(bs) + " format " + kv_format_name(format));
    Fixture f(2, 2, 5, bs, 4000 / bs + 40, format);
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

TEST(KvStore, AttentionOverStoreMatchesDenseReference) {
  for (KvFormat format : kRowKvFormats) {
  SCOPED_TRACE(kv_format_name(format));
  // The kernels read the store's LayerKv directly; compare with a dense softmax over the model
  // (the dequantised rows for a format other than f32).
  Fixture f(1, 2, 32, 7, 200, format);
  KvStore store(f.cfg);
  const SeqId s = store.create_sequence();
  auto model = f.empty_model();
  ASSERT_EQ(store.reserve(s, 50), AllocStatus::kOk);
  for (int t = 0; t < 50; ++t) f.append(store, s, t, model);
  Evictions ev;
  ev.clear(2);
  ev.slots[0] = {3, 4, 20};
  ev.slots[1] = {0, 30, 31};
  store.evict(s, 0, ev);
  for (int h = 0; h < 2; ++h) {
    std::vector<Token> kept;
    for (int i = 0; i < 50; ++i)
      if (std::find(ev.slots[h].begin(), ev.slots[h].end(), i) == ev.slots[h].end())
        kept.push_back(model[0][h][i]);
    model[0][h] = kept;
  }
  const int G = 2, D = 32;
  std::vector<float> q(2 * G * D), out(q.size());
  for (auto& x : q) x = f.nd(f.rng);
  const int64_t qpos = 40;
  AttentionArgs a =
      attention_args(q.data(), 1, 2 * G, 2, D, &qpos, store.layer(s, 0), 1.f / std::sqrt(static_cast<float>(D)));
  a.out = out.data();
  attention(a, 2);
  for (int h = 0; h < 2 * G; ++h) {
    const auto& toks = model[0][h / G];
    const testing::ReferenceRow ref = testing::reference_attention_row(
        q.data() + h * D, D, static_cast<int64_t>(toks.size()), a.scale,
        [&](int64_t j) { return toks[j].k.data(); }, [&](int64_t j) { return toks[j].v.data(); },
        [&](int64_t j) { return toks[j].pos <= qpos; });
    for (int d = 0; d < D; ++d) ASSERT_NEAR(out[h * D + d], ref.out[d], 1e-5);
  }
  }
}

// Attention over a store in any format equals attention over an f32 store holding the
// dequantised rows, bit for bit, on every kernel (tiled AVX2 and portable, 1 and 2 threads, the
// naive reference, window_attention; out, LSE, key_mass): the kernels decode exactly and then do
// the f32 arithmetic in the same order, so the f32 kernels' tolerances against the fp64
// reference (kernels/cpu/attention_test.cpp) carry over unchanged. Awkward sizes, holes from
// per-head eviction (compaction), rope at read, an explicit selection.
TEST(KvFormat, AttentionEqualsF32AttentionOverTheDequantisedRows) {
  std::mt19937 rng(15);
  std::normal_distribution<float> nd(0.f, 1.f);
  int cases = 0;
  for (KvFormat format : kAllKvFormats) {
    for (int bs : {1, 3, 7, 16}) {
      for (int D : {32, 64, 80, 20}) {
        for (int G : {1, 4}) {
          const int H = 2, n = 5 + static_cast<int>(rng() % 120);
          SCOPED_TRACE(std::string(kv_format_name(format)) + " bs " + std::to_string(bs) + " D " +
                       std::to_string(D) + " G " + std::to_string(G) + " n " + std::to_string(n));
          KvStoreConfig c{1, H, D, bs, 0, format, 0.125f};
          const bool kivi = kv_format_is_kivi(format);
          c.budget_bytes = 0;  // set below, once the KIVI group is known
          // G must divide D and divide (or be a multiple of) bs: 4 with bs 1 (groups span blocks),
          // 8 (or 4 for D = 20) with bs 16; no G in 4 | D fits bs 3 or 7.
          c.group_size = bs == 16 && D % 8 == 0 ? 8 : 4;
          if (kivi && bs % c.group_size != 0 && c.group_size % bs != 0) continue;
          c.residual = 2 * c.group_size;
          c.budget_bytes = size_t(n / bs + 2) * 2 * KvBlockLayout{format, bs, H, D, c.group_size}.block_bytes();
          KvStoreConfig cm = c;
          cm.format = KvFormat::kF32;
          cm.budget_bytes = size_t(n / bs + 2) * 2 * KvBlockLayout{KvFormat::kF32, bs, H, D}.block_bytes();
          KvStore q_store(c), m_store(cm);
          const SeqId qs = q_store.create_sequence(), ms = m_store.create_sequence();
          ASSERT_EQ(q_store.reserve(qs, n), AllocStatus::kOk);
          ASSERT_EQ(m_store.reserve(ms, n), AllocStatus::kOk);
          std::vector<float> k(H * D), v(H * D), dk(H * D), dv(H * D);
          for (int t = 0; t < n; ++t) {
            for (auto& x : k) x = nd(rng) * (t % 9 == 0 ? 20.f : 1.f);  // some outlier tokens
            for (auto& x : v) x = nd(rng);
            q_store.append(qs, 0, t, k.data(), v.data());
          }
          // The mirror holds the rows as they read now (KIVI quantises groups after later
          // appends, and never again: rows keep their values through eviction).
          for (int t = 0; t < n; ++t) {
            const LayerKv kv = q_store.layer(qs, 0);
            for (int h = 0; h < H; ++h) {
              kv.load_key(t, h, dk.data() + h * D);
              kv.load_value(t, h, dv.data() + h * D);
            }
            m_store.append(ms, 0, t, dk.data(), dv.data());
          }
          Evictions ev;  // per head, about a third: holes and (often) a compaction
          ev.clear(H);
          for (int h = 0; h < H; ++h)
            for (int s = 0; s < n; ++s)
              if (rng() % 3 == 0) ev.slots[h].push_back(s);
          q_store.evict(qs, 0, ev);
          m_store.evict(ms, 0, ev);
          const LayerKv qkv = q_store.layer(qs, 0), mkv = m_store.layer(ms, 0);
          if (!kivi) ASSERT_EQ(qkv.n_slots, mkv.n_slots);  // KIVI does not compact: other slot numbers
          const int rows = 1 + static_cast<int>(rng() % 3), nh = H * G;
          std::vector<float> q(size_t(rows) * nh * D);
          for (auto& x : q) x = nd(rng);
          std::vector<int64_t> qpos(rows);
          for (int r = 0; r < rows; ++r) qpos[r] = n - rows + r;
          const bool rope = rng() % 2 == 0;
          RopeConfig rc;
          rc.head_dim = D;
          RopeTable table(rc, 64);
          const bool explicit_sel = !kivi && rng() % 2 == 0;  // (slot ranges: same slot numbers only)
          auto run = [&](const LayerKv& kv, int which) {
            std::vector<int32_t> rank(size_t(kv.n_slots) * H);
            cache_rank_positions(kv, rank.data());
            for (auto& r : rank) r = std::max(r, 0);
            KeySelection sel;
            if (explicit_sel) {
              sel.begin(rows, H);
              for (int r = 0; r < rows; ++r)
                for (int h = 0; h < H; ++h) {
                  sel.add(0, kv.n_slots / 2);
                  sel.add(kv.n_slots / 2 + 1, kv.n_slots);
                  sel.close_list();
                }
            }
            AttentionArgs a = attention_args(q.data(), rows, nh, H, D, qpos.data(), kv, 1.f / std::sqrt(float(D)));
            if (rope) {
              a.rope = &table;
              a.key_rope_pos = rank.data();
            }
            if (explicit_sel) a.selection = &sel;
            std::vector<float> out(q.size()), lse(size_t(rows) * nh), mass(size_t(H) * kv.n_slots, 0.f);
            a.out = out.data(), a.lse = lse.data(), a.key_mass = mass.data();
            if (which == 0) attention_naive(a);
            if (which == 1) attention(a, 1, CpuPath::kPortable);
            if (which == 2) attention(a, 2, CpuPath::kPortable);
            if (which == 3) attention(a, 1, CpuPath::kAvx2);
            if (which == 4) attention(a, 2, CpuPath::kAvx2);
            std::vector<float> w(size_t(nh) * kv.n_slots, 0.f);
            if (which == 5) {
              std::fill(out.begin(), out.end(), 0.f);
              window_attention(a, 0, w.data());
            }
            out.insert(out.end(), lse.begin(), lse.end());
            // Per-slot outputs in text-position order (slot numbers differ without compaction).
            for (int h = 0; h < nh; ++h)
              for (int s = 0; s < kv.n_slots; ++s)
                if (kv.is_valid(s, h / G)) out.push_back(w[size_t(h) * kv.n_slots + s]);
            for (int g = 0; g < H; ++g)
              for (int s = 0; s < kv.n_slots; ++s)
                if (kv.is_valid(s, g)) out.push_back(mass[size_t(g) * kv.n_slots + s]);
            return out;
          };
          for (int which = 0; which < 6; ++which) {
            if (which >= 3 && which <= 4 && !cpu_has_avx2_fma_f16c()) continue;
            const std::vector<float> got = run(qkv, which), want = run(mkv, which);
            ASSERT_EQ(got.size(), want.size());
            for (size_t i = 0; i < got.size(); ++i)
              ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
                  << "kernel " << which << " element " << i << ": " << got[i] << " vs " << want[i];
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 6 * 4 * 4 * 2 + 2 * 2 * 4 * 2);  // KIVI: block sizes 1 and 16 only
}

// Formats: bad input is refused before anything changes, bytes per token are measured.
TEST(KvFormat, NanRefusedNamingTheLayerAndNothingChanges) {
  for (KvFormat format : kAllKvFormats) {
    if (format == KvFormat::kF32) continue;
    Fixture f(2, 2, 8, 4, 16, format);
    f.cfg.group_size = 4;
    KvStore store(f.cfg);
    const SeqId s = store.create_sequence();
    ASSERT_EQ(store.reserve(s, 2), AllocStatus::kOk);
    std::vector<float> k(16, 1.f), v(16, 1.f);
    v[11] = NAN;  // head 1
    try {
      store.append(s, 1, 0, k.data(), v.data());
      FAIL() << kv_format_name(format) << ": NaN accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("layer 1 kv_head 1"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("NaN"), std::string::npos) << e.what();
    }
    EXPECT_EQ(store.n_slots(s, 1), 0);
    v[11] = INFINITY;
    const bool scaled = format == KvFormat::kInt8 || kv_format_has_head_scale(format) || kv_format_is_kivi(format);
    if (scaled) {
      EXPECT_THROW(store.append(s, 1, 0, k.data(), v.data()), Error);
    } else {
      EXPECT_EQ(store.append(s, 1, 0, k.data(), v.data()), 0);  // bf16 / f16 keep inf
      std::vector<float> row(8);
      store.layer(s, 1).load_value(0, 1, row.data());
      EXPECT_TRUE(std::isinf(row[3]));
    }
  }
}

TEST(KvFormat, BytesPerTokenAndFp8Scales) {
  // D = 64, 4 KV heads, 2 layers, blocks of 16: f32 2*2*4*64*4 = 4096 bytes a token.
  for (KvFormat format : kRowKvFormats) {
    KvStoreConfig c{2, 4, 64, 16, size_t(1) << 20, format, 1.f};
    const double want = format == KvFormat::kF32 ? 4096 : format == KvFormat::kBf16 || format == KvFormat::kF16 ? 2048
                        : format == KvFormat::kInt8 ? 2 * 2 * 4 * (64 + 4) : 1024;
    EXPECT_EQ(kv_bytes_per_token(c), want) << kv_format_name(format);
    KvStore store(c);
    EXPECT_EQ(store.block_bytes(), size_t(want * 16 / 2)) << kv_format_name(format);
  }
  KvStoreConfig c{1, 2, 8, 4, 4096, KvFormat::kFp8E4m3, 1.f};
  KvStore store(c);
  const float ks[2] = {0.5f, 2.f}, vs[2] = {1.f, 4.f}, bad[2] = {0.f, 1.f};
  EXPECT_THROW(store.set_fp8_scales(0, bad, vs), Error);
  store.set_fp8_scales(0, ks, vs);
  const SeqId s = store.create_sequence();
  ASSERT_EQ(store.reserve(s, 1), AllocStatus::kOk);
  std::vector<float> k(16, 3.f), v(16, 3.f);
  store.append(s, 0, 0, k.data(), v.data());
  const LayerKv kv = store.layer(s, 0);
  EXPECT_EQ(kv.key_scale(0, 1), 2.f);
  EXPECT_EQ(kv.value_scale(0, 1), 4.f);
  EXPECT_EQ(kv.key_codes(0, 1)[0], kv_encode_e4m3(1.5f));
  EXPECT_THROW(store.set_fp8_scales(0, ks, vs), Error);  // rows already stored
  KvStoreConfig c8 = c;
  c8.format = KvFormat::kInt8;
  KvStore s8(c8);
  EXPECT_THROW(s8.set_fp8_scales(0, ks, vs), Error);
  c.fp8_scale = -1.f;
  EXPECT_THROW(KvStore{c}, Error);
}

}  // namespace
}  // namespace kvlab

namespace kvlab {
namespace {

// KIVI (int4 / int2) under random create / fork / free / append / per-head evict: every live row
// reads as its input while it is in the residual (slot >= q), and once its group is quantised it
// reads the same bits forever after, through forks (copy-on-write), evictions and block removals;
// the R newest slots always stay exact; the quantised values are the group quantisation of
// kv_format.h (checked against an independent recomputation from the inputs of the group's live
// cells at the moment it was quantised); accounting: every block in use is referenced.
TEST(KvFormat, KiviRandomOperationsKeepRowsBitExact) {
  struct Row {
    int64_t pos;
    std::vector<float> k, v;      // input
    std::vector<float> qk, qv;    // as read once quantised (empty before)
  };
  for (KvFormat format : {KvFormat::kInt4, KvFormat::kInt2})
    for (int bs : {1, 4, 8}) {
      for (int G : {2, 4}) {
        for (int R : {0, 4}) {
          if (bs % G != 0 && G % bs != 0) continue;
          SCOPED_TRACE(std::string(kv_format_name(format)) + " bs " + std::to_string(bs) + " G " +
                       std::to_string(G) + " R " + std::to_string(R));
          const int L = 2, H = 2, D = 8;
          KvStoreConfig c{L, H, D, bs, 0, format, 1.f, G, R};
          c.budget_bytes = size_t(120 / bs + 8) * 2 * KvBlockLayout{format, bs, H, D, G}.block_bytes();
          KvStore store(c);
          using Model = std::vector<std::vector<std::vector<Row>>>;  // [layer][head][live rows]
          std::map<SeqId, Model> models;
          std::map<SeqId, int64_t> next_pos;
          std::mt19937 rng(bs * 100 + G * 10 + R);
          std::normal_distribution<float> nd(0.f, 1.f);
          int quantised_seen = 0;
          float max_abs = 0.f;  // over every key input
          for (int op = 0; op < 300; ++op) {
            const int kind = static_cast<int>(rng() % 10);
            if (models.empty() || kind == 0) {
              const SeqId s = store.create_sequence();
              models[s] = Model(L, std::vector<std::vector<Row>>(H));
              next_pos[s] = 0;
              continue;
            }
            auto it = models.begin();
            std::advance(it, rng() % models.size());
            const SeqId s = it->first;
            if (kind == 1 && models.size() < 5) {
              const SeqId ch = store.fork(s);
              models[ch] = models[s];
              next_pos[ch] = next_pos[s];
            } else if (kind == 2 && models.size() > 1) {
              store.free_sequence(s);
              models.erase(s);
            } else if (kind <= 7) {
              const int n = 1 + static_cast<int>(rng() % 6);
              if (store.reserve(s, n) != AllocStatus::kOk) continue;
              for (int t = 0; t < n; ++t) {
                const int64_t pos = next_pos[s]++;
                for (int l = 0; l < L; ++l) {
                  std::vector<float> k(H * D), v(H * D);
                  for (auto& x : k) max_abs = std::max(max_abs, std::fabs(x = nd(rng) * (rng() % 7 == 0 ? 10.f : 1.f)));
                  for (auto& x : v) x = nd(rng);
                  store.append(s, l, pos, k.data(), v.data());
                  for (int h = 0; h < H; ++h)
                    models[s][l][h].push_back({pos, {k.begin() + h * D, k.begin() + (h + 1) * D},
                                               {v.begin() + h * D, v.begin() + (h + 1) * D}, {}, {}});
                }
              }
            } else {
              for (int l = 0; l < L; ++l) {
                const LayerKv kv = store.layer(s, l);
                Evictions ev;
                ev.clear(H);
                for (int h = 0; h < H; ++h) {
                  std::vector<Row> kept;
                  size_t i = 0;
                  for (int slot = 0; slot < kv.n_slots; ++slot) {
                    if (!kv.is_valid(slot, h)) continue;
                    if (rng() % 3 == 0) ev.slots[h].push_back(slot); else kept.push_back(models[s][l][h][i]);
                    ++i;
                  }
                  models[s][l][h] = kept;
                }
                store.evict(s, l, ev);
              }
            }
            // Check every sequence against its model.
            std::set<int32_t> referenced;
            for (auto& [id, model] : models) {
              for (int l = 0; l < L; ++l) {
                const LayerKv kv = store.layer(id, l);
                for (int b = 0; b < kv.view.indptr[1]; ++b) referenced.insert(kv.view.indices[b]);
                ASSERT_EQ(kv.kivi_q_slots % std::min(G, bs) == 0 || kv.kivi_q_slots % bs == 0, true);
                std::vector<float> key(D), val(D);
                for (int h = 0; h < H; ++h) {
                  size_t i = 0;
                  for (int slot = 0; slot < kv.n_slots; ++slot) {
                    if (!kv.is_valid(slot, h)) continue;
                    ASSERT_LT(i, model[l][h].size());
                    Row& row = model[l][h][i++];
                    ASSERT_EQ(kv.position(slot, h), row.pos);
                    kv.load_key(slot, h, key.data());
                    kv.load_value(slot, h, val.data());
                    // The R most recent tokens (positions = append order) are never quantised.
                    if (slot < kv.kivi_q_slots) ASSERT_LT(row.pos, next_pos[id] - R) << "slot " << slot;
                    if (slot >= kv.kivi_q_slots) {
                      ASSERT_TRUE(row.qk.empty()) << "a quantised row went back to the residual";
                      ASSERT_EQ(key, row.k) << "residual slot " << slot;
                      ASSERT_EQ(val, row.v);
                    } else if (row.qk.empty()) {
                      row.qk = key;
                      row.qv = val;
                      ++quantised_seen;
                      // Values per token: exactly kv_format.h's group quantisation of the input.
                      std::vector<uint8_t> codes(D);
                      std::vector<float> sz(2 * (D / G)), want(D);
                      ASSERT_TRUE(kv_kivi_encode_value(row.v.data(), D, G, kv_format_bits(format), sz.data(), codes.data()));
                      kv_kivi_decode_value(codes.data(), D, G, kv_format_bits(format), sz.data(), want.data());
                      ASSERT_EQ(val, want) << "slot " << slot;
                      // Keys per channel: within half a step s_d / 2 of the input; s_d = range / L
                      // <= 2 max|x| / L (plus a few float roundings: x 1.001).
                      for (int d = 0; d < D; ++d)
                        ASSERT_LE(std::fabs(key[d] - row.k[d]), 1.001f * max_abs / ((1 << kv_format_bits(format)) - 1)) << d;
                    } else {
                      ASSERT_EQ(key, row.qk) << "a quantised key changed: slot " << slot;
                      ASSERT_EQ(val, row.qv);
                    }
                  }
                  ASSERT_EQ(i, model[l][h].size());
                }
              }
            }
            if (HasFatalFailure()) return;
            ASSERT_EQ(store.stats().blocks_in_use, static_cast<int64_t>(referenced.size())) << "op " << op;
          }
          EXPECT_GT(quantised_seen, 50);
          for (const auto& [id, m] : models) store.free_sequence(id);
          EXPECT_EQ(store.stats().blocks_in_use, 0);
        }
      }
    }
}

TEST(KvFormat, KiviShapeErrorsAndBytes) {
  KvStoreConfig c{1, 2, 64, 16, 1 << 20, KvFormat::kInt4, 1.f, 32, 128};
  EXPECT_NO_THROW(KvStore{c});
  // int4, G 32, D 64, blocks of 16: codes 32 bytes a row; key (s, z) of the group in each
  // block: 2 * 64 * 4 per head; values 2 groups x (s, z) a row. Arena = max(16*32 + 512,
  // 16*32 + 16*16) = 1024 per head.
  EXPECT_EQ(KvBlockLayout(KvBlockLayout{KvFormat::kInt4, 16, 2, 64, 32}).block_bytes(), size_t(2 * 1024));
  EXPECT_EQ(kv_bytes_per_token(c), 2.0 * 2 * 1024 / 16);
  auto expect_error = [&](KvStoreConfig bad, const std::string& what) {
    try {
      KvStore s(bad);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  KvStoreConfig b = c;
  b.group_size = 48;
  expect_error(b, "group_size 48 must divide head_dim 64");
  b = c;
  b.residual = 100;
  expect_error(b, "residual 100 must be a non-negative multiple of group_size 32");
  b = c;
  b.block_size_tokens = 24;
  expect_error(b, "must divide or be a multiple of block_size 24");
}

}  // namespace
}  // namespace kvlab
