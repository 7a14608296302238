// DeviceForward on CUDA (device_forward.h): the dense layers through cuBLAS, the attention
// kernels of kernels/cuda over a device mirror of the host KV blocks, the policies on the host.
//
// T is the device dtype of weights, KV pages and GEMM inputs: __nv_bfloat16 ("bf16") or float
// ("f32"). Activations between kernels (residual stream, q/k/v, attention output) are fp32.
//
// Keeping the device pages equal to the host blocks (block b = page b), per (sequence, layer):
//   * new rows: appended on the device from the same fp32 k, v the host store appended;
//   * KvStore::data_version changed (compaction moved rows, copy-on-write replaced a block):
//     every page of the layer's table is re-uploaded from the host copy;
//   * the policy evicted (holes; emptied blocks leave the table): the page metadata (positions,
//     -1 = hole) is re-uploaded; the block table itself is uploaded for every launch anyway.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <type_traits>
#include <vector>

#include "framework/core/error.h"
#include "framework/engine/device_forward.h"
#include "framework/engine/device_plan.h"
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
using engine_detail::Group;

// fp32 -> bf16 rounding to nearest even (NaN stays NaN), as the device's conversions.
__nv_bfloat16 bf16_from_float(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    u = 0x7fc00000u;
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
  }
  __nv_bfloat16_raw raw;
  raw.x = static_cast<unsigned short>(u >> 16);
  return __nv_bfloat16(raw);
}

