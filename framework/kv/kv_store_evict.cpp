// Paged KV store: eviction (holes, removal of emptied blocks, compaction of shared or sparse
// tables) and the per-page key bounds (layout and rules in kv_store.h).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "framework/core/error.h"
#include "framework/kv/kv_store.h"
#include "framework/kv/kv_store_tables.h"

namespace kvlab {

void KvStore::evict(SeqId seq, int layer, const Evictions& ev) {
  LayerTable& lc = layer_at(seq, layer);
  const int H = config_.n_kv_heads, bs = config_.block_size_tokens;
  if (ev.slots.empty()) return;
  if (static_cast<int>(ev.slots.size()) != H)
    fail("KvStore::evict: Evictions has ", ev.slots.size(), " head lists, expected ", H);
  // Validate everything first: nothing changes on error.
  std::vector<int32_t> sorted;
  for (int h = 0; h < H; ++h) {
    sorted.assign(ev.slots[h].begin(), ev.slots[h].end());
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
      const int32_t s = sorted[i];
      if (s < 0 || s >= lc.n_slots)
        fail("KvStore::evict: slot ", s, " out of range [0, ", lc.n_slots, ") for kv_head ", h);
      if (!lc.valid[static_cast<size_t>(s) * H + h] || (i > 0 && sorted[i - 1] == s))
        fail("KvStore::evict: slot ", s, " of kv_head ", h, " is already evicted (or listed twice)");
    }
  }
  std::vector<int32_t> touched;
  for (int h = 0; h < H; ++h) {
    for (int32_t s : ev.slots[h]) {
      lc.valid[static_cast<size_t>(s) * H + h] = 0;
      --lc.live[h];
      touched.push_back(s / bs);
    }
  }
  if (lc.pending > 0) {
    // Reserved slots not yet appended: keep every slot where it is (the reservation may rely on
    // the blocks), only mark holes; the next eviction without pending slots scans every block.
    lc.rescan_blocks = true;
    if (lc.page_stats) {
      std::sort(touched.begin(), touched.end());
      touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
      for (int32_t b : touched) recompute_page(lc, b);
    }
    refresh_view(lc);
    return;
  }
  if (lc.rescan_blocks) {
    touched.resize(ceil_div(lc.n_slots, bs));
    for (size_t b = 0; b < touched.size(); ++b) touched[b] = static_cast<int32_t>(b);
    lc.rescan_blocks = false;
  }
  const int64_t version_before = lc.version;
  remove_empty_blocks(lc, touched);  // sorts and dedups `touched`
  const int compacted_from = maybe_compact(lc);
  trim_trailing_blocks(lc);
  if (tables_ > 1) {
    // Per-head tables: a head's block of a page left with only holes of that head goes back.
    // After a renumbering (removed pages, compaction) every page from the first changed one.
    const int used = static_cast<int>(ceil_div(lc.n_slots, bs));
    if (lc.version != version_before) {
      const int first_touched = touched.empty() ? used : touched.front();
      release_hole_entries(lc, std::min(first_touched, compacted_from), used);
    } else {
      for (int32_t b : touched)
        if (b < used) release_hole_entries(lc, b, b + 1);
    }
  }
  if (lc.page_stats) {
    // Pages before the first touched one keep their cells and numbers (only touched blocks are
    // removed, compaction moves rows from compacted_from on); after a renumbering every later
    // page is recomputed, else only the touched pages that remain.
    const int first_touched = touched.empty() ? INT32_MAX : touched.front();
    if (lc.version != version_before) {
      refresh_page_stats(lc, std::min(first_touched, compacted_from));
    } else {
      refresh_page_stats(lc, INT32_MAX);  // resize only (a trailing emptied page is dropped)
      const int used = static_cast<int>(ceil_div(lc.n_slots, bs));
      for (int32_t b : touched)
        if (b < used) recompute_page(lc, b);
    }
  }
  refresh_view(lc);
}

void KvStore::recompute_page(LayerTable& lc, int page) {
  const int H = config_.n_kv_heads, bs = config_.block_size_tokens, D = config_.head_dim;
  const int first = page * bs, last = std::min(lc.n_slots, first + bs);
  thread_local std::vector<float> dec;  // a decoded key (formats other than f32)
  dec.resize(D);
  for (int h = 0; h < H; ++h) {
    const uint8_t* kb = pool_.k(entry(lc, page, h));
    float* mx = lc.key_max.data() + (static_cast<size_t>(page) * H + h) * D;
    float* mn = lc.key_min.data() + (static_cast<size_t>(page) * H + h) * D;
    std::fill(mx, mx + D, -std::numeric_limits<float>::infinity());
    std::fill(mn, mn + D, std::numeric_limits<float>::infinity());
    for (int s = first; s < last; ++s) {
      if (!lc.valid[static_cast<size_t>(s) * H + h]) continue;
      const float* key = reinterpret_cast<const float*>(kb + row_offset(s - first, h));
      if (layout_.format != KvFormat::kF32) {
        decode_key(lc, s, h, dec.data());
        key = dec.data();
      }
      for (int d = 0; d < D; ++d) {
        mx[d] = std::max(mx[d], key[d]);
        mn[d] = std::min(mn[d], key[d]);
      }
    }
  }
}

