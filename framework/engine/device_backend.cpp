// The host side of the device backends (device_backend.h): keeping the device pages a mirror of
// the host blocks, and the attention launch plans. The device work itself is a DeviceExecutor.
//
// Keeping the device pages equal to the host blocks (block b = page b), per (sequence, layer):
//   * new rows: appended on the device from the same fp32 k, v the host store appended;
//   * KvStore::data_version changed (compaction moved rows, copy-on-write replaced a block):
//     every page of the layer's table is re-uploaded from the host copy;
//   * the policy evicted (holes; emptied blocks leave the table): the page metadata (positions,
//     -1 = hole) is re-uploaded; the block tables themselves go with every launch;
//   * rope-at-read policies: the pages' cache ranks are re-uploaded every step (they shift).
// A new sequence starts with a full upload; end_sequence forgets it (its blocks may be reused).
#include "framework/engine/device_backend.h"

#include <algorithm>
#include <map>
#include <vector>

#include "framework/core/error.h"
#include "framework/engine/device_executor.h"
#include "framework/engine/device_plan.h"
#include "kernels/common/attention_limits.h"

namespace kvlab::engine_detail {
namespace {

constexpr int kMaxGridDim = 65535;  // CUDA's limit on grid y and z

class DeviceBackend final : public Backend {
 public:
  DeviceBackend(const ModelConfig& config, const KvStore& store, int launch_rows,
                std::unique_ptr<DeviceExecutor> exec)
      : c_(config), store_(store), launch_rows_(launch_rows), exec_(std::move(exec)) {}

  void begin_call(std::span<const Group> groups, std::span<const int32_t> tokens) override {
    const size_t n = tokens.size();
    const size_t qd = size_t(c_.n_heads) * c_.head_dim, kvd = size_t(c_.n_kv_heads) * c_.head_dim;
    hq_.resize(n * qd), hatt_.resize(n * qd), hk_.resize(n * kvd), hv_.resize(n * kvd);
    exec_->begin_call(tokens);
  }
  HostRows qkv(int layer, std::span<const int32_t> rope_pos, bool need_q) override {
    exec_->qkv(layer, rope_pos);
    exec_->read_kv(hk_.data(), hv_.data());
    if (need_q) exec_->read_q(hq_.data());
    return {hq_.data(), hk_.data(), hv_.data()};
  }
  void attend(std::span<Group> groups, int layer) override;
  const float* attention_output(bool need_out) override {
    if (need_out) exec_->read_attention(hatt_.data());
    return hatt_.data();
  }
  void evicted(const Group& g, int layer) override { mirror_[{g.seq->id, layer}].meta_stale = true; }
  void finish_layer(int layer) override { exec_->finish_layer(layer); }
  void logits(std::span<const int> rows, float* out) override;
  void end_sequence(SeqId seq) override {
    for (int l = 0; l < c_.n_layers; ++l) mirror_.erase({seq, l});
  }

 private:
  // What the device pages of one (sequence, layer) reflect.
  struct Mirror {
    int64_t data_version = -1;  // -1: nothing uploaded yet
    bool meta_stale = true;
  };

  PageUpdate plan_pages(std::span<Group> groups, int layer);
  void run_decode(std::span<Group* const> members, int layer, bool rope_at_read);
  void run_prefill(Group& g, int layer);

