// Entry point of libopforge_ort.so, loaded by
//   SessionOptions.register_custom_ops_library(opforge.ort_library_path())
// It exports exactly one symbol, RegisterCustomOps (see opforge/ort_exports.map),
// and links neither libonnxruntime nor libtorch: the running ORT hands us its
// API. Every kernel file registers itself (OPFORGE_ORT_KERNELS), CPU and CUDA EP
// kernels alike, under one name and domain: ORT places each node on the EP it
// assigned and picks the matching kernel.
#include "opforge/ort_library.h"
#include "ort_common.h"

OPFORGE_ORT_LIBRARY("libopforge_ort", opforge::ort::kDomain)
