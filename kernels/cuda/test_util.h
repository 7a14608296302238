// Host-side helpers shared by the CUDA kernel tests and benchmarks: a random paged KV cache
// (pages in shuffled order, lengths not a multiple of the page, optional evicted holes), its
// device copy in the storage type T, and conversions. Plain C++ (compiled by the host compiler).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/key_selection.h"
#include "kernels/common/paged_kv.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/testing/reference_attention.h"

namespace kvlab::cuda::testing {

template <class T>
T to_storage(float x);
template <>
inline float to_storage<float>(float x) { return x; }
template <>
inline __half to_storage<__half>(float x) { return __float2half_rn(x); }
template <>
inline __nv_bfloat16 to_storage<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

inline float to_host_float(float x) { return x; }
inline float to_host_float(__half x) { return __half2float(x); }
inline float to_host_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// x rounded to T and back (the values the GPU really sees).
template <class T>
float round_to(float x) {
  return to_host_float(to_storage<T>(x));
}

template <class T>
const char* type_name();
template <>
inline const char* type_name<float>() { return "f32"; }
template <>
inline const char* type_name<__half>() { return "f16"; }
template <>
inline const char* type_name<__nv_bfloat16>() { return "bf16"; }

template <class T>
std::vector<T> to_storage_vec(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_storage<T>(v[i]);
  return out;
}

// A paged cache for a batch, kept in float (already rounded to the storage type) on the host.
struct HostPagedKv {
  int page_size = 16, num_kv_heads = 1, head_dim = 64, num_pages = 0;
  std::vector<float> k, v;              // [num_pages, num_kv_heads, page_size, head_dim]
  std::vector<int32_t> kv_pos;          // [num_pages, num_kv_heads, page_size], -1 = hole
  std::vector<int32_t> indptr{0}, indices, last_page_len;
  std::vector<int32_t> lengths;         // slots per request

  PagedKvView<const float> view() const {
    PagedKvView<const float> v_;
    v_.page_size = page_size;
    v_.num_kv_heads = num_kv_heads;
    v_.head_dim = head_dim;
    v_.k_data = k.data();
    v_.v_data = v.data();
    v_.indptr = indptr.data();
    v_.indices = indices.data();
    v_.last_page_len = last_page_len.data();
    return v_;
  }
};

// Lengths as given; pages drawn from a shuffled pool with a few spare pages; values N(0,1)
// rounded to T; positions = slot index (+ gap) with a fraction `hole_fraction` of holes (-1).
template <class T>
HostPagedKv random_paged_kv(std::mt19937& rng, const std::vector<int32_t>& lengths, int page_size,
                            int num_kv_heads, int head_dim, float hole_fraction = 0.f) {
  HostPagedKv kv;
  kv.page_size = page_size;
  kv.num_kv_heads = num_kv_heads;
  kv.head_dim = head_dim;
  kv.lengths = lengths;
  int total_pages = 0;
  for (int32_t len : lengths) total_pages += (len + page_size - 1) / page_size;
  kv.num_pages = total_pages + 3;
  std::vector<int32_t> pool(kv.num_pages);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  int next = 0;
  for (int32_t len : lengths) {
    const int pages = (len + page_size - 1) / page_size;
    for (int i = 0; i < pages; ++i) kv.indices.push_back(pool[next++]);
    kv.indptr.push_back(static_cast<int32_t>(kv.indices.size()));
    kv.last_page_len.push_back(pages == 0 ? 0 : len - (pages - 1) * page_size);
  }
  const size_t elems = size_t(kv.num_pages) * num_kv_heads * page_size * head_dim;
  kv.k.resize(elems);
  kv.v.resize(elems);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : kv.k) x = round_to<T>(nd(rng));
  for (auto& x : kv.v) x = round_to<T>(nd(rng));
  kv.kv_pos.assign(size_t(kv.num_pages) * num_kv_heads * page_size, -1);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  const auto view = kv.view();
  for (size_t b = 0; b < lengths.size(); ++b) {
    for (int h = 0; h < num_kv_heads; ++h) {
      for (int s = 0; s < lengths[b]; ++s) {
        const bool hole = s + 1 < lengths[b] && u(rng) < hole_fraction;  // last slot stays
        kv.kv_pos[view.slot_meta_offset(int(b), s, h)] = hole ? -1 : s;
      }
    }
  }
  return kv;
}

