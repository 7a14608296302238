// The emulated device (device_executor.h): the device forward pass's plans executed with plain
// CPU loops over arrays laid out exactly as the CUDA executor's — the page arenas
// [num_pages, n_kv, page, hd], position and rank pages, block tables and selection lists as
// uploaded — so the host-side planning (mirror uploads, appends, launch construction, row
// mapping, key-mass sums) is tested in CI without a GPU. The attention of a launch request is
// the CPU reference (kernels/cpu attention_naive) over a LayerKv rebuilt from those arrays, which
// is the contract the CUDA kernels are tested against; the dense layers are the CPU engine's
// (linear.h, one thread). Everything is fp32 (device dtype only picks the plans: "bf16" has the
// prefill kernel, as on CUDA; "f32" does not).
#include <cmath>
#include <cstring>
#include <vector>

#include "framework/core/error.h"
#include "framework/engine/device_executor.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/common/masks.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/rope.h"

namespace kvlab {
namespace {

class EmulatedExecutor final : public DeviceExecutor {
 public:
  explicit EmulatedExecutor(const DeviceExecutorConfig& config)
      : pool_(1), m_(*config.model), c_(config.model->config), inv_freq_(config.rope_inv_freq),
        cache_rope_(*config.cache_rope), page_size_(config.page_size),
        prefill_kernel_(config.dtype == "bf16") {
    qd_ = c_.n_heads * c_.head_dim;
    kvd_ = c_.n_kv_heads * c_.head_dim;
    const size_t page_meta = size_t(c_.n_kv_heads) * page_size_;
    k_pages_.assign(size_t(config.num_pages) * page_meta * c_.head_dim, NAN);  // unwritten = NaN
    v_pages_.assign(k_pages_.size(), NAN);
    pos_pages_.assign(size_t(config.num_pages) * page_meta, -1);
    rank_pages_.assign(pos_pages_.size(), -1);
  }

  void begin_call(std::span<const int32_t> tokens) override {
    n_ = static_cast<int>(tokens.size());
    x_.resize(size_t(n_) * c_.dim);
    for (int r = 0; r < n_; ++r) weight_row_to_float(m_.tok_embeddings, tokens[r], x_.data() + size_t(r) * c_.dim);
    q_.resize(size_t(n_) * qd_), att_.assign(size_t(n_) * qd_, NAN);
    k_.resize(size_t(n_) * kvd_), v_.resize(size_t(n_) * kvd_);
  }

  void qkv(int layer, std::span<const int32_t> rope_pos) override {
    const LayerWeights& w = m_.layers[layer];
    norm(w.attn_norm);
    matmul(w.wq, w.bq, q_.data());
    matmul(w.wk, w.bk, k_.data());
    matmul(w.wv, w.bv, v_.data());
    for (int r = 0; r < n_; ++r) {
      if (rope_pos[r] < 0) continue;
      rotate(q_.data() + size_t(r) * qd_, c_.n_heads, rope_pos[r]);
      rotate(k_.data() + size_t(r) * kvd_, c_.n_kv_heads, rope_pos[r]);
    }
  }

  void read_q(float* q) override { std::memcpy(q, q_.data(), q_.size() * sizeof(float)); }
  void read_kv(float* k, float* v) override {
    std::memcpy(k, k_.data(), k_.size() * sizeof(float));
    std::memcpy(v, v_.data(), v_.size() * sizeof(float));
  }
  void write_q_rows(int row0, int n_rows, const float* q) override {
    std::memcpy(q_.data() + size_t(row0) * qd_, q, size_t(n_rows) * qd_ * sizeof(float));
  }

