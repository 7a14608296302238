// Paged KV store (layout and rules in kv_store.h): sequences, forks, reservations, appends,
// KIVI group quantisation, the views readers get and the statistics. Eviction, compaction and
// page statistics: kv_store_evict.cpp.
#include "framework/kv/kv_store.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "framework/core/error.h"
#include "framework/kv/kv_store_tables.h"

namespace kvlab {

namespace {

KvBlockLayout checked_layout(const KvStoreConfig& c) {
  if (c.n_layers <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 || c.block_size_tokens <= 0)
    fail("KvStoreConfig: n_layers, n_kv_heads, head_dim and block_size_tokens must be positive (got ",
         c.n_layers, ", ", c.n_kv_heads, ", ", c.head_dim, ", ", c.block_size_tokens, ")");
  if (kv_format_has_head_scale(c.format) && !(c.fp8_scale > 0.f && std::isfinite(c.fp8_scale)))
    fail("KvStoreConfig: fp8_scale must be positive and finite (got ", c.fp8_scale, ")");
  if (c.values_alias_keys && kv_format_is_kivi(c.format))
    fail("KvStoreConfig: KV format ", kv_format_name(c.format), " cannot store values as aliases of the keys "
         "(MLA's latent cache): KIVI quantises keys per channel and values per token, so one stored row cannot be "
         "both; choose f32, f16, bf16, int8 or an fp8 format");
  if (kv_format_is_kivi(c.format)) {
    const int G = c.group_size, P = c.block_size_tokens, D = c.head_dim;
    if (G <= 0 || D % G != 0)
      fail("KvStoreConfig: group_size ", G, " must divide head_dim ", D, " (", kv_format_name(c.format), ")");
    if (P % G != 0 && G % P != 0)
      fail("KvStoreConfig: group_size ", G, " must divide or be a multiple of block_size ", P);
    if (D * kv_format_bits(c.format) % 8 != 0) fail("KvStoreConfig: head_dim ", D, " does not pack into bytes");
    if (c.residual < 0 || c.residual % G != 0)
      fail("KvStoreConfig: residual ", c.residual, " must be a non-negative multiple of group_size ", G);
  }
  if (c.per_head_tables && kv_format_is_kivi(c.format))
    fail("KvStoreConfig: per-head block tables cannot hold KV format ", kv_format_name(c.format),
         " (KIVI's quantised rows never move, so a head's holes are never compacted into fewer blocks); "
         "choose per-layer tables or another format");
  // A block holds every KV head of a page, or one head's rows with per-head tables.
  return {c.format, c.block_size_tokens, c.per_head_tables ? 1 : c.n_kv_heads, c.head_dim,
          kv_format_is_kivi(c.format) ? c.group_size : 32};
}

// Arenas a block occupies: K and V, or one when values alias keys.
size_t arenas(const KvStoreConfig& c) { return c.values_alias_keys ? 1 : 2; }

int64_t pool_blocks(const KvStoreConfig& c) {
  const size_t n = c.budget_bytes / kv_block_bytes(c) + (c.per_head_tables ? 1 : 0);  // + the hole block
  return static_cast<int64_t>(std::min<size_t>(n, (size_t{1} << 31) - 1));
}


}  // namespace

size_t kv_block_bytes(const KvStoreConfig& c) { return arenas(c) * checked_layout(c).block_bytes(); }

double kv_bytes_per_token(const KvStoreConfig& c) {
  const int tables = c.per_head_tables ? c.n_kv_heads : 1;
  return static_cast<double>(kv_block_bytes(c)) * tables * c.n_layers / c.block_size_tokens;
}

KvStore::KvStore(const KvStoreConfig& config)
    : config_(config),
      tables_(config.per_head_tables ? std::max(1, config.n_kv_heads) : 1),
      layout_(checked_layout(config)),
      block_bytes_(arenas(config) * layout_.block_bytes()),
      pool_(pool_blocks(config), layout_.block_bytes(), config.values_alias_keys) {
  if (config.per_head_tables) {
    hole_block_ = pool_.allocate();
    if (hole_block_ < 0) fail("KvStoreConfig: budget_bytes ", config.budget_bytes, " holds no block");
    std::memset(pool_.k(hole_block_), 0, layout_.block_bytes());
    if (!config.values_alias_keys) std::memset(pool_.v(hole_block_), 0, layout_.block_bytes());
  }
  if (kv_format_has_head_scale(config.format)) {
    k_head_scale_.assign(static_cast<size_t>(config.n_layers) * config.n_kv_heads, config.fp8_scale);
    v_head_scale_ = k_head_scale_;
  }
}

KvStore::~KvStore() = default;

size_t KvStore::row_offset(int entry, int kv_head) const { return layout_.row_offset(tables_ == 1 ? kv_head : 0, entry); }
size_t KvStore::meta_offset(int entry, int kv_head) const { return layout_.meta_offset(tables_ == 1 ? kv_head : 0, entry); }
int32_t& KvStore::entry(LayerTable& lc, int page, int kv_head) const {
  return lc.blocks[static_cast<size_t>(page) * tables_ + table_of(kv_head)];
}
int32_t KvStore::entry(const LayerTable& lc, int page, int kv_head) const {
  return lc.blocks[static_cast<size_t>(page) * tables_ + table_of(kv_head)];
}
int KvStore::n_table_pages(const LayerTable& lc) const { return static_cast<int>(lc.blocks.size()) / tables_; }

void KvStore::check_fp8_scales(const char* what, int layer, const float* k_scales, const float* v_scales) const {
  if (!kv_format_has_head_scale(config_.format))
    fail("KvStore::", what, ": the store's format is ", kv_format_name(config_.format), ", not fp8");
  if (layer < 0 || layer >= config_.n_layers)
    fail("KvStore::", what, ": layer ", layer, " out of range [0, ", config_.n_layers, ")");
  for (int h = 0; h < config_.n_kv_heads; ++h)
    if (!(k_scales[h] > 0.f && std::isfinite(k_scales[h]) && v_scales[h] > 0.f && std::isfinite(v_scales[h])))
      fail("KvStore::", what, ": layer ", layer, " kv_head ", h, ": scales must be positive and finite");
  if (config_.values_alias_keys)
    for (int h = 0; h < config_.n_kv_heads; ++h)
      if (k_scales[h] != v_scales[h])
        fail("KvStore::", what, ": layer ", layer, " kv_head ", h, ": values alias keys, so the K and V scales must "
             "be equal (got ", k_scales[h], " and ", v_scales[h], ")");
}

void KvStore::set_fp8_scales(int layer, const float* k_scales, const float* v_scales) {
  check_fp8_scales("set_fp8_scales", layer, k_scales, v_scales);
  if (stored_any_) fail("KvStore::set_fp8_scales: slots are already reserved (rows may be stored with the old scales)");
  const int H = config_.n_kv_heads;
  std::copy(k_scales, k_scales + H, k_head_scale_.begin() + static_cast<ptrdiff_t>(layer) * H);
  std::copy(v_scales, v_scales + H, v_head_scale_.begin() + static_cast<ptrdiff_t>(layer) * H);
  for (auto& [id, s] : seqs_) {  // sequences created before (none holds a row yet)
    s->layers[layer].k_scale.assign(k_scales, k_scales + H);
    s->layers[layer].v_scale.assign(v_scales, v_scales + H);
  }
}

void KvStore::set_sequence_fp8_scales(SeqId seq, int layer, const float* k_scales, const float* v_scales) {
  check_fp8_scales("set_sequence_fp8_scales", layer, k_scales, v_scales);
  LayerTable& lc = layer_at(seq, layer);
  if (lc.n_slots > 0)
    fail("KvStore::set_sequence_fp8_scales: sequence ", seq, " layer ", layer, " already holds ", lc.n_slots,
         " rows (stored with the old scales)");
  lc.k_scale.assign(k_scales, k_scales + config_.n_kv_heads);
  lc.v_scale.assign(v_scales, v_scales + config_.n_kv_heads);
}

// One row (codes and, for int8, its scale) of kv_head from (src_b, src_entry) to (dst_b,
// dst_entry), K and V: the row's values are unchanged (kv_format.h "Block layout").
void KvStore::move_row(int32_t dst_b, size_t dst_entry, int32_t src_b, size_t src_entry, int kv_head) {
  const int e0 = static_cast<int>(dst_entry), e1 = static_cast<int>(src_entry);
  const size_t rb = layout_.row_bytes();
  const bool alias = config_.values_alias_keys;  // V is K: one copy
  std::memcpy(pool_.k(dst_b) + row_offset(e0, kv_head), pool_.k(src_b) + row_offset(e1, kv_head), rb);
  if (!alias) std::memcpy(pool_.v(dst_b) + row_offset(e0, kv_head), pool_.v(src_b) + row_offset(e1, kv_head), rb);
  if (const int mb = kv_format_row_meta_bytes(layout_.format); mb > 0) {
    std::memcpy(pool_.k(dst_b) + meta_offset(e0, kv_head), pool_.k(src_b) + meta_offset(e1, kv_head), mb);
    if (!alias) std::memcpy(pool_.v(dst_b) + meta_offset(e0, kv_head), pool_.v(src_b) + meta_offset(e1, kv_head), mb);
  }
}

const KvStore::Sequence& KvStore::seq_at(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) fail("KvStore: unknown sequence ", seq);
  return *it->second;
}
KvStore::Sequence& KvStore::seq_at(SeqId seq) {
  return const_cast<Sequence&>(std::as_const(*this).seq_at(seq));
}
const KvStore::LayerTable& KvStore::layer_at(SeqId seq, int layer) const {
  const Sequence& s = seq_at(seq);
  if (layer < 0 || layer >= config_.n_layers)
    fail("KvStore: layer ", layer, " out of range [0, ", config_.n_layers, ")");
  return s.layers[layer];
}
KvStore::LayerTable& KvStore::layer_at(SeqId seq, int layer) {
  return const_cast<LayerTable&>(std::as_const(*this).layer_at(seq, layer));
}

