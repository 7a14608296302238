// What a device does for the Engine's device backends (device_backend.h): the dense layers,
// the KV page arenas and the attention launches, driven by host-side plans in the layouts of
// kernels/cuda (paged_kv.h, key_selection.h). Two implementations:
//   * CUDA (device_executor_cuda.cpp): cuBLAS and the kernels of kernels/cuda;
//   * the emulator (device_emulator.cpp): plain CPU loops over arrays laid out exactly like the
//     device's, so CI exercises every host-side plan, page upload and launch without a GPU.
//
// All activations live on the device: rows [n] of one call (one per token), the residual stream
// x [n, dim], q [n, n_heads * hd], k and v [n, n_kv * hd], the attention output att like q.
// The KV arenas are one "layer" of num_pages pages (host block b = page b): K and V
// [num_pages, n_kv, page, hd] in the device dtype, positions and rope-at-read ranks
// [num_pages, n_kv, page] int32 (-1 = hole).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "framework/engine/device.h"
#include "framework/engine/device_plan.h"
#include "framework/model/model.h"
#include "framework/policy/policy.h"
#include "kernels/cpu/rope.h"

namespace kvlab {

// Page arena updates of one layer step, applied in this order: data pages, position pages, rank
// pages, then the appended rows.
struct PageUpdate {
  std::vector<int32_t> data_pages;   // pages whose K and V are replaced from the host copy
  std::vector<float> k, v;           // [data_pages, n_kv, page, hd] fp32
  std::vector<int32_t> meta_pages;   // pages whose positions are replaced
  std::vector<int32_t> meta;         // [meta_pages, n_kv, page]
  std::vector<int32_t> rank_pages;   // pages whose rope-at-read ranks are replaced
  std::vector<int32_t> ranks;        // [rank_pages, n_kv, page]
  // Rows 0..n-1 of k and v (all rows of the call, in order) appended: row i into slot
  // append_slot[i] of request append_request[i] of append_table, with text position
  // append_position[i] (also written to the position pages).
  BlockTableArrays append_table;
  std::vector<int32_t> append_request, append_slot, append_position;
};

// Rows as requests of the decode kernel: request i reads with the query of device row rows[i]
// at position q_pos[i] over the pages of request i of `table` and the lists of request i of
// `selection` (causal by position, holes skipped), and writes the attention output to row
// rows[i]. With key_mass_stride > 0 the probability mass each slot received (summed over the
// group's query heads) is kept per request [n_kv, stride] and, for each (first, count) of
// mass_sums, summed over requests [first, first + count) into one [n_kv, stride] result.
struct DecodeLaunch {
  BlockTableArrays table;
  SelectionArrays selection;
  std::vector<int32_t> q_pos;
  std::vector<int> rows;
  bool rope_at_read = false;  // keys rotated to their rank pages before the dot product
  int key_mass_stride = 0;
  std::vector<std::pair<int, int>> mass_sums;
};

// One prefill chunk on the tensor-core kernel: rows [row0, row0 + n_rows) of one request, every
// row reading the same lists (selection has n_kv lists) intersected with `mask` at its position
// (policy.h PositionMask; window 0 = causal only), holes skipped.
struct PrefillLaunch {
  BlockTableArrays table;  // one request
  SelectionArrays selection;
  std::vector<int32_t> q_pos;  // [n_rows]
  int row0 = 0, n_rows = 0;
  bool rope_at_read = false;
  PositionMask mask;
};

struct DeviceExecutorConfig {
  const Model* model = nullptr;
  int num_pages = 0, page_size = 0;
  int64_t max_tokens = 0;           // EngineOptions::max_tokens (bounds cache ranks)
  DeviceDtype dtype = DeviceDtype::kBf16;  // weights, KV pages, GEMM inputs
  const RopeTable* rope = nullptr;  // the engine's host RoPE (its inv_freq, its rotations)
};

class DeviceExecutor {
 public:
  virtual ~DeviceExecutor() = default;
  // Starts a call of tokens.size() rows: x = embeddings.
  virtual void begin_call(std::span<const int32_t> tokens) = 0;
  // h = RMSNorm(x) attn_norm; q, k, v = W h (+ bias); RoPE of q and k at rope_pos [n]
  // (negative: the row stays raw).
  virtual void qkv(int layer, std::span<const int32_t> rope_pos) = 0;
  virtual void read_q(float* q) = 0;                 // all rows, to the host
  virtual void read_kv(float* k, float* v) = 0;
  virtual void write_q_rows(int row0, int n_rows, const float* q) = 0;
  virtual void update_pages(const PageUpdate& update) = 0;
  // key_mass: one [n_kv, stride] vector per launch.mass_sums entry.
  virtual void decode(const DecodeLaunch& launch, std::vector<std::vector<float>>& key_mass) = 0;
  virtual bool has_prefill_kernel() const = 0;  // prefill() available (bf16 on CUDA)
  virtual void prefill(const PrefillLaunch& launch) = 0;
  virtual void read_attention(float* att) = 0;
  // x += Wo att; x += W_down(silu(W_gate h) * W_up h), h = RMSNorm(x) ffn_norm.
  virtual void finish_layer(int layer) = 0;
  // logits of rows [row0, row0 + m): lm_head RMSNorm(x) final_norm, into out [m, vocab].
  virtual void logits(int row0, int m, float* out) = 0;
};

// Throws Error naming the reason when no CUDA GPU can be used (or the build has no CUDA).
std::unique_ptr<DeviceExecutor> make_cuda_executor(const DeviceExecutorConfig& config);
std::unique_ptr<DeviceExecutor> make_emulated_executor(const DeviceExecutorConfig& config);

}  // namespace kvlab
