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

#include "kernels/common/paged_kv.h"
#include "kernels/cuda/device_buffer.h"

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
// rotated as the kernels do (float cos/sin of the CPU table, fp32 arithmetic).
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

inline std::vector<float> rotate_key(const float* k, int head_dim, int pos, bool neox,
                                     const std::vector<float>& cos_sin_table) {
  std::vector<float> out(k, k + head_dim);
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float c = cos_sin_table[(size_t(pos) * half + i) * 2], s = cos_sin_table[(size_t(pos) * half + i) * 2 + 1];
    const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
    out[ia] = k[ia] * c - k[ib] * s;
    out[ib] = k[ia] * s + k[ib] * c;
  }
  return out;
}

// Random normal floats.
inline std::vector<float> random_normal(std::mt19937& rng, size_t n, float stddev = 1.f) {
  std::normal_distribution<float> nd(0.f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

}  // namespace kvlab::cuda::testing
