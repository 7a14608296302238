// The KV store in device memory: the same page layout as the host store (kernels/common/
// paged_kv.h: k/v [num_pages, num_kv_heads, page_size, head_dim] per layer) in bf16, fp16 or
// fp32, plus per-slot positions [num_pages, num_kv_heads, page_size] (-1 = empty or evicted).
//
// Page ownership (which request holds which page, free lists, eviction) stays on the host with
// the host store's bookkeeping; once per step the host uploads the batch's block tables
// (indptr / indices / last_page_len: DeviceBlockTable) and every layer's kernels read them.
// append_kv writes new tokens into their slots; the attention kernels read layer views.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/common/key_selection.h"
#include "kernels/common/paged_kv.h"
#include "kernels/cuda/device_buffer.h"

namespace kvlab::cuda {

enum class KvDType { kF32, kF16, kBF16 };
size_t kv_dtype_bytes(KvDType dtype);
const char* kv_dtype_name(KvDType dtype);

struct DeviceKvConfig {
  int n_layers = 1;
  int num_kv_heads = 1;
  int head_dim = 64;
  int page_size = 16;
  int num_pages = 0;
  KvDType dtype = KvDType::kBF16;
};

// The batch's block tables on the device (uploaded once per step, shared by all layers).
class DeviceBlockTable {
 public:
  // indptr [batch + 1], indices [indptr[batch]], last_page_len [batch] (paged_kv.h contract).
  void upload(const std::vector<int32_t>& indptr, const std::vector<int32_t>& indices,
              const std::vector<int32_t>& last_page_len, cudaStream_t stream = nullptr);
  int batch() const { return batch_; }
  const int32_t* indptr() const { return indptr_.data(); }
  const int32_t* indices() const { return indices_.data(); }
  const int32_t* last_page_len() const { return last_page_len_.data(); }

 private:
  int batch_ = 0;
  DeviceBuffer<int32_t> indptr_, indices_, last_page_len_;
};

// A step's key selection on the device (one per layer: policies select per layer): ranges in
// indptr form plus their key offsets, uploaded in one call; max_count() sizes plan_decode.
class DeviceSelection {
 public:
  // indptr [n_lists + 1] into ranges (sorted, disjoint per list; KeySelection::ranges has this
  // layout). list_slots [n_lists] bounds each list (checked: ranges must lie in [0, slots)).
  KeySelectionView upload(const std::vector<int32_t>& indptr, const std::vector<SlotRange>& ranges,
                          const std::vector<int32_t>& list_slots, cudaStream_t stream = nullptr);
  int max_count() const { return max_count_; }

 private:
  int max_count_ = 0;
  DeviceBuffer<int32_t> indptr_, offsets_;
  DeviceBuffer<SlotRange> ranges_;
};

class DeviceKvPool {
 public:
  // Allocates every layer's pages, zeroed, positions -1. Throws kvlab::Error when out of memory.
  explicit DeviceKvPool(const DeviceKvConfig& config);
  const DeviceKvConfig& config() const { return config_; }
  size_t bytes() const { return data_.bytes() + positions_.bytes(); }

  // View of one layer over a batch's block tables. T must match config().dtype (float, __half,
  // __nv_bfloat16); checked.
  template <class T>
  PagedKvView<T> layer(int layer, const DeviceBlockTable& table);
  int32_t* positions(int layer);  // [num_pages, num_kv_heads, page_size]
  // Base of one layer's K / V arena [num_pages, num_kv_heads, page_size, head_dim] (page p starts
  // at p * num_kv_heads * page_size * head_dim); T checked against config().dtype like layer<T>().
  template <class T>
  T* k_data(int layer);
  template <class T>
  T* v_data(int layer);

 private:
  size_t layer_elems() const;  // K or V elements of one layer
  template <class T>
  T* layer_base(int layer, const char* who);  // the layer's K arena; V follows it
  DeviceKvConfig config_;
  DeviceBuffer<unsigned char> data_;  // [n_layers][K, V][num_pages, H, page_size, D]
  DeviceBuffer<int32_t> positions_;   // [n_layers][num_pages, H, page_size]
};

// Writes n_tokens new tokens into their slots: token i belongs to request batch_idx[i] of the
// view's block table and goes to slot slot_idx[i] (its page must already be in the table) with
// text position position[i]. k, v: [n_tokens, num_kv_heads, head_dim] fp32 (rounded to T).
// Copies whole pages into a pool arena: for i < n_pages and e < page_elems,
//   dst_base[page_ids[i] * page_elems + e] = Dst(src[i * page_elems + e])
// (src [n_pages, page_elems] packed, dst_base [num_pages, page_elems]; float -> float / __half /
// __nv_bfloat16 rounds to nearest even, int32_t -> int32_t copies). Uploads host-staged KV pages
// (fp32, page_elems = num_kv_heads * page_size * head_dim) into k_data<T>(layer) / v_data<T>(layer),
// and their slot positions (-1 = hole, page_elems = num_kv_heads * page_size) into positions(layer).
// page_ids [n_pages] must be distinct pages of the arena (the host's page table checks them; the
// device cannot); a negative id skips its page. src, page_ids, dst_base are device pointers.
template <class Src, class Dst>
void scatter_pages(const Src* src, const int32_t* page_ids, int n_pages, size_t page_elems,
                   Dst* dst_base, cudaStream_t stream = nullptr);

template <class T>
void append_kv(const PagedKvView<T>& kv, int32_t* kv_pos, const float* k, const float* v,
               const int32_t* batch_idx, const int32_t* slot_idx, const int32_t* position,
               int n_tokens, cudaStream_t stream = nullptr);

}  // namespace kvlab::cuda
