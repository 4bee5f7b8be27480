// Portable 16-bit float storage types for the compute cores.
//
// The cores must not depend on torch (c10::Half, c10::BFloat16) or ORT
// (Ort::Float16_t, Ort::BFloat16_t). All four of those are a bare uint16_t
// with IEEE binary16 / bfloat16 bits, exactly like the structs below, so each
// front end reinterprets its pointers as these types. Arithmetic happens in
// float (see acc_type), so torch and ORT round identically by construction.
#pragma once

#include <cstdint>
#include <cstring>

namespace opforge {
namespace core {

struct float16_t {
  uint16_t bits;
};
struct bfloat16_t {
  uint16_t bits;
};
static_assert(sizeof(float16_t) == 2 && sizeof(bfloat16_t) == 2, "16-bit storage types must be 2 bytes");

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// binary16 -> binary32, exact. Only normal-float arithmetic is used (no
// reliance on denormal inputs), so it is right even with flush-to-zero/DAZ on.
inline float half_to_float(float16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t o = static_cast<uint32_t>(h.bits & 0x7fffu) << 13;  // exponent/mantissa into float position
  const uint32_t exp = o & shifted_exp;
  o += (127u - 15u) << 23;                                       // rebias exponent
  if (exp == shifted_exp) {                                      // inf / nan
    o += (128u - 16u) << 23;
  } else if (exp == 0) {                                         // zero / subnormal: renormalise
    o += 1u << 23;
    o = float_to_bits(bits_to_float(o) - bits_to_float(113u << 23));
  }
  return bits_to_float(o | sign);
}

// binary32 -> binary16, round to nearest even (the IEEE default, what torch's
// c10::Half and ORT's MLFloat16 do), overflow to inf, nan stays nan.
inline float16_t float_to_half(float f) {
  uint32_t x = float_to_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  uint16_t out;
  if (x >= 0x7f800000u) {  // inf or nan
    out = static_cast<uint16_t>(x > 0x7f800000u ? 0x7e00u : 0x7c00u);
  } else if (x >= 0x47800000u) {  // >= 65536: inf (65520..65536 round up to inf in the normal path)
    out = 0x7c00u;
  } else if (x < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // Adding 0.5 (2^-1) aligns the half-subnormal grid with float's ulp, so the
    // FPU's own round-to-nearest-even does the rounding.
    const float shifted = bits_to_float(x) + 0.5f;
    out = static_cast<uint16_t>(float_to_bits(shifted) - 0x3f000000u);
  } else {
    const uint32_t mant_odd = (x >> 13) & 1u;
    x += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round half to even
    out = static_cast<uint16_t>(x >> 13);
  }
  return float16_t{static_cast<uint16_t>(out | sign)};
}

inline float bfloat16_to_float(bfloat16_t b) { return bits_to_float(static_cast<uint32_t>(b.bits) << 16); }

inline bfloat16_t float_to_bfloat16(float f) {
  uint32_t x = float_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return bfloat16_t{0x7fc0u};  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1u);                                   // round to nearest even
  return bfloat16_t{static_cast<uint16_t>(x >> 16)};
}

// acc_type<T>: the type arithmetic is done in; load/store convert to and from it.
template <typename T>
struct acc_type {
  using type = T;
};
template <>
struct acc_type<float16_t> {
  using type = float;
};
template <>
struct acc_type<bfloat16_t> {
  using type = float;
};
template <typename T>
using acc_t = typename acc_type<T>::type;

template <typename T>
inline acc_t<T> load(T v) {
  return v;
}
template <>
inline float load<float16_t>(float16_t v) {
  return half_to_float(v);
}
template <>
inline float load<bfloat16_t>(bfloat16_t v) {
  return bfloat16_to_float(v);
}

template <typename T>
inline T store(acc_t<T> v) {
  return v;
}
template <>
inline float16_t store<float16_t>(float v) {
  return float_to_half(v);
}
template <>
inline bfloat16_t store<bfloat16_t>(float v) {
  return float_to_bfloat16(v);
}

}  // namespace core
}  // namespace opforge