  void update_pages(const PageUpdate& u) override {
    const size_t page_meta = size_t(c_.n_kv_heads) * page_size_, page_elems = page_meta * c_.head_dim;
    for (size_t i = 0; i < u.data_pages.size(); ++i) {
      std::memcpy(&k_pages_[u.data_pages[i] * page_elems], &u.k[i * page_elems], page_elems * sizeof(float));
      std::memcpy(&v_pages_[u.data_pages[i] * page_elems], &u.v[i * page_elems], page_elems * sizeof(float));
    }
    for (size_t i = 0; i < u.meta_pages.size(); ++i)
      std::memcpy(&pos_pages_[u.meta_pages[i] * page_meta], &u.meta[i * page_meta], page_meta * sizeof(int32_t));
    for (size_t i = 0; i < u.rank_pages.size(); ++i)
      std::memcpy(&rank_pages_[u.rank_pages[i] * page_meta], &u.ranks[i * page_meta], page_meta * sizeof(int32_t));
    // appends, as kernels/cuda append_kv: row i -> slot append_slot[i] of its request
    KVLAB_CHECK(int(u.append_request.size()) == n_, "append of ", u.append_request.size(), " rows in a call of ", n_);
    const PagedKvView<const float> table = view(u.append_table);
    for (int i = 0; i < n_; ++i) {
      const int b = u.append_request[i], slot = u.append_slot[i];
      KVLAB_CHECK(slot >= 0 && slot < table.length(b), "append into slot ", slot, " of a request of ", table.length(b));
      for (int h = 0; h < c_.n_kv_heads; ++h) {
        const size_t off = table.slot_offset(b, slot, h);
        std::memcpy(&k_pages_[off], &k_[size_t(i) * kvd_ + size_t(h) * c_.head_dim], c_.head_dim * sizeof(float));
        std::memcpy(&v_pages_[off], &v_[size_t(i) * kvd_ + size_t(h) * c_.head_dim], c_.head_dim * sizeof(float));
        pos_pages_[table.slot_meta_offset(b, slot, h)] = u.append_position[i];
      }
    }
  }

  void decode(const DecodeLaunch& l, std::vector<std::vector<float>>& key_mass) override {
    const int nkv = c_.n_kv_heads, stride = l.key_mass_stride;
    std::vector<float> mass(stride > 0 ? size_t(l.table.batch()) * nkv * stride : 0, 0.f);
    for (int i = 0; i < l.table.batch(); ++i) {
      const int64_t q_pos = l.q_pos[i];
      std::vector<float> request_mass;
      attend(l.table, i, l.selection, i, q_.data() + size_t(l.rows[i]) * qd_, &q_pos, 1, l.rope_at_read,
             att_.data() + size_t(l.rows[i]) * qd_, stride > 0 ? &request_mass : nullptr);
      if (stride > 0) {
        const int n_slots = static_cast<int>(request_mass.size()) / nkv;
        for (int h = 0; h < nkv; ++h)
          for (int s = 0; s < n_slots; ++s)
            mass[(size_t(i) * nkv + h) * stride + s] = request_mass[size_t(h) * n_slots + s];
      }
    }
    key_mass.clear();
    for (const auto& [first, count] : l.mass_sums) {
      std::vector<float> sum(size_t(nkv) * stride, 0.f);
      for (int r = first; r < first + count; ++r)
        for (size_t j = 0; j < sum.size(); ++j) sum[j] += mass[size_t(r) * sum.size() + j];
      key_mass.push_back(std::move(sum));
    }
  }

  bool has_prefill_kernel() const override { return prefill_kernel_; }

