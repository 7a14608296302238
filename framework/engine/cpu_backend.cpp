// The CPU backend (cpu_backend.h).
#include "framework/engine/cpu_backend.h"

#include <cmath>
#include <vector>

#include "framework/engine/dense_layers.h"
#include "kernels/cpu/attention.h"

namespace kvlab::engine_detail {
namespace {

// K/V bytes an attention call reads (x query rows) below which it runs on one thread.
constexpr size_t kAttentionParallelBytes = size_t{1} << 20;

class CpuBackend final : public Backend {
 public:
  CpuBackend(const Model& model, ThreadPool& pool, const KvStore& store, const LayerRopes& rope)
      : c_(model.config), pool_(pool), store_(store), rope_(rope), dense_(model, pool) {}

  void begin_call(std::span<const Group>, std::span<const int32_t> tokens) override {
    const size_t n = tokens.size();
    const size_t qd = size_t(c_.n_heads) * c_.head_dim, kvd = size_t(c_.n_kv_heads) * c_.head_dim;
    if (x_.size() < n * c_.dim) {
      x_.resize(n * c_.dim);
      q_.resize(n * qd), att_.resize(n * qd), k_.resize(n * kvd), v_.resize(n * kvd);
    }
    n_ = static_cast<int>(n);
    dense_.embed(tokens, x_.data());
  }

  HostRows qkv(int layer, std::span<const int32_t> rope_pos, bool) override {
    dense_.qkv(layer, x_.data(), n_, q_.data(), k_.data(), v_.data());
    const int hd = c_.head_dim, qd = c_.n_heads * hd, kvd = c_.n_kv_heads * hd;
    if (c_.mla()) {  // RoPE on each head's last qk_rope_head_dim features; the value rows are the key rows
      const int r0 = c_.kv_lora_rank;
      for (int r = 0; r < n_; ++r) {
        if (rope_pos[r] < 0) continue;  // (refused for MLA by the engine)
        for (int h = 0; h < c_.n_heads; ++h)
          rope_[layer].rotate(q_.data() + static_cast<size_t>(r) * qd + h * hd + r0, rope_pos[r]);
        rope_[layer].rotate(k_.data() + static_cast<size_t>(r) * kvd + r0, rope_pos[r]);
      }
      return {q_.data(), k_.data(), k_.data()};
    }
    for (int r = 0; r < n_; ++r) {
      if (rope_pos[r] < 0) continue;
      apply_rope(q_.data() + static_cast<size_t>(r) * qd, c_.n_heads, hd, rope_pos[r], rope_[layer]);
      apply_rope(k_.data() + static_cast<size_t>(r) * kvd, c_.n_kv_heads, hd, rope_pos[r], rope_[layer]);
    }
    return {q_.data(), k_.data(), v_.data()};
  }

  void attend(std::span<Group> groups, int layer) override {
    const size_t qd = size_t(c_.n_heads) * c_.head_dim;
    for (Group& g : groups)
      attend_group(g, layer, q_.data() + g.row0 * qd, att_.data() + g.row0 * qd);
  }
  const float* attention_output(bool) override { return att_.data(); }
  void finish_layer(int layer) override { dense_.out_ffn(layer, att_.data(), n_, x_.data()); }
  void logits(std::span<const int> rows, float* out) override { dense_.logits(x_.data(), rows, out); }

 private:
  // Attention of the group's rows (q: [n_rows, n_heads, head_dim]) over its selection.
  void attend_group(Group& g, int layer, const float* q, float* out) {
    Sequence& s = *g.seq;
    const int hd = c_.head_dim, nkv = c_.n_kv_heads;
    const LayerKv kv = store_.layer(s.id, layer);
    AttentionArgs a = attention_args(q, g.n_rows, c_.n_heads, nkv, hd, g.positions.data(), kv,
                                     attention_scale(c_));
    a.softcap = c_.attn_softcap;
    a.selection = s.selection.all ? nullptr : &s.selection;
    if (s.needs.rope_at_cache_position) {
      a.key_rope_pos = s.key_rope_pos.data();
      a.rope = &rope_[layer];
    }
    if (s.needs.key_attention_mass) a.key_mass = s.key_mass.data();
    if (s.window_rows > 0) {  // the observation window from the same pass (no key read twice)
      a.head_mass = s.window_attention.data();
      a.head_mass_first_row = g.n_rows - s.window_rows;
      s.window_by_kernel = true;
    }
    a.out = out;
    // Attention runs on the engine's pool (between its dense jobs, so no second team of threads
    // spins against it). Short attention (decode at short contexts, tiny models) stays on this
    // thread: a fork-join costs more than it saves there, and far more when the cores are shared.
    const size_t kv_bytes_read =
        size_t{2} * kv.n_slots * nkv * hd * sizeof(float) * static_cast<size_t>(g.n_rows);
    attention(a, kv_bytes_read < kAttentionParallelBytes ? nullptr : &pool_);
  }

  const ModelConfig& c_;
  ThreadPool& pool_;
  const KvStore& store_;
  const LayerRopes& rope_;
  DenseLayers dense_;
  int n_ = 0;
  std::vector<float> x_, q_, k_, v_, att_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Model& model, ThreadPool& pool, const KvStore& store,
                                          const LayerRopes& rope) {
  return std::make_unique<CpuBackend>(model, pool, store, rope);
}

}  // namespace kvlab::engine_detail
