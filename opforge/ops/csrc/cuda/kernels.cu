// The torch extension's one nvcc translation unit: every CUDA kernel of the
// shared cores (opforge/csrc/core/cuda), reached through core/cuda/launch.h
// from the host-compiled *_cuda.cpp files next to it.
#include "core/cuda/kernels.cuh"
