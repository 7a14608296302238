// Tiled online-softmax attention over the paged KV view (contract in attention.h).
//
// Work item = (KV head g, a block of rows, a chunk of the group's query heads): its Q query
// vectors all read the same key list (with a full selection several rows share it; an explicit
// selection is per row), so each key tile is loaded once for all Q of them. Per tile of up to
// kTile candidate keys (valid, and not past the item's last query position):
//   S[q][j] = tau q_q . k_j   (-inf where position(k_j) > position(q))  -- dot4x2 / dot8, hsum8
//   online-softmax update of (m_q, l_q), O_q <- alpha O_q + sum_j p_qj v_j  -- exp8, pv4 / pv
// Queries go in register-blocked groups of 4 (the G heads of a GQA group, or rows), so a key or
// value chunk loaded once feeds 4 FMAs; a remainder of 1-3 queries uses the one-query kernels.
// and at the end O_q / l_q, LSE_q = m_q + log l_q. With key_mass, each tile's raw scores S (and
// its slots) are also kept in per-thread scratch; once the item's LSEs are known its column sums
// col_j = sum_q exp(S[q][j] - LSE_q) are formed from them, so no key is read twice. Column sums
// go into key_mass directly on one thread (items run in order), else into per-item buffers that
// are added per KV head in item order afterwards: the same sums in the same order either way.
// head_mass is formed from the same kept scores, one row per query of the window.
//
// Storage formats (kernels/common/kv_format.h): with a store in any format but f32 the walker
// hands each tile its rows as stored (codes, scales, KIVI metadata) and the tile's two products
// run with the decode fused in (attention_fused.h: codes converted in registers, AVX-512 or AVX2
// chosen from cpuid, scalar on the portable path): no row is decoded into memory. The result
// equals attention over the dequantised rows up to float rounding (summation order; int8 / fp8
// apply their scale once per dot product and per probability). With rope at read a key must be
// rotated as floats, so there the walker decodes each key's and value's row into the tile's
// scratch (kTile x D floats, in L1) exactly as kv_decode_row does, and the f32 tile runs on
// those. KIVI's fp32 residual rows come in tiles of their own and take the f32 path.
//
// This file is compiled twice (cpu_path.h): as itself, the portable instance (plain loops, the
// build's baseline ISA; it also holds the dispatching attention()), and through
// attention_avx2.cpp with KVLAB_ATTENTION_AVX2=1, where every function below is compiled with
// target("avx2,fma") and the 8-wide helpers are used. Only the helpers and the four places
// that call them differ between the two (#if KVLAB_ATTENTION_AVX2). Two parts of it live in
// files of their own, included below (so both instances still compile the same text):
// attention_simd.inc (the 8-wide helpers and row decoders) and attention_keys.inc (work items,
// scratch and the key walker).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/common/online_softmax.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_common.h"
#include "kernels/cpu/attention_fused.h"
#include "kernels/cpu/cpu_path.h"
#include "kernels/cpu/simd_target.h"
#include "kernels/cpu/thread_pool.h"

#ifndef KVLAB_ATTENTION_AVX2
#define KVLAB_ATTENTION_AVX2 0
#endif

// Everything from here to the matching pop gets the AVX2+FMA target in the AVX2 instance (the
// headers above keep the baseline, so their inline functions are the same in both objects).
#if KVLAB_ATTENTION_AVX2
KVLAB_TARGET_BEGIN("avx2,fma")
#endif

