// my_add(a, b) = 2*a + b: the one compute core behind torch.ops.opforge.my_add
// and the ORT kernel opforge::my_add. Plain C++ (no torch, no ORT types).
//
// The op is memory-bound (one pass: read a, read b, write out), so the core's
// job is to keep every inner loop a unit-stride (auto-vectorised) run and,
// for outputs too big for the caches, to write with non-temporal stores: that
// skips the read-for-ownership of each output line, i.e. 3 instead of 4 memory
// transfers per element.
//
// Numerics: computed in acc_t<T> (float for the 16-bit types) as (a + a) + b,
// exactly 2*a + b with one rounding to T at the end.
#pragma once

#include <cstdint>
#include <type_traits>

#include "broadcast.h"
#include "half.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace opforge {
namespace core {

// Below this many output bytes, streaming stores hurt (the result would have
// been cache-resident for the consumer); above it they save bandwidth.
constexpr int64_t kMyAddStreamingBytes = int64_t(4) << 20;

// A good slice per parallel task: big enough to amortise scheduling, small
// enough to balance 2..64 threads on a few-MB tensor.
constexpr int64_t kMyAddGrain = 32768;

template <typename T>
inline void my_add_run(const T* __restrict a, int64_t sa, const T* __restrict b, int64_t sb, T* __restrict out,
                       int64_t n) {
  // Separate loops per stride pattern: each is a simple counted loop the
  // compiler vectorises (the general strided one cannot be).
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

#if defined(__SSE2__)
// Contiguous float/double with non-temporal stores. Caller issues _mm_sfence
// (done at the end of my_add_range) before the data is read by another thread.
inline void my_add_run_streaming(const float* a, const float* b, float* out, int64_t n) {
  int64_t i = 0;
  for (; i < n && (reinterpret_cast<uintptr_t>(out + i) & 15u); ++i) out[i] = (a[i] + a[i]) + b[i];
  for (; i + 8 <= n; i += 8) {
    __m128 a0 = _mm_loadu_ps(a + i), a1 = _mm_loadu_ps(a + i + 4);
    __m128 b0 = _mm_loadu_ps(b + i), b1 = _mm_loadu_ps(b + i + 4);
    _mm_stream_ps(out + i, _mm_add_ps(_mm_add_ps(a0, a0), b0));
    _mm_stream_ps(out + i + 4, _mm_add_ps(_mm_add_ps(a1, a1), b1));
  }
  for (; i < n; ++i) out[i] = (a[i] + a[i]) + b[i];
}
inline void my_add_run_streaming(const double* a, const double* b, double* out, int64_t n) {
  int64_t i = 0;
  for (; i < n && (reinterpret_cast<uintptr_t>(out + i) & 15u); ++i) out[i] = (a[i] + a[i]) + b[i];
  for (; i + 4 <= n; i += 4) {
    __m128d a0 = _mm_loadu_pd(a + i), a1 = _mm_loadu_pd(a + i + 2);
    __m128d b0 = _mm_loadu_pd(b + i), b1 = _mm_loadu_pd(b + i + 2);
    _mm_stream_pd(out + i, _mm_add_pd(_mm_add_pd(a0, a0), b0));
    _mm_stream_pd(out + i + 2, _mm_add_pd(_mm_add_pd(a1, a1), b1));
  }
  for (; i < n; ++i) out[i] = (a[i] + a[i]) + b[i];
}
template <typename T>
struct has_streaming : std::false_type {};
template <>
struct has_streaming<float> : std::true_type {};
template <>
struct has_streaming<double> : std::true_type {};
#endif

// Computes output elements [begin, end) of the plan. Thread-safe for disjoint
// ranges; this is the unit both runtimes' parallel-for hand to each task.
template <typename T>
inline void my_add_range(const BinaryPlan& plan, const T* a, const T* b, T* out, int64_t begin, int64_t end) {
#if defined(__SSE2__)
  if constexpr (has_streaming<T>::value) {
    if (plan.numel * int64_t(sizeof(T)) >= kMyAddStreamingBytes) {
      bool streamed = false;
      for_each_inner_run(plan, begin, end, [&](int64_t oa, int64_t ob, int64_t oo, int64_t n, int64_t sa, int64_t sb) {
        if (sa == 1 && sb == 1) {
          my_add_run_streaming(a + oa, b + ob, out + oo, n);
          streamed = true;
        } else {
          my_add_run(a + oa, sa, b + ob, sb, out + oo, n);
        }
      });
      if (streamed) _mm_sfence();  // make the non-temporal stores globally visible before returning
      return;
    }
  }
#endif
  for_each_inner_run(plan, begin, end, [&](int64_t oa, int64_t ob, int64_t oo, int64_t n, int64_t sa, int64_t sb) {
    my_add_run(a + oa, sa, b + ob, sb, out + oo, n);
  });
}

}  // namespace core
}  // namespace opforge