void KvStore::refresh_view(LayerTable& lc) {
  const int bs = config_.block_size_tokens;
  const int used = static_cast<int>(ceil_div(lc.n_slots, bs));
  lc.indptr[0] = 0;
  lc.indptr[1] = used;
  lc.last_page_len = used == 0 ? 0 : lc.n_slots - (used - 1) * bs;
}

SeqId KvStore::create_sequence() {
  auto s = std::make_unique<Sequence>();
  s->layers.resize(config_.n_layers);
  for (size_t l = 0; l < s->layers.size(); ++l) {
    s->layers[l].layer = static_cast<int>(l);
    s->layers[l].live.assign(config_.n_kv_heads, 0);
    if (!k_head_scale_.empty()) {
      const auto first = k_head_scale_.begin() + static_cast<ptrdiff_t>(l) * config_.n_kv_heads;
      s->layers[l].k_scale.assign(first, first + config_.n_kv_heads);
      const auto vfirst = v_head_scale_.begin() + static_cast<ptrdiff_t>(l) * config_.n_kv_heads;
      s->layers[l].v_scale.assign(vfirst, vfirst + config_.n_kv_heads);
    }
  }
  const SeqId id = next_id_++;
  seqs_.emplace(id, std::move(s));
  return id;
}

void KvStore::free_sequence(SeqId seq) {
  Sequence& s = seq_at(seq);
  for (LayerTable& lc : s.layers)
    for (int32_t b : lc.blocks) pool_.release(b);
  seqs_.erase(seq);
}