namespace kvlab {

void attention_tiled_avx2(const AttentionArgs& a, ThreadPool* pool);      // attention_avx2.cpp
void attention_tiled_portable(const AttentionArgs& a, ThreadPool* pool);  // this file

namespace {

constexpr int kTile = 32;   // keys per tile (a multiple of 8)
constexpr int kMaxQ = 32;   // query vectors per work item
static_assert(kTile % 8 == 0);
static_assert(kTile <= kFusedMaxKeys && kMaxQ <= kFusedMaxQ);

// The 8-wide helpers (AVX2 instance only), then the key walker; split out only for length.
#include "kernels/cpu/attention_simd.inc"  // NOLINT(bugprone-suspicious-include)
#include "kernels/cpu/attention_keys.inc"  // NOLINT(bugprone-suspicious-include)

// The item's query vectors: q index = (row - row_begin) * n_item_heads + (head - head_begin).
struct ItemQueries {
  int n = 0;
  int64_t pos[kMaxQ];
  int64_t max_pos = -1;
  int row[kMaxQ], head[kMaxQ];
};

ItemQueries item_queries(const AttentionArgs& a, const WorkItem& it, Scratch& sc) {
  ItemQueries iq;
  const int D = a.head_dim;
  iq.max_pos = INT64_MIN;
  for (int r = it.row_begin; r < it.row_end; ++r) {
    for (int h = it.head_begin; h < it.head_end; ++h) {
      const float* src = a.q + (static_cast<size_t>(r) * a.n_heads + h) * D;
      float* dst = sc.q.data() + static_cast<size_t>(iq.n) * D;
      for (int d = 0; d < D; ++d) dst[d] = a.scale * src[d];
      iq.pos[iq.n] = a.q_positions[r];
      iq.row[iq.n] = r;
      iq.head[iq.n] = h;
      iq.max_pos = std::max(iq.max_pos, a.q_positions[r]);
      ++iq.n;
    }
  }
  return iq;
}

// Padding past t.n and causality per query: -inf.
void mask_scores(const ItemQueries& iq, const KeyTile& t, float* S) {
  int64_t tile_max_pos = INT64_MIN;
  for (int j = 0; j < t.n; ++j) tile_max_pos = std::max(tile_max_pos, t.pos[j]);
  for (int q = 0; q < iq.n; ++q) {
    float* row = S + static_cast<size_t>(q) * kTile;
    for (int j = t.n; j < kTile; ++j) row[j] = kNegInf;
    if (tile_max_pos > iq.pos[q])
      for (int j = 0; j < t.n; ++j)
        if (t.pos[j] > iq.pos[q]) row[j] = kNegInf;
  }
}

// The fused kernels' view of a tile of coded rows.
FusedRows fused_rows(const AttentionArgs& a, const KeyTile& t) {
  FusedRows r;
  r.format = a.kv.format();
  r.n = t.n;
  r.head_dim = a.head_dim;
  r.group_size = a.kv.layout.group_size;
  r.k_codes = t.kc;
  r.v_codes = t.vc;
  r.k_scale = t.ks;
  r.v_scale = t.vs;
  r.k_meta = t.km;
  r.v_meta = t.vm;
  if (kv_format_has_head_scale(r.format)) r.fp8_table = fp8_table(r.format);
  return r;
}

// S[q][0..kTile) for every query of the item: scores of the tile's keys, -inf where masked
// (causality per query, and the padding past t.n).
void tile_scores(const ItemQueries& iq, const KeyTile& t, const Scratch& sc, float* S, int D) {
  const bool simd = KVLAB_ATTENTION_AVX2 && D % 8 == 0;
  const float* kp[kTile];
  for (int j = 0; j < kTile; ++j) kp[j] = j < t.n ? t.k[j] : sc.zeros.data();
  int q = 0;
#if KVLAB_ATTENTION_AVX2
  const int n8 = (t.n + 7) / 8 * 8;
  if (simd) {  // groups of 4 queries share every key load
    for (; q + 4 <= iq.n; q += 4) {
      const float* qv = sc.q.data() + static_cast<size_t>(q) * D;
      float* rows = S + static_cast<size_t>(q) * kTile;
      alignas(32) float r[8];
      for (int j = 0; j < n8; j += 2) {
        dot4x2(qv, D, kp[j], kp[j + 1], D, r);
        for (int i = 0; i < 4; ++i) {
          rows[i * kTile + j] = r[2 * i];
          rows[i * kTile + j + 1] = r[2 * i + 1];
        }
      }
    }
  }
#endif
  for (; q < iq.n; ++q) {
    const float* qv = sc.q.data() + static_cast<size_t>(q) * D;
    float* row = S + static_cast<size_t>(q) * kTile;
    if (simd) {
#if KVLAB_ATTENTION_AVX2
      for (int j = 0; j < n8; j += 8) _mm256_storeu_ps(row + j, dot8(qv, kp + j, D));
#endif
    } else {
      for (int j = 0; j < t.n; ++j) {
        float acc = 0.f;
        for (int d = 0; d < D; ++d) acc += qv[d] * kp[j][d];
        row[j] = acc;
      }
    }
  }
  mask_scores(iq, t, S);
}

// A tile of coded rows (any format but f32, no rope at read): the same scores with the format's
// decode fused into the dot products (attention_fused.h), then the same masks.
void coded_tile_scores(const AttentionArgs& a, FusedIsa isa, const ItemQueries& iq, const KeyTile& t,
                       const Scratch& sc, float* S) {
  fused_scores(isa, fused_rows(a, t), sc.q.data(), iq.n, S, kTile);
  mask_scores(iq, t, S);
}

// Column sums of one item: where its keys go when key_mass / head_mass is set.
struct ItemMass {
  std::vector<int32_t> slot;  // [n_keys] in walk order
  std::vector<float> mass;    // [n_keys] sum over the item's queries of exp(s - LSE) (key_mass)
  std::vector<int> head;      // [n_window] query head of each window query (head_mass)
  std::vector<float> head_p;  // [n_window][n_keys] its exp(s - LSE)
};

// Adds n values at slots into dst[slot[j]].
void add_at(float* dst, const int32_t* slot, const float* x, size_t n) {
  for (size_t j = 0; j < n; ++j) dst[slot[j]] += x[j];
}

// Adds a buffered item's sums into key_mass[g, :] and head_mass[its heads, :].
void add_item_mass(const AttentionArgs& a, int g, const ItemMass& m) {
  const size_t n = m.slot.size(), n_slots = static_cast<size_t>(a.kv.n_slots);
  if (a.key_mass != nullptr) add_at(a.key_mass + g * n_slots, m.slot.data(), m.mass.data(), n);
  for (size_t w = 0; w < m.head.size(); ++w)
    add_at(a.head_mass + m.head[w] * n_slots, m.slot.data(), m.head_p.data() + w * n, n);
}

// From the scores kept in sc.raw_* during run_item: col_j = sum_q exp(S[q][j] - LSE_q), summed
// over q in order (queries with LSE = -inf saw nothing and add nothing), and for each window
// query (row >= head_mass_first_row) its own row exp(S[q][j] - LSE_q). Added to key_mass /
// head_mass directly when `direct`, else stored in `item_mass`.
void item_key_mass(const AttentionArgs& a, const WorkItem& it, const ItemQueries& iq, const float* lse,
                   Scratch& sc, bool direct, ItemMass* item_mass) {
  const int n_q = iq.n;
  const size_t n_tiles = sc.raw_n.size(), n_slots = static_cast<size_t>(a.kv.n_slots);
  int window[kMaxQ], n_window = 0;  // the window queries, in q order
  if (a.head_mass != nullptr)
    for (int q = 0; q < n_q; ++q)
      if (iq.row[q] >= a.head_mass_first_row && lse[q] != kNegInf) window[n_window++] = q;
  size_t n_keys = 0;
  for (int n : sc.raw_n) n_keys += n;
  if (!direct) {
    item_mass->slot.resize(n_keys);
    if (a.key_mass != nullptr) item_mass->mass.resize(n_keys);
    item_mass->head.resize(n_window);
    for (int w = 0; w < n_window; ++w) item_mass->head[w] = iq.head[window[w]];
    item_mass->head_p.resize(n_window * n_keys);
  }
  size_t out = 0;
  for (size_t ti = 0; ti < n_tiles; ++ti) {
    const float* S = sc.raw_s.data() + ti * static_cast<size_t>(n_q) * kTile;
    const int32_t* slot = sc.raw_slot.data() + ti * kTile;
    const int n = sc.raw_n[ti];
    alignas(32) float col[kTile] = {};
    alignas(32) float p[kTile];
    int w = 0;  // next window query
    for (int q = 0; q < n_q; ++q) {
      if (lse[q] == kNegInf) continue;
      const float* row = S + static_cast<size_t>(q) * kTile;
#if KVLAB_ATTENTION_AVX2
      const __m256 l = _mm256_set1_ps(lse[q]);
      for (int j = 0; j < kTile; j += 8) _mm256_store_ps(p + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), l)));
#else
      for (int j = 0; j < n; ++j) p[j] = std::exp(row[j] - lse[q]);
#endif
      if (a.key_mass != nullptr)
        for (int j = 0; j < n; ++j) col[j] += p[j];
      if (w < n_window && window[w] == q) {
        if (direct)
          add_at(a.head_mass + iq.head[q] * n_slots, slot, p, n);
        else
          std::copy(p, p + n, item_mass->head_p.begin() + static_cast<ptrdiff_t>(w * n_keys + out));
        ++w;
      }
    }
    if (direct) {
      if (a.key_mass != nullptr) add_at(a.key_mass + it.kv_head * n_slots, slot, col, n);
    } else {
      std::copy(slot, slot + n, item_mass->slot.begin() + static_cast<ptrdiff_t>(out));
      if (a.key_mass != nullptr) std::copy(col, col + n, item_mass->mass.begin() + static_cast<ptrdiff_t>(out));
    }
    out += n;
  }
}

