// The CUDA EP's Io (see HostIo in ort_common.h), shared by the CUDA EP kernels of
// libopforge_ort and libopforge_mmdeploy: the CUDA EP hands a default-memory custom op
// every input and output in device memory, so what a kernel reads or writes on the
// host is copied on ORT's compute stream, ordered after whatever produced the input.
// These are small tensors (index data, boxes) and synchronous copies: correctness
// over speed.
#pragma once

#include <cstddef>
#include <vector>

#include "opforge/ort_cuda.h"
#include "ort_common.h"

namespace opforge {
namespace ort {

// One run's copies. The node's device is current while it lives (InputDeviceGuard):
// copies and the kernel's launches act on the current device.
class CudaHostIo {
 public:
  CudaHostIo(OrtKernelContext* ctx, const char* op) : device_(ctx), stream_(compute_stream(ctx)), op_(op) {}

  // Enqueues the copy; view.data is readable after wait().
  template <typename T>
  Ort::Status fetch(const T* data, size_t count, const char* what, HostView<T>& view) {
    Ort::Status s = to_host(data, count, view.copy, stream_, op_, what);
    view.data = view.copy.data();
    pending_ = pending_ || count > 0;
    return s;
  }

  // Waits for the fetched copies (nothing to wait for when none copied anything).
  Ort::Status wait(const char* what) {
    if (!pending_) return Ort::Status(nullptr);
    pending_ = false;
    return cuda_status(cudaStreamSynchronize(stream_), op_, what);
  }

  // Copies `count` host values into the device output `out`, synchronously: `values` may
  // be freed when this returns.
  template <typename T>
  Ort::Status store(const T* values, size_t count, T* out, const char* what) {
    if (count == 0) return Ort::Status(nullptr);
    cudaError_t ce = cudaMemcpyAsync(out, values, count * sizeof(T), cudaMemcpyHostToDevice, stream_);
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(stream_);
    return cuda_status(ce, op_, what);
  }

 private:
  const InputDeviceGuard device_;
  const cudaStream_t stream_;
  const char* op_;
  bool pending_ = false;
};

}  // namespace ort
}  // namespace opforge