void KvStore::refresh_page_stats(LayerTable& lc, int from_page) {
  if (!lc.page_stats) return;
  const int used = static_cast<int>(ceil_div(lc.n_slots, config_.block_size_tokens));
  const size_t n = static_cast<size_t>(used) * config_.n_kv_heads * config_.head_dim;
  lc.key_max.resize(n);
  lc.key_min.resize(n);
  for (int p = std::max(0, from_page); p < used; ++p) recompute_page(lc, p);
}

void KvStore::set_page_stats(SeqId seq, bool on) {
  for (LayerTable& lc : seq_at(seq).layers) {
    if (lc.page_stats == on) continue;
    lc.page_stats = on;
    lc.key_max.clear();
    lc.key_min.clear();
    refresh_page_stats(lc, 0);
  }
}

bool KvStore::page_stats(SeqId seq) const {
  const Sequence& s = seq_at(seq);
  return !s.layers.empty() && s.layers[0].page_stats;
}

void KvStore::remove_empty_blocks(LayerTable& lc, std::vector<int32_t>& touched) {
  const int H = config_.n_kv_heads, bs = config_.block_size_tokens;
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  bool renumbered = false;
  // Descending, so erasing block b leaves the indices of smaller touched blocks intact.
  for (auto it = touched.rbegin(); it != touched.rend(); ++it) {
    const int b = *it;
    const int first = b * bs, last = std::min(lc.n_slots, first + bs);
    const auto row0 = lc.valid.begin() + static_cast<ptrdiff_t>(first) * H;
    const auto row1 = lc.valid.begin() + static_cast<ptrdiff_t>(last) * H;
    if (std::find(row0, row1, uint8_t{1}) != row1) continue;  // still holds a live cell
    if (kv_format_is_kivi(layout_.format)) {  // its residual rows go, q moves down past its codes
      const size_t row = static_cast<size_t>(H) * config_.head_dim;
      const int r0 = std::max(first, lc.q_slots);
      if (r0 < last) {
        lc.res_k.erase(lc.res_k.begin() + static_cast<ptrdiff_t>((r0 - lc.q_slots) * row),
                       lc.res_k.begin() + static_cast<ptrdiff_t>((last - lc.q_slots) * row));
        lc.res_v.erase(lc.res_v.begin() + static_cast<ptrdiff_t>((r0 - lc.q_slots) * row),
                       lc.res_v.begin() + static_cast<ptrdiff_t>((last - lc.q_slots) * row));
      }
      lc.q_slots -= std::max(0, std::min(last, lc.q_slots) - first);
    }
    lc.valid.erase(row0, row1);
    lc.positions.erase(lc.positions.begin() + static_cast<ptrdiff_t>(first) * H,
                       lc.positions.begin() + static_cast<ptrdiff_t>(last) * H);
    if (last == lc.n_slots) {
      // The last used block (possibly partly filled): left in the table past n_slots, where
      // trim_trailing_blocks returns it to the pool (nothing is pending here).
      lc.n_slots = first;
    } else {
      const auto e0 = lc.blocks.begin() + static_cast<ptrdiff_t>(b) * tables_;
      for (auto e = e0; e != e0 + tables_; ++e) pool_.release(*e);
      lc.blocks.erase(e0, e0 + tables_);
      lc.n_slots -= bs;
      renumbered = true;
    }
  }
  if (renumbered) ++lc.version;
}

