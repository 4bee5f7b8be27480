// A packed, register-blocked GEMM for the cores (plain C++, no BLAS needed):
//
//   C[M x N] = A[M x K] * B[N x K]^T  (+ C when accumulate)
//
// "NT" because both operands are K-contiguous: A is a weight matrix [O, K],
// B a pixel-major column tile [pixels, K] (deform conv's im2col_nhwc_tile).
//
// Why our own: the ORT library must not link libtorch (whose MKL serves the
// torch side) and a BLAS from a wheel brings its own thread pool, fighting
// ORT's intra-op threads (and OpenBLAS's thread count is process-global).
// This one is single-threaded by design: callers parallelise over tiles with
// their runtime's pool. Structure (Goto/BLIS): K is blocked by KC, A and B
// panels are packed into MR- and NR-interleaved strips, and an MR x NR
// micro-kernel of vector FMAs (GCC vector extensions) runs at the widest ISA
// the CPU has (AVX-512 / AVX2 / SSE2 via cpu_dispatch.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_dispatch.h"

namespace opforge {
namespace core {

namespace gemm_detail {

constexpr int64_t kKC = 256;  // K block: an NR x KC panel of B stays in L1

// Packs rows [r0, r0 + rows) of X (row stride ldx), K range [k0, k0 + kc), into
// strips of R rows: dst[strip][k][r], zero-padded to a multiple of R rows.
template <typename T, int R>
OPFORGE_ALWAYS_INLINE void pack(const T* x, int64_t ldx, int64_t rows, int64_t k0, int64_t kc, T* dst) {
  for (int64_t s = 0; s < rows; s += R) {
    const int64_t n = std::min<int64_t>(R, rows - s);
    for (int64_t k = 0; k < kc; ++k) {
      for (int64_t r = 0; r < n; ++r) dst[k * R + r] = x[(s + r) * ldx + k0 + k];
      for (int64_t r = n; r < R; ++r) dst[k * R + r] = T(0);
    }
    dst += kc * R;
  }
}

// MR x (NV vectors) micro-kernel over kc: acc += a_strip (kc x MR) outer b_strip (kc x NR).
template <typename T, int VB, int MR, int NV>
OPFORGE_ALWAYS_INLINE void micro(const T* a, const T* b, int64_t kc, T* c, int64_t ldc, int64_t m, int64_t n,
                                 bool accumulate) {
  typedef T vec __attribute__((vector_size(VB)));
  constexpr int L = VB / sizeof(T), NR = L * NV;
  vec acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = vec{} ;
  for (int64_t k = 0; k < kc; ++k) {
    vec bv[NV];
    for (int v = 0; v < NV; ++v) std::memcpy(&bv[v], b + k * NR + v * L, VB);
    for (int r = 0; r < MR; ++r) {
      const T av = a[k * MR + r];
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
  if (m == MR && n == NR) {  // full tile: straight vector load/stores
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) {
        vec out = acc[r][v];
        if (accumulate) {
          vec old;
          std::memcpy(&old, c + r * ldc + v * L, VB);
          out += old;
        }
        std::memcpy(c + r * ldc + v * L, &out, VB);
      }
    return;
  }
  T buf[MR][NR];
  std::memcpy(buf, acc, sizeof buf);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) c[r * ldc + j] = (accumulate ? c[r * ldc + j] : T(0)) + buf[r][j];
}

template <typename T, int VB, int MR, int NV>
OPFORGE_ALWAYS_INLINE void gemm_nt_impl(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
                                        int64_t ldb, T* C, int64_t ldc, bool accumulate) {
  constexpr int NR = int(VB / sizeof(T)) * NV;
  const int64_t Mp = (M + MR - 1) / MR * MR, Np = (N + NR - 1) / NR * NR;
  // Per-thread scratch, reused across calls (callers run one GEMM per thread at a time).
  thread_local std::vector<T> pa, pb;
  pa.resize(static_cast<size_t>(Mp * kKC));
  pb.resize(static_cast<size_t>(Np * kKC));
  for (int64_t k0 = 0; k0 < K; k0 += kKC) {
    const int64_t kc = std::min(kKC, K - k0);
    pack<T, MR>(A, lda, M, k0, kc, pa.data());
    pack<T, NR>(B, ldb, N, k0, kc, pb.data());
    const bool acc = accumulate || k0 > 0;
    for (int64_t j = 0; j < N; j += NR)
      for (int64_t i = 0; i < M; i += MR)
        micro<T, VB, MR, NV>(pa.data() + i * kc, pb.data() + j * kc, kc, C + i * ldc + j, ldc,
                             std::min<int64_t>(MR, M - i), std::min<int64_t>(NR, N - j), acc);
  }
  if (K == 0 && !accumulate)
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, T(0));
}

template <typename T>
void gemm_nt_base(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C,
                  int64_t ldc, bool accumulate) {
  gemm_nt_impl<T, 16, 4, 2>(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}
#if OPFORGE_X86_DISPATCH
template <typename T>
OPFORGE_TARGET_AVX2 void gemm_nt_avx2(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
                                      int64_t ldb, T* C, int64_t ldc, bool accumulate) {
  gemm_nt_impl<T, 32, 6, 2>(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}
template <typename T>
OPFORGE_TARGET_AVX512 void gemm_nt_avx512(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
                                          int64_t ldb, T* C, int64_t ldc, bool accumulate) {
  gemm_nt_impl<T, 64, 8, 3>(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}
#endif

}  // namespace gemm_detail

// C[M x N] (+)= A[M x K] * B[N x K]^T, row-major with leading dimensions. float/double.
template <typename T>
inline void gemm_nt(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C,
                    int64_t ldc, bool accumulate = false) {
#if OPFORGE_X86_DISPATCH
  switch (cpu_isa()) {
    case Isa::kAvx512:
      return gemm_detail::gemm_nt_avx512(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    case Isa::kAvx2:
      return gemm_detail::gemm_nt_avx2(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    default:
      break;
  }
#endif
  gemm_detail::gemm_nt_base(M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

}  // namespace core
}  // namespace opforge