SeqId KvStore::fork(SeqId parent) {
  const Sequence& p = seq_at(parent);
  for (const LayerTable& lc : p.layers)
    if (lc.pending != 0)
      fail("KvStore::fork: sequence ", parent, " has reserved slots not yet appended");
  const SeqId child = create_sequence();
  Sequence& c = *seqs_.at(child);
  const int bs = config_.block_size_tokens;
  for (int l = 0; l < config_.n_layers; ++l) {
    const LayerTable& src = p.layers[l];
    LayerTable& dst = c.layers[l];
    const int used = static_cast<int>(ceil_div(src.n_slots, bs));
    dst.blocks.assign(src.blocks.begin(), src.blocks.begin() + static_cast<ptrdiff_t>(used) * tables_);
    for (int32_t b : dst.blocks) pool_.retain(b);
    dst.n_slots = src.n_slots;
    dst.k_scale = src.k_scale;  // the shared rows were stored with them
    dst.v_scale = src.v_scale;
    dst.positions = src.positions;
    dst.valid = src.valid;
    dst.live = src.live;
    dst.rescan_blocks = src.rescan_blocks;
    dst.page_stats = src.page_stats;
    dst.key_max = src.key_max;
    dst.key_min = src.key_min;
    dst.q_slots = src.q_slots;
    dst.res_k = src.res_k;
    dst.res_v = src.res_v;
    refresh_view(dst);
  }
  return child;
}

