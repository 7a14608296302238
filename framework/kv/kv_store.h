// KvStore: the paged KV cache of all sequences, with per-slot metadata for eviction policies.
//
// Memory layout.
//   * One BlockPool shared by every sequence and layer, sized by a byte budget:
//       n_blocks = budget_bytes / block_bytes,
//       block_bytes = 2 (K, V) * KvBlockLayout::block_bytes()
//                   = 2 * block_size_tokens * n_kv_heads * head_dim * 4 for f32.
//     A block holds one layer's K and V for block_size_tokens slots, head-major inside the block
//     (kernels/common/paged_kv.h):  k[block][kv_head][entry][feat],  v likewise, each row
//     encoded in the store's format with its metadata beside the block's data
//     (kernels/common/kv_format.h: "Block layout"). fp8 formats also keep one scale per (layer,
//     KV head) for K and V (KvStoreConfig::fp8_scale for all of them, or set_fp8_scales()),
//     which each sequence copies when created (set_sequence_fp8_scales() replaces its own).
//   * Per (sequence, layer) a block table (layers may evict differently). Slot s of a layer is
//     entry s % block_size of block table[s / block_size]; every block but the last used one is
//     full. Blocks past the last used one are reserved (reserve()) and not yet written.
//   * Per (sequence, layer) slot metadata, kept apart from the blocks (never shared):
//       positions[n_slots, n_kv_heads]  text position of the token in (slot, kv_head)
//       valid[n_slots, n_kv_heads]      1 = live, 0 = evicted hole
//     Per KV head because H2O evicts per head (equal counts, different tokens).
//
// Sharing and copy-on-write: fork() gives the child the parent's block table with every block's
// reference count raised; a shared block is copied before anything writes into it (the partly
// filled last block, at reserve(); blocks rewritten by compaction). Metadata is copied.
//
// Eviction (evict()): marks (slot, head) holes; holes are never refilled (slot order = insertion
// order). A block whose used slots are all holes for all heads is returned to the pool at once
// and removed from the table, so later slots move down by block_size (a renumbering). When a
// layer's removable holes (n_slots - max over heads of live slots) exceed
// max(block_size, 2% of n_slots), the layer is compacted: per KV head the live slots move down
// in order, n_slots becomes the largest per-head live count, trailing blocks are freed. Cost is
// amortised O(1) row copies per evicted token. Every renumbering bumps layout_version(), so a
// policy holding slot indices across steps knows to re-read slot_position(). An eviction in a
// layer that still has reserved-but-unwritten slots only marks holes; blocks are freed and
// compacted by the layer's next eviction without pending slots.
//
// KIVI (int4 / int2, POLICIES.md 17). Per (sequence, layer), slots [0, q) are in the blocks as
// codes (q a multiple of G, or of block_size when G > block_size), slots [q, n_slots) in an
// fp32 residual beside the blocks ([n_slots - q, n_kv_heads, head_dim] K and V). When an append
// makes n_slots - q >= R + G, the key group [q, q + G) is quantised (per channel over the
// group's live cells of each head; its values per token) into its block(s) and q += G: the R
// newest slots always stay exact. Rows of a quantised group never move (compaction is off for
// these formats: its holes are reclaimed when a whole block empties, which removes the block
// with its metadata); reserve() copies shared blocks from q on, so quantising never writes into
// a block another sequence holds. residual_bytes() is this fp32 part.
//
// Formats and policies compose (POLICIES.md 17): every reader of keys gets the dequantised rows
// (LayerKv::load_key, the attention kernels); copy-on-write, compaction and fork move a row's
// codes and its scale together, so no value changes when a row moves (bit-exact).
//
// Page statistics (Quest, POLICIES.md 15), per sequence and only when asked (set_page_stats):
// per (layer, page = slot / block_size, KV head) the elementwise max and min of the keys of the
// page's valid cells, as stored (dequantised) (post-RoPE at the original position unless the policy stores raw
// keys), [n_used_pages, n_kv_heads, head_dim] each, -inf / +inf where the page holds no valid
// cell of that head. Per-sequence metadata like positions (forked sequences evict differently):
// append widens the last page's bounds; evict recomputes the bounds of every page it touched
// from its valid cells, and, when blocks were removed or compacted, of every page from the first
// one that changed (O(tail) for that eviction; policies that keep page stats do not evict).
//
// Per-head block tables (KvStoreConfig::per_head_tables; POLICIES.md §13, AdaKV's and
// DuoAttention's per-head budgets): a block holds ONE KV head's block_size_tokens rows (the
// block layout with num_kv_heads = 1), and each page of a (sequence, layer) has one block per KV
// head, its table page-major [pages, n_kv_heads] (kernels/common/paged_kv.h). Slot numbering,
// positions, valid, compaction and page statistics are exactly as above (so attention reads the
// same slots in the same order and the outputs equal the per-layer tables' bit for bit); what
// changes is that a head's block of a page whose cells of that head are all holes is returned
// to the pool and the entry points at the store's one shared hole block (zeros, never written:
// it is held like a block shared with another sequence, so any write into it first takes a
// fresh block, as copy-on-write does). After compaction a head with fewer live tokens than the
// layer's fullest head therefore holds only ceil(live / block_size) blocks up to there, plus the
// pages appended since: bytes resident follow each head's own budget (head_blocks()). Not
// with KIVI formats (Error: their rows never move). The hole block is counted in
// KvStats::blocks_total only.
//
// Values alias keys (KvStoreConfig::values_alias_keys; MLA's latent cache, ModelConfig::mla()):
// the pool has one arena and a slot's value row IS its key row (LayerKv's v_bytes / v_data equal
// k_bytes / k_data; append() stores k and ignores v), so a block is half the bytes and
// kv_bytes_per_token counts one row per (layer, head). The engine's absorbed MLA reads the first
// kv_lora_rank features of the attention output as sum_j p_j c_j. Every per-row format aliases
// (f32, f16, bf16, int8, fp8: a row and its scale are one object; fp8 then needs equal K and V
// scales); KIVI does not (keys quantised per channel over a group, values per token) and is an
// Error at construction.
//
// Running out of blocks is a value (AllocStatus::kOutOfBlocks from reserve(), all-or-nothing),
// never a crash; misuse (unknown sequence, append without reserve, evicting a hole) throws
// kvlab::Error. Not thread-safe for mutation; concurrent append() to DIFFERENT sequences after
// their reserve() is safe (append never touches the pool), as are concurrent reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "framework/kv/block_pool.h"
#include "kernels/common/kv_format.h"
#include "kernels/common/layer_kv.h"
#include "kernels/common/selection.h"  // Evictions