template <class T>
T from_float(float f) {
  if constexpr (std::is_same_v<T, float>) {
    return f;
  } else {
    return bf16_from_float(f);
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
PagedKvView<const T> as_const(const PagedKvView<T>& v) {
  PagedKvView<const T> c;
  c.page_size = v.page_size;
  c.num_kv_heads = v.num_kv_heads;
  c.head_dim = v.head_dim;
  c.k_data = v.k_data;
  c.v_data = v.v_data;
  c.indptr = v.indptr;
  c.indices = v.indices;
  c.last_page_len = v.last_page_len;
  return c;
}

template <class T>
class CudaForward final : public DeviceForward {
 public:
  explicit CudaForward(Engine& engine);
  void forward(std::span<Group> groups, std::span<const int32_t> tokens,
               std::span<const int> logit_rows, float* logits) override;
  void end_sequence(SeqId seq) override {
    for (int l = 0; l < c_.n_layers; ++l) mirror_.erase({seq, l});
  }

 private:
  struct Layer {
    DeviceBuffer<T> wq, wk, wv, wo, w_gate, w_up, w_down;
    DeviceBuffer<float> attn_norm, ffn_norm, bq, bk, bv;
  };
  // What the device pages of one (sequence, layer) reflect.
  struct Mirror {
    int64_t data_version = -1;  // -1: nothing uploaded yet
    bool meta_stale = true;
  };

  void ensure_rows(int n);
  void sync_pages(std::span<Group> groups, int layer);
  void attend_decode(std::span<Group> groups, int layer, bool cache_pos);
  void attend_prefill(Group& g, int layer);
  void rows_as_requests(std::span<Group*> members, int layer, bool cache_pos);
  void compute_logits(std::span<const int> logit_rows, float* logits);

  Engine& e_;
  const ModelConfig& c_;
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
  std::map<std::pair<SeqId, int>, Mirror> mirror_;

  // activations (device), sized for the rows of a call
  int rows_cap_ = 0;
  DeviceBuffer<float> x_, q_, k_, v_, att_, gate_, up_, logits_;
  DeviceBuffer<T> h_, att_t_, hidden_t_, q_t_;
  DeviceBuffer<int32_t> tokens_, rope_pos_;
  // per launch
  cuda::DeviceBlockTable table_;
  cuda::DeviceSelection selection_;
  cuda::DecodeWorkspace workspace_;
  DeviceBuffer<int32_t> q_pos_, append_batch_, append_slot_, append_pos_, page_ids_, meta_, qo_indptr_;
  DeviceBuffer<float> stage_k_, stage_v_, key_mass_, key_mass_sum_, q_gather_, out_gather_;
  // host copies
  std::vector<float> hq_, hk_, hv_, hatt_;
};

template <class T>
CudaForward<T>::CudaForward(Engine& engine) : e_(engine), c_(model(engine).config) {
  const Model& m = model(engine);
  layers_.resize(c_.n_layers);
  for (int l = 0; l < c_.n_layers; ++l) {
    const LayerWeights& w = m.layers[l];
    Layer& d = layers_[l];
    d.wq = upload_weight<T>(w.wq), d.wk = upload_weight<T>(w.wk), d.wv = upload_weight<T>(w.wv);
    d.wo = upload_weight<T>(w.wo);
    d.w_gate = upload_weight<T>(w.w_gate), d.w_up = upload_weight<T>(w.w_up);
    d.w_down = upload_weight<T>(w.w_down);
    d.attn_norm = upload_vector(w.attn_norm), d.ffn_norm = upload_vector(w.ffn_norm);
    if (!w.bq.empty()) d.bq = upload_vector(w.bq), d.bk = upload_vector(w.bk), d.bv = upload_vector(w.bv);
  }
  embeddings_ = upload_weight<T>(m.tok_embeddings);
  if (m.lm_head.data == m.tok_embeddings.data && m.lm_head.dtype == m.tok_embeddings.dtype) {
    lm_head_ = embeddings_.data();
  } else {
    lm_head_own_ = upload_weight<T>(m.lm_head);
    lm_head_ = lm_head_own_.data();
  }
  final_norm_ = upload_vector(m.final_norm);

  const std::vector<double> inv_freq = model_rope_inv_freq(c_);
  inv_freq_ = DeviceBuffer<double>(inv_freq);
  pairs_ = c_.rope_style == RopeStyle::kNeox ? cuda::RopePairs::kNeox : cuda::RopePairs::kInterleaved;
  // rope at read (cache ranks < the cache's tokens <= max_seq_len)
  const int n_positions = c_.max_seq_len + 1;
  rope_table_ = DeviceBuffer<float>(cuda::rope_cos_sin_table(inv_freq, n_positions));
  rope_view_.cos_sin = reinterpret_cast<const float2*>(rope_table_.data());
  rope_view_.n_positions = n_positions;
  rope_view_.half = c_.head_dim / 2;
  rope_view_.neox = pairs_ == cuda::RopePairs::kNeox;

  const KvStore& st = store(engine);
  cuda::DeviceKvConfig kc;
  kc.n_layers = 1;  // the host pool is shared by all layers: block ids are global
  kc.num_kv_heads = c_.n_kv_heads;
  kc.head_dim = c_.head_dim;
  kc.page_size = st.config().block_size_tokens;
  kc.num_pages = static_cast<int>(st.stats().blocks_total);
  kc.dtype = kv_dtype<T>();
  pool_ = std::make_unique<cuda::DeviceKvPool>(kc);
  ranks_ = DeviceBuffer<int32_t>(static_cast<size_t>(kc.num_pages) * kc.num_kv_heads * kc.page_size);
}

template <class T>
void CudaForward<T>::ensure_rows(int n) {
  if (n <= rows_cap_) return;
  const size_t r = static_cast<size_t>(n);
  const size_t qd = size_t(c_.n_heads) * c_.head_dim, kvd = size_t(c_.n_kv_heads) * c_.head_dim;
  x_.resize(r * c_.dim), h_.resize(r * std::max<size_t>(c_.dim, qd));
  q_.resize(r * qd), att_.resize(r * qd), att_t_.resize(r * qd), q_t_.resize(r * qd);
  k_.resize(r * kvd), v_.resize(r * kvd);
  gate_.resize(r * c_.hidden_dim), up_.resize(r * c_.hidden_dim), hidden_t_.resize(r * c_.hidden_dim);
  tokens_.resize(r), rope_pos_.resize(r);
  hq_.resize(r * qd), hk_.resize(r * kvd), hv_.resize(r * kvd), hatt_.resize(r * qd);
  rows_cap_ = n;
}

template <class T>
void CudaForward<T>::forward(std::span<Group> groups, std::span<const int32_t> tokens,
                             std::span<const int> logit_rows, float* logits) {
  const int n = static_cast<int>(tokens.size());
  const int dim = c_.dim, hd = c_.head_dim, nh = c_.n_heads, nkv = c_.n_kv_heads;
  const int qd = nh * hd, kvd = nkv * hd;
  ensure_rows(n);
  to_device(tokens_.data(), tokens.data(), tokens.size());
  cuda::embedding_gather<T>(embeddings_.data(), c_.vocab_size, dim, tokens_.data(), n, x_.data());

  // RoPE positions of the rows: the text position, or -1 (left raw: rotated on the host at the
  // cache rank, keys at read time) for policies with rope_at_cache_position.
  std::vector<int32_t> rope_pos(n);
  bool q_to_host = false, q_back = false, att_to_host = false;
  for (const Group& g : groups) {
    const bool cache_pos = g.seq->needs.rope_at_cache_position;
    for (int r = 0; r < g.n_rows; ++r) {
      if (g.positions[r] > INT32_MAX) fail("device forward: text position ", g.positions[r], " exceeds int32");
      rope_pos[g.row0 + r] = cache_pos ? -1 : static_cast<int32_t>(g.positions[r]);
    }
    q_to_host = q_to_host || g.seq->policy != nullptr || g.seq->probing_step || cache_pos;
    q_back = q_back || cache_pos;
    att_to_host = att_to_host || g.seq->probing_step;
  }
  to_device(rope_pos_.data(), rope_pos.data(), rope_pos.size());

  for (int l = 0; l < c_.n_layers; ++l) {
    Layer& w = layers_[l];
    cuda::rms_norm<T>(x_.data(), w.attn_norm.data(), c_.rms_eps, n, dim, h_.data());
    gemm_.linear(h_.data(), w.wq.data(), q_.data(), n, dim, qd);
    gemm_.linear(h_.data(), w.wk.data(), k_.data(), n, dim, kvd);
    gemm_.linear(h_.data(), w.wv.data(), v_.data(), n, dim, kvd);
    if (w.bq.size() > 0) {
      cuda::add_bias(q_.data(), w.bq.data(), n, qd);
      cuda::add_bias(k_.data(), w.bk.data(), n, kvd);
      cuda::add_bias(v_.data(), w.bv.data(), n, kvd);
    }
    cuda::rope(q_.data(), rope_pos_.data(), inv_freq_.data(), n, nh, hd, pairs_);
    cuda::rope(k_.data(), rope_pos_.data(), inv_freq_.data(), n, nkv, hd, pairs_);

    // host: append to the store, the policies' selections
    to_host(hk_.data(), k_.data(), size_t(n) * kvd);
    to_host(hv_.data(), v_.data(), size_t(n) * kvd);
    if (q_to_host) to_host(hq_.data(), q_.data(), size_t(n) * qd);
    for (Group& g : groups)
      begin_attention(e_, g, l, hq_.data() + size_t(g.row0) * qd, hk_.data() + size_t(g.row0) * kvd,
                      hv_.data() + size_t(g.row0) * kvd);
    if (q_back)  // queries rotated to their cache rank on the host
      for (const Group& g : groups)
        if (g.seq->needs.rope_at_cache_position)
          to_device(q_.data() + size_t(g.row0) * qd, hq_.data() + size_t(g.row0) * qd, size_t(g.n_rows) * qd);

    // device: pages, then attention
    sync_pages(groups, l);
    attend_decode(groups, l, false);
    attend_decode(groups, l, true);
    for (Group& g : groups)
      if (!g.decode) attend_prefill(g, l);

    // host: statistics, probes, the policies' observations and evictions
    if (att_to_host) {
      KVLAB_CUDA_CHECK(cudaDeviceSynchronize());
      to_host(hatt_.data(), att_.data(), size_t(n) * qd);
    }
    for (Group& g : groups)
      if (end_attention(e_, g, l, hatt_.data() + size_t(g.row0) * qd)) mirror_[{g.seq->id, l}].meta_stale = true;

    // device: output projection and feed-forward, both added to the residual stream
    const T* att_in;
    if constexpr (std::is_same_v<T, float>) {
      att_in = att_.data();
    } else {
      cuda::convert<T>(att_.data(), int64_t(n) * qd, att_t_.data());
      att_in = att_t_.data();
    }
    gemm_.linear(att_in, w.wo.data(), x_.data(), n, qd, dim, nullptr, /*accumulate=*/true);
    cuda::rms_norm<T>(x_.data(), w.ffn_norm.data(), c_.rms_eps, n, dim, h_.data());
    gemm_.linear(h_.data(), w.w_gate.data(), gate_.data(), n, dim, c_.hidden_dim);
    gemm_.linear(h_.data(), w.w_up.data(), up_.data(), n, dim, c_.hidden_dim);
    cuda::swiglu<T>(gate_.data(), up_.data(), int64_t(n) * c_.hidden_dim, hidden_t_.data());
    gemm_.linear(hidden_t_.data(), w.w_down.data(), x_.data(), n, c_.hidden_dim, dim, nullptr,
                 /*accumulate=*/true);
  }
  compute_logits(logit_rows, logits);
}

// Brings the device pages of every group's (sequence, layer) up to the host store (see the
// file comment), then appends this call's rows.
template <class T>
void CudaForward<T>::sync_pages(std::span<Group> groups, int layer) {
  KvStore& st = store(e_);
  std::vector<int32_t> data_ids, meta_ids, meta, rank_ids, ranks;
  std::vector<float> k, v;
  BlockTableArrays append_table;
  std::vector<int32_t> batch_idx, slot_idx, position;
  for (size_t i = 0; i < groups.size(); ++i) {
    Group& g = groups[i];
    const SeqId id = g.seq->id;
    const LayerKv kv = st.layer(id, layer);
    Mirror& m = mirror_[{id, layer}];
    const int64_t dv = st.data_version(id, layer);
    if (m.data_version != dv) {
      append_page_data(kv, data_ids, k, v);
      m.data_version = dv;
      m.meta_stale = true;
    }
    if (m.meta_stale) {
      append_page_positions(kv, meta_ids, meta);
      m.meta_stale = false;
    }
    if (g.seq->needs.rope_at_cache_position) append_page_values(kv, g.key_rope_pos.data(), rank_ids, ranks);
    append_table.add(kv);
    for (int r = 0; r < g.n_rows; ++r) {
      batch_idx.push_back(static_cast<int32_t>(i));
      slot_idx.push_back(kv.n_slots - g.n_rows + r);
      position.push_back(static_cast<int32_t>(g.positions[r]));
    }
  }
  const cuda::DeviceKvConfig& pc = pool_->config();
  const size_t page_meta = size_t(pc.num_kv_heads) * pc.page_size, page_elems = page_meta * pc.head_dim;
  auto scatter_meta = [&](const std::vector<int32_t>& ids, const std::vector<int32_t>& values, int32_t* dst) {
    if (ids.empty()) return;
    upload(page_ids_, ids);
    upload(meta_, values);
    cuda::scatter_pages<int32_t, int32_t>(meta_.data(), page_ids_.data(), static_cast<int>(ids.size()),
                                          page_meta, dst);
  };
  if (!data_ids.empty()) {
    upload(page_ids_, data_ids);
    upload(stage_k_, k);
    upload(stage_v_, v);
    cuda::scatter_pages<float, T>(stage_k_.data(), page_ids_.data(), static_cast<int>(data_ids.size()),
                                  page_elems, pool_->template k_data<T>(0));
    cuda::scatter_pages<float, T>(stage_v_.data(), page_ids_.data(), static_cast<int>(data_ids.size()),
                                  page_elems, pool_->template v_data<T>(0));
    KVLAB_CUDA_CHECK(cudaDeviceSynchronize());  // the staging buffers are reused below
  }
  scatter_meta(meta_ids, meta, pool_->positions(0));
  KVLAB_CUDA_CHECK(cudaDeviceSynchronize());
  scatter_meta(rank_ids, ranks, ranks_.data());

  // the new rows, from the device k, v the host copied (rows of all groups, in order)
  table_.upload(append_table.indptr, append_table.indices, append_table.last_page_len);
  upload(append_batch_, batch_idx);
  upload(append_slot_, slot_idx);
  upload(append_pos_, position);
  cuda::append_kv<T>(pool_->template layer<T>(0, table_), pool_->positions(0), k_.data(), v_.data(),
                     append_batch_.data(), append_slot_.data(), append_pos_.data(),
                     static_cast<int>(batch_idx.size()));
  KVLAB_CUDA_CHECK(cudaDeviceSynchronize());
}

// Every decode group (one row each) whose policy rotates keys at read time (cache_pos) or not,
// in one FlashDecoding launch.
template <class T>
void CudaForward<T>::attend_decode(std::span<Group> groups, int layer, bool cache_pos) {
  std::vector<Group*> members;
  for (Group& g : groups)
    if (g.decode && g.seq->needs.rope_at_cache_position == cache_pos) members.push_back(&g);
  if (!members.empty()) rows_as_requests(members, layer, cache_pos);
}

// Rows as requests of the decode kernel: each member group contributes its rows, each row a
// request with its own selection lists and query position (exact for any per-row selection).
// Key mass is summed over a group's rows into its g.key_mass.
template <class T>
void CudaForward<T>::rows_as_requests(std::span<Group*> members, int layer, bool cache_pos) {
  KvStore& st = store(e_);
  const int hd = c_.head_dim, nh = c_.n_heads, nkv = c_.n_kv_heads, qd = nh * hd;
  BlockTableArrays table;
  SelectionArrays sel;
  std::vector<int32_t> q_pos;
  std::vector<int> request_rows;  // device row of each request
  int stride = 1;
  bool mass = false;
  for (Group* g : members) {
    const LayerKv kv = st.layer(g->seq->id, layer);
    table.add(kv, g->n_rows);
    for (int r = 0; r < g->n_rows; ++r) {
      sel.add_row(g->selection, g->selection.all ? 0 : r, nkv, kv.n_slots);
      q_pos.push_back(static_cast<int32_t>(g->positions[r]));
      request_rows.push_back(g->row0 + r);
    }
    stride = std::max(stride, kv.n_slots);
    mass = mass || g->seq->needs.key_attention_mass;
  }
  const int batch = table.batch();
  // queries and outputs: in place when the requests are the rows [r0, r0 + batch) in order
  bool contiguous = true;
  for (int i = 1; i < batch; ++i) contiguous = contiguous && request_rows[i] == request_rows[0] + i;
  float* q = q_.data() + size_t(request_rows[0]) * qd;
  float* out = att_.data() + size_t(request_rows[0]) * qd;
  if (!contiguous) {
    q_gather_.reserve(size_t(batch) * qd);
    out_gather_.reserve(size_t(batch) * qd);
    for (int i = 0; i < batch; ++i)
      KVLAB_CUDA_CHECK(cudaMemcpy(q_gather_.data() + size_t(i) * qd, q_.data() + size_t(request_rows[i]) * qd,
                                  qd * sizeof(float), cudaMemcpyDeviceToDevice));
    q = q_gather_.data();
    out = out_gather_.data();
  }

  table_.upload(table.indptr, table.indices, table.last_page_len);
  const KeySelectionView sel_view = selection_.upload(sel.indptr, sel.ranges, sel.list_slots);
  upload(q_pos_, q_pos);
  cuda::DecodeParams<T> p;
  p.kv = as_const(pool_->template layer<T>(0, table_));
  p.q = q;
  p.batch = batch;
  p.num_qo_heads = nh;
  p.q_pos = q_pos_.data();
  p.kv_pos = pool_->positions(0);
  p.sel = sel_view;
  p.scale = 1.f / std::sqrt(static_cast<float>(hd));
  p.out = out;
  if (mass) {
    key_mass_.reserve(size_t(batch) * nkv * stride);
    KVLAB_CUDA_CHECK(cudaMemset(key_mass_.data(), 0, size_t(batch) * nkv * stride * sizeof(float)));
    p.key_mass = key_mass_.data();
    p.key_mass_stride = stride;
  }
  if (cache_pos) {
    p.key_rope_pos = ranks_.data();
    p.rope = rope_view_;
  }
  const cuda::DecodePlan plan = cuda::plan_decode(batch, nkv, selection_.max_count());
  cuda::decode_attention<T>(p, plan, workspace_);
  if (!contiguous)
    for (int i = 0; i < batch; ++i)
      KVLAB_CUDA_CHECK(cudaMemcpy(att_.data() + size_t(request_rows[i]) * qd, out_gather_.data() + size_t(i) * qd,
                                  qd * sizeof(float), cudaMemcpyDeviceToDevice));
  if (!mass) return;
  // per group: the sum over its rows of [n_kv, stride] -> g.key_mass [n_kv, n_slots]
  int request = 0;
  std::vector<float> host(size_t(nkv) * stride);
  for (Group* g : members) {
    const size_t block = size_t(nkv) * stride;
    if (g->seq->needs.key_attention_mass) {
      key_mass_sum_.reserve(block);
      cuda::sum_rows(key_mass_.data() + size_t(request) * block, g->n_rows, static_cast<int64_t>(block),
                     key_mass_sum_.data());
      to_host(host.data(), key_mass_sum_.data(), block);
      const int n_slots = static_cast<int>(g->key_mass.size()) / nkv;
      for (int h = 0; h < nkv; ++h)
        std::copy_n(host.data() + size_t(h) * stride, n_slots, g->key_mass.data() + size_t(h) * n_slots);
    }
    request += g->n_rows;
  }
}

// A prefill chunk: the tensor-core kernel when every row reads the same lists and no key mass is
// asked (T must be a 16-bit type), else its rows as decode requests.
template <class T>
void CudaForward<T>::attend_prefill(Group& g, int layer) {
  const bool cache_pos = g.seq->needs.rope_at_cache_position;
  if (!std::is_same_v<T, __nv_bfloat16> || g.seq->needs.key_attention_mass || !rows_share_lists(g.selection)) {
    Group* one = &g;
    rows_as_requests(std::span<Group*>(&one, 1), layer, cache_pos);
    return;
  }
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const int hd = c_.head_dim, nh = c_.n_heads, nkv = c_.n_kv_heads, qd = nh * hd;
    const LayerKv kv = store(e_).layer(g.seq->id, layer);
    BlockTableArrays table;
    table.add(kv);
    SelectionArrays sel;
    sel.add_row(g.selection, 0, nkv, kv.n_slots);
    std::vector<int32_t> q_pos(g.n_rows);
    for (int r = 0; r < g.n_rows; ++r) q_pos[r] = static_cast<int32_t>(g.positions[r]);
    table_.upload(table.indptr, table.indices, table.last_page_len);
    const KeySelectionView sel_view = selection_.upload(sel.indptr, sel.ranges, sel.list_slots);
    upload(q_pos_, q_pos);
    upload(qo_indptr_, std::vector<int32_t>{0, g.n_rows});
    cuda::convert<T>(q_.data() + size_t(g.row0) * qd, int64_t(g.n_rows) * qd, q_t_.data());
    cuda::PrefillParams<T> p;
    p.kv = as_const(pool_->template layer<T>(0, table_));
    p.q = q_t_.data();
    p.qo_indptr = qo_indptr_.data();
    p.batch = 1;
    p.num_qo_heads = nh;
    p.max_rows = g.n_rows;
    p.q_pos = q_pos_.data();
    p.kv_pos = pool_->positions(0);
    p.sel = sel_view;
    p.scale = 1.f / std::sqrt(static_cast<float>(hd));
    p.out = att_.data() + size_t(g.row0) * qd;
    if (cache_pos) {
      p.key_rope_pos = ranks_.data();
      p.rope = rope_view_;
    }
    cuda::prefill_attention<T>(p);
    KVLAB_CUDA_CHECK(cudaDeviceSynchronize());  // q_pos_ / qo_indptr_ are reused
  }
}

template <class T>
void CudaForward<T>::compute_logits(std::span<const int> logit_rows, float* logits) {
  const int dim = c_.dim, vocab = c_.vocab_size;
  // consecutive runs of rows (one run in practice: the last row of a chunk, or all rows)
  size_t i = 0;
  while (i < logit_rows.size()) {
    size_t j = i + 1;
    while (j < logit_rows.size() && logit_rows[j] == logit_rows[j - 1] + 1) ++j;
    const int m = static_cast<int>(j - i);
    logits_.reserve(size_t(m) * vocab);
    cuda::rms_norm<T>(x_.data() + size_t(logit_rows[i]) * dim, final_norm_.data(), c_.rms_eps, m, dim, h_.data());
    gemm_.linear(h_.data(), lm_head_, logits_.data(), m, dim, vocab);
    to_host(logits + i * vocab, logits_.data(), size_t(m) * vocab);
    i = j;
  }
}

}  // namespace