int64_t KvStore::write_begin(const LayerTable& lc) const {
  // KIVI writes codes into the groups it quantises, from q_slots on.
  return kv_format_is_kivi(layout_.format) ? lc.q_slots : lc.n_slots + lc.pending;
}

int64_t KvStore::layer_blocks_needed(const LayerTable& lc, int n_new) const {
  const int bs = config_.block_size_tokens;
  const int64_t cursor = lc.n_slots + lc.pending;  // next slot to be written
  const int64_t have = n_table_pages(lc);
  const int64_t fresh = std::max<int64_t>(0, ceil_div(cursor + n_new, bs) - have) * tables_;
  int64_t copies = 0;  // shared blocks (the hole block among them) that the new slots would write into
  for (int64_t b = write_begin(lc) / bs; b < have && b * bs < cursor + n_new; ++b)
    for (int t = 0; t < tables_; ++t)
      if (pool_.ref_count(lc.blocks[static_cast<size_t>(b) * tables_ + t]) > 1) ++copies;
  return fresh + copies;
}

int64_t KvStore::blocks_needed(SeqId seq, int n_new) const {
  if (n_new < 0) fail("KvStore::blocks_needed: n_new = ", n_new);
  int64_t total = 0;
  for (const LayerTable& lc : seq_at(seq).layers) total += layer_blocks_needed(lc, n_new);
  return total;
}

void KvStore::copy_block(int32_t dst, int32_t src) {
  std::memcpy(pool_.k(dst), pool_.k(src), layout_.block_bytes());
  if (!config_.values_alias_keys) std::memcpy(pool_.v(dst), pool_.v(src), layout_.block_bytes());
}

AllocStatus KvStore::reserve(SeqId seq, int n_new) {
  if (n_new < 0) fail("KvStore::reserve: n_new = ", n_new);
  Sequence& s = seq_at(seq);
  if (n_new == 0) return AllocStatus::kOk;
  const int bs = config_.block_size_tokens;
  int64_t total = 0;
  for (const LayerTable& lc : s.layers) {
    const int64_t cap = static_cast<int64_t>(lc.n_slots) + lc.pending + n_new;
    if (cap > INT32_MAX - bs) fail("KvStore::reserve: more than 2^31 slots in one layer");
    total += layer_blocks_needed(lc, n_new);
  }
  if (total > pool_.n_free()) return AllocStatus::kOutOfBlocks;
  stored_any_ = true;  // here, not in append: appends to different sequences may run concurrently
  for (LayerTable& lc : s.layers) {
    const int64_t cursor = lc.n_slots + lc.pending;
    const int64_t have = n_table_pages(lc);
    for (int64_t b = write_begin(lc) / bs; b < have && b * bs < cursor + n_new; ++b) {
      for (int t = 0; t < tables_; ++t) {
        int32_t& e = lc.blocks[static_cast<size_t>(b) * tables_ + t];
        const int32_t old = e;
        if (pool_.ref_count(old) <= 1) continue;
        const int32_t fresh = pool_.allocate();
        KVLAB_CHECK(fresh >= 0);
        copy_block(fresh, old);
        ++lc.data_version;
        pool_.release(old);
        e = fresh;
      }
    }
    while (static_cast<int64_t>(n_table_pages(lc)) * bs < cursor + n_new) {
      for (int t = 0; t < tables_; ++t) {
        const int32_t fresh = pool_.allocate();
        KVLAB_CHECK(fresh >= 0);
        lc.blocks.push_back(fresh);
      }
    }
    lc.pending += n_new;
  }
  return AllocStatus::kOk;
}