// Gemma 2's soft-capping of the tile's scores (rows of kTile, the first n_keys live): s <- c tanh(s / c);
// masked entries stay -inf.
void softcap_scores(float* S, int n_queries, int n_keys, float cap) {
  for (int q = 0; q < n_queries; ++q) {
    float* row = S + static_cast<size_t>(q) * kTile;
    for (int j = 0; j < n_keys; ++j)
      if (row[j] != kNegInf) row[j] = cap * std::tanh(row[j] / cap);
  }
}

// One work item of the main pass. With key_mass / head_mass set, the sums go to them directly
// (`direct`) or into *item_mass.
void run_item(const AttentionArgs& a, const WorkItem& it, float* lse_all, bool direct,
              ItemMass* item_mass) {
  Scratch& sc = thread_scratch();
  const int D = a.head_dim;
  sc.ensure(D);
  const ItemQueries iq = item_queries(a, it, sc);
  std::fill(sc.o.begin(), sc.o.begin() + static_cast<ptrdiff_t>(iq.n) * D, 0.f);
  SoftmaxState st[kMaxQ];
  KeyWalker walker(a, it, iq.max_pos, sc);
  KeyTile t;
  float* S = sc.s.data();
  const bool simd = KVLAB_ATTENTION_AVX2 && D % 8 == 0;
  const bool mass = a.key_mass != nullptr || a.head_mass != nullptr;
  if (mass) { sc.raw_s.clear(); sc.raw_slot.clear(); sc.raw_n.clear(); }
  // The fused kernels' instruction set: the portable instance's scalar one, else cpuid's best.
  const FusedIsa isa = KVLAB_ATTENTION_AVX2 ? fused_isa() : FusedIsa::kPortable;
  while (walker.next(t)) {
    if (t.coded)
      coded_tile_scores(a, isa, iq, t, sc, S);
    else
      tile_scores(iq, t, sc, S, D);
    if (a.softcap > 0) softcap_scores(S, iq.n, t.n, a.softcap);
    if (mass) {  // keep the raw scores for the column sums (S is overwritten by p below)
      sc.raw_s.insert(sc.raw_s.end(), S, S + static_cast<size_t>(iq.n) * kTile);
      sc.raw_slot.insert(sc.raw_slot.end(), t.slot, t.slot + t.n);
      sc.raw_slot.resize(sc.raw_slot.size() + (kTile - t.n), 0);
      sc.raw_n.push_back(t.n);
    }
    float alpha[kMaxQ];
    for (int q = 0; q < iq.n; ++q) {
      float* row = S + static_cast<size_t>(q) * kTile;
      // m' = max(m, max_j s_j); alpha = exp(m - m'); p_j = exp(s_j - m') (0 where masked; a
      // query that sees nothing in the tile gets alpha 1, or 0 while it has seen nothing).
#if KVLAB_ATTENTION_AVX2
      const int n8 = (t.n + 7) / 8 * 8;
      __m256 mx = _mm256_set1_ps(kNegInf);
      for (int j = 0; j < n8; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(row + j));
      float shift;
      alpha[q] = softmax_rescale(st[q], hmax(mx), &shift);
      __m256 lsum = _mm256_setzero_ps();
      const __m256 sh = _mm256_set1_ps(shift);
      for (int j = 0; j < n8; j += 8) {
        const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), sh));
        _mm256_storeu_ps(row + j, p);
        lsum = _mm256_add_ps(lsum, p);
      }
      st[q].l += hsum(lsum);
