#include "framework/kv/block_pool.h"

#include <cstdlib>
#include <new>

#include "framework/core/error.h"

namespace kvlab {
namespace {

// 64-byte aligned, uninitialised (large requests are mmapped: committed on first touch).
uint8_t* alloc_arena(size_t n) {
  if (n == 0) return nullptr;
  const size_t bytes = (n + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (p == nullptr) fail("KV store: cannot reserve ", bytes, " bytes of address space for the block pool");
  return static_cast<uint8_t*>(p);
}

}  // namespace

BlockPool::BlockPool(int64_t n_blocks, size_t block_bytes, bool shared_arenas) : block_bytes_(block_bytes) {
  KVLAB_CHECK(n_blocks >= 0 && n_blocks < (int64_t{1} << 31), "n_blocks = ", n_blocks);
  k_base_ = alloc_arena(static_cast<size_t>(n_blocks) * block_bytes);
  v_base_ = shared_arenas ? k_base_ : alloc_arena(static_cast<size_t>(n_blocks) * block_bytes);
  ref_.assign(static_cast<size_t>(n_blocks), 0);
  free_.reserve(static_cast<size_t>(n_blocks));
  // Stack: block 0 on top, so blocks are handed out in increasing order at first.
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

BlockPool::~BlockPool() {
  if (v_base_ != k_base_) std::free(v_base_);
  std::free(k_base_);
}

int32_t BlockPool::allocate() {
  if (free_.empty()) return -1;
  const int32_t b = free_.back();
  free_.pop_back();
  ref_[b] = 1;
  if (n_in_use() > peak_in_use_) peak_in_use_ = n_in_use();
  return b;
}

void BlockPool::retain(int32_t b) {
  KVLAB_CHECK(b >= 0 && b < n_blocks() && ref_[b] > 0, "retain of free block ", b);
  if (++ref_[b] == 2) ++n_shared_;
}

void BlockPool::release(int32_t b) {
  KVLAB_CHECK(b >= 0 && b < n_blocks() && ref_[b] > 0, "release of free block ", b);
  if (--ref_[b] == 1) --n_shared_;
  if (ref_[b] == 0) free_.push_back(b);
}

}  // namespace kvlab
