// DeviceExecutor on CUDA (device_executor.h): the dense layers through cuBLAS, the KV page
// arenas in a DeviceKvPool and the attention kernels of kernels/cuda.
//
// T is the device dtype of weights, KV pages and GEMM inputs: __nv_bfloat16 ("bf16") or float
// ("f32"). Activations between kernels (residual stream, q/k/v, attention output) are fp32.
// Everything runs on the legacy default stream, so each host<->device copy orders after the
// kernels before it; host vectors handed to a copy outlive it (cudaMemcpy is synchronous).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "framework/core/error.h"
#include "framework/engine/device_executor.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/device_kv_store.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/layer_ops.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/rope_table.h"

namespace kvlab {
namespace {

using cuda::DeviceBuffer;

template <class T>
T from_float(float f) {
  if constexpr (std::is_same_v<T, float>) {
    return f;
  } else {
    return __float2bfloat16_rn(f);  // nearest even, as the device's conversions
  }
}

template <class T>
constexpr cuda::KvDType kv_dtype() {
  return std::is_same_v<T, float> ? cuda::KvDType::kF32 : cuda::KvDType::kBF16;
}

template <class T>
void to_device(T* dst, const T* src, size_t n) {
  if (n > 0) KVLAB_CUDA_CHECK(cudaMemcpy(dst, src, n * sizeof(T), cudaMemcpyHostToDevice));
}

template <class T>
void to_host(T* dst, const T* src, size_t n) {
  if (n > 0) KVLAB_CUDA_CHECK(cudaMemcpy(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost));
}

template <class T>
void upload(DeviceBuffer<T>& buf, const std::vector<T>& host) {
  buf.reserve(std::max<size_t>(host.size(), 1));
  to_device(buf.data(), host.data(), host.size());
}

// A weight matrix converted to T on the host, a few MiB of rows at a time.
template <class T>
DeviceBuffer<T> upload_weight(const WeightView& w) {
  DeviceBuffer<T> d(static_cast<size_t>(w.rows) * w.cols);
  const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 22) / std::max<int64_t>(1, w.cols));
  std::vector<float> row(w.cols);
  std::vector<T> staging(static_cast<size_t>(std::min(chunk, w.rows)) * w.cols);
  for (int64_t r0 = 0; r0 < w.rows; r0 += chunk) {
    const int64_t n = std::min(chunk, w.rows - r0);
    for (int64_t r = 0; r < n; ++r) {
      weight_row_to_float(w, r0 + r, row.data());
      for (int64_t c = 0; c < w.cols; ++c) staging[r * w.cols + c] = from_float<T>(row[c]);
    }
    to_device(d.data() + r0 * w.cols, staging.data(), static_cast<size_t>(n * w.cols));
  }
  return d;
}

DeviceBuffer<float> upload_vector(const std::vector<float>& v) { return DeviceBuffer<float>(v); }

template <class T>
class CudaExecutor final : public DeviceExecutor {
 public:
  explicit CudaExecutor(const DeviceExecutorConfig& config);

  void begin_call(std::span<const int32_t> tokens) override;
  void qkv(int layer, std::span<const int32_t> rope_pos) override;
  void read_q(float* q) override { to_host(q, q_.data(), size_t(n_) * qd_); }
  void read_kv(float* k, float* v) override {
    to_host(k, k_.data(), size_t(n_) * kvd_);
    to_host(v, v_.data(), size_t(n_) * kvd_);
  }
  void write_q_rows(int row0, int n_rows, const float* q) override {
    to_device(q_.data() + size_t(row0) * qd_, q, size_t(n_rows) * qd_);
  }
  void update_pages(const PageUpdate& u) override;
  void decode(const DecodeLaunch& launch, std::vector<std::vector<float>>& key_mass) override;
  bool has_prefill_kernel() const override { return std::is_same_v<T, __nv_bfloat16>; }
  void prefill(const PrefillLaunch& launch) override;
  void read_attention(float* att) override { to_host(att, att_.data(), size_t(n_) * qd_); }
  void finish_layer(int layer) override;
  void logits(int row0, int m, float* out) override;

 private:
  struct Layer {
    DeviceBuffer<T> wq, wk, wv, wo, w_gate, w_up, w_down;
    DeviceBuffer<float> attn_norm, ffn_norm, bq, bk, bv;
  };
  void ensure_rows(int n);
  PagedKvView<const T> view(const BlockTableArrays& table);