#else
      float mx = kNegInf;
      for (int j = 0; j < t.n; ++j) mx = std::max(mx, row[j]);
      float shift;
      alpha[q] = softmax_rescale(st[q], mx, &shift);
      float lsum = 0.f;
      for (int j = 0; j < t.n; ++j) lsum += (row[j] = std::exp(row[j] - shift));
      st[q].l += lsum;
#endif
    }
    // O_q <- alpha_q O_q + sum_j p_qj v_j
    if (t.coded) {
      fused_pv(isa, fused_rows(a, t), sc.o.data(), alpha, S, kTile, iq.n);
      continue;
    }
    int q = 0;
#if KVLAB_ATTENTION_AVX2
    if (simd) {
      for (; q + 4 <= iq.n; q += 4) {
        float* o4[4];
        const float* p4[4];
        for (int i = 0; i < 4; ++i) {
          o4[i] = sc.o.data() + static_cast<size_t>(q + i) * D;
          p4[i] = S + static_cast<size_t>(q + i) * kTile;
        }
        pv4_accumulate(o4, alpha + q, p4, t.v, t.n, D);
      }
    }
#endif
    for (; q < iq.n; ++q) {
      const float* row = S + static_cast<size_t>(q) * kTile;
      float* o = sc.o.data() + static_cast<size_t>(q) * D;
      if (simd) {
#if KVLAB_ATTENTION_AVX2
        pv_accumulate(o, alpha[q], row, t.v, t.n, D);
#endif
      } else {
        for (int d = 0; d < D; ++d) {
          float acc = alpha[q] * o[d];
          for (int j = 0; j < t.n; ++j) acc += row[j] * t.v[j][d];
          o[d] = acc;
        }
      }
    }
  }
  for (int q = 0; q < iq.n; ++q) {
    const size_t qh = static_cast<size_t>(iq.row[q]) * a.n_heads + iq.head[q];
    float* out = a.out + qh * D;
    const float* o = sc.o.data() + static_cast<size_t>(q) * D;
    const float inv = st[q].l > 0.f ? 1.f / st[q].l : 0.f;
    for (int d = 0; d < D; ++d) out[d] = o[d] * inv;
    if (lse_all != nullptr) lse_all[qh] = softmax_lse(st[q]);
  }
  if (mass) {
    float lse[kMaxQ];
    for (int q = 0; q < iq.n; ++q) lse[q] = softmax_lse(st[q]);
    item_key_mass(a, it, iq, lse, sc, direct, item_mass);
  }
}