  const ModelConfig& c_;
  const KvStore& store_;
  int launch_rows_;
  std::unique_ptr<DeviceExecutor> exec_;
  std::map<std::pair<SeqId, int>, Mirror> mirror_;
  std::vector<float> hq_, hk_, hv_, hatt_;  // host copies of the call's rows
};

void DeviceBackend::attend(std::span<Group> groups, int layer) {
  const size_t qd = size_t(c_.n_heads) * c_.head_dim;
  // queries rotated to their cache rank on the host go back
  for (const Group& g : groups)
    if (g.seq->needs.rope_at_cache_position) exec_->write_q_rows(g.row0, g.n_rows, hq_.data() + g.row0 * qd);
  exec_->update_pages(plan_pages(groups, layer));
  std::vector<Group*> decode_plain, decode_rope_at_read;
  for (Group& g : groups)
    if (g.decode) (g.seq->needs.rope_at_cache_position ? decode_rope_at_read : decode_plain).push_back(&g);
  if (!decode_plain.empty()) run_decode(decode_plain, layer, false);
  if (!decode_rope_at_read.empty()) run_decode(decode_rope_at_read, layer, true);
  for (Group& g : groups)
    if (!g.decode) run_prefill(g, layer);
}

// logits, one run of consecutive rows at a time (one run in practice)
void DeviceBackend::logits(std::span<const int> rows, float* out) {
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    exec_->logits(rows[i], static_cast<int>(j - i), out + i * size_t(c_.vocab_size));
    i = j;
  }
}

// The page uploads that bring every group's (sequence, layer) up to the host store (see the file
// comment), and the append of this call's rows (row i of the call = row i of k and v).
PageUpdate DeviceBackend::plan_pages(std::span<Group> groups, int layer) {
  PageUpdate u;
  int row = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    Group& g = groups[i];
    KVLAB_CHECK(g.row0 == row, "device forward: the groups' rows are not consecutive");
    row += g.n_rows;
    const SeqId id = g.seq->id;
    const LayerKv kv = store_.layer(id, layer);
    Mirror& m = mirror_[{id, layer}];
    const int64_t dv = store_.data_version(id, layer);
    if (m.data_version != dv) {
      append_page_data(kv, u.data_pages, u.k, u.v);
      m.data_version = dv;
      m.meta_stale = true;
    }
    if (m.meta_stale) {
      append_page_positions(kv, u.meta_pages, u.meta);
      m.meta_stale = false;
    }
    if (g.seq->needs.rope_at_cache_position) append_page_values(kv, g.seq->key_rope_pos.data(), u.rank_pages, u.ranks);
    u.append_table.add(kv);
    for (int r = 0; r < g.n_rows; ++r) {
      u.append_request.push_back(static_cast<int32_t>(i));
      u.append_slot.push_back(kv.n_slots - g.n_rows + r);
      u.append_position.push_back(static_cast<int32_t>(g.positions[r]));
    }
  }
  return u;
}

// Every row of `members` as a request of the decode kernel, with its own lists and position
// (exact for any per-row selection); key mass summed over each member's rows into g.seq->key_mass.
// At most EngineOptions::device_launch_rows requests per launch (and batch x n_kv within the
// grid's 65535: the kernel's grid has that many CTAs in one dimension; its score workspace grows
// with the batch), so a long prefill chunk run this way takes several launches.
void DeviceBackend::run_decode(std::span<Group* const> members, int layer, bool rope_at_read) {
  const int nkv = c_.n_kv_heads;
  const int max_requests = std::max(1, std::min(launch_rows_, kMaxGridDim / nkv));
  struct Request {
    Group* g;
    int row;
  };
  std::vector<Request> requests;
  for (Group* g : members)
    for (int r = 0; r < g->n_rows; ++r) requests.push_back({g, r});
  for (size_t first = 0; first < requests.size(); first += max_requests) {
    const size_t last = std::min(requests.size(), first + max_requests);
    DecodeLaunch launch;
    launch.rope_at_read = rope_at_read;
    std::vector<Group*> mass_groups;
    int stride = 1;
    for (size_t i = first; i < last; ++i) {
      Group* g = requests[i].g;
      const int r = requests[i].row;
      const LayerKv kv = store_.layer(g->seq->id, layer);
      launch.table.add(kv);
      launch.selection.add_row(g->seq->selection, g->seq->selection.all ? 0 : r, nkv, kv.n_slots);
      launch.q_pos.push_back(static_cast<int32_t>(g->positions[r]));
      launch.rows.push_back(g->row0 + r);
      stride = std::max(stride, kv.n_slots);
      if (!g->seq->needs.key_attention_mass) continue;
      const int request = static_cast<int>(i - first);
      if (!mass_groups.empty() && mass_groups.back() == g) {
        ++launch.mass_sums.back().second;  // the group's next row
      } else {
        launch.mass_sums.push_back({request, 1});
        mass_groups.push_back(g);
      }
    }
    if (!mass_groups.empty()) launch.key_mass_stride = stride;
    std::vector<std::vector<float>> sums;
    exec_->decode(launch, sums);
    KVLAB_CHECK(sums.size() == mass_groups.size(), "device decode returned ", sums.size(), " key mass sums");
    for (size_t i = 0; i < mass_groups.size(); ++i) {  // added: a group may span launches
      Group& g = *mass_groups[i];
      const int n_slots = static_cast<int>(g.seq->key_mass.size()) / nkv;
      for (int h = 0; h < nkv; ++h)
        for (int s = 0; s < n_slots; ++s) g.seq->key_mass[size_t(h) * n_slots + s] += sums[i][size_t(h) * stride + s];
    }
  }
}

