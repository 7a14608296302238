// The emulated device (device_executor.h): the device forward pass's plans executed with plain
// CPU loops over arrays laid out exactly as the CUDA executor's — the page arenas
// [num_pages, n_kv, page, hd], position and rank pages, block tables and selection lists as
// uploaded — so the host-side planning (mirror uploads, appends, launch construction, row
// mapping, key-mass sums) is tested in CI without a GPU. The attention of a launch request is
// the CPU reference (kernels/cpu attention_naive) over a LayerKv rebuilt from those arrays and
// the launch's own selection lists, which is the contract the CUDA kernels are tested against;
// the dense layers are the CPU backend's (dense_layers.h, one thread) and RoPE is the engine's
// host table. Everything is fp32 (device dtype only picks the plans: bf16 has the prefill kernel,
// as on CUDA; f32 does not).
#include <cmath>
#include <cstring>
#include <vector>

#include "framework/core/error.h"
#include "framework/engine/dense_layers.h"
#include "framework/engine/device_executor.h"
#include "kernels/common/masks.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/thread_pool.h"

namespace kvlab {
namespace {

using engine_detail::DenseLayers;

class EmulatedExecutor final : public DeviceExecutor {
 public:
  explicit EmulatedExecutor(const DeviceExecutorConfig& config)
      : pool_(1), dense_(*config.model, pool_), c_(config.model->config), rope_(*config.rope),
        page_size_(config.page_size), prefill_kernel_(config.dtype == DeviceDtype::kBf16) {
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
    dense_.embed(tokens, x_.data());
    q_.resize(size_t(n_) * qd_), att_.assign(size_t(n_) * qd_, NAN);
    k_.resize(size_t(n_) * kvd_), v_.resize(size_t(n_) * kvd_);
  }

  void qkv(int layer, std::span<const int32_t> rope_pos) override {
    dense_.qkv(layer, x_.data(), n_, q_.data(), k_.data(), v_.data());
    for (int r = 0; r < n_; ++r) {
      if (rope_pos[r] < 0) continue;
      apply_rope(q_.data() + size_t(r) * qd_, c_.n_heads, c_.head_dim, rope_pos[r], rope_);
      apply_rope(k_.data() + size_t(r) * kvd_, c_.n_kv_heads, c_.head_dim, rope_pos[r], rope_);
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
      attend(l.table, i, l.selection, i, q_.data() + size_t(l.rows[i]) * qd_, &q_pos, l.rope_at_read,
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
      row.n_rows = 1;
      row.n_kv_heads = c_.n_kv_heads;
      for (int h = 0; h < c_.n_kv_heads; ++h) {
        for (const SlotRange& range : l.selection.list(0, h))
          for (int32_t s = range.begin; s < range.end; ++s) {
            const int32_t pos = pos_pages_[arena.slot_meta_offset(0, s, h)];
            if (pos < 0 || mask(l.q_pos[r], pos)) row.add(s, s + 1);  // holes stay: attention skips them
          }
        row.close_list();
        row.list_slots.push_back(l.selection.list_slots[h]);
      }
      const int64_t q_pos = l.q_pos[r];
      attend(l.table, 0, row, 0, q_.data() + size_t(l.row0 + r) * qd_, &q_pos, l.rope_at_read,
             att_.data() + size_t(l.row0 + r) * qd_, nullptr);
    }
  }

  void read_attention(float* att) override { std::memcpy(att, att_.data(), att_.size() * sizeof(float)); }

  void finish_layer(int layer) override { dense_.out_ffn(layer, att_.data(), n_, x_.data()); }

  void logits(int row0, int m, float* out) override {
    std::vector<int> rows(m);
    for (int r = 0; r < m; ++r) rows[r] = row0 + r;
    dense_.logits(x_.data(), rows, out);
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

  // Attention of one query row over request `b` of `table` reading the n_kv lists of selection
  // request `sel_request`: the reference over a LayerKv rebuilt from the arrays.
  void attend(const BlockTableArrays& table, int b, const SelectionArrays& sel, int sel_request, const float* q,
              const int64_t* q_pos, bool rope_at_read, float* out, std::vector<float>* mass) {
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
    for (int h = 0; h < nkv; ++h)
      KVLAB_CHECK(sel.list_slots[sel_request * nkv + h] == kv.n_slots, "selection list of ",
                  sel.list_slots[sel_request * nkv + h], " slots for a request of ", kv.n_slots);
    AttentionArgs a = attention_args(q, 1, c_.n_heads, nkv, c_.head_dim, q_pos, kv,
                                     1.f / std::sqrt(static_cast<float>(c_.head_dim)));
    a.selection = &sel;  // the launch's lists of request sel_request
    a.selection_row = sel_request;
    if (rope_at_read) {
      a.key_rope_pos = ranks.data();
      a.rope = &rope_;
    }
    if (mass) {
      mass->assign(size_t(nkv) * kv.n_slots, 0.f);
      a.key_mass = mass->data();
    }
    a.out = out;
    attention_naive(a);
  }

  ThreadPool pool_;
  DenseLayers dense_;
  const ModelConfig& c_;
  const RopeTable& rope_;
  int page_size_;
  bool prefill_kernel_;
  int qd_ = 0, kvd_ = 0, n_ = 0;
  std::vector<float> x_, q_, k_, v_, att_;
  std::vector<float> k_pages_, v_pages_;
  std::vector<int32_t> pos_pages_, rank_pages_;
};

}  // namespace

std::unique_ptr<DeviceExecutor> make_emulated_executor(const DeviceExecutorConfig& config) {
  return std::make_unique<EmulatedExecutor>(config);
}

}  // namespace kvlab
