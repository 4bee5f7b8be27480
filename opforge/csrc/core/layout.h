// Layout changes the cores' CPU kernels share: a feature map NCHW -> NHWC, so
// the channels of one position are contiguous for vector loops over C.
#pragma once

#include <algorithm>
#include <cstdint>

namespace opforge {
namespace core {

// Channels and pixels per cache-blocked tile of the transpose.
constexpr int64_t kLayoutTile = 32;

// Work items of nchw_to_nhwc over `batch` images: (image, tile of channels) pairs.
inline int64_t nchw_to_nhwc_items(int64_t batch, int64_t channels) {
  return batch * ((channels + kLayoutTile - 1) / kLayoutTile);
}

// Items [item_begin, item_end) of src [N, C, HW] -> dst [N, HW, C], each
// element through `convert` (a 16-bit -> float32 widening, or a copy), in
// tiles of kLayoutTile channels x kLayoutTile pixels. Items write disjoint
// elements, so callers split them over threads.
template <typename S, typename D, typename Convert>
inline void nchw_to_nhwc(const S* src, D* dst, int64_t channels, int64_t pixels, int64_t item_begin,
                         int64_t item_end, Convert convert) {
  const int64_t tiles = (channels + kLayoutTile - 1) / kLayoutTile;
  for (int64_t item = item_begin; item < item_end; ++item) {
    const int64_t n = item / tiles, c0 = (item % tiles) * kLayoutTile;
    const int64_t c1 = std::min(channels, c0 + kLayoutTile);
    const S* s = src + n * channels * pixels;
    D* d = dst + n * channels * pixels;
    for (int64_t q0 = 0; q0 < pixels; q0 += kLayoutTile)
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t q = q0; q < std::min(pixels, q0 + kLayoutTile); ++q)
          d[q * channels + c] = convert(s[c * pixels + q]);
  }
}

// One image [C, H, W] -> [H, W, C], copied.
template <typename T>
inline void nchw_to_nhwc(const T* src, T* dst, int64_t C, int64_t HW) {
  nchw_to_nhwc(src, dst, C, HW, 0, nchw_to_nhwc_items(1, C), [](T v) { return v; });
}

}  // namespace core
}  // namespace opforge