int KvStore::append(SeqId seq, int layer, int64_t position, const float* k, const float* v) {
  if (config_.values_alias_keys) v = k;  // the value row is the key row (one arena)
  LayerTable& lc = layer_at(seq, layer);
  if (lc.pending <= 0)
    fail("KvStore::append: sequence ", seq, " layer ", layer, " has no reserved slot (call reserve)");
  const int bs = config_.block_size_tokens;
  const int slot = lc.n_slots;
  const int H = config_.n_kv_heads, D = config_.head_dim;
  for (int t = 0; t < tables_; ++t)
    KVLAB_CHECK(pool_.ref_count(entry(lc, slot / bs, t)) == 1, "append into a shared block");
  // Order contract (policy.h): positions increase with the slot.
  if (slot > 0)
    for (int h = 0; h < H; ++h)
      if (position <= lc.positions[static_cast<size_t>(slot - 1) * H + h])
        fail("KvStore::append: sequence ", seq, " layer ", layer, ": position ", position,
             " does not follow position ", lc.positions[static_cast<size_t>(slot - 1) * H + h]);
  const KvFormat fmt = layout_.format;
  const size_t rb = layout_.row_bytes();
  // Other formats: every head's rows are encoded (and checked) before anything changes;
  // per-thread buffers, as concurrent appends to different sequences are allowed.
  thread_local std::vector<uint8_t> enc;     // [2 (K, V), H, row_bytes]
  thread_local std::vector<float> enc_scale; // [2, H] int8 row scales
  thread_local std::vector<float> dec;       // [D] a decoded key (page statistics)
  if (kv_format_is_kivi(fmt)) {
    for (int h = 0; h < H; ++h)
      if (!kv_row_storable(fmt, k + static_cast<size_t>(h) * D, D) || !kv_row_storable(fmt, v + static_cast<size_t>(h) * D, D))
        fail("KvStore::append: sequence ", seq, " layer ", layer, " kv_head ", h, " position ", position,
             ": a NaN or infinite feature cannot be stored as ", kv_format_name(fmt));
  } else if (fmt != KvFormat::kF32) {
    enc.resize(2 * static_cast<size_t>(H) * rb);
    enc_scale.assign(2 * static_cast<size_t>(H), 1.f);
    dec.resize(D);
    for (int h = 0; h < H; ++h) {
      const float hs_k = lc.k_scale.empty() ? 1.f : lc.k_scale[h];
      const float hs_v = lc.v_scale.empty() ? 1.f : lc.v_scale[h];
      if (!kv_encode_row(fmt, k + static_cast<size_t>(h) * D, D, hs_k, enc.data() + h * rb, &enc_scale[h]) ||
          !kv_encode_row(fmt, v + static_cast<size_t>(h) * D, D, hs_v, enc.data() + (H + h) * rb, &enc_scale[H + h]))
        fail("KvStore::append: sequence ", seq, " layer ", layer, " kv_head ", h, " position ", position,
             ": a NaN", fmt == KvFormat::kBf16 || fmt == KvFormat::kF16 ? "" : " or infinite",
             " feature cannot be stored as ", kv_format_name(fmt));
    }
  }
  if (lc.page_stats && slot % bs == 0) {  // a new page: the empty bounds
    lc.key_max.resize(lc.key_max.size() + static_cast<size_t>(H) * D, -std::numeric_limits<float>::infinity());
    lc.key_min.resize(lc.key_min.size() + static_cast<size_t>(H) * D, std::numeric_limits<float>::infinity());
  }
  for (int h = 0; h < H; ++h) {
    const float* key = k + static_cast<size_t>(h) * D;  // as stored: f32's row, else decoded
    uint8_t* kb = pool_.k(entry(lc, slot / bs, h));
    uint8_t* vb = pool_.v(entry(lc, slot / bs, h));
    if (kv_format_is_kivi(fmt)) {
      lc.res_k.insert(lc.res_k.end(), k + static_cast<size_t>(h) * D, k + static_cast<size_t>(h + 1) * D);
      lc.res_v.insert(lc.res_v.end(), v + static_cast<size_t>(h) * D, v + static_cast<size_t>(h + 1) * D);
    } else if (fmt == KvFormat::kF32) {
      std::memcpy(kb + row_offset(slot % bs, h), k + static_cast<size_t>(h) * D, sizeof(float) * D);
      std::memcpy(vb + row_offset(slot % bs, h), v + static_cast<size_t>(h) * D, sizeof(float) * D);
    } else {
      std::memcpy(kb + row_offset(slot % bs, h), enc.data() + h * rb, rb);
      std::memcpy(vb + row_offset(slot % bs, h), enc.data() + (H + h) * rb, rb);
      if (fmt == KvFormat::kInt8) {
        std::memcpy(kb + meta_offset(slot % bs, h), &enc_scale[h], 4);
        std::memcpy(vb + meta_offset(slot % bs, h), &enc_scale[H + h], 4);
      }
      if (lc.page_stats) {
        const float hs = fmt == KvFormat::kInt8 ? enc_scale[h]
                         : lc.k_scale.empty() ? 1.f : lc.k_scale[h];
        kv_decode_row(fmt, enc.data() + h * rb, D, hs, dec.data());
        key = dec.data();
      }
    }
    if (lc.page_stats) {  // widen the page's bounds by the new key
      const size_t o = (static_cast<size_t>(slot / bs) * H + h) * D;
      for (int d = 0; d < D; ++d) {
        lc.key_max[o + d] = std::max(lc.key_max[o + d], key[d]);
        lc.key_min[o + d] = std::min(lc.key_min[o + d], key[d]);
      }
    }
    lc.positions.push_back(position);
    lc.valid.push_back(1);
    ++lc.live[h];
  }
  ++lc.n_slots;
  --lc.pending;
  if (kv_format_is_kivi(fmt))
    while (lc.n_slots - lc.q_slots >= config_.residual + config_.group_size) quantise_group(lc);
  refresh_view(lc);
  return slot;
}