namespace kvlab {

enum class AllocStatus { kOk, kOutOfBlocks };

struct KvStoreConfig {
  int n_layers = 0, n_kv_heads = 0, head_dim = 0;
  int block_size_tokens = 16;
  size_t budget_bytes = 0;  // pool = budget / bytes per block (rounded down)
  KvFormat format = KvFormat::kF32;  // how rows are stored (kernels/common/kv_format.h)
  float fp8_scale = 1.f;  // fp8: the scale S of every (layer, KV head), K and V (vLLM's default)
  // int4 / int2 (KIVI): G (divides head_dim; divides or is a multiple of block_size_tokens) and
  // R (a multiple of G): see "KIVI" above.
  int group_size = 32;
  int residual = 128;
  bool values_alias_keys = false;  // see "Values alias keys" above
  bool per_head_tables = false;    // see "Per-head block tables" above
};

// Bytes a store of this shape and format keeps per token, K and V (one row when values alias
// keys), all layers and KV heads:
// data plus per-row metadata, block padding included (what the pool holds per slot).
double kv_bytes_per_token(const KvStoreConfig& config);
// Bytes of one pool block, K and V (one arena when values alias keys): every KV head of a
// layer's page, or one head's with per-head block tables.
size_t kv_block_bytes(const KvStoreConfig& config);

struct KvStats {
  int64_t blocks_total = 0, blocks_in_use = 0, blocks_peak = 0;
  size_t bytes_in_use = 0, bytes_peak = 0;  // blocks x block bytes (K and V)
  // Token x head cells holding a live token, / n_kv_heads (a physical cell shared by forked
  // sequences counts once; live if any sequence holding the block has it live).
  int64_t slots_valid = 0;
  int64_t slots_allocated = 0;  // blocks_in_use x block_size (per-head tables: / n_kv_heads)
  double waste_fraction = 0;    // 1 - live cells / allocated cells (0 when nothing allocated)
};

using SeqId = int32_t;

class KvStore {
 public:
  explicit KvStore(const KvStoreConfig& config);  // throws Error on a non-positive shape
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  const KvStoreConfig& config() const { return config_; }
  size_t block_bytes() const { return block_bytes_; }  // K + V
  const KvBlockLayout& block_layout() const { return layout_; }  // one arena (K or V)
  // fp8 formats: the scales of (layer, kv_head), K and V ([n_kv_heads] each); only before the
  // first reserve() (Error otherwise, or on a non-positive / non-finite scale, or another format).
  void set_fp8_scales(int layer, const float* k_scales, const float* v_scales);
  // fp8: the scales of one sequence's layer (the engine's scales from the prompt), while it holds
  // no row; a fork inherits its parent's with the rows. Error as set_fp8_scales, or when rows
  // are already stored.
  void set_sequence_fp8_scales(SeqId seq, int layer, const float* k_scales, const float* v_scales);
  int64_t free_blocks() const { return pool_.n_free(); }
  // Per-head block tables: the block every all-hole (page, head) entry points at; -1 otherwise.
  int32_t hole_block() const { return hole_block_; }

