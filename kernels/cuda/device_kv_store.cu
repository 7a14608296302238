// Device page pool, block-table upload and the append kernel (device_kv_store.h).
#include "kernels/cuda/device_kv_store.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/numeric.cuh"

namespace kvlab::cuda {

namespace {

// dst = src on the device (room for at least one element, so an empty list still has a pointer).
template <class T>
void upload_all(DeviceBuffer<T>& dst, const std::vector<T>& src, cudaStream_t stream) {
  dst.reserve(src.size() > 0 ? src.size() : 1);
  dst.upload_prefix(src.data(), src.size(), stream);
}

}  // namespace

size_t kv_dtype_bytes(KvDType dtype) {
  switch (dtype) {
    case KvDType::kF32: return 4;
    case KvDType::kF16: return 2;
    case KvDType::kBF16: return 2;
  }
  return 0;
}

const char* kv_dtype_name(KvDType dtype) {
  static constexpr const char* kNames[] = {"f32", "f16", "bf16"};  // KvDType order
  return kNames[static_cast<int>(dtype)];
}

void DeviceBlockTable::upload(const std::vector<int32_t>& indptr,
                              const std::vector<int32_t>& indices,
                              const std::vector<int32_t>& last_page_len, cudaStream_t stream) {
  if (indptr.empty() || last_page_len.size() + 1 != indptr.size() ||
      static_cast<size_t>(indptr.back()) != indices.size())
    fail("DeviceBlockTable::upload: indptr [", indptr.size(), "], indices [", indices.size(),
         "], last_page_len [", last_page_len.size(), "] do not describe one batch");
  batch_ = static_cast<int>(last_page_len.size());
  upload_all(indptr_, indptr, stream);
  upload_all(indices_, indices, stream);
  upload_all(last_page_len_, last_page_len, stream);
  KVLAB_CUDA_CHECK(cudaStreamSynchronize(stream));  // host vectors may die after return
}

KeySelectionView DeviceSelection::upload(const std::vector<int32_t>& indptr,
                                         const std::vector<SlotRange>& ranges,
                                         const std::vector<int32_t>& list_slots,
                                         cudaStream_t stream) {
  if (indptr.empty() || list_slots.size() + 1 != indptr.size() ||
      static_cast<size_t>(indptr.back()) != ranges.size())
    fail("DeviceSelection::upload: indptr [", indptr.size(), "], ranges [", ranges.size(),
         "], list_slots [", list_slots.size(), "] do not describe one selection");
  max_count_ = 0;
  for (size_t l = 0; l < list_slots.size(); ++l) {
    int count = 0, prev_end = 0;
    for (int32_t r = indptr[l]; r < indptr[l + 1]; ++r) {
      const SlotRange kr = ranges[r];
      if (kr.begin < prev_end || kr.end <= kr.begin || kr.end > list_slots[l])
        fail("DeviceSelection::upload: list ", l, " range ", r - indptr[l], " [", kr.begin, ", ",
             kr.end, ") is empty, unsorted, overlapping or past the list's ", list_slots[l], " slots");
      prev_end = kr.end;
      count += kr.end - kr.begin;
    }
    max_count_ = count > max_count_ ? count : max_count_;
  }
  const std::vector<int32_t> offsets = build_key_offsets(indptr, ranges);
  upload_all(indptr_, indptr, stream);
  upload_all(offsets_, offsets, stream);
  upload_all(ranges_, ranges, stream);
  KVLAB_CUDA_CHECK(cudaStreamSynchronize(stream));  // the host vectors may die after return
  return {indptr_.data(), ranges_.data(), offsets_.data()};
}

DeviceKvPool::DeviceKvPool(const DeviceKvConfig& config) : config_(config) {
  if (config.n_layers <= 0 || config.num_kv_heads <= 0 || config.head_dim <= 0 ||
      config.page_size <= 0 || config.num_pages <= 0)
    fail("DeviceKvPool: every size must be positive (layers ", config.n_layers, ", kv heads ",
         config.num_kv_heads, ", head_dim ", config.head_dim, ", page_size ", config.page_size,
         ", pages ", config.num_pages, ")");
  data_.resize(size_t(config.n_layers) * 2 * layer_elems() * kv_dtype_bytes(config.dtype));
  data_.zero();  // never a NaN bit pattern in an unwritten slot
  positions_.resize(size_t(config.n_layers) * config.num_pages * config.num_kv_heads *
                    config.page_size);
  KVLAB_CUDA_CHECK(cudaMemset(positions_.data(), 0xff, positions_.bytes()));  // -1
}

size_t DeviceKvPool::layer_elems() const {
  return size_t(config_.num_pages) * config_.num_kv_heads * config_.page_size * config_.head_dim;
}

template <class T>
T* DeviceKvPool::layer_base(int layer, const char* who) {
  constexpr KvDType want = std::is_same_v<T, float>    ? KvDType::kF32
                           : std::is_same_v<T, __half> ? KvDType::kF16
                                                       : KvDType::kBF16;
  if (want != config_.dtype)
    fail("DeviceKvPool::", who, ": the pool stores ", kv_dtype_name(config_.dtype), ", asked for ",
         kv_dtype_name(want));
  if (layer < 0 || layer >= config_.n_layers) fail("DeviceKvPool::", who, ": no layer ", layer);
  return reinterpret_cast<T*>(data_.data()) + size_t(layer) * 2 * layer_elems();
}

template <class T>
T* DeviceKvPool::k_data(int layer) {
  return layer_base<T>(layer, "k_data");
}

template <class T>
T* DeviceKvPool::v_data(int layer) {
  return layer_base<T>(layer, "v_data") + layer_elems();
}

template <class T>
PagedKvView<T> DeviceKvPool::layer(int layer, const DeviceBlockTable& table) {
  T* base = layer_base<T>(layer, "layer");
  PagedKvView<T> v;
  v.page_size = config_.page_size;
  v.num_kv_heads = config_.num_kv_heads;
  v.head_dim = config_.head_dim;
  v.k_data = base;
  v.v_data = base + layer_elems();
  v.indptr = table.indptr();
  v.indices = table.indices();
  v.last_page_len = table.last_page_len();
  return v;
}

int32_t* DeviceKvPool::positions(int layer) {
  if (layer < 0 || layer >= config_.n_layers) fail("DeviceKvPool::positions: no layer ", layer);
  return positions_.data() + size_t(layer) * config_.num_pages * config_.num_kv_heads * config_.page_size;
}

template PagedKvView<float> DeviceKvPool::layer<float>(int, const DeviceBlockTable&);
template PagedKvView<__half> DeviceKvPool::layer<__half>(int, const DeviceBlockTable&);
template PagedKvView<__nv_bfloat16> DeviceKvPool::layer<__nv_bfloat16>(int, const DeviceBlockTable&);
template float* DeviceKvPool::k_data<float>(int);
template __half* DeviceKvPool::k_data<__half>(int);
template __nv_bfloat16* DeviceKvPool::k_data<__nv_bfloat16>(int);
template float* DeviceKvPool::v_data<float>(int);
template __half* DeviceKvPool::v_data<__half>(int);
template __nv_bfloat16* DeviceKvPool::v_data<__nv_bfloat16>(int);

namespace {

// One block per (token, KV head); threads over the features.
template <class T>
__global__ void append_kv_kernel(const PagedKvView<T> kv, int32_t* __restrict__ kv_pos,
                                 const float* __restrict__ k, const float* __restrict__ v,
                                 const int32_t* __restrict__ batch_idx,
                                 const int32_t* __restrict__ slot_idx,
                                 const int32_t* __restrict__ position) {
  const int token = blockIdx.x, head = blockIdx.y;
  const int b = batch_idx[token], slot = slot_idx[token];
  const size_t dst = kv.slot_offset(b, slot, head);
  const size_t src = (size_t(token) * kv.num_kv_heads + head) * kv.head_dim;
  for (int f = threadIdx.x; f < kv.head_dim; f += blockDim.x) {
    kv.k_data[dst + f] = from_float<T>(k[src + f]);
    kv.v_data[dst + f] = from_float<T>(v[src + f]);
  }
  if (threadIdx.x == 0 && kv_pos != nullptr) kv_pos[kv.slot_meta_offset(b, slot, head)] = position[token];
}

// Element idx of the packed source is (page i, element e) = (idx / page_elems, idx % page_elems).
template <class Src, class Dst>
__global__ void scatter_pages_kernel(const Src* __restrict__ src, const int32_t* __restrict__ page_ids,
                                     size_t n, size_t page_elems, Dst* __restrict__ dst_base) {
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < n;
       idx += size_t(gridDim.x) * blockDim.x) {
    const size_t i = idx / page_elems, e = idx % page_elems;
    const int32_t page = page_ids[i];
    if (page < 0) continue;
    if constexpr (std::is_same_v<Src, Dst>)
      dst_base[size_t(page) * page_elems + e] = src[idx];
    else
      dst_base[size_t(page) * page_elems + e] = from_float<Dst>(src[idx]);
  }
}

}  // namespace

