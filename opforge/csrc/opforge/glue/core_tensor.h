// How the compute cores of `opforge new-op --schema` packages see a tensor. Installed with opforge
// and included from there (opforge.build puts opforge's csrc/ on every package's include path), so
// a fix here reaches every package at its next build; no package keeps a copy.
// The kernels around a core hand it every input as an Input: contiguous, row-major, float tensors
// already in the compute type, so a core never deals with strides or 16-bit storage. A package's
// core names these types in its own namespace (`using opforge::glue::Input;` ...).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/shape.h"

// The glue's inline namespace: opforge's version (tests/test_new_op_schema.py keeps them equal).
// Two packages built against different opforge versions and loaded in one process thus never share
// (or swap) an inline function or a type of the glue: their symbols differ.
#define OPFORGE_GLUE_NAMESPACE v0_2_0

namespace opforge {
namespace glue {
inline namespace OPFORGE_GLUE_NAMESPACE {

template <typename T>
struct Input {
  const T* data = nullptr;
  std::vector<int64_t> shape;
  bool present = true;  // false: an optional input that was not given (None in torch, omitted in ONNX)

  int rank() const { return static_cast<int>(shape.size()); }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// A tensor input's shape as a shape rule reads it (Dim: int64_t in the kernels, opforge::RuleDim, a
// size that may be symbolic, in torch's fake impl), how messages print it ("[2, 3]"; a symbolic dim
// as its expression, e.g. s0), message(...) to build an error from strings, numbers, dims and
// shapes, and known(dim) (a dim's number, when it is not symbolic): opforge's own ops'
// (core/shape.h), one definition for both.
using ::opforge::core::known;
using ::opforge::core::message;
using ::opforge::core::Shape;

}  // namespace OPFORGE_GLUE_NAMESPACE
}  // namespace glue
}  // namespace opforge
