#include "framework/engine/device_plan.h"

#include <algorithm>
#include <limits>

#include "framework/core/error.h"

namespace kvlab {
namespace {

int pages_in_use(const LayerKv& kv) {
  return (kv.n_slots + kv.view.page_size - 1) / kv.view.page_size;
}

// The device mirrors keep per-layer block tables only (the engine refuses kv_tables = per_head on
// a device backend: engine.cpp).
int32_t block_of(const LayerKv& kv, int page) {
  KVLAB_CHECK(kv.view.table_heads == 1, "per-head block tables on a device path");
  return kv.view.indices[kv.view.indptr[0] + page];
}

// The pages holding kv's slots, their entries in [page][kv_head][entry] order: value(slot, h)
// for slots in use, -1 past n_slots.
template <class Value>
void append_page_meta(const LayerKv& kv, std::vector<int32_t>& page_ids, std::vector<int32_t>& meta,
                      Value value) {
  const int pages = pages_in_use(kv), ps = kv.view.page_size, H = kv.view.num_kv_heads;
  for (int p = 0; p < pages; ++p) {
    page_ids.push_back(block_of(kv, p));
    for (int h = 0; h < H; ++h)
      for (int e = 0; e < ps; ++e) {
        const int slot = p * ps + e;
        meta.push_back(slot < kv.n_slots ? value(slot, h) : -1);
      }
  }
}

}  // namespace

void BlockTableArrays::clear() {
  indptr.assign(1, 0);
  indices.clear();
  last_page_len.clear();
}

void BlockTableArrays::add(const LayerKv& kv) {
  const int pages = pages_in_use(kv);
  for (int p = 0; p < pages; ++p) indices.push_back(block_of(kv, p));
  indptr.push_back(static_cast<int32_t>(indices.size()));
  last_page_len.push_back(pages == 0 ? 0 : kv.n_slots - (pages - 1) * kv.view.page_size);
}

void SelectionArrays::add_row(const KeySelection& sel, int row, int n_kv_heads, int n_slots) {
  if (n_rows == 0) this->n_kv_heads = n_kv_heads;
  KVLAB_CHECK(this->n_kv_heads == n_kv_heads, "selection lists of ", n_kv_heads, " heads added to a launch of ",
              this->n_kv_heads);
  ++n_rows;
  for (int h = 0; h < n_kv_heads; ++h) {
    if (sel.all) {
      if (n_slots > 0) ranges.push_back({0, n_slots});
    } else {
      for (const SlotRange& r : sel.list(row, h)) ranges.push_back({r.begin, r.end});
    }
    indptr.push_back(static_cast<int32_t>(ranges.size()));
    list_slots.push_back(n_slots);
  }
}

int SelectionArrays::max_count() const {
  int best = 0;
  for (int l = 0; l < n_lists(); ++l) {
    int n = 0;
    for (int32_t r = indptr[l]; r < indptr[l + 1]; ++r) n += ranges[r].end - ranges[r].begin;
    best = std::max(best, n);
  }
  return best;
}

void SelectionArrays::check() const {
  for (int l = 0; l < n_lists(); ++l) {
    int32_t prev_end = 0;
    for (int32_t r = indptr[l]; r < indptr[l + 1]; ++r) {
      const SlotRange kr = ranges[r];
      if (kr.begin < prev_end || kr.end <= kr.begin || kr.end > list_slots[l])
        fail("key selection: list ", l, " range ", r - indptr[l], " [", kr.begin, ", ", kr.end,
             ") is empty, unsorted, overlapping or past the list's ", list_slots[l], " slots");
      prev_end = kr.end;
    }
  }
}

bool rows_share_lists(const KeySelection& sel) {
  if (sel.all) return true;
  for (int r = 1; r < sel.n_rows; ++r)
    for (int h = 0; h < sel.n_kv_heads; ++h) {
      const auto a = sel.list(0, h), b = sel.list(r, h);
      if (!std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const SlotRange& x, const SlotRange& y) {
            return x.begin == y.begin && x.end == y.end;
          }))
        return false;
    }
  return true;
}

void append_page_positions(const LayerKv& kv, std::vector<int32_t>& page_ids,
                           std::vector<int32_t>& meta) {
  append_page_meta(kv, page_ids, meta, [&](int slot, int h) -> int32_t {
    if (!kv.is_valid(slot, h)) return -1;
    const int64_t pos = kv.position(slot, h);
    if (pos > std::numeric_limits<int32_t>::max())
      fail("device KV store: text position ", pos, " does not fit the kernels' int32 positions");
    return static_cast<int32_t>(pos);
  });
}

void append_page_values(const LayerKv& kv, const int32_t* values, std::vector<int32_t>& page_ids,
                        std::vector<int32_t>& meta) {
  const int H = kv.view.num_kv_heads;
  append_page_meta(kv, page_ids, meta,
                   [&](int slot, int h) { return values[static_cast<size_t>(slot) * H + h]; });
}

void append_page_data(const LayerKv& kv, std::vector<int32_t>& page_ids, std::vector<float>& k,
                      std::vector<float>& v) {
  const int pages = pages_in_use(kv);
  const size_t elems = kv.view.page_elems();
  for (int p = 0; p < pages; ++p) {
    const int32_t b = block_of(kv, p);
    page_ids.push_back(b);
    const size_t off = kv.view.offset(b, 0, 0, 0);
    k.insert(k.end(), kv.view.k_data + off, kv.view.k_data + off + elems);
    v.insert(v.end(), kv.view.v_data + off, kv.view.v_data + off + elems);
  }
}

}  // namespace kvlab