void KvStore::quantise_group(LayerTable& lc) {
  const int H = config_.n_kv_heads, D = config_.head_dim, bs = config_.block_size_tokens;
  const int G = config_.group_size, bits = kv_format_bits(layout_.format);
  const int q = lc.q_slots;
  const size_t row = static_cast<size_t>(H) * D;  // residual floats per slot
  std::vector<float> s(D), z(D), sz(static_cast<size_t>(2 * (D / G)));
  std::vector<uint8_t> live(G);
  KVLAB_CHECK(tables_ == 1, "KIVI with per-head block tables");  // refused by checked_layout
  for (int b = q / bs; b * bs < q + G; ++b) KVLAB_CHECK(pool_.ref_count(lc.blocks[b]) == 1, "quantising into a shared block");
  for (int h = 0; h < H; ++h) {
    for (int i = 0; i < G; ++i) live[i] = lc.valid[static_cast<size_t>(q + i) * H + h];
    const float* k0 = lc.res_k.data() + static_cast<size_t>(h) * D;  // slot q's key of head h
    for (int d = 0; d < D; ++d)
      KVLAB_CHECK(kv_kivi_range(k0 + d, G, row, live.data(), bits, &s[d], &z[d]), "key range overflows float32");
    // The group's (s, z) into every block it covers (one block when G <= block size).
    for (int b = q / bs; b * bs < q + G; ++b) {
      uint8_t* meta = pool_.k(lc.blocks[b]) + layout_.key_group_meta_offset(h, std::max(q, b * bs) % bs);
      std::memcpy(meta, s.data(), sizeof(float) * D);
      std::memcpy(meta + sizeof(float) * D, z.data(), sizeof(float) * D);
    }
    for (int i = 0; i < G; ++i) {
      const int slot = q + i;
      const int32_t blk = lc.blocks[slot / bs];
      uint8_t* kc = pool_.k(blk) + row_offset(slot % bs, h);
      uint8_t* vc = pool_.v(blk) + row_offset(slot % bs, h);
      std::memset(kc, 0, layout_.row_bytes());
      std::memset(vc, 0, layout_.row_bytes());
      kv_kivi_encode_key(k0 + i * row, D, bits, s.data(), z.data(), kc);
      KVLAB_CHECK(kv_kivi_encode_value(lc.res_v.data() + i * row + static_cast<size_t>(h) * D, D, G, bits, sz.data(), vc),
                  "value range overflows float32");
      std::memcpy(pool_.v(blk) + layout_.value_meta_offset(h, slot % bs), sz.data(), sizeof(float) * sz.size());
    }
  }
  lc.res_k.erase(lc.res_k.begin(), lc.res_k.begin() + static_cast<ptrdiff_t>(G * row));
  lc.res_v.erase(lc.res_v.begin(), lc.res_v.begin() + static_cast<ptrdiff_t>(G * row));
  lc.q_slots = q + G;
  ++lc.data_version;  // rows of these blocks changed in place
  if (lc.page_stats)  // the group's keys now read as their dequantised values
    for (int p = q / bs; p * bs < q + G; ++p) recompute_page(lc, p);
}