std::string cuda_device_summary() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return str_cat("no usable CUDA GPU (", cudaGetErrorString(err), ")");
  }
  if (n == 0) return "no CUDA GPU found";
  cudaDeviceProp prop{};
  KVLAB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  char gib[32];
  std::snprintf(gib, sizeof gib, "%.1f", double(prop.totalGlobalMem) / double(1ull << 30));
  return str_cat(prop.name, " (sm_", prop.major, prop.minor, ", ", gib, " GiB)");
}

bool cuda_device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

std::unique_ptr<DeviceForward> DeviceForward::create(Engine& engine) {
  if (!cuda_device_available()) fail("device cuda: ", cuda_device_summary(), "; use device cpu");
  const ModelConfig& c = model(engine).config;
  if (c.head_dim != 64 && c.head_dim != 128)
    fail("device cuda: the attention kernels take head_dim 64 or 128; this model has ", c.head_dim,
         " (use device cpu)");
  if (c.n_heads / c.n_kv_heads > cuda::kDecodeMaxGroup)
    fail("device cuda: the decode kernel takes up to ", cuda::kDecodeMaxGroup,
         " query heads per KV head; this model has ", c.n_heads / c.n_kv_heads, " (use device cpu)");
  const std::string& dtype = options(engine).device_dtype;
  if (dtype == "bf16") return std::make_unique<CudaForward<__nv_bfloat16>>(engine);
  if (dtype == "f32") return std::make_unique<CudaForward<float>>(engine);
  fail("device cuda: device dtype must be bf16 or f32, got '", dtype, "'");
}

}  // namespace kvlab