  const ModelConfig& c_;
  int qd_ = 0, kvd_ = 0;
  cuda::Gemm gemm_;
  std::vector<Layer> layers_;
  DeviceBuffer<T> embeddings_, lm_head_own_;
  const T* lm_head_ = nullptr;
  DeviceBuffer<float> final_norm_;
  DeviceBuffer<double> inv_freq_;
  DeviceBuffer<float> rope_table_;  // [n_positions, head_dim / 2] (cos, sin) pairs
  cuda::RopeTableView rope_view_;
  cuda::RopePairs pairs_;
  std::unique_ptr<cuda::DeviceKvPool> pool_;
  DeviceBuffer<int32_t> ranks_;  // [num_pages, n_kv_heads, page] rope-at-read ranks

  // activations of the call (n_ rows), grown on demand
  int n_ = 0, rows_cap_ = 0;
  DeviceBuffer<float> x_, q_, k_, v_, att_, gate_, up_, logits_;
  DeviceBuffer<T> h_, att_t_, hidden_t_, q_t_;
  DeviceBuffer<int32_t> tokens_, rope_pos_;
  // per launch
  cuda::DeviceBlockTable table_;
  cuda::DeviceSelection selection_;
  cuda::DecodeWorkspace workspace_;
  DeviceBuffer<int32_t> q_pos_, append_request_, append_slot_, append_pos_, page_ids_, meta_, qo_indptr_;
  DeviceBuffer<float> stage_k_, stage_v_, key_mass_, key_mass_sum_, q_gather_, out_gather_;
};

template <class T>
CudaExecutor<T>::CudaExecutor(const DeviceExecutorConfig& config) : c_(config.model->config) {
  const Model& m = *config.model;
  qd_ = c_.n_heads * c_.head_dim;
  kvd_ = c_.n_kv_heads * c_.head_dim;
  layers_.resize(c_.n_layers);
  for (int l = 0; l < c_.n_layers; ++l) {
    const LayerWeights& w = m.layers[l];
    Layer& d = layers_[l];
    d.wq = upload_weight<T>(w.wq), d.wk = upload_weight<T>(w.wk), d.wv = upload_weight<T>(w.wv);
    d.wo = upload_weight<T>(w.wo);
    d.w_gate = upload_weight<T>(w.w_gate), d.w_up = upload_weight<T>(w.w_up);
    d.w_down = upload_weight<T>(w.w_down);
    d.attn_norm = upload_vector(w.attn_norm), d.ffn_norm = upload_vector(w.ffn_norm);
    if (!w.bq.empty()) d.bq = upload_vector(w.bq);
    if (!w.bk.empty()) d.bk = upload_vector(w.bk);
    if (!w.bv.empty()) d.bv = upload_vector(w.bv);
  }
  embeddings_ = upload_weight<T>(m.tok_embeddings);
  if (m.lm_head.data == m.tok_embeddings.data && m.lm_head.dtype == m.tok_embeddings.dtype) {
    lm_head_ = embeddings_.data();
  } else {
    lm_head_own_ = upload_weight<T>(m.lm_head);
    lm_head_ = lm_head_own_.data();
  }
  final_norm_ = upload_vector(m.final_norm);

  inv_freq_ = DeviceBuffer<double>(config.rope->inv_freq());
  pairs_ = c_.rope_style == RopeStyle::kNeox ? cuda::RopePairs::kNeox : cuda::RopePairs::kInterleaved;
  // rope at read: cache ranks < the cached tokens <= min(max_tokens, the pool's slots)
  const int n_positions =
      static_cast<int>(std::min<int64_t>(config.max_tokens, int64_t(config.num_pages) * config.page_size)) + 1;
  rope_table_ = DeviceBuffer<float>(cuda::rope_cos_sin_table(config.rope->inv_freq(), n_positions));
  rope_view_.cos_sin = reinterpret_cast<const float2*>(rope_table_.data());
  rope_view_.n_positions = n_positions;
  rope_view_.half = c_.head_dim / 2;
  rope_view_.neox = pairs_ == cuda::RopePairs::kNeox;

  // The pool mirrors every host block: say so when it cannot fit next to the weights.
  const size_t page_bytes = size_t(c_.n_kv_heads) * config.page_size * (2 * c_.head_dim * sizeof(T) + 2 * sizeof(int32_t));
  const size_t pool_bytes = page_bytes * size_t(config.num_pages);
  size_t free_bytes = 0, total_bytes = 0;
  KVLAB_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (config.num_pages <= 0) fail("device cuda: the KV budget holds no block (kv.budget_bytes)");
  if (pool_bytes + (size_t{512} << 20) > free_bytes)
    fail("device cuda: the KV pool mirroring the host budget needs ", pool_bytes >> 20, " MiB on the GPU but ",
         free_bytes >> 20, " MiB are free after the weights; lower kv.budget_bytes");
  cuda::DeviceKvConfig kc;
  kc.n_layers = 1;  // the host pool is shared by all layers: block ids are global
  kc.num_kv_heads = c_.n_kv_heads;
  kc.head_dim = c_.head_dim;
  kc.page_size = config.page_size;
  kc.num_pages = config.num_pages;
  kc.dtype = kv_dtype<T>();
  pool_ = std::make_unique<cuda::DeviceKvPool>(kc);
  ranks_ = DeviceBuffer<int32_t>(static_cast<size_t>(kc.num_pages) * kc.num_kv_heads * kc.page_size);
}