template <class Src, class Dst>
void scatter_pages(const Src* src, const int32_t* page_ids, int n_pages, size_t page_elems,
                   Dst* dst_base, cudaStream_t stream) {
  if (n_pages < 0) fail("scatter_pages: negative page count ", n_pages);
  const size_t n = size_t(n_pages) * page_elems;
  if (n == 0) return;
  const size_t blocks = (n + 255) / 256;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);
  scatter_pages_kernel<Src, Dst><<<grid, 256, 0, stream>>>(src, page_ids, n, page_elems, dst_base);
  KVLAB_CUDA_CHECK_LAUNCH();
}

template void scatter_pages<float, float>(const float*, const int32_t*, int, size_t, float*,
                                          cudaStream_t);
template void scatter_pages<float, __half>(const float*, const int32_t*, int, size_t, __half*,
                                           cudaStream_t);
template void scatter_pages<float, __nv_bfloat16>(const float*, const int32_t*, int, size_t,
                                                  __nv_bfloat16*, cudaStream_t);
template void scatter_pages<int32_t, int32_t>(const int32_t*, const int32_t*, int, size_t,
                                              int32_t*, cudaStream_t);

template <class T>
void append_kv(const PagedKvView<T>& kv, int32_t* kv_pos, const float* k, const float* v,
               const int32_t* batch_idx, const int32_t* slot_idx, const int32_t* position,
               int n_tokens, cudaStream_t stream) {
  if (n_tokens <= 0) return;
  const dim3 grid(n_tokens, kv.num_kv_heads);
  append_kv_kernel<T><<<grid, 128, 0, stream>>>(kv, kv_pos, k, v, batch_idx, slot_idx, position);
  KVLAB_CUDA_CHECK_LAUNCH();
}

template void append_kv<float>(const PagedKvView<float>&, int32_t*, const float*, const float*,
                               const int32_t*, const int32_t*, const int32_t*, int, cudaStream_t);
template void append_kv<__half>(const PagedKvView<__half>&, int32_t*, const float*, const float*,
                                const int32_t*, const int32_t*, const int32_t*, int, cudaStream_t);
template void append_kv<__nv_bfloat16>(const PagedKvView<__nv_bfloat16>&, int32_t*, const float*,
                                       const float*, const int32_t*, const int32_t*,
                                       const int32_t*, int, cudaStream_t);

}  // namespace kvlab::cuda
