// BlockPool: a fixed number of equally sized KV blocks with a free list and reference counts.
//
// Memory: two arenas, K and V, each [n_blocks, block_bytes] bytes (the store's format decides
// what a block holds: kernels/common/kv_format.h), allocated once (lazily committed by the OS:
// untouched blocks cost no resident memory). Block b's K data starts at k_base() + b *
// block_bytes (likewise V), so a PagedKvView (f32) or a KvBlockLayout indexes the pool directly.
// A block is free (ref count 0, on the free list) or in use (ref count >= 1: the number of block
// tables holding it; > 1 means shared by forked sequences and copied before any write).
// Allocation is LIFO (a just-freed block is still warm in cache). Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace kvlab {

class BlockPool {
 public:
  // block_bytes per arena. shared_arenas: one arena serves as both K and V (v(b) == k(b): the
  // store's values-alias-keys mode, MLA's latent cache), half the memory.
  BlockPool(int64_t n_blocks, size_t block_bytes, bool shared_arenas = false);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int64_t n_blocks() const { return static_cast<int64_t>(ref_.size()); }
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t n_in_use() const { return n_blocks() - n_free(); }
  int64_t peak_in_use() const { return peak_in_use_; }
  int64_t n_shared() const { return n_shared_; }  // blocks with ref count > 1
  size_t block_bytes() const { return block_bytes_; }  // per arena (K or V)

  // A free block with ref count 1, or -1 when none is left (nothing changes then).
  int32_t allocate();
  void retain(int32_t block);   // ref count + 1
  void release(int32_t block);  // ref count - 1; back on the free list at 0
  int32_t ref_count(int32_t block) const { return ref_[block]; }

  uint8_t* k(int32_t block) { return k_base_ + static_cast<size_t>(block) * block_bytes_; }
  uint8_t* v(int32_t block) { return v_base_ + static_cast<size_t>(block) * block_bytes_; }
  const uint8_t* k(int32_t block) const { return k_base_ + static_cast<size_t>(block) * block_bytes_; }
  const uint8_t* v(int32_t block) const { return v_base_ + static_cast<size_t>(block) * block_bytes_; }
  const uint8_t* k_base() const { return k_base_; }
  const uint8_t* v_base() const { return v_base_; }

 private:
  size_t block_bytes_ = 0;
  uint8_t* k_base_ = nullptr;  // [n_blocks, block_bytes]
  uint8_t* v_base_ = nullptr;  // [n_blocks, block_bytes]
  std::vector<int32_t> ref_;   // [n_blocks]
  std::vector<int32_t> free_;  // stack of free block ids
  int64_t peak_in_use_ = 0;
  int64_t n_shared_ = 0;
};

}  // namespace kvlab