void KvStore::decode_key(const LayerTable& lc, int slot, int h, float* out) const {
  const int bs = config_.block_size_tokens, D = config_.head_dim;
  const uint8_t* kb = pool_.k(entry(lc, slot / bs, h));
  const int e = slot % bs;
  if (kv_format_is_kivi(layout_.format)) {
    if (slot >= lc.q_slots) {
      std::memcpy(out, lc.res_k.data() + (static_cast<size_t>(slot - lc.q_slots) * config_.n_kv_heads + h) * D,
                  sizeof(float) * D);
      return;
    }
    const float* meta = reinterpret_cast<const float*>(kb + layout_.key_group_meta_offset(h, e));
    kv_kivi_decode_key(kb + row_offset(e, h), D, kv_format_bits(layout_.format), meta, meta + D, out);
    return;
  }
  float scale = 1.f;
  if (layout_.format == KvFormat::kInt8) std::memcpy(&scale, kb + meta_offset(e, h), 4);
  else if (!lc.k_scale.empty()) scale = lc.k_scale[h];
  kv_decode_row(layout_.format, kb + row_offset(e, h), D, scale, out);
}

LayerKv KvStore::layer(SeqId seq, int layer) const {
  const LayerTable& lc = layer_at(seq, layer);
  LayerKv kv;
  kv.view.page_size = config_.block_size_tokens;
  kv.view.num_kv_heads = config_.n_kv_heads;
  kv.view.head_dim = config_.head_dim;
  const bool f32 = layout_.format == KvFormat::kF32;
  kv.view.k_data = f32 ? reinterpret_cast<const float*>(pool_.k_base()) : nullptr;
  kv.view.v_data = f32 ? reinterpret_cast<const float*>(pool_.v_base()) : nullptr;
  kv.layout = layout_;
  kv.k_bytes = pool_.k_base();
  kv.v_bytes = pool_.v_base();
  kv.kivi_q_slots = lc.q_slots;
  kv.res_k = lc.res_k.data();
  kv.res_v = lc.res_v.data();
  if (!lc.k_scale.empty()) {
    kv.k_head_scale = lc.k_scale.data();
    kv.v_head_scale = lc.v_scale.data();
  }
  kv.view.indptr = lc.indptr;
  kv.view.indices = lc.blocks.data();
  kv.view.table_heads = tables_;
  kv.view.last_page_len = &lc.last_page_len;
  kv.n_slots = lc.n_slots;
  kv.positions = lc.positions.data();
  kv.valid = lc.valid.data();
  if (lc.page_stats) {
    kv.page_key_max = lc.key_max.data();
    kv.page_key_min = lc.key_min.data();
  }
  return kv;
}


