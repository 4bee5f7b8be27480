// my_add's per-element body for the CUDA kernels (host+device, so the tests
// can also run it on the CPU). Same numerics as core/my_add.h: (a + a) + b in
// the accumulation type A, rounded once to T.
#pragma once

#include <cstdint>

#include "broadcast.h"
#include "host_device.h"

namespace opforge {
namespace core {

template <typename T, typename A>
OPFORGE_HD_INLINE T my_add_element(T a, T b) {
  using IO = ScalarIO<T, A>;
  const A x = IO::load(a);
  return IO::store((x + x) + IO::load(b));
}

// Output element i of a broadcasting plan (general, strided path).
template <typename T, typename A>
OPFORGE_HD_INLINE void my_add_item(const BinaryPlan& plan, int64_t i, const T* a, const T* b, T* out) {
  int64_t oa, ob;
  plan_offsets(plan, i, &oa, &ob);
  out[i] = my_add_element<T, A>(a[oa], b[ob]);
}

}  // namespace core
}  // namespace opforge