// A prefill chunk on the tensor-core kernel when the executor has it, no key mass is asked and
// the rows' selections are one pattern: the policy's prefill_mask over the whole cache, or the
// same lists for every row. Otherwise its rows run as decode requests.
void DeviceBackend::run_prefill(Group& g, int layer) {
  const PolicyNeeds& needs = g.seq->needs;
  const bool masked = needs.prefill_mask.has_value();
  if (!exec_->has_prefill_kernel() || needs.key_attention_mass || (!masked && !rows_share_lists(g.seq->selection))) {
    Group* one = &g;
    run_decode(std::span<Group* const>(&one, 1), layer, needs.rope_at_cache_position);
    return;
  }
  const LayerKv kv = store_.layer(g.seq->id, layer);
  PrefillLaunch launch;
  launch.table.add(kv);
  KeySelection all;
  all.select_all();
  launch.selection.add_row(masked ? all : g.seq->selection, 0, c_.n_kv_heads, kv.n_slots);
  if (masked) launch.mask = *needs.prefill_mask;
  for (int r = 0; r < g.n_rows; ++r) launch.q_pos.push_back(static_cast<int32_t>(g.positions[r]));
  launch.row0 = g.row0;
  launch.n_rows = g.n_rows;
  launch.rope_at_read = needs.rope_at_cache_position;
  exec_->prefill(launch);
}

}  // namespace

std::unique_ptr<Backend> make_device_backend(const Model& model, const EngineOptions& o,
                                             const KvStore& store, const RopeTable& rope) {
  const ModelConfig& c = model.config;
  const char* name = device_name(o.device);
  if (o.device == Device::kCuda && !cuda_device_available())
    fail("device cuda: ", cuda_device_summary(), "; use device cpu");
  if (o.device_launch_rows <= 0) fail("device ", name, ": device_launch_rows must be > 0");
  if (c.sandwich_norms || !c.local_layers.empty() || c.embed_scale || c.attn_softcap > 0 ||
      c.final_softcap > 0 || c.ffn_activation != FfnActivation::kSilu || c.query_scale > 0)
    fail("device ", name, ": ", c.arch, " needs what the device path does not have yet (sliding-window "
         "layers, per-layer RoPE bases, post-attention/post-FFN norms, GeGLU, embedding scaling, "
         "query_pre_attn_scalar, soft-capping); use device cpu");
  if (!attention_head_dim_supported(c.head_dim))
    fail("device ", name, ": the attention kernels take head_dim 64 or 128; this model has ",
         c.head_dim, " (use device cpu)");
  if (c.n_heads / c.n_kv_heads > kAttentionMaxQueryGroup)
    fail("device ", name, ": the decode kernel takes up to ", kAttentionMaxQueryGroup,
         " query heads per KV head; this model has ", c.n_heads / c.n_kv_heads, " (use device cpu)");
  DeviceExecutorConfig ec;
  ec.model = &model;
  ec.num_pages = static_cast<int>(store.stats().blocks_total);
  ec.page_size = store.config().block_size_tokens;
  ec.max_tokens = o.max_tokens;
  ec.dtype = o.device_dtype;
  ec.rope = &rope;
  std::unique_ptr<DeviceExecutor> exec =
      o.device == Device::kEmulated ? make_emulated_executor(ec) : make_cuda_executor(ec);
  return std::make_unique<DeviceBackend>(c, store, o.device_launch_rows, std::move(exec));
}

}  // namespace kvlab::engine_detail
