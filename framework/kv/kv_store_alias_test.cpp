// KvStore with values aliasing keys (kv_store.h "Values alias keys", MLA's latent cache): one
// arena, half the bytes per token, every value read equals its key row (through fork,
// copy-on-write, eviction and compaction, in every per-row format), and the formats that cannot
// alias (KIVI) or fp8 scales that differ for K and V are refused with one clear error.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "framework/core/error.h"
#include "framework/kv/kv_store.h"

namespace kvlab {
namespace {

KvStoreConfig alias_config(KvFormat format) {
  KvStoreConfig c;
  c.n_layers = 2;
  c.n_kv_heads = 1;
  c.head_dim = 40;
  c.block_size_tokens = 4;
  c.budget_bytes = size_t{1} << 20;
  c.format = format;
  c.values_alias_keys = true;
  return c;
}

TEST(KvStoreAlias, HalfTheBytesAndOneArena) {
  for (KvFormat f : kRowKvFormats) {
    SCOPED_TRACE(kv_format_name(f));
    KvStoreConfig c = alias_config(f);
    KvStoreConfig two = c;
    two.values_alias_keys = false;
    EXPECT_DOUBLE_EQ(2 * kv_bytes_per_token(c), kv_bytes_per_token(two));
    KvStore alias(c), plain(two);
    EXPECT_EQ(2 * alias.block_bytes(), plain.block_bytes());
    // the same budget holds twice the blocks (each count rounded down)
    EXPECT_EQ(alias.free_blocks(), int64_t(c.budget_bytes / alias.block_bytes()));
    EXPECT_EQ(plain.free_blocks(), int64_t(c.budget_bytes / (2 * alias.block_bytes())));
  }
  // f32: exactly one row of head_dim floats per (layer, token)
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(alias_config(KvFormat::kF32)), 2.0 * 40 * 4);
}

TEST(KvStoreAlias, ValuesAreTheKeyRowsThroughForkEvictAndCompaction) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (KvFormat f : kRowKvFormats) {
    SCOPED_TRACE(kv_format_name(f));
    KvStore s(alias_config(f));
    const SeqId a = s.create_sequence();
    const int D = 40;
    std::vector<float> k(D), junk(D, 123.f);
    auto append = [&](SeqId seq, int n, int64_t pos0) {
      ASSERT_EQ(s.reserve(seq, n), AllocStatus::kOk);
      for (int t = 0; t < n; ++t)
        for (int l = 0; l < 2; ++l) {
          for (float& x : k) x = nd(rng);
          s.append(seq, l, pos0 + t, k.data(), junk.data());  // v is ignored: the value is the key row
        }
    };
    auto expect_values_are_keys = [&](SeqId seq) {
      std::vector<float> key(D), value(D);
      for (int l = 0; l < 2; ++l) {
        const LayerKv kv = s.layer(seq, l);
        EXPECT_EQ(kv.k_bytes, kv.v_bytes);
        for (int slot = 0; slot < kv.n_slots; ++slot) {
          if (!kv.is_valid(slot, 0)) continue;
          kv.load_key(slot, 0, key.data());
          kv.load_value(slot, 0, value.data());
          ASSERT_EQ(std::memcmp(key.data(), value.data(), sizeof(float) * D), 0) << "layer " << l << " slot " << slot;
          EXPECT_NE(value[0], 123.f);
        }
      }
    };
    append(a, 10, 0);
    expect_values_are_keys(a);
    const SeqId b = s.fork(a);
    append(b, 3, 10);  // copy-on-write of the shared last block
    append(a, 2, 10);
    expect_values_are_keys(a);
    expect_values_are_keys(b);
    Evictions ev;
    ev.clear(1);
    for (int slot : {0, 1, 2, 3, 5, 6, 7}) ev.slots[0].push_back(slot);  // frees block 0, then compacts
    s.evict(a, 0, ev);
    expect_values_are_keys(a);
    expect_values_are_keys(b);
  }
}

TEST(KvStoreAlias, RefusesKiviAndUnequalFp8Scales) {
  for (KvFormat f : {KvFormat::kInt4, KvFormat::kInt2}) {
    KvStoreConfig c = alias_config(f);
    c.group_size = 8;
    c.residual = 8;
    try {
      KvStore s(c);
      ADD_FAILURE() << "constructed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot store values as aliases of the keys"), std::string::npos) << e.what();
    }
  }
  KvStore s(alias_config(KvFormat::kFp8E4m3));
  const float k = 0.5f, v = 0.25f;
  EXPECT_THROW(s.set_fp8_scales(0, &k, &v), Error);
  s.set_fp8_scales(0, &k, &k);
}

}  // namespace
}  // namespace kvlab
