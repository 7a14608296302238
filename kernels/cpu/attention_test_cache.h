// Random inputs shared by the CPU attention tests (attention_test.cpp, attention_fused_test.cpp):
// normal values, a paged cache with scattered pages and holes, random explicit selections.
// Test-only, header-only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"

namespace kvlab::attention_test {

// n values ~ N(0, sigma^2), drawn from rng in order.
inline std::vector<float> random_normal(size_t n, float sigma, std::mt19937& rng) {
  std::vector<float> x(n);
  std::normal_distribution<float> nd(0.f, sigma);
  for (auto& v : x) v = nd(rng);
  return x;
}

// A paged cache built directly (no KvStore: kernels depend on nothing in framework/), with its
// pages scattered through a larger pool in random order.
struct FakeCache {
  int bs, H, D, n_slots;
  std::vector<float> k, v;          // [n_pages, H, bs, D]
  std::vector<int32_t> indices;     // block table
  int32_t indptr[2];
  int32_t last_len;
  std::vector<int64_t> positions;   // [n_slots, H]
  std::vector<uint8_t> valid;       // [n_slots, H]

  FakeCache(int bs_, int H_, int D_, int n, double hole_prob, std::mt19937& rng)
      : bs(bs_), H(H_), D(D_), n_slots(n) {
    const int used = (n + bs - 1) / bs;
    const int n_pages = used + 3;
    std::normal_distribution<float> nd(0.f, 1.f);
    k.resize(static_cast<size_t>(n_pages) * H * bs * D);
    v.resize(k.size());
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    std::vector<int32_t> perm(n_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    indices.assign(perm.begin(), perm.begin() + used);
    indptr[0] = 0;
    indptr[1] = used;
    last_len = used == 0 ? 0 : n - (used - 1) * bs;
    positions.resize(static_cast<size_t>(n) * H);
    valid.resize(positions.size());
    std::uniform_real_distribution<double> u(0, 1);
    for (int h = 0; h < H; ++h) {
      int64_t p = rng() % 3;
      for (int s = 0; s < n; ++s) {
        p += 1 + (u(rng) < 0.2 ? rng() % 3 : 0);  // increasing, with gaps (earlier evictions)
        positions[static_cast<size_t>(s) * H + h] = p;
        valid[static_cast<size_t>(s) * H + h] = u(rng) >= hole_prob;
      }
    }
  }
  LayerKv layer() const {
    LayerKv kv;
    kv.view.page_size = bs;
    kv.view.num_kv_heads = H;
    kv.view.head_dim = D;
    kv.view.k_data = k.data();
    kv.view.v_data = v.data();
    kv.view.indptr = indptr;
    kv.view.indices = indices.data();
    kv.view.last_page_len = &last_len;
    kv.n_slots = n_slots;
    kv.positions = positions.data();
    kv.valid = valid.data();
    return kv;
  }
  int64_t max_position() const {
    int64_t m = 0;
    for (int64_t p : positions) m = std::max(m, p);
    return m;
  }
};

// Random sorted, disjoint ranges per (row, kv head); some lists empty.
inline KeySelection random_selection(int rows, int H, int n_slots, std::mt19937& rng) {
  KeySelection sel;
  sel.begin(rows, H);
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < H; ++h) {
      if (rng() % 5 != 0) {
        int s = 0;
        while (s < n_slots) {
          const int gap = rng() % 9, len = 1 + rng() % 12;
          const int b = std::min(n_slots, s + gap), e = std::min(n_slots, b + len);
          sel.add(b, e);
          s = e + 1;
        }
      }
      sel.close_list();
    }
  }
  return sel;
}

}  // namespace kvlab::attention_test
