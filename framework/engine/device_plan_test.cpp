// The device plan's arrays against the host store they describe: a view built from the block
// table arrays reads exactly the host's keys and values, per-page metadata scattered into a
// device-shaped array gives every slot's position (or -1 for a hole), and the selection lists
// are the policy's ranges (or [0, n_slots) for select_all). Awkward shapes: page sizes 1, 7, 16,
// several layers, two sequences interleaved, per-head evictions with compaction.
#include "framework/engine/device_plan.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "framework/core/error.h"
#include "framework/kv/kv_store.h"

namespace kvlab {
namespace {

struct Store {
  KvStoreConfig cfg;
  std::unique_ptr<KvStore> kv;
  std::mt19937 rng{7};
  Store(int heads, int dim, int page) {
    cfg.n_layers = 2;
    cfg.n_kv_heads = heads;
    cfg.head_dim = dim;
    cfg.block_size_tokens = page;
    cfg.budget_bytes = size_t{2} * page * heads * dim * sizeof(float) * 400;
    kv = std::make_unique<KvStore>(cfg);
  }
  void feed(SeqId s, int n, int64_t& pos) {
    ASSERT_EQ(kv->reserve(s, n), AllocStatus::kOk);
    std::normal_distribution<float> nd;
    std::vector<float> k(size_t(cfg.n_kv_heads) * cfg.head_dim), v(k.size());
    for (int i = 0; i < n; ++i, pos += 2) {  // positions with gaps: slot != position
      for (auto& x : k) x = nd(rng);
      for (auto& x : v) x = nd(rng);
      for (int l = 0; l < cfg.n_layers; ++l) kv->append(s, l, pos, k.data(), v.data());
    }
  }
};

// Every slot of every request in `table` reads the host data of `kvs[b]` through the arrays.
void expect_table_reads_host(const BlockTableArrays& t, const std::vector<LayerKv>& kvs) {
  ASSERT_EQ(t.batch(), int(kvs.size()));
  for (int b = 0; b < t.batch(); ++b) {
    PagedKvView<const float> view = kvs[b].view;
    view.indptr = t.indptr.data();
    view.indices = t.indices.data();
    view.last_page_len = t.last_page_len.data();
    ASSERT_EQ(view.length(b), kvs[b].n_slots);
    for (int s = 0; s < kvs[b].n_slots; ++s)
      for (int h = 0; h < view.num_kv_heads; ++h) {
        EXPECT_EQ(view.k_data + view.slot_offset(b, s, h), kvs[b].key(s, h));
        EXPECT_EQ(view.v_data + view.slot_offset(b, s, h), kvs[b].value(s, h));
      }
  }
}

class DevicePlan : public ::testing::TestWithParam<int> {};

TEST_P(DevicePlan, TablesMetadataAndDataMirrorTheHostStore) {
  const int page = GetParam(), H = 3, D = 5;
  Store st(H, D, page);
  const SeqId a = st.kv->create_sequence(), b = st.kv->create_sequence();
  int64_t pa = 0, pb = 100;
  for (int round = 0; round < 4; ++round) {  // interleaved: the two tables mix block ids
    st.feed(a, 3 + round * 5, pa);
    st.feed(b, 2 + round * 3, pb);
  }
  // per-head evictions in layer 1 of a (some compaction), none in layer 0
  Evictions ev;
  ev.clear(H);
  const int n_a = st.kv->n_slots(a, 1);
  for (int s = 0; s < n_a; ++s)
    for (int h = 0; h < H; ++h)
      if ((s * 7 + h * 3) % 5 < 2) ev.slots[h].push_back(s);
  st.kv->evict(a, 1, ev);
  ev.clear(H);
  ev.slots[1].push_back(st.kv->n_slots(a, 1) - 1);  // a hole the store keeps (no compaction)
  st.kv->evict(a, 1, ev);

  for (int layer = 0; layer < 2; ++layer) {
    const std::vector<LayerKv> kvs = {st.kv->layer(a, layer), st.kv->layer(b, layer)};
    BlockTableArrays t;
    t.add(kvs[0]);
    t.add(kvs[1]);
    expect_table_reads_host(t, kvs);
    // the same request several times (prefill rows as requests) reads the same pages
    BlockTableArrays rep;
    for (int i = 0; i < 3; ++i) rep.add(kvs[1]);
    expect_table_reads_host(rep, {kvs[1], kvs[1], kvs[1]});

    // metadata and data scattered into device-shaped arrays
    const int64_t n_pages = st.kv->stats().blocks_total;
    const size_t page_meta = size_t(H) * page, page_elems = page_meta * D;
    std::vector<int32_t> dev_pos(n_pages * page_meta, -7), dev_rank(n_pages * page_meta, -7);
    std::vector<float> dev_k(n_pages * page_elems, NAN), dev_v(n_pages * page_elems, NAN);
    for (const LayerKv& kv : kvs) {
      std::vector<int32_t> ids, meta, ids2, ranks_meta, ids3;
      std::vector<float> k, v;
      append_page_positions(kv, ids, meta);
      std::vector<int32_t> ranks(size_t(kv.n_slots) * H);
      for (size_t i = 0; i < ranks.size(); ++i) ranks[i] = int32_t(i * 3 + 1);
      append_page_values(kv, ranks.data(), ids2, ranks_meta);
      append_page_data(kv, ids3, k, v);
      ASSERT_EQ(ids, ids2);
      ASSERT_EQ(ids, ids3);
      ASSERT_EQ(meta.size(), ids.size() * page_meta);
      ASSERT_EQ(k.size(), ids.size() * page_elems);
      for (size_t i = 0; i < ids.size(); ++i) {
        std::copy_n(meta.begin() + i * page_meta, page_meta, dev_pos.begin() + ids[i] * page_meta);
        std::copy_n(ranks_meta.begin() + i * page_meta, page_meta, dev_rank.begin() + ids[i] * page_meta);
        std::copy_n(k.begin() + i * page_elems, page_elems, dev_k.begin() + ids[i] * page_elems);
        std::copy_n(v.begin() + i * page_elems, page_elems, dev_v.begin() + ids[i] * page_elems);
      }
      for (int s = 0; s < kv.n_slots; ++s)
        for (int h = 0; h < H; ++h) {
          const size_t m = kv.view.slot_meta_offset(0, s, h);
          EXPECT_EQ(dev_pos[m], kv.is_valid(s, h) ? kv.position(s, h) : -1) << "slot " << s << " head " << h;
          EXPECT_EQ(dev_rank[m], ranks[size_t(s) * H + h]);
          const size_t o = kv.view.slot_offset(0, s, h);
          for (int d = 0; d < D; ++d) {
            EXPECT_EQ(dev_k[o + d], kv.key(s, h)[d]);
            EXPECT_EQ(dev_v[o + d], kv.value(s, h)[d]);
          }
        }
      // the tail of the last page is marked empty
      for (int s = kv.n_slots; s < (kv.n_slots + page - 1) / page * page; ++s)
        for (int h = 0; h < H; ++h) EXPECT_EQ(dev_pos[kv.view.slot_meta_offset(0, s, h)], -1);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PageSizes, DevicePlan, ::testing::Values(1, 7, 16));

TEST(DevicePlanSelection, ListsAreThePolicyRangesOrTheWholeCache) {
  KeySelection all;
  all.select_all();
  SelectionArrays s;
  s.add_row(all, 0, 2, 9);
  ASSERT_EQ(s.n_lists(), 2);
  EXPECT_EQ(s.indptr, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(s.ranges[1].begin, 0);
  EXPECT_EQ(s.ranges[1].end, 9);
  s.add_row(all, 0, 2, 0);  // an empty cache: empty lists
  EXPECT_EQ(s.indptr, (std::vector<int32_t>{0, 1, 2, 2, 2}));
  EXPECT_EQ(s.max_count(), 9);

  KeySelection sel;
  sel.begin(2, 2);
  sel.add(0, 3), sel.add(5, 7), sel.close_list();  // row 0 head 0
  sel.close_list();                                // row 0 head 1: empty
  sel.add(1, 2), sel.close_list();                 // row 1 head 0
  sel.add(4, 8), sel.close_list();                 // row 1 head 1
  SelectionArrays t;
  t.add_row(sel, 1, 2, 8);
  t.add_row(sel, 0, 2, 8);
  EXPECT_EQ(t.indptr, (std::vector<int32_t>{0, 1, 2, 4, 4}));
  EXPECT_EQ(t.ranges[2].begin, 0);
  EXPECT_EQ(t.ranges[3].end, 7);
  EXPECT_EQ(t.list_slots, (std::vector<int32_t>{8, 8, 8, 8}));
  EXPECT_EQ(t.max_count(), 5);
  // the tables pass DeviceSelection's own contract (key offsets restart per list)
  EXPECT_EQ(build_key_offsets(t.indptr, t.ranges), (std::vector<int32_t>{0, 0, 0, 3}));

  t.check();
  SelectionArrays bad = t;
  bad.ranges[2] = {3, 2};  // empty
  EXPECT_THROW(bad.check(), Error);
  bad = t;
  bad.list_slots[2] = 6;   // past the list's slots
  EXPECT_THROW(bad.check(), Error);
  bad = t;
  bad.ranges[3] = {2, 7};  // overlaps [0, 3)
  EXPECT_THROW(bad.check(), Error);

  EXPECT_TRUE(rows_share_lists(all));
  EXPECT_FALSE(rows_share_lists(sel));
  KeySelection same;
  same.begin(3, 1);
  for (int r = 0; r < 3; ++r) same.add(0, 2), same.add(4, 6), same.close_list();
  EXPECT_TRUE(rows_share_lists(same));
}

}  // namespace
}  // namespace kvlab