// The device copy of a HostPagedKv in storage type T.
template <class T>
struct DevicePagedKv {
  DeviceBuffer<T> k, v;
  DeviceBuffer<int32_t> kv_pos, indptr, indices, last_page_len;
  PagedKvView<const T> view;

  explicit DevicePagedKv(const HostPagedKv& h)
      : k(to_storage_vec<T>(h.k)), v(to_storage_vec<T>(h.v)), kv_pos(h.kv_pos),
        indptr(h.indptr), indices(h.indices), last_page_len(h.last_page_len) {
    view.page_size = h.page_size;
    view.num_kv_heads = h.num_kv_heads;
    view.head_dim = h.head_dim;
    view.k_data = k.data();
    view.v_data = v.data();
    view.indptr = indptr.data();
    view.indices = indices.data();
    view.last_page_len = last_page_len.data();
  }
};

// Rope at read for tests: key_rope_pos (paged like kv_pos) = rank of the slot among the valid
// slots of its head (StreamingLLM's cache positions; holes -1), and a host copy of the key
// rotated by the one host RoPE (kernels/cpu/rope.h), which the device twin must match: its table
// is rope_cos_sin_table(host.inv_freq()).
inline std::vector<int32_t> cache_rank_positions(const HostPagedKv& kv) {
  std::vector<int32_t> rank(kv.kv_pos.size(), -1);
  const auto view = kv.view();
  for (size_t b = 0; b < kv.lengths.size(); ++b)
    for (int h = 0; h < kv.num_kv_heads; ++h) {
      int r = 0;
      for (int s = 0; s < kv.lengths[b]; ++s) {
        const size_t m = view.slot_meta_offset(int(b), s, h);
        if (kv.kv_pos[m] >= 0) rank[m] = r++;
      }
    }
  return rank;
}

// The host RoPE of a test: theta, head_dim, pair layout, a table of n_positions.
inline RopeTable host_rope(int head_dim, bool neox, int n_positions, double theta = 10000.0) {
  RopeConfig c;
  c.layout = neox ? RopeLayout::kNeox : RopeLayout::kInterleaved;
  c.head_dim = head_dim;
  c.theta = theta;
  return RopeTable(c, n_positions);
}

inline std::vector<float> rotate_key(const float* k, int head_dim, int pos, const RopeTable& rope) {
  std::vector<float> out(k, k + head_dim);
  rope.rotate(out.data(), pos);
  return out;
}

// A selection for the kernels, built on the host (KeySelectionView over these arrays).
struct HostSelection {
  bool all = true;
  std::vector<int32_t> indptr;
  std::vector<SlotRange> ranges;
  std::vector<int32_t> offsets;
  KeySelectionView view() const {
    return all ? KeySelectionView{} : KeySelectionView{indptr.data(), ranges.data(), offsets.data()};
  }
};

// The fp64 dense reference (kernels/testing) of one query head q over list `list` (request b,
// KV head kvh) of `sel`: the n-th selected key is key_of(slot) (the stored key, or a rotated
// copy that stays valid until the call returns), read when allow(slot).
template <class KeyOf, class Allow>
::kvlab::testing::ReferenceRow reference_list_row(const HostPagedKv& kv, const KeySelectionView& sel, int b,
                                                  int kvh, const float* q, float scale, KeyOf&& key_of,
                                                  Allow&& allow) {
  const auto view = kv.view();
  const int list = b * kv.num_kv_heads + kvh;
  auto slot = [&](int64_t n) { return sel.slot_of(list, static_cast<int>(n)); };
  return ::kvlab::testing::reference_attention_row(
      q, kv.head_dim, sel.count(list, kv.lengths[b]), scale, [&](int64_t n) { return key_of(slot(n)); },
      [&](int64_t n) { return kv.v.data() + view.slot_offset(b, slot(n), kvh); },
      [&](int64_t n) { return allow(slot(n)); });
}

// Random normal floats.
inline std::vector<float> random_normal(std::mt19937& rng, size_t n, float stddev = 1.f) {
  std::normal_distribution<float> nd(0.f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

}  // namespace kvlab::cuda::testing