  SeqId create_sequence();
  void free_sequence(SeqId seq);  // returns its blocks (those no one else shares) to the pool
  bool has_sequence(SeqId seq) const { return seqs_.count(seq) != 0; }
  // Shares every block of the parent (ref counts), copy-on-write later. The parent must have no
  // reserved-but-unwritten slots (fork between steps).
  SeqId fork(SeqId parent);

  // Keep (on) or drop (off) the sequence's page statistics (see "Page statistics"); turning them
  // on computes them from the current contents. A fork copies the parent's setting and bounds.
  void set_page_stats(SeqId seq, bool on);
  bool page_stats(SeqId seq) const;

  // Room for n_new more slots in every layer, copying a shared partly-filled last block first.
  // All-or-nothing: on kOutOfBlocks nothing changed.
  AllocStatus reserve(SeqId seq, int n_new);
  // Blocks reserve(seq, n_new) would take from the pool now (for pre-emption decisions).
  int64_t blocks_needed(SeqId seq, int n_new) const;

  // Writes one token's K and V ([n_kv_heads, head_dim] each) for `layer` into the next slot,
  // valid for every head, with text position `position`, which must exceed every position
  // already in the layer (policy.h's order contract), encoded in the store's format. Returns
  // the slot. Requires a prior successful reserve() covering it; a NaN feature (or, for int8 and
  // fp8, an infinite one) is refused; Error otherwise, before anything changes.
  int append(SeqId seq, int layer, int64_t position, const float* k, const float* v);

  // One layer's K/V and slot metadata (the kernels' form; policies read it through
  // framework/policy/layer_kv_cache_view.h). Valid until this sequence next changes.
  LayerKv layer(SeqId seq, int layer) const;
  // Drops the given (slot, head) cells (Evictions.slots[h], any order). A slot out of range, a
  // hole or a duplicate throws Error (before anything changes). Frees empty blocks, compacts.
  void evict(SeqId seq, int layer, const Evictions& evictions);