// Items for the main pass. Rows share an item only under a full selection; a group wider than
// kMaxQ heads is split into head chunks.
std::vector<WorkItem> make_items(const AttentionArgs& a) {
  const int G = a.n_heads / a.n_kv_heads;
  const int heads_per_item = std::min(G, kMaxQ);
  const int rows_per_item = selection_is_all(a) ? std::max(1, kMaxQ / heads_per_item) : 1;
  std::vector<WorkItem> items;
  for (int r0 = 0; r0 < a.n_rows; r0 += rows_per_item)
    for (int g = 0; g < a.n_kv_heads; ++g)
      for (int h0 = 0; h0 < G; h0 += heads_per_item)
        items.push_back({g, r0, std::min(a.n_rows, r0 + rows_per_item), g * G + h0,
                         g * G + std::min(G, h0 + heads_per_item)});
  return items;
}

}  // namespace

#if KVLAB_ATTENTION_AVX2
void attention_tiled_avx2(const AttentionArgs& a, ThreadPool* pool) {
#else
void attention_tiled_portable(const AttentionArgs& a, ThreadPool* pool) {
#endif
  check_attention_args(a);
  if (a.n_rows == 0) return;
  const std::vector<WorkItem> items = make_items(a);
  const int n_items = static_cast<int>(items.size());
  const bool parallel = pool != nullptr && pool->size() > 1 && n_items > 1;
  // key_mass / head_mass: one thread runs the items in order and adds as it goes; several
  // threads would race (and add in a schedule-dependent order), so each item keeps its sums and
  // they are added afterwards per KV head in item order -- the same sums in the same order (an
  // item's heads belong to its KV head).
  const bool direct = !parallel;
  std::vector<ItemMass> item_mass;
  if ((a.key_mass != nullptr || a.head_mass != nullptr) && !direct) item_mass.resize(items.size());
  const auto main_pass = [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i)
      run_item(a, items[i], a.lse, direct, item_mass.empty() ? nullptr : &item_mass[i]);
  };
  if (parallel) pool->parallel_for(n_items, main_pass);
  else main_pass(0, n_items, 0);

  if (item_mass.empty()) return;
  const auto add_pass = [&](int64_t begin, int64_t end, int) {
    for (int64_t g = begin; g < end; ++g)
      for (int i = 0; i < n_items; ++i)
        if (items[i].kv_head == g) add_item_mass(a, static_cast<int>(g), item_mass[i]);
  };
  pool->parallel_for(a.n_kv_heads, add_pass);  // (parallel: pool is set)
}