  // Every row reads the launch's lists filtered by the mask at its position (as the kernel).
  void prefill(const PrefillLaunch& l) override {
    const WindowSinkMask mask{l.mask.window, l.mask.sinks, false};
    const PagedKvView<const float> arena = view(l.table);
    for (int r = 0; r < l.n_rows; ++r) {
      SelectionArrays row;
      row.indptr.assign(1, 0);
      for (int h = 0; h < c_.n_kv_heads; ++h) {
        for (int32_t i = l.selection.indptr[h]; i < l.selection.indptr[h + 1]; ++i)
          for (int32_t s = l.selection.ranges[i].begin; s < l.selection.ranges[i].end; ++s) {
            const int32_t pos = pos_pages_[arena.slot_meta_offset(0, s, h)];
            if (pos >= 0 && !mask(l.q_pos[r], pos)) continue;  // holes stay: attention skips them
            if (!row.ranges.empty() && int(row.ranges.size()) > row.indptr.back() && row.ranges.back().end == s)
              ++row.ranges.back().end;
            else
              row.ranges.push_back({s, s + 1});
          }
        row.indptr.push_back(static_cast<int32_t>(row.ranges.size()));
        row.list_slots.push_back(l.selection.list_slots[h]);
      }
      const int64_t q_pos = l.q_pos[r];
      attend(l.table, 0, row, 0, q_.data() + size_t(l.row0 + r) * qd_, &q_pos, 1, l.rope_at_read,
             att_.data() + size_t(l.row0 + r) * qd_, nullptr);
    }
  }

  void read_attention(float* att) override { std::memcpy(att, att_.data(), att_.size() * sizeof(float)); }

  void finish_layer(int layer) override {
    const LayerWeights& w = m_.layers[layer];
    std::vector<float> o(size_t(n_) * c_.dim);
    linear(pool_, att_.data(), n_, {{w.wo, o.data(), nullptr}}, scratch_);
    add_inplace(x_.data(), o.data(), int64_t(o.size()));
    norm(w.ffn_norm);
    std::vector<float> gate(size_t(n_) * c_.hidden_dim), up(gate.size());
    linear(pool_, h_.data(), n_, {{w.w_gate, gate.data(), nullptr}, {w.w_up, up.data(), nullptr}},
           scratch_);
    swiglu(gate.data(), up.data(), int64_t(gate.size()));
    linear(pool_, gate.data(), n_, {{w.w_down, o.data(), nullptr}}, scratch_);
    add_inplace(x_.data(), o.data(), int64_t(o.size()));
  }

  void logits(int row0, int m, float* out) override {
    std::vector<float> h(size_t(m) * c_.dim);
    for (int r = 0; r < m; ++r)
      rms_norm(x_.data() + size_t(row0 + r) * c_.dim, m_.final_norm.data(), c_.dim, c_.rms_eps, h.data() + size_t(r) * c_.dim);
    linear(pool_, h.data(), m, {{m_.lm_head, out, nullptr}}, scratch_);
  }

 private:
  // The arena view of a launch's block tables (as the kernels see it).
  PagedKvView<const float> view(const BlockTableArrays& t) const {
    PagedKvView<const float> v;
    v.page_size = page_size_;
    v.num_kv_heads = c_.n_kv_heads;
    v.head_dim = c_.head_dim;
    v.k_data = k_pages_.data();
    v.v_data = v_pages_.data();
    v.indptr = t.indptr.data();
    v.indices = t.indices.data();
    v.last_page_len = t.last_page_len.data();
    return v;
  }

