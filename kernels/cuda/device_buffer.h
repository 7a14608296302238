// DeviceBuffer<T>: an owning, movable array in device memory (cudaMalloc), with host copies.
// The only place kernels/cuda allocates; everything else takes raw pointers (views).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace kvlab::cuda {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { resize(n); }
  explicit DeviceBuffer(const std::vector<T>& host) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { release(); }

  // Reallocates (contents lost) when n differs from the current size.
  void resize(size_t n) {
    if (n == n_) return;
    release();
    if (n > 0) KVLAB_CUDA_CHECK(cudaMalloc(&ptr_, n * sizeof(T)));
    n_ = n;
  }
  // Grows to at least n elements (contents lost when it grows).
  void reserve(size_t n) {
    if (n > n_) resize(n);
  }
  void zero() {
    if (n_ > 0) KVLAB_CUDA_CHECK(cudaMemset(ptr_, 0, n_ * sizeof(T)));
  }
  void upload(const std::vector<T>& host) { upload(host.data(), host.size()); }
  void upload(const T* host, size_t n) {
    resize(n);
    if (n > 0) KVLAB_CUDA_CHECK(cudaMemcpy(ptr_, host, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  // Uploads into the first n elements without reallocating (n <= size()).
  void upload_prefix(const T* host, size_t n, cudaStream_t stream = nullptr) {
    KVLAB_CHECK(n <= n_, "upload of ", n, " elements into a buffer of ", n_);
    if (n > 0)
      KVLAB_CUDA_CHECK(cudaMemcpyAsync(ptr_, host, n * sizeof(T), cudaMemcpyHostToDevice, stream));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0) KVLAB_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  void release() {
    if (ptr_ != nullptr) cudaFree(ptr_);  // no throw from a destructor path
    ptr_ = nullptr;
    n_ = 0;
  }
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

}  // namespace kvlab::cuda
