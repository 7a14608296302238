// Test support for the KV store's tests (kv_store_test.cpp, kv_format_test.cpp): a mirror of
// what each (sequence, layer, head) must hold, a fixture that appends random tokens to a store and
// its mirror, the check that the two agree through every reader, and the random walk over a
// store's sequence lifecycle that the random-operation tests share.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "framework/kv/kv_store.h"
#include "framework/policy/layer_kv_cache_view.h"

namespace kvlab::kv_test {

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

  // budget_blocks: blocks of every KV head of a page (with per-head tables, H times as many
  // one-head blocks: the same bytes).
  Fixture(int layers, int heads, int dim, int bs, int64_t budget_blocks, KvFormat format = KvFormat::kF32,
          bool per_head_tables = false) {
    cfg.per_head_tables = per_head_tables;
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
  // A new sequence holding n tokens at positions first, first + 1, ... (mirrored into model).
  SeqId filled_sequence(KvStore& store, int n, std::vector<HeadTokens>& model, int64_t first = 0) {
    const SeqId s = store.create_sequence();
    EXPECT_EQ(store.reserve(s, n), AllocStatus::kOk);
    for (int t = 0; t < n; ++t) append(store, s, first + t, model);
    return s;
  }
  std::vector<HeadTokens> empty_model() const {
    return std::vector<HeadTokens>(cfg.n_layers, HeadTokens(cfg.n_kv_heads));
  }
};

// The store's live cells, read through LayerKv and through the policy view, equal the model.
inline void expect_matches(const KvStore& store_c, SeqId seq, const std::vector<HeadTokens>& model) {
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

// The live slots of one KV head of a layer's cache, in slot order.
inline std::vector<int32_t> live_slots(const LayerCacheView& view, int kv_head) {
  std::vector<int32_t> live;
  for (int slot = 0; slot < view.n_slots(); ++slot)
    if (view.slot_valid(slot, kv_head)) live.push_back(slot);
  return live;
}

// The number of distinct blocks the live sequences' block tables reference (a block shared by
// forks counts once): what the store's blocks_in_use must equal.
template <class Model>
int64_t referenced_blocks(KvStore& store, const std::map<SeqId, Model>& models) {
  std::set<int32_t> referenced;
  for (const auto& [id, model] : models)
    for (int l = 0; l < store.config().n_layers; ++l) {
      const LayerKv kv = store.layer(id, l);
      for (int b = 0; b < kv.view.indptr[1] * kv.view.table_heads; ++b)
        if (kv.view.indices[b] != store.hole_block()) referenced.insert(kv.view.indices[b]);
    }
  return static_cast<int64_t>(referenced.size());
}

// Per-head block tables (kv_store.h): a (page, head) entry is the hole block exactly when the
// page holds no live cell of that head, so each head holds one block per page it has a live
// token in (head_blocks()). Not exact (exact = false: only "the hole block holds no live cell")
// after an eviction under a pending reservation, which frees nothing until the next eviction.
inline void expect_head_blocks_follow_live_cells(const KvStore& store, SeqId seq, bool exact = true) {
  const KvStoreConfig& cfg = store.config();
  const int H = cfg.n_kv_heads, bs = cfg.block_size_tokens;
  for (int l = 0; l < cfg.n_layers; ++l) {
    const LayerKv kv = store.layer(seq, l);
    const int pages = kv.view.indptr[1];
    for (int h = 0; h < H; ++h) {
      int64_t with_live = 0;
      for (int p = 0; p < pages; ++p) {
        bool live = false;
        for (int s = p * bs; s < std::min(kv.n_slots, (p + 1) * bs); ++s) live = live || kv.is_valid(s, h);
        with_live += live ? 1 : 0;
        if (!cfg.per_head_tables) continue;
        const bool hole = kv.view.page_id(0, p, h) == store.hole_block();
        if (hole) ASSERT_FALSE(live) << "layer " << l << " page " << p << " head " << h << ": a live cell in the hole block";
        if (exact) ASSERT_EQ(hole, !live) << "layer " << l << " page " << p << " head " << h;
      }
      if (cfg.per_head_tables && exact)
        ASSERT_EQ(store.head_blocks(seq, l, h), with_live) << "layer " << l << " head " << h;
    }
  }
}

// A random walk over a store's sequence lifecycle: each step draws kind = rng() % 10 and creates a
// sequence (kind 0, or when none is live), forks one (kind 1, below max_seqs live), frees one
// (kind 2, if another stays), reserves and appends 1..max_append tokens (kinds 3..last_append_kind;
// a refused reservation is counted and nothing else happens), or evicts (the other kinds). The
// test supplies what a sequence's mirror is and how appending and evicting change it; check runs
// after every step but a create or a refused reservation, and a fatal failure ends the walk.
template <class Model>
struct RandomStoreWalk {
  RandomStoreWalk(int ops, size_t max_seqs, int last_append_kind, int max_append)
      : ops(ops), max_seqs(max_seqs), last_append_kind(last_append_kind), max_append(max_append) {}
  int ops;
  size_t max_seqs;
  int last_append_kind;
  int max_append;

  std::map<SeqId, Model> models;
  std::map<SeqId, int64_t> next_pos;
  int refused_reservations = 0;

  template <class Empty, class Append, class Evict, class Check>
  void run(KvStore& store, std::mt19937& rng, Empty empty, Append append, Evict evict, Check check) {
    for (int op = 0; op < ops; ++op) {
      const int kind = static_cast<int>(rng() % 10);
      if (models.empty() || kind == 0) {
        const SeqId s = store.create_sequence();
        models[s] = empty();
        next_pos[s] = 0;
        continue;
      }
      auto it = models.begin();
      std::advance(it, rng() % models.size());
      const SeqId s = it->first;
      if (kind == 1 && models.size() < max_seqs) {
        const SeqId c = store.fork(s);
        models[c] = models[s];
        next_pos[c] = next_pos[s];
      } else if (kind == 2 && models.size() > 1) {
        store.free_sequence(s);
        models.erase(s);
      } else if (kind <= last_append_kind) {
        const int n = 1 + static_cast<int>(rng() % max_append);
        if (store.reserve(s, n) != AllocStatus::kOk) {
          ++refused_reservations;
          continue;
        }
        for (int t = 0; t < n; ++t) append(s, next_pos[s]++);
      } else {
        evict(s);
      }
      check(op, kind, s);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
};

}  // namespace kvlab::kv_test
