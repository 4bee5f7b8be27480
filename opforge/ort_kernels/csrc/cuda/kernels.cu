// The ORT library's one nvcc translation unit: every CUDA kernel of the
// shared cores (opforge/csrc/core/cuda), the same source the torch extension
// compiles, reached through core/cuda/launch.h from the host-compiled *.cc.
#include "core/cuda/kernels.cuh"