KvStats KvStore::stats() const {
  const int H = config_.n_kv_heads, bs = config_.block_size_tokens;
  const int hb = H / tables_;  // KV heads per block
  const int64_t hole = hole_block_ >= 0 ? 1 : 0;  // the hole block: in blocks_total only
  KvStats st;
  st.blocks_total = pool_.n_blocks();
  st.blocks_in_use = pool_.n_in_use() - hole;
  st.blocks_peak = pool_.peak_in_use() - hole;
  st.bytes_in_use = static_cast<size_t>(st.blocks_in_use) * block_bytes_;
  st.bytes_peak = static_cast<size_t>(st.blocks_peak) * block_bytes_;
  st.slots_allocated = st.blocks_in_use * bs * hb / H;  // cells / n_kv_heads
  int64_t live_cells = 0;
  for (const auto& [id, s] : seqs_)
    for (const LayerTable& lc : s->layers)
      for (int64_t n : lc.live) live_cells += n;
  if (pool_.n_shared() > 0) {
    // A cell of a shared block counts once: live if any sequence holding the block has it
    // live. Only the shared blocks' cells are rescanned (the hole block's are never live).
    std::unordered_map<int32_t, std::vector<uint8_t>> shared_live;  // block -> [bs * hb]
    for (const auto& [id, s] : seqs_) {
      for (const LayerTable& lc : s->layers) {
        const int used = static_cast<int>(ceil_div(lc.n_slots, bs));
        for (int b = 0; b < used; ++b) {
          for (int t = 0; t < tables_; ++t) {
            const int32_t blk = lc.blocks[static_cast<size_t>(b) * tables_ + t];
            if (pool_.ref_count(blk) < 2 || blk == hole_block_) continue;
            std::vector<uint8_t>& cells = shared_live[blk];
            cells.resize(static_cast<size_t>(bs) * hb, 0);
            for (int slot = b * bs; slot < std::min(lc.n_slots, (b + 1) * bs); ++slot)
              for (int i = 0; i < hb; ++i)
                if (lc.valid[static_cast<size_t>(slot) * H + t * hb + i]) {
                  --live_cells;
                  cells[static_cast<size_t>(slot % bs) * hb + i] = 1;
                }
          }
        }
      }
    }
    for (const auto& [block, cells] : shared_live)
      for (uint8_t x : cells) live_cells += x;
  }
  st.slots_valid = live_cells / H;
  const int64_t alloc_cells = st.blocks_in_use * bs * hb;
  st.waste_fraction = alloc_cells == 0 ? 0.0 : 1.0 - static_cast<double>(live_cells) / alloc_cells;
  return st;
}

int64_t KvStore::resident_tokens(SeqId seq, int layer, int kv_head) const {
  const LayerTable& lc = layer_at(seq, layer);
  if (kv_head < 0 || kv_head >= config_.n_kv_heads)
    fail("KvStore::resident_tokens: kv_head ", kv_head, " out of range");
  return lc.live[kv_head];
}

size_t KvStore::residual_bytes(SeqId seq) const {
  size_t n = 0;
  for (const LayerTable& lc : seq_at(seq).layers) n += (lc.res_k.size() + lc.res_v.size()) * sizeof(float);
  return n;
}

int KvStore::n_slots(SeqId seq, int layer) const { return layer_at(seq, layer).n_slots; }

int64_t KvStore::sequence_blocks(SeqId seq) const {
  int64_t n = 0;
  for (const LayerTable& lc : seq_at(seq).layers)
    for (int32_t b : lc.blocks) n += b != hole_block_ ? 1 : 0;
  return n;
}

size_t KvStore::head_bytes(SeqId seq, int layer, int kv_head) const {
  return static_cast<size_t>(head_blocks(seq, layer, kv_head)) * block_bytes_ / (config_.n_kv_heads / tables_);
}

int64_t KvStore::head_blocks(SeqId seq, int layer, int kv_head) const {
  const LayerTable& lc = layer_at(seq, layer);
  if (kv_head < 0 || kv_head >= config_.n_kv_heads)
    fail("KvStore::head_blocks: kv_head ", kv_head, " out of range [0, ", config_.n_kv_heads, ")");
  int64_t n = 0;
  for (int p = 0; p < n_table_pages(lc); ++p) n += entry(lc, p, kv_head) != hole_block_ ? 1 : 0;
  return n;
}

int64_t KvStore::layout_version(SeqId seq, int layer) const { return layer_at(seq, layer).version; }

int64_t KvStore::data_version(SeqId seq, int layer) const { return layer_at(seq, layer).data_version; }

}  // namespace kvlab
