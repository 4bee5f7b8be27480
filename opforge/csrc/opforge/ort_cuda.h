// opforge's ORT CUDA-EP glue: ORT's compute stream, the node's device,
// stream-ordered scratch memory, cuBLAS, and CUDA/cuBLAS errors as ORT statuses.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <string>
#include <vector>

#include "core/cuda/launch.h"
#include "opforge/ort_op.h"

namespace opforge {
namespace ort {

template <typename T>
constexpr core::cuda::Dtype gpu_dtype();
template <>
constexpr core::cuda::Dtype gpu_dtype<float>() { return core::cuda::Dtype::kFloat32; }
template <>
constexpr core::cuda::Dtype gpu_dtype<double>() { return core::cuda::Dtype::kFloat64; }
template <>
constexpr core::cuda::Dtype gpu_dtype<Ort::Float16_t>() { return core::cuda::Dtype::kFloat16; }
template <>
constexpr core::cuda::Dtype gpu_dtype<Ort::BFloat16_t>() { return core::cuda::Dtype::kBFloat16; }

// The stream ORT runs this node on: all our work is enqueued there, so it is
// ordered with the neighbouring ORT kernels and never touches the default stream.
inline cudaStream_t compute_stream(OrtKernelContext* ctx) {
  return static_cast<cudaStream_t>(Ort::KernelContext(ctx).GetGPUComputeStream());
}

// Makes the GPU holding the node's first input current for the call (and
// restores the previous one): launches, cudaMallocAsync and cuBLAS act on the
// current device, which need not be the session's device_id on this thread.
class InputDeviceGuard {
 public:
  explicit InputDeviceGuard(OrtKernelContext* ctx) {
    const int want = Ort::KernelContext(ctx).GetInput(0).GetTensorMemoryInfo().GetDeviceId();
    int current = 0;
    if (cudaGetDevice(&current) == cudaSuccess && current != want && cudaSetDevice(want) == cudaSuccess)
      previous_ = current;
  }
  ~InputDeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  InputDeviceGuard(const InputDeviceGuard&) = delete;
  InputDeviceGuard& operator=(const InputDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

inline Ort::Status cuda_status(cudaError_t err, const char* op, const char* what) {
  if (err == cudaSuccess) return Ort::Status(nullptr);
  const std::string msg = std::string(op) + ": " + what + " failed: " + cudaGetErrorString(err);
  return Ort::Status(msg.c_str(), ORT_EP_FAIL);
}

inline Ort::Status cublas_status(cublasStatus_t err, const char* op, const char* what) {
  if (err == CUBLAS_STATUS_SUCCESS) return Ort::Status(nullptr);
  const std::string msg = std::string(op) + ": " + what + " failed: cuBLAS status " + std::to_string(int(err));
  return Ort::Status(msg.c_str(), ORT_EP_FAIL);
}

// Enqueues a copy of `count` device elements into `host` (resized) on `stream`; the
// caller synchronises the stream before reading them.
template <typename T>
Ort::Status to_host(const T* device, size_t count, std::vector<T>& host, cudaStream_t stream, const char* op,
                    const char* what) {
  host.resize(count);
  if (count == 0) return Ort::Status(nullptr);
  return cuda_status(cudaMemcpyAsync(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost, stream), op,
                     what);
}

// Scratch device memory from CUDA's stream-ordered allocator: allocation and
// release are enqueued on the compute stream, so the buffer cannot be reused
// by other work before our kernels on that stream are done with it, without
// any synchronisation (the driver pools the memory, so this is cheap).
class StreamScratch {
 public:
  StreamScratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
    status_ = cudaMallocAsync(&ptr_, bytes, stream);
  }
  ~StreamScratch() {
    if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  cudaError_t status() const { return status_; }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
  cudaError_t status_;
};

// One cuBLAS handle per kernel instance (i.e. per node and session), created
// on first use on the device ORT runs the node on. Concurrent Run() calls
// share the instance, so stream binding + GEMM enqueue happen under a lock.
class CublasHandle {
 public:
  ~CublasHandle() {
    if (handle_ != nullptr) cublasDestroy(handle_);
  }
  // Locks, creates on first use, binds `stream`; the returned lock keeps the
  // handle exclusive until it goes out of scope.
  std::unique_lock<std::mutex> acquire(cudaStream_t stream, cublasHandle_t* out, cublasStatus_t* status) {
    std::unique_lock<std::mutex> lock(mutex_);
    *status = CUBLAS_STATUS_SUCCESS;
    if (handle_ == nullptr) *status = cublasCreate(&handle_);
    if (*status == CUBLAS_STATUS_SUCCESS) *status = cublasSetStream(handle_, stream);
    *out = handle_;
    return lock;
  }

 private:
  std::mutex mutex_;
  cublasHandle_t handle_ = nullptr;
};

}  // namespace ort
}  // namespace opforge