template <class T>
void CudaExecutor<T>::ensure_rows(int n) {
  n_ = n;
  if (n <= rows_cap_) return;
  const size_t r = static_cast<size_t>(n);
  x_.resize(r * c_.dim), h_.resize(r * std::max<size_t>(c_.dim, qd_));
  q_.resize(r * qd_), att_.resize(r * qd_), att_t_.resize(r * qd_), q_t_.resize(r * qd_);
  k_.resize(r * kvd_), v_.resize(r * kvd_);
  gate_.resize(r * c_.hidden_dim), up_.resize(r * c_.hidden_dim), hidden_t_.resize(r * c_.hidden_dim);
  tokens_.resize(r), rope_pos_.resize(r);
  rows_cap_ = n;
}

template <class T>
PagedKvView<const T> CudaExecutor<T>::view(const BlockTableArrays& table) {
  table_.upload(table.indptr, table.indices, table.last_page_len);
  return pool_->template layer<T>(0, table_).as_const();
}

template <class T>
void CudaExecutor<T>::begin_call(std::span<const int32_t> tokens) {
  ensure_rows(static_cast<int>(tokens.size()));
  to_device(tokens_.data(), tokens.data(), tokens.size());
  cuda::embedding_gather<T>(embeddings_.data(), c_.vocab_size, c_.dim, tokens_.data(), n_, x_.data());
}

template <class T>
void CudaExecutor<T>::qkv(int layer, std::span<const int32_t> rope_pos) {
  Layer& w = layers_[layer];
  const int n = n_, dim = c_.dim, hd = c_.head_dim;
  cuda::rms_norm<T>(x_.data(), w.attn_norm.data(), c_.rms_eps, n, dim, h_.data());
  gemm_.linear(h_.data(), w.wq.data(), q_.data(), n, dim, qd_);
  gemm_.linear(h_.data(), w.wk.data(), k_.data(), n, dim, kvd_);
  gemm_.linear(h_.data(), w.wv.data(), v_.data(), n, dim, kvd_);
  if (w.bq.size() > 0) cuda::add_bias(q_.data(), w.bq.data(), n, qd_);
  if (w.bk.size() > 0) cuda::add_bias(k_.data(), w.bk.data(), n, kvd_);
  if (w.bv.size() > 0) cuda::add_bias(v_.data(), w.bv.data(), n, kvd_);
  to_device(rope_pos_.data(), rope_pos.data(), rope_pos.size());
  cuda::rope(q_.data(), rope_pos_.data(), inv_freq_.data(), n, c_.n_heads, hd, pairs_);
  cuda::rope(k_.data(), rope_pos_.data(), inv_freq_.data(), n, c_.n_kv_heads, hd, pairs_);
}

template <class T>
void CudaExecutor<T>::update_pages(const PageUpdate& u) {
  const cuda::DeviceKvConfig& pc = pool_->config();
  const size_t page_meta = size_t(pc.num_kv_heads) * pc.page_size, page_elems = page_meta * pc.head_dim;
  if (!u.data_pages.empty()) {
    const int n_pages = static_cast<int>(u.data_pages.size());
    upload(page_ids_, u.data_pages);
    upload(stage_k_, u.k);
    upload(stage_v_, u.v);
    cuda::scatter_pages<float, T>(stage_k_.data(), page_ids_.data(), n_pages, page_elems, pool_->template k_data<T>(0));
    cuda::scatter_pages<float, T>(stage_v_.data(), page_ids_.data(), n_pages, page_elems, pool_->template v_data<T>(0));
  }
  auto scatter_meta = [&](const std::vector<int32_t>& ids, const std::vector<int32_t>& values, int32_t* dst) {
    if (ids.empty()) return;
    upload(page_ids_, ids);  // ordered after the kernels above that read page_ids_
    upload(meta_, values);
    cuda::scatter_pages<int32_t, int32_t>(meta_.data(), page_ids_.data(), static_cast<int>(ids.size()), page_meta, dst);
  };
  scatter_meta(u.meta_pages, u.meta, pool_->positions(0));
  scatter_meta(u.rank_pages, u.ranks, ranks_.data());
  if (u.append_request.empty()) return;
  table_.upload(u.append_table.indptr, u.append_table.indices, u.append_table.last_page_len);
  const PagedKvView<T> kv = pool_->template layer<T>(0, table_);
  upload(append_request_, u.append_request);
  upload(append_slot_, u.append_slot);
  upload(append_pos_, u.append_position);
  cuda::append_kv<T>(kv, pool_->positions(0), k_.data(), v_.data(), append_request_.data(), append_slot_.data(),
                     append_pos_.data(), static_cast<int>(u.append_request.size()));
}