  KvStats stats() const;  // O(sequences x layers), plus the cells of shared blocks
  int64_t resident_tokens(SeqId seq, int layer, int kv_head) const;
  // Pool blocks holding (seq, layer)'s rows of kv_head: with per-head block tables the head's
  // own (the hole block not counted), else the layer's, which every head shares. Reserved
  // blocks included. Times block_bytes(): the bytes the head keeps resident.
  int64_t head_blocks(SeqId seq, int layer, int kv_head) const;
  // Pool bytes holding kv_head's rows of (seq, layer): head_blocks x block_bytes(), divided by
  // the heads a block holds (per-layer tables: the head's share of its layer's blocks).
  size_t head_bytes(SeqId seq, int layer, int kv_head) const;
  size_t residual_bytes(SeqId seq) const;  // KIVI's fp32 residual over all layers (0 otherwise)
  int n_slots(SeqId seq, int layer) const;
  int64_t sequence_blocks(SeqId seq) const;  // block-table entries over all layers (incl. reserved)
  // Incremented whenever slots of this (sequence, layer) are renumbered (block removal or
  // compaction); slot indices from before are then stale.
  int64_t layout_version(SeqId seq, int layer) const;
  // Incremented whenever rows of this (sequence, layer) move to other blocks or a block of its
  // table is replaced by a copy (compaction, copy-on-write). Otherwise every block of the table
  // keeps its contents (appends only add rows; removing an emptied block only shortens the
  // table), which is what lets a mirror of the blocks (the device KV pool) stay in sync by
  // appending rows and re-reading metadata.
  int64_t data_version(SeqId seq, int layer) const;

 private:
  struct LayerTable;  // one (sequence, layer): block table and slot metadata
  struct Sequence;

  Sequence& seq_at(SeqId seq);
  const Sequence& seq_at(SeqId seq) const;
  LayerTable& layer_at(SeqId seq, int layer);
  const LayerTable& layer_at(SeqId seq, int layer) const;
  int64_t layer_blocks_needed(const LayerTable& lc, int n_new) const;
  void copy_block(int32_t dst, int32_t src);
  void remove_empty_blocks(LayerTable& lc, std::vector<int32_t>& touched_blocks);
  int maybe_compact(LayerTable& lc);  // first page rewritten, or INT32_MAX when none
  // Resizes the page bounds to the used pages and recomputes pages [from_page, used) from their
  // valid cells (no-op unless the sequence keeps page stats).
  void refresh_page_stats(LayerTable& lc, int from_page);
  void recompute_page(LayerTable& lc, int page);
  void trim_trailing_blocks(LayerTable& lc);
  void refresh_view(LayerTable& lc);
  size_t row_offset(int entry, int kv_head) const;  // bytes from the start of kv_head's block (codes)
  size_t meta_offset(int entry, int kv_head) const;  // an int8 row's scale, likewise
  // The table entry (block id) of (page, kv_head): LayerTable::blocks[page * tables_ + head's table].
  int32_t& entry(LayerTable& lc, int page, int kv_head) const;
  int32_t entry(const LayerTable& lc, int page, int kv_head) const;
  int table_of(int kv_head) const { return tables_ == 1 ? 0 : kv_head; }
  int n_table_pages(const LayerTable& lc) const;  // pages in the table (used and reserved)
  // Per-head tables: every (page in [from, to), head) entry whose cells of that head are all
  // holes goes back to the pool and points at the hole block (no-op with per-layer tables).
  void release_hole_entries(LayerTable& lc, int from_page, int to_page);
  void move_row(int32_t dst_b, size_t dst_entry, int32_t src_b, size_t src_entry, int kv_head);
  void decode_key(const LayerTable& lc, int slot, int kv_head, float* out) const;  // as stored
  void quantise_group(LayerTable& lc);  // KIVI: slots [q, q + G) into the blocks
  int64_t write_begin(const LayerTable& lc) const;  // first slot the next appends may write

  KvStoreConfig config_;
  int tables_ = 1;           // block-table entries per page: 1, or n_kv_heads (per-head tables)
  int32_t hole_block_ = -1;  // per-head tables: the shared all-zero block of holes
  KvBlockLayout layout_;     // one arena (K or V) of a block
  size_t block_bytes_ = 0;   // K + V
  std::vector<float> k_head_scale_, v_head_scale_;  // fp8: [n_layers, n_kv_heads] new sequences' scales
  void check_fp8_scales(const char* what, int layer, const float* k_scales, const float* v_scales) const;
  bool stored_any_ = false;  // a slot was reserved (fp8 scales are fixed from then on)
  BlockPool pool_;
  std::unordered_map<SeqId, std::unique_ptr<Sequence>> seqs_;
  SeqId next_id_ = 0;
};

}  // namespace kvlab
