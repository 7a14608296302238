// The host side of the device forward pass (device_forward.h): RoPE positions per row, the
// policies' phases through the Engine, keeping the device pages a mirror of the host blocks, and
// the attention launch plans. The device work itself is a DeviceExecutor.
//
// Keeping the device pages equal to the host blocks (block b = page b), per (sequence, layer):
//   * new rows: appended on the device from the same fp32 k, v the host store appended;
//   * KvStore::data_version changed (compaction moved rows, copy-on-write replaced a block):
//     every page of the layer's table is re-uploaded from the host copy;
//   * the policy evicted (holes; emptied blocks leave the table): the page metadata (positions,
//     -1 = hole) is re-uploaded; the block tables themselves go with every launch;
//   * rope-at-read policies: the pages' cache ranks are re-uploaded every step (they shift).
// A new sequence starts with a full upload; end_sequence forgets it (its blocks may be reused).
#include "framework/engine/device_forward.h"

#include <algorithm>
#include <climits>
#include <map>
#include <vector>

#include "framework/core/error.h"
#include "framework/engine/device_executor.h"
#include "framework/engine/device_plan.h"
#include "kernels/common/attention_limits.h"

namespace kvlab {
namespace {

using engine_detail::Group;

constexpr int kMaxGridDim = 65535;  // CUDA's limit on grid y and z

class PlannedForward final : public DeviceForward {
 public:
  PlannedForward(Engine& engine, std::unique_ptr<DeviceExecutor> exec)
      : e_(engine), c_(model(engine).config), exec_(std::move(exec)) {}

  void forward(std::span<Group> groups, std::span<const int32_t> tokens,
               std::span<const int> logit_rows, float* logits) override;
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