template <class T>
void CudaExecutor<T>::decode(const DecodeLaunch& launch, std::vector<std::vector<float>>& key_mass) {
  const int hd = c_.head_dim, nkv = c_.n_kv_heads;
  const int batch = launch.table.batch();
  key_mass.clear();
  if (batch == 0) return;
  // queries and outputs in place when the requests are rows [r0, r0 + batch) in order
  bool contiguous = true;
  for (int i = 1; i < batch; ++i) contiguous = contiguous && launch.rows[i] == launch.rows[0] + i;
  float* q = q_.data() + size_t(launch.rows[0]) * qd_;
  float* out = att_.data() + size_t(launch.rows[0]) * qd_;
  if (!contiguous) {
    q_gather_.reserve(size_t(batch) * qd_);
    out_gather_.reserve(size_t(batch) * qd_);
    for (int i = 0; i < batch; ++i)
      KVLAB_CUDA_CHECK(cudaMemcpy(q_gather_.data() + size_t(i) * qd_, q_.data() + size_t(launch.rows[i]) * qd_,
                                  qd_ * sizeof(float), cudaMemcpyDeviceToDevice));
    q = q_gather_.data();
    out = out_gather_.data();
  }
  cuda::DecodeParams<T> p;
  p.kv = view(launch.table);
  p.sel = selection_.upload(launch.selection.indptr, launch.selection.ranges, launch.selection.list_slots);
  upload(q_pos_, launch.q_pos);
  p.q = q;
  p.batch = batch;
  p.num_qo_heads = c_.n_heads;
  p.q_pos = q_pos_.data();
  p.kv_pos = pool_->positions(0);
  p.scale = 1.f / std::sqrt(static_cast<float>(hd));
  p.out = out;
  const int stride = launch.key_mass_stride;
  if (stride > 0) {
    key_mass_.reserve(size_t(batch) * nkv * stride);
    KVLAB_CUDA_CHECK(cudaMemset(key_mass_.data(), 0, size_t(batch) * nkv * stride * sizeof(float)));
    p.key_mass = key_mass_.data();
    p.key_mass_stride = stride;
  }
  if (launch.rope_at_read) {
    p.key_rope_pos = ranks_.data();
    p.rope = rope_view_;
  }
  const cuda::DecodePlan plan = cuda::plan_decode(batch, nkv, selection_.max_count());
  cuda::decode_attention<T>(p, plan, workspace_);
  if (!contiguous)
    for (int i = 0; i < batch; ++i)
      KVLAB_CUDA_CHECK(cudaMemcpy(att_.data() + size_t(launch.rows[i]) * qd_, out_gather_.data() + size_t(i) * qd_,
                                  qd_ * sizeof(float), cudaMemcpyDeviceToDevice));
  if (stride <= 0) return;
  const size_t block = size_t(nkv) * stride;
  key_mass_sum_.reserve(block);
  for (const auto& [first, count] : launch.mass_sums) {
    cuda::sum_rows(key_mass_.data() + size_t(first) * block, count, static_cast<int64_t>(block), key_mass_sum_.data());
    key_mass.emplace_back(block);
    to_host(key_mass.back().data(), key_mass_sum_.data(), block);
  }
}