int KvStore::maybe_compact(LayerTable& lc) {
  const int H = config_.n_kv_heads, bs = config_.block_size_tokens;
  if (lc.n_slots == 0) return INT32_MAX;
  if (kv_format_is_kivi(layout_.format)) return INT32_MAX;  // rows of a key group never move (kv_store.h "KIVI")
  const int64_t max_live = *std::max_element(lc.live.begin(), lc.live.end());
  const int64_t removable = lc.n_slots - max_live;
  const int64_t threshold = std::max<int64_t>(bs, lc.n_slots / 50);
  if (removable <= threshold) return INT32_MAX;
  // First slot holding a hole for any head: everything before it stays where it is.
  int first_hole = lc.n_slots;
  for (int s = 0; s < lc.n_slots && first_hole == lc.n_slots; ++s)
    for (int h = 0; h < H; ++h)
      if (!lc.valid[static_cast<size_t>(s) * H + h]) { first_hole = s; break; }
  const int new_n = static_cast<int>(max_live);
  const int first_block = first_hole / bs;
  const int new_used = static_cast<int>(ceil_div(new_n, bs));
  // Pages of table t that receive rows: up to its heads' largest live count (every table has
  // new_used of them with per-layer tables; a head's own with per-head tables).
  std::vector<int> dst_pages(tables_);
  for (int t = 0; t < tables_; ++t) {
    int64_t live_t = 0;
    for (int h = 0; h < H; ++h)
      if (table_of(h) == t) live_t = std::max(live_t, lc.live[h]);
    dst_pages[t] = static_cast<int>(ceil_div(live_t, bs));
  }
  // Destination blocks shared with another sequence (or the hole block) get a fresh private one.
  int64_t shared = 0;
  for (int t = 0; t < tables_; ++t)
    for (int b = first_block; b < dst_pages[t]; ++b)
      if (pool_.ref_count(lc.blocks[static_cast<size_t>(b) * tables_ + t]) > 1) ++shared;
  if (shared > pool_.n_free()) return INT32_MAX;  // compaction is an optimisation: skip it, stay exact
  std::vector<int32_t> dst_blocks = lc.blocks;
  for (int t = 0; t < tables_; ++t) {
    for (int b = first_block; b < dst_pages[t]; ++b) {
      const size_t i = static_cast<size_t>(b) * tables_ + t;
      if (pool_.ref_count(lc.blocks[i]) > 1) {
        // A private copy (rows before first_hole in this block stay as they are).
        dst_blocks[i] = pool_.allocate();
        copy_block(dst_blocks[i], lc.blocks[i]);
      }
    }
  }
  std::vector<int64_t> new_pos(static_cast<size_t>(new_n) * H, 0);
  std::vector<uint8_t> new_valid(static_cast<size_t>(new_n) * H, 0);
  std::copy(lc.positions.begin(), lc.positions.begin() + static_cast<ptrdiff_t>(first_hole) * H,
            new_pos.begin());
  std::copy(lc.valid.begin(), lc.valid.begin() + static_cast<ptrdiff_t>(first_hole) * H,
            new_valid.begin());
  for (int h = 0; h < H; ++h) {
    // Stable in-place move down: destination j <= source s, both increasing, so every source is
    // read before anything overwrites it; sources in replaced (shared) blocks are read from the
    // old, untouched block.
    int j = first_hole;
    for (int s = first_hole; s < lc.n_slots; ++s) {
      const size_t cell = static_cast<size_t>(s) * H + h;
      if (!lc.valid[cell]) continue;
      const int32_t src_b = entry(lc, s / bs, h);
      const int32_t dst_b = dst_blocks[static_cast<size_t>(j / bs) * tables_ + table_of(h)];
      const size_t src_off = row_offset(s % bs, h), dst_off = row_offset(j % bs, h);
      if (src_b != dst_b || src_off != dst_off) move_row(dst_b, j % bs, src_b, s % bs, h);
      new_pos[static_cast<size_t>(j) * H + h] = lc.positions[cell];
      new_valid[static_cast<size_t>(j) * H + h] = 1;
      ++j;
    }
    // Trailing holes of a head with fewer live slots: copy the position of the slot before so
    // positions stay non-decreasing (they are never read: the cell is invalid).
    for (; j < new_n; ++j)
      new_pos[static_cast<size_t>(j) * H + h] = j > 0 ? new_pos[static_cast<size_t>(j - 1) * H + h] : 0;
  }
  for (size_t i = static_cast<size_t>(first_block) * tables_; i < static_cast<size_t>(new_used) * tables_; ++i) {
    if (dst_blocks[i] != lc.blocks[i]) {
      pool_.release(lc.blocks[i]);
      lc.blocks[i] = dst_blocks[i];
    }
  }
  lc.positions = std::move(new_pos);
  lc.valid = std::move(new_valid);
  lc.n_slots = new_n;
  ++lc.version;
  ++lc.data_version;
  return first_block;
}

void KvStore::trim_trailing_blocks(LayerTable& lc) {
  const int bs = config_.block_size_tokens;
  const size_t keep = static_cast<size_t>(ceil_div(lc.n_slots + lc.pending, bs)) * tables_;
  while (lc.blocks.size() > keep) {
    pool_.release(lc.blocks.back());
    lc.blocks.pop_back();
  }
}

void KvStore::release_hole_entries(LayerTable& lc, int from_page, int to_page) {
  if (tables_ == 1 || lc.pending > 0) return;  // (pending: the reservation may rely on the blocks)
  const int H = config_.n_kv_heads, bs = config_.block_size_tokens;
  for (int p = std::max(0, from_page); p < std::min(to_page, n_table_pages(lc)); ++p) {
    const int first = p * bs, last = std::min(lc.n_slots, first + bs);
    for (int h = 0; h < H; ++h) {
      int32_t& e = entry(lc, p, h);
      if (e == hole_block_) continue;
      bool any_live = false;
      for (int s = first; s < last && !any_live; ++s) any_live = lc.valid[static_cast<size_t>(s) * H + h] != 0;
      if (any_live) continue;
      pool_.release(e);
      pool_.retain(hole_block_);
      e = hole_block_;
      ++lc.data_version;  // a block of the table replaced (its cells were all holes)
    }
  }
}

}  // namespace kvlab
