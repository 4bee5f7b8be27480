// my_add(a, b) = 2*a + b: the one compute core behind torch.ops.opforge.my_add
// and the ORT kernel opforge::my_add. Plain C++ (no torch, no ORT types).
//
// The op is memory-bound (read a, read b, write out, once each), so the core's
// job is to keep every inner loop a unit-stride run the compiler vectorises,
// at the widest vectors the CPU has (cpu_dispatch.h), and to split the output
// into slices either runtime's thread pool can run in parallel.
//
// Numerics: computed in acc_t<T> (float for the 16-bit types) as (a + a) + b,
// exactly 2*a + b, with one rounding to T at the end.
//
// (Non-temporal stores were tried for large outputs and dropped: no gain on
// ORT's reused arena buffers, a loss on torch's freshly faulted pages.)
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "broadcast.h"
#include "cpu_dispatch.h"
#include "half.h"
#include "shape.h"

namespace opforge {
namespace core {

// What my_add's shape rule reads: the operands' shapes, and the names the
// messages give them (torch's a and b; the ONNX node's A and B).
template <typename Dim>
struct MyAddShapes {
  Shape<Dim> a, b;
  const char* a_name = "a";
  const char* b_name = "b";
};

// my_add's shape rule: numpy broadcasting of a and b (at most kMaxDims dims).
// Returns "" and the output's shape in `out`, or the message every front end
// raises: torch's kernels and fake impl (through _my_add_output_shapes) and
// ONNX Runtime's kernels.
template <typename Dim>
std::string my_add_output_shapes(const MyAddShapes<Dim>& in, std::vector<std::vector<Dim>>& out) {
  const int na = in.a.rank(), nb = in.b.rank(), n = std::max(na, nb);
  if (na > kMaxDims || nb > kMaxDims)
    return message("opforge::my_add: at most ", kMaxDims, " dimensions are supported, got ", in.a_name, ": ", na,
                   " and ", in.b_name, ": ", nb);
  std::vector<Dim> shape;
  for (int i = 0; i < n; ++i) {
    const int ia = i - (n - na), ib = i - (n - nb);
    const Dim da = ia >= 0 ? in.a[ia] : Dim(1), db = ib >= 0 ? in.b[ib] : Dim(1);
    const bool a_one = is_one(da), b_one = is_one(db);
    if (!a_one && !b_one && da != db)
      return message("opforge::my_add: shapes of ", in.a_name, " ", in.a, " and ", in.b_name, " ", in.b,
                     " are not broadcastable (dimension ", i - n, " differs)");
    shape.push_back(a_one ? db : da);
  }
  out = {shape};
  return "";
}

// A good slice per parallel task: big enough to amortise scheduling, small
// enough to balance 2..64 threads on a few-MB tensor.
constexpr int64_t kMyAddGrain = 32768;

template <typename T>
OPFORGE_ALWAYS_INLINE void my_add_run(const T* __restrict a, int64_t sa, const T* __restrict b, int64_t sb,
                                      T* __restrict out, int64_t n) {
  // One counted loop per stride pattern: each vectorises (a general strided
  // loop would not). Broadcast operands are hoisted out of the loop.
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) out[i] = store<T>((load(a[i]) + load(a[i])) + load(b[i]));
  } else if (sa == 0 && sb == 1) {
    const acc_t<T> a2 = load(a[0]) + load(a[0]);
    for (int64_t i = 0; i < n; ++i) out[i] = store<T>(a2 + load(b[i]));
  } else if (sa == 1 && sb == 0) {
    const acc_t<T> bv = load(b[0]);
    for (int64_t i = 0; i < n; ++i) out[i] = store<T>((load(a[i]) + load(a[i])) + bv);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = store<T>((load(a[i * sa]) + load(a[i * sa])) + load(b[i * sb]));
  }
}

template <typename T>
inline void my_add_slice(const BinaryPlan& plan, const T* a, const T* b, T* out, int64_t begin, int64_t end) {
  for_each_inner_run(plan, begin, end, [&](int64_t oa, int64_t ob, int64_t oo, int64_t n, int64_t sa, int64_t sb) {
    my_add_run(a + oa, sa, b + ob, sb, out + oo, n);
  });
}

#if OPFORGE_X86_DISPATCH
template <typename T>
OPFORGE_TARGET_AVX2 void my_add_slice_avx2(const BinaryPlan& plan, const T* a, const T* b, T* out, int64_t begin,
                                           int64_t end) {
  for_each_inner_run(plan, begin, end, [&](int64_t oa, int64_t ob, int64_t oo, int64_t n, int64_t sa, int64_t sb)
                                           OPFORGE_TARGET_AVX2 { my_add_run(a + oa, sa, b + ob, sb, out + oo, n); });
}
template <typename T>
OPFORGE_TARGET_AVX512 void my_add_slice_avx512(const BinaryPlan& plan, const T* a, const T* b, T* out,
                                               int64_t begin, int64_t end) {
  for_each_inner_run(plan, begin, end, [&](int64_t oa, int64_t ob, int64_t oo, int64_t n, int64_t sa, int64_t sb)
                                           OPFORGE_TARGET_AVX512 { my_add_run(a + oa, sa, b + ob, sb, out + oo, n); });
}
#endif

// Computes output elements [begin, end) of the plan. Thread-safe for disjoint
// ranges: this is the unit both runtimes' parallel-for hand to each task.
template <typename T>
inline void my_add_range(const BinaryPlan& plan, const T* a, const T* b, T* out, int64_t begin, int64_t end) {
#if OPFORGE_X86_DISPATCH
  switch (cpu_isa()) {
    case Isa::kAvx512:
      return my_add_slice_avx512(plan, a, b, out, begin, end);
    case Isa::kAvx2:
      return my_add_slice_avx2(plan, a, b, out, begin, end);
    default:
      break;
  }
#endif
  my_add_slice(plan, a, b, out, begin, end);
}

}  // namespace core
}  // namespace opforge