template <class T>
void CudaExecutor<T>::prefill(const PrefillLaunch& launch) {
  if constexpr (!std::is_same_v<T, __nv_bfloat16>) {
    fail("device cuda: the prefill kernel needs 16-bit KV pages");
  } else {
    cuda::PrefillParams<T> p;
    p.kv = view(launch.table);
    p.sel = selection_.upload(launch.selection.indptr, launch.selection.ranges, launch.selection.list_slots);
    upload(q_pos_, launch.q_pos);
    upload(qo_indptr_, std::vector<int32_t>{0, launch.n_rows});
    cuda::convert<T>(q_.data() + size_t(launch.row0) * qd_, int64_t(launch.n_rows) * qd_, q_t_.data());
    p.q = q_t_.data();
    p.qo_indptr = qo_indptr_.data();
    p.batch = 1;
    p.num_qo_heads = c_.n_heads;
    p.max_rows = launch.n_rows;
    p.q_pos = q_pos_.data();
    p.kv_pos = pool_->positions(0);
    p.scale = 1.f / std::sqrt(static_cast<float>(c_.head_dim));
    p.mask = WindowSinkMask{launch.mask.window, launch.mask.sinks, false};
    p.out = att_.data() + size_t(launch.row0) * qd_;
    if (launch.rope_at_read) {
      p.key_rope_pos = ranks_.data();
      p.rope = rope_view_;
    }
    cuda::prefill_attention<T>(p);
  }
}

template <class T>
void CudaExecutor<T>::finish_layer(int layer) {
  Layer& w = layers_[layer];
  const int n = n_, dim = c_.dim, hidden = c_.hidden_dim;
  const T* att_in;
  if constexpr (std::is_same_v<T, float>) {
    att_in = att_.data();
  } else {
    cuda::convert<T>(att_.data(), int64_t(n) * qd_, att_t_.data());
    att_in = att_t_.data();
  }
  gemm_.linear(att_in, w.wo.data(), x_.data(), n, qd_, dim, nullptr, /*accumulate=*/true);
  cuda::rms_norm<T>(x_.data(), w.ffn_norm.data(), c_.rms_eps, n, dim, h_.data());
  gemm_.linear(h_.data(), w.w_gate.data(), gate_.data(), n, dim, hidden);
  gemm_.linear(h_.data(), w.w_up.data(), up_.data(), n, dim, hidden);
  cuda::swiglu<T>(gate_.data(), up_.data(), int64_t(n) * hidden, hidden_t_.data());
  gemm_.linear(hidden_t_.data(), w.w_down.data(), x_.data(), n, hidden, dim, nullptr, /*accumulate=*/true);
}

template <class T>
void CudaExecutor<T>::logits(int row0, int m, float* out) {
  const int dim = c_.dim, vocab = c_.vocab_size;
  logits_.reserve(size_t(m) * vocab);
  cuda::rms_norm<T>(x_.data() + size_t(row0) * dim, final_norm_.data(), c_.rms_eps, m, dim, h_.data());
  gemm_.linear(h_.data(), lm_head_, logits_.data(), m, dim, vocab);
  to_host(out, logits_.data(), size_t(m) * vocab);
}

}  // namespace

std::string cuda_device_summary() {
  if (const std::string why = cuda::no_device_reason(); !why.empty()) return why;
  cudaDeviceProp prop{};
  KVLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  char gib[32];
  std::snprintf(gib, sizeof gib, "%.1f", double(prop.totalGlobalMem) / double(1ull << 30));
  return str_cat(prop.name, " (sm_", prop.major, prop.minor, ", ", gib, " GiB)");
}

bool cuda_device_available() { return cuda::device_count() > 0; }

std::unique_ptr<DeviceExecutor> make_cuda_executor(const DeviceExecutorConfig& config) {
  if (const ModelConfig& mc = config.model->config; mc.sandwich_norms || !mc.local_layers.empty())
    fail("device cuda: the CUDA executor does not run ", mc.arch, " (sliding-window layers, per-layer RoPE "
         "bases, post-attention/post-FFN norms, GeGLU, embedding scaling, query_pre_attn_scalar, "
         "soft-capping are missing); use device cpu");
  if (config.model->config.qk_norm)
    fail("device cuda: the CUDA layer kernels have no per-head q/k RMSNorm yet (", config.model->config.arch,
         "); use device cpu or emulated");
  if (!cuda_device_available()) fail("device cuda: ", cuda_device_summary(), "; use device cpu");
  int device = 0, major = 0;
  KVLAB_CUDA_CHECK(cudaGetDevice(&device));
  KVLAB_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 8)
    fail("device cuda: the kernels need compute capability 8.0 or newer (cp.async, bf16 tensor cores); ",
         cuda_device_summary());
  if (config.dtype == DeviceDtype::kBf16) return std::make_unique<CudaExecutor<__nv_bfloat16>>(config);
  return std::make_unique<CudaExecutor<float>>(config);
}

}  // namespace kvlab
