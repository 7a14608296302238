// Host-side planning of the device forward pass: the host store's block tables and slot
// metadata and the policies' selections, turned into the flat arrays the CUDA kernels read
// (kernels/common/paged_kv.h, key_selection.h). Plain C++ (no CUDA), so CI tests it on the CPU.
//
// The device pool mirrors the host pool block for block: host block b is device page b (one
// "layer" of num_pages = host blocks on the device, since the host pool is shared by all layers).
// So a request's device block table is its host block table, cut to the slots in use.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/common/layer_kv.h"
#include "kernels/common/selection.h"

namespace kvlab {

// A batch's block tables (paged_kv.h contract): request b owns pages
// indices[indptr[b] .. indptr[b + 1]), its last page holding last_page_len[b] slots.
struct BlockTableArrays {
  std::vector<int32_t> indptr{0}, indices, last_page_len;

  void clear();
  int batch() const { return static_cast<int>(last_page_len.size()); }
  // Adds a request: the first ceil(n_slots / page_size) blocks of kv's table (the blocks holding
  // its slots; reserved ones past them are left out).
  void add(const LayerKv& kv);
};

// Selection lists of a batch, in the one CSR form (kernels/common/selection.h): a KeySelection
// with one row per request (list = request * n_kv_heads + h, each sorted disjoint slot ranges),
// never `all`; list_slots bounds each list (DeviceSelection::upload). The CPU attention reads
// request b's lists directly (AttentionArgs::selection_row = b).
struct SelectionArrays : KeySelection {
  std::vector<int32_t> list_slots;

  SelectionArrays() { begin(0, 0); }
  void clear() { begin(0, 0); list_slots.clear(); }
  int n_lists() const { return static_cast<int>(list_slots.size()); }
  // Appends a request: the n_kv_heads lists of query row `row` of `sel`; sel.all gives
  // [0, n_slots).
  void add_row(const KeySelection& sel, int row, int n_kv_heads, int n_slots);
  // Most selected slots in any list (what sizes a split-K plan).
  int max_count() const;
  // Throws Error unless every list's ranges are non-empty, sorted, disjoint and inside its
  // list_slots (the contract the device kernels rely on; DeviceSelection::upload checks the same).
  void check() const;
};

// True when every query row of `sel` reads the same lists as row 0 (always for sel.all): the
// chunk's selection is then one block-sparse pattern the tensor-core prefill kernel can take.
bool rows_share_lists(const KeySelection& sel);

// Per-page int32 metadata of one layer's pages in the device layout [page][kv_head][entry]
// (PagedKvView::meta_offset order), for the first ceil(n_slots / page_size) pages of kv; appends
// the page ids to page_ids and their entries to meta. Entries past n_slots are -1.
//   append_page_positions: the slot's text position; -1 for an evicted hole.
//   append_page_values:    values given slot-major, values[slot * n_kv_heads + h] (e.g. cache
//                          ranks), holes included as given.
// Throws Error for a position that does not fit int32 (the device kernels' type).
void append_page_positions(const LayerKv& kv, std::vector<int32_t>& page_ids,
                           std::vector<int32_t>& meta);
void append_page_values(const LayerKv& kv, const int32_t* values, std::vector<int32_t>& page_ids,
                        std::vector<int32_t>& meta);

// The K and V data of the same pages, fp32 in the device page layout [page][kv_head][entry][d]
// (a copy of the host blocks: the host and device layouts are the same).
void append_page_data(const LayerKv& kv, std::vector<int32_t>& page_ids, std::vector<float>& k,
                      std::vector<float>& v);

}  // namespace kvlab