  // Attention of `n_rows` query rows over request `b` of `table` reading the n_kv lists of
  // selection request `sel_request`: the reference over a LayerKv rebuilt from the arrays.
  void attend(const BlockTableArrays& table, int b, const SelectionArrays& sel, int sel_request, const float* q,
              const int64_t* q_pos, int n_rows, bool rope_at_read, float* out, std::vector<float>* mass) {
    const int nkv = c_.n_kv_heads;
    sel.check();
    const PagedKvView<const float> arena = view(table);
    const int32_t indptr[2] = {0, table.indptr[b + 1] - table.indptr[b]};
    LayerKv kv;
    kv.view = arena;
    kv.view.indptr = indptr;
    kv.view.indices = table.indices.data() + table.indptr[b];
    kv.view.last_page_len = table.last_page_len.data() + b;
    kv.n_slots = kv.view.length(0);
    std::vector<int64_t> positions(size_t(kv.n_slots) * nkv);
    std::vector<uint8_t> valid(positions.size());
    std::vector<int32_t> ranks(positions.size());
    for (int s = 0; s < kv.n_slots; ++s)
      for (int h = 0; h < nkv; ++h) {
        const size_t m = kv.view.slot_meta_offset(0, s, h);
        positions[size_t(s) * nkv + h] = pos_pages_[m];
        valid[size_t(s) * nkv + h] = pos_pages_[m] >= 0;
        ranks[size_t(s) * nkv + h] = rank_pages_[m];
      }
    kv.positions = positions.data();
    kv.valid = valid.data();
    KeySelection ks;
    ks.begin(n_rows, nkv);
    for (int r = 0; r < n_rows; ++r)
      for (int h = 0; h < nkv; ++h) {
        const int list = sel_request * nkv + h;
        KVLAB_CHECK(sel.list_slots[list] == kv.n_slots, "selection list of ", sel.list_slots[list],
                    " slots for a request of ", kv.n_slots);
        for (int32_t i = sel.indptr[list]; i < sel.indptr[list + 1]; ++i) ks.add(sel.ranges[i].begin, sel.ranges[i].end);
        ks.close_list();
      }
    AttentionArgs a;
    a.q = q;
    a.n_rows = n_rows;
    a.n_heads = c_.n_heads;
    a.n_kv_heads = nkv;
    a.head_dim = c_.head_dim;
    a.q_positions = q_pos;
    a.kv = kv;
    a.selection = &ks;
    a.scale = 1.f / std::sqrt(static_cast<float>(c_.head_dim));
    if (rope_at_read) {
      a.key_rope_pos = ranks.data();
      a.rope = &cache_rope_;
    }
    if (mass) {
      mass->assign(size_t(nkv) * kv.n_slots, 0.f);
      a.key_mass = mass->data();
    }
    a.out = out;
    attention_naive(a);
  }

  void norm(const std::vector<float>& weight) {
    h_.resize(size_t(n_) * c_.dim);
    for (int r = 0; r < n_; ++r)
      rms_norm(x_.data() + size_t(r) * c_.dim, weight.data(), c_.dim, c_.rms_eps, h_.data() + size_t(r) * c_.dim);
  }
  void matmul(const WeightView& w, const std::vector<float>& bias, float* y) {
    linear(pool_, h_.data(), n_, {{w, y, bias.empty() ? nullptr : bias.data()}}, scratch_);
  }
  // RoPE of x [n_heads, hd] at `pos` (the CUDA kernel's angles: pos * inv_freq in double,
  // cos/sin rounded to float).
  void rotate(float* x, int n_heads, int32_t pos) const {
    const int half = c_.head_dim / 2;
    std::vector<float> co(half), si(half);
    for (int i = 0; i < half; ++i) {
      const double angle = double(pos) * inv_freq_[i];
      co[i] = static_cast<float>(std::cos(angle));
      si[i] = static_cast<float>(std::sin(angle));
    }
    const RopeLayout layout = c_.rope_style == RopeStyle::kNeox ? RopeLayout::kNeox : RopeLayout::kInterleaved;
    for (int h = 0; h < n_heads; ++h) rope_rotate_head(x + size_t(h) * c_.head_dim, c_.head_dim, layout, co.data(), si.data());
  }

  ThreadPool pool_;
  LinearScratch scratch_;
  const Model& m_;
  const ModelConfig& c_;
  std::vector<double> inv_freq_;
  const RopeTable& cache_rope_;
  int page_size_;
  bool prefill_kernel_;
  int qd_ = 0, kvd_ = 0, n_ = 0;
  std::vector<float> x_, h_, q_, k_, v_, att_;
  std::vector<float> k_pages_, v_pages_;
  std::vector<int32_t> pos_pages_, rank_pages_;
};

}  // namespace

std::unique_ptr<DeviceExecutor> make_emulated_executor(const DeviceExecutorConfig& config) {
  return std::make_unique<EmulatedExecutor>(config);
}

}  // namespace kvlab