  Engine& e_;
  const ModelConfig& c_;
  std::unique_ptr<DeviceExecutor> exec_;
  std::map<std::pair<SeqId, int>, Mirror> mirror_;
  std::vector<float> hq_, hk_, hv_, hatt_;  // host copies of the call's rows
};

void PlannedForward::forward(std::span<Group> groups, std::span<const int32_t> tokens,
                             std::span<const int> logit_rows, float* logits) {
  const int n = static_cast<int>(tokens.size());
  const int qd = c_.n_heads * c_.head_dim, kvd = c_.n_kv_heads * c_.head_dim;
  hq_.resize(size_t(n) * qd), hatt_.resize(size_t(n) * qd);
  hk_.resize(size_t(n) * kvd), hv_.resize(size_t(n) * kvd);
  exec_->begin_call(tokens);

  // RoPE positions of the rows: the text position, or -1 (left raw: the query is rotated on the
  // host at its cache rank, keys at read time) for policies with rope_at_cache_position.
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

  std::vector<Group*> decode_plain, decode_rope_at_read;
  for (Group& g : groups)
    if (g.decode) (g.seq->needs.rope_at_cache_position ? decode_rope_at_read : decode_plain).push_back(&g);

  for (int l = 0; l < c_.n_layers; ++l) {
    exec_->qkv(l, rope_pos);
    // host: append to the store, the policies' selections
    exec_->read_kv(hk_.data(), hv_.data());
    if (q_to_host) exec_->read_q(hq_.data());
    for (Group& g : groups)
      begin_attention(e_, g, l, hq_.data() + size_t(g.row0) * qd, hk_.data() + size_t(g.row0) * kvd,
                      hv_.data() + size_t(g.row0) * kvd);
    if (q_back)  // queries rotated to their cache rank on the host
      for (const Group& g : groups)
        if (g.seq->needs.rope_at_cache_position)
          exec_->write_q_rows(g.row0, g.n_rows, hq_.data() + size_t(g.row0) * qd);
    // device: pages, then attention
    exec_->update_pages(plan_pages(groups, l));
    if (!decode_plain.empty()) run_decode(decode_plain, l, false);
    if (!decode_rope_at_read.empty()) run_decode(decode_rope_at_read, l, true);
    for (Group& g : groups)
      if (!g.decode) run_prefill(g, l);
    // host: statistics, probes, the policies' observations and evictions
    if (att_to_host) exec_->read_attention(hatt_.data());
    for (Group& g : groups)
      if (end_attention(e_, g, l, hatt_.data() + size_t(g.row0) * qd)) mirror_[{g.seq->id, l}].meta_stale = true;
    exec_->finish_layer(l);
  }
  // logits, one run of consecutive rows at a time (one run in practice)
  for (size_t i = 0; i < logit_rows.size();) {
    size_t j = i + 1;
    while (j < logit_rows.size() && logit_rows[j] == logit_rows[j - 1] + 1) ++j;
    exec_->logits(logit_rows[i], static_cast<int>(j - i), logits + i * size_t(c_.vocab_size));
    i = j;
  }
}

// The page uploads that bring every group's (sequence, layer) up to the host store (see the file
// comment), and the append of this call's rows (row i of the call = row i of k and v).
PageUpdate PlannedForward::plan_pages(std::span<Group> groups, int layer) {
  KvStore& st = store(e_);
  PageUpdate u;
  int row = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    Group& g = groups[i];
    KVLAB_CHECK(g.row0 == row, "device forward: the groups' rows are not consecutive");
    row += g.n_rows;
    const SeqId id = g.seq->id;
    const LayerKv kv = st.layer(id, layer);
    Mirror& m = mirror_[{id, layer}];
    const int64_t dv = st.data_version(id, layer);
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
void PlannedForward::run_decode(std::span<Group* const> members, int layer, bool rope_at_read) {
  KvStore& st = store(e_);
  const int nkv = c_.n_kv_heads;
  const int max_requests = std::max(1, std::min(options(e_).device_launch_rows, kMaxGridDim / nkv));
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
      const LayerKv kv = st.layer(g->seq->id, layer);
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
void PlannedForward::run_prefill(Group& g, int layer) {
  const PolicyNeeds& needs = g.seq->needs;
  const bool masked = needs.prefill_mask.has_value();
  if (!exec_->has_prefill_kernel() || needs.key_attention_mass || (!masked && !rows_share_lists(g.seq->selection))) {
    Group* one = &g;
    run_decode(std::span<Group* const>(&one, 1), layer, needs.rope_at_cache_position);
    return;
  }
  const LayerKv kv = store(e_).layer(g.seq->id, layer);
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

std::unique_ptr<DeviceForward> DeviceForward::create(Engine& engine) {
  const EngineOptions& o = options(engine);
  const ModelConfig& c = model(engine).config;
  const KvStore& st = store(engine);
  if (o.device == "cuda" && !cuda_device_available())
    fail("device cuda: ", cuda_device_summary(), "; use device cpu");
  if (o.device_launch_rows <= 0) fail("device ", o.device, ": device_launch_rows must be > 0");
  if (o.device_dtype != "bf16" && o.device_dtype != "f32")
    fail("device ", o.device, ": device dtype must be bf16 or f32, got '", o.device_dtype, "'");
  if (!attention_head_dim_supported(c.head_dim))
    fail("device ", o.device, ": the attention kernels take head_dim 64 or 128; this model has ",
         c.head_dim, " (use device cpu)");
  if (c.n_heads / c.n_kv_heads > kAttentionMaxQueryGroup)
    fail("device ", o.device, ": the decode kernel takes up to ", kAttentionMaxQueryGroup,
         " query heads per KV head; this model has ", c.n_heads / c.n_kv_heads, " (use device cpu)");
  DeviceExecutorConfig ec;
  ec.model = &model(engine);
  ec.num_pages = static_cast<int>(st.stats().blocks_total);
  ec.page_size = st.config().block_size_tokens;
  ec.max_tokens = o.max_tokens;
  ec.dtype = o.device_dtype;
  ec.rope_inv_freq = model_rope_inv_freq(c);
  ec.cache_rope = &cache_rope(engine);
  std::unique_ptr<DeviceExecutor> exec =
      o.device == "emulated" ? make_emulated_executor(ec) : make_cuda_executor(ec);
  return std::make_unique<PlannedForward>(engine, std::move(exec));
}

}  // namespace kvlab
