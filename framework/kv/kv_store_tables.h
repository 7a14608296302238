// The KV store's private tables (kv_store.cpp, kv_store_evict.cpp): one (sequence, layer)'s
// block table and slot metadata, a sequence's layers, and ceil_div. Not part of the store's interface.
#pragma once

#include <cstdint>
#include <vector>

#include "framework/kv/kv_store.h"

namespace kvlab {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct KvStore::LayerTable {  // (kv_store.h: "Memory layout")
  int layer = 0;                   // which layer of its sequence
  std::vector<float> k_scale, v_scale;  // fp8: [n_kv_heads] the scales its rows are stored with
  // Block table: used pages, then reserved ones; [pages, tables] page-major (tables = 1, or
  // n_kv_heads with per-head block tables: kv_store.h).
  std::vector<int32_t> blocks;
  int n_slots = 0;                 // slots written (live or holes)
  int pending = 0;                 // reserved slots not yet appended
  std::vector<int64_t> positions;  // [n_slots, n_kv_heads]
  std::vector<uint8_t> valid;      // [n_slots, n_kv_heads]
  std::vector<int64_t> live;       // [n_kv_heads] live slots per head
  int64_t version = 0;
  int64_t data_version = 0;  // rows moved or a block replaced by a copy (data_version())
  bool rescan_blocks = false;      // holes were made under pending slots: check every block
  bool page_stats = false;         // keep key_max / key_min (kv_store.h "Page statistics")
  std::vector<float> key_max, key_min;  // [used pages, n_kv_heads, head_dim] when page_stats
  int q_slots = 0;                 // KIVI: slots [0, q_slots) are codes, the rest residual
  std::vector<float> res_k, res_v; // KIVI: [n_slots - q_slots, n_kv_heads, head_dim] fp32
  int32_t indptr[2] = {0, 0};      // view fields, refreshed after every change
  int32_t last_page_len = 0;
};

struct KvStore::Sequence {
  std::vector<LayerTable> layers;
};

}  // namespace kvlab
