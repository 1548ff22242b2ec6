// RAII device buffer for the CUDA tests (the parity runner and the emulator's own checks): tests may allocate;
// the library may not.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "fairkv/cuda/error.cuh"
#include "fairkv/status.hpp"

namespace fairkv_test {

class device_buffer {
 public:
  device_buffer() = default;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  fairkv::result allocate(std::size_t bytes) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = bytes;
    if (bytes == 0) return {};
    return fairkv::cuda::from_cuda(cudaMalloc(&ptr_, bytes));
  }
  template <class T>
  fairkv::result upload(const std::vector<T>& host) {
    FAIRKV_TRY(allocate(host.size() * sizeof(T)));
    if (host.empty()) return {};
    return fairkv::cuda::from_cuda(cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice));
  }
  template <class T>
  fairkv::result download(std::vector<T>& host) const {
    host.resize(bytes_ / sizeof(T));
    if (bytes_ == 0) return {};
    return fairkv::cuda::from_cuda(cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost));
  }
  template <class T = void>
  [[nodiscard]] T* get() const noexcept {
    return static_cast<T*>(ptr_);
  }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace fairkv_test