#if !KVLAB_ATTENTION_AVX2
void attention(const AttentionArgs& a, ThreadPool* pool, CpuPath path) {
  if (path == CpuPath::kAvx2) {
    if (!cpu_has_avx2_fma_f16c()) throw std::invalid_argument("attention: this CPU has no AVX2+FMA");
    attention_tiled_avx2(a, pool);
  } else {
    attention_tiled_portable(a, pool);
  }
}

void attention(const AttentionArgs& a, ThreadPool* pool) { attention(a, pool, cpu_path()); }

void attention(const AttentionArgs& a, int n_threads, CpuPath path) {
  if (n_threads <= 1) {
    attention(a, nullptr, path);
    return;
  }
  // The callers that give a thread count (tests, benchmarks) share one pool per process, rebuilt
  // when the count changes; the lock keeps its one-job-at-a-time contract across caller threads.
  static std::mutex mutex;
  static std::unique_ptr<ThreadPool> pool;
  const std::lock_guard<std::mutex> lock(mutex);
  if (pool == nullptr || pool->size() != n_threads) {
    pool.reset();
    pool = std::make_unique<ThreadPool>(n_threads);
  }
  attention(a, pool.get(), path);
}

void attention(const AttentionArgs& a, int n_threads) { attention(a, n_threads, cpu_path()); }
#endif

}  // namespace kvlab

#if KVLAB_ATTENTION_AVX2
KVLAB_TARGET_END
#endif
