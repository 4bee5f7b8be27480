"""Compositions for opsets below the ONNX op that dynamo's translation of an ATen op needs.

The bridge (:mod:`.bridge`, :mod:`.translation`) tries torchlib's direct translation first, then torch's own
decompositions of the op. Where all of them still need a newer ONNX op than the target opset
has (ScatterElements with a reduction: 16; Col2Im: 18; per-axis QuantizeLinear: 13; Resize
with antialias: 18), the op is rewritten here in torch ops that older opsets do have, and that
rewrite goes through the same pipeline. They are used only at the opsets where nothing else
lowers, and the round-trip tests hold each to torch's values.

Each entry of :data:`LOWERINGS` is a factory: ``factory(call) -> fn``, called eagerly (outside
tracing) with the :class:`~.binding.Call`, so it can precompute constants from the call's
static sizes; ``fn`` takes the call's arguments like the ATen op does.

Two compositions here are used at *every* opset instead (``compositions.CURATED``), because
dynamo's own translation is wrong: :func:`scatter_reduce_one_hot` and
:func:`cross_entropy_one_hot_smoothing`.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from .errors import BridgeError


def _error(call, why: str):
    return BridgeError(f"{call.overload}: {why}")


# --------------------------------------------------------------------------------------------
# col2im (nn.Fold): each kernel offset's block, spread out by the stride with zeros and
# shifted by the offset, summed. Zeros are added, never multiplied, so inf and nan stay where
# torch puts them (a one-hot ConvTranspose would turn 0 * inf into nan everywhere).


def _col2im(call) -> Callable:
    def fn(x, output_size, kernel_size, dilation, padding, stride):
        unbatched = x.dim() == 2
        if unbatched:
            x = x.unsqueeze(0)
        (h, w), (kh, kw), (dh, dw), (ph, pw), (sh, sw) = output_size, kernel_size, dilation, padding, stride
        blocks_h = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        blocks_w = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        channels = x.shape[1] // (kh * kw)
        x = x.reshape(-1, channels, kh, kw, blocks_h, blocks_w)
        padded_h, padded_w = h + 2 * ph, w + 2 * pw
        out = None
        for i in range(kh):
            for j in range(kw):
                block = x[:, :, i, j, :, None, :, None]  # (n, c, blocks_h, 1, blocks_w, 1)
                block = F.pad(block, (0, sw - 1, 0, 0, 0, sh - 1))  # stride gaps
                block = block.reshape(-1, channels, blocks_h * sh, blocks_w * sw)
                top, left = i * dh, j * dw
                block = F.pad(block, (left, max(0, padded_w - left - blocks_w * sw),
                                      top, max(0, padded_h - top - blocks_h * sh)))
                block = block[:, :, :padded_h, :padded_w]
                out = block if out is None else out + block
        out = out[:, :, ph:ph + h, pw:pw + w]
        return out.squeeze(0) if unbatched else out

    return fn


# --------------------------------------------------------------------------------------------
# scatter_reduce: a one-hot match of each index against the positions along `dim`, then a
# plain reduction over the scattered elements. Memory is index.numel() x self.size(dim).
# The bridge uses it at every opset it covers (see compositions.CURATED): below 16 ONNX has no
# ScatterElements reduction, and dynamo's translation is wrong for reduce="mean" (it scatters
# without reducing), ignores include_self=False and needs index and src of one shape.


def scatter_reduce_one_hot(self, dim, index, src, reduce, include_self=True):
    """torch.Tensor.scatter_reduce in ops every opset has (see above)."""
    dim = dim % max(self.dim(), 1)
    size = self.shape[dim]
    src = src[tuple(slice(0, n) for n in index.shape)]
    hit = index.unsqueeze(-1) == torch.arange(size, dtype=index.dtype)  # index.shape + (size,)
    values = src.unsqueeze(-1)
    if reduce == "sum" or reduce == "mean":
        combined = torch.where(hit, values, torch.zeros((), dtype=src.dtype)).sum(dim)
    elif reduce == "prod":
        combined = torch.where(hit, values, torch.ones((), dtype=src.dtype)).prod(dim)
    elif reduce in ("amax", "amin"):
        low = -math.inf if src.dtype.is_floating_point else torch.iinfo(src.dtype).min
        high = math.inf if src.dtype.is_floating_point else torch.iinfo(src.dtype).max
        fill = torch.full((), low if reduce == "amax" else high, dtype=src.dtype)
        masked = torch.where(hit, values, fill)
        combined = masked.amax(dim) if reduce == "amax" else masked.amin(dim)
    else:
        raise ValueError(f"scatter_reduce: reduce must be sum, prod, mean, amax or amin, not {reduce!r}")
    count = hit.sum(dim)
    # (index.shape without dim) + (size,) -> self's layout, zero-padded where index is smaller.
    combined, count = combined.movedim(-1, dim), count.movedim(-1, dim)
    pads = []
    for d in reversed(range(self.dim())):
        pads += [0, self.shape[d] - combined.shape[d]]
    combined, count = F.pad(combined, pads), F.pad(count, pads)
    if reduce == "sum":
        reduced = combined + self if include_self else combined
    elif reduce == "prod":
        reduced = combined * self if include_self else combined
    elif reduce == "amax":
        reduced = torch.maximum(combined, self) if include_self else combined
    elif reduce == "amin":
        reduced = torch.minimum(combined, self) if include_self else combined
    else:  # mean: self counts as one more element when included
        total = combined + self if include_self else combined
        n = count + 1 if include_self else count
        n = torch.where(n > 0, n, torch.ones((), dtype=n.dtype)).to(self.dtype)  # 0 only where unused
        reduced = total / n if self.dtype.is_floating_point else torch.div(total, n, rounding_mode="floor")
    return torch.where(count > 0, reduced, self)


# --------------------------------------------------------------------------------------------
# cross_entropy with label smoothing or class probabilities. dynamo's translation writes ONNX
# SoftmaxCrossEntropyLoss and drops label_smoothing (a silent wrong answer, measured on torch
# 2.14), so the bridge uses it (see compositions.CURATED): log_softmax, then the loss written
# out, label smoothing as torch defines it (the uniform share weighted like the targets).


def cross_entropy_one_hot_smoothing(x, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
    """torch.nn.functional.cross_entropy (reduction: 0 none, 1 mean, 2 sum)."""
    if label_smoothing == 0.0 and not target.is_floating_point():
        return torch.ops.aten.cross_entropy_loss(x, target, weight, reduction, ignore_index, 0.0)
    class_dim = 0 if x.dim() == 1 else 1
    n_classes = x.shape[class_dim]
    logp = torch.log_softmax(x, class_dim)
    shape = [1] * x.dim()
    shape[class_dim] = n_classes
    w = weight.reshape(shape) if weight is not None else None
    weighted = logp * w if w is not None else logp
    if target.is_floating_point():  # class probabilities
        if label_smoothing:
            target = target * (1 - label_smoothing) + label_smoothing / n_classes
        loss = -(weighted * target).sum(class_dim)
        if reduction == 1:
            return loss.sum() / (x.numel() // n_classes) if x.dim() > 1 else loss
        return loss.sum() if reduction == 2 else loss
    nll = F.nll_loss(logp, target, weight, ignore_index=ignore_index, reduction=("none", "mean", "sum")[reduction])
    ignored = target == ignore_index
    smooth = torch.where(ignored, torch.zeros((), dtype=x.dtype), -weighted.sum(class_dim))
    if reduction == 1:
        if w is not None:
            safe = torch.where(ignored, torch.zeros((), dtype=target.dtype), target)
            denominator = torch.where(ignored, torch.zeros((), dtype=x.dtype), weight[safe]).sum()
        else:
            denominator = (~ignored).sum().to(x.dtype)
        smooth = smooth.sum() / denominator
    elif reduction == 2:
        smooth = smooth.sum()
    return (1 - label_smoothing) * nll + smooth * (label_smoothing / n_classes)


# --------------------------------------------------------------------------------------------
# fake_quantize_per_channel_affine: torch's kernel, written out. Per-axis QuantizeLinear needs
# opset 13; Round (11) rounds half to even like torch's nearbyint.


def _fake_quantize_per_channel(call) -> Callable:
    def fn(x, scale, zero_point, axis, quant_min, quant_max):
        shape = [1] * x.dim()
        shape[axis] = -1
        scale = scale.reshape(shape).to(x.dtype)
        zero_point = zero_point.reshape(shape).to(x.dtype)
        q = torch.clamp(torch.round(x * (1.0 / scale)) + zero_point, quant_min, quant_max)
        return (q - zero_point) * scale

    return fn


# --------------------------------------------------------------------------------------------
# Antialiased bilinear/bicubic resize: separable and linear, so it is two matrix products,
# out = Wh @ x @ Ww^T. The matrices are torch's own weights, read off by running the op itself
# on unit vectors (in float64, once, at export time). Needs a static height and width.


def _antialiased(call) -> Callable:
    x = call.args[0]
    height, width = x.shape[-2:]
    if height is None or width is None:
        raise _error(call, "below opset 18 (Resize with antialias), opforge exports it as two matrix "
                           "products, which need a static height and width; export with a static image size "
                           "or at opset 18")
    vec = call.overload.endswith(".vec")
    if vec:
        output_size, align_corners, scale_factors = call.args[1:4]
        scales = tuple(scale_factors) if scale_factors is not None else (None, None)
    else:
        output_size, align_corners, scale_h, scale_w = call.args[1:5]
        scales = (scale_h, scale_w)
    op = call.op

    def weights(n: int, axis: int) -> torch.Tensor:
        # Unit vectors along one axis; size 2 along the other, at scale 1 (the identity). (Not
        # size 1: torch's antialiased kernels give wrong values for a (n, 1, n, 1) input, whose
        # strides also read as channels-last.)
        basis = torch.eye(n, dtype=torch.float64)
        basis = basis[:, None, :, None].expand(n, 1, n, 2) if axis == 0 else basis[:, None, None, :].expand(n, 1, 2, n)
        basis = basis.contiguous()
        if vec:
            size = None if output_size is None else [output_size[0], 2] if axis == 0 else [2, output_size[1]]
            factors = None if scale_factors is None else [scales[0], 1.0] if axis == 0 else [1.0, scales[1]]
            out = op(basis, size, align_corners, factors)
        else:
            size = [output_size[0], 2] if axis == 0 else [2, output_size[1]]
            out = op(basis, size, align_corners, scales[0] if axis == 0 else None,
                     None if axis == 0 else scales[1])
        out = out[:, 0, :, 0] if axis == 0 else out[:, 0, 0, :]  # (n, out_n)
        return out.T.contiguous()  # (out_n, n)

    weights_h, weights_w = weights(height, 0), weights(width, 1)

    def fn(x, *args):
        wh = weights_h.to(x.dtype)
        ww = weights_w.to(x.dtype)
        # Both products with the weights on the right (x @ W folds x to 2-D): a 2-D weight on
        # the left would make torch.export pin the dynamic batch size.
        rows = torch.matmul(x.transpose(-1, -2), wh.T).transpose(-1, -2)  # (..., out_h, w)
        return torch.matmul(rows, ww.T)

    return fn


# --------------------------------------------------------------------------------------------
# stft (real output, return_complex=False): DFT is opset 17. Below, the frames are gathered
# (positions from Range, so the signal length may vary) and multiplied by the cos/sin DFT
# matrices (phases reduced exactly in integers, trig in float64).


def _stft(call) -> Callable:
    def fn(x, n_fft, hop_length=None, win_length=None, window=None, normalized=False, onesided=None,
           return_complex=None, align_to_window=None):
        if align_to_window:
            raise ValueError("stft: align_to_window=True is not supported below opset 17")
        hop = hop_length or n_fft // 4
        win = win_length or n_fft
        n_frames = 1 + (x.shape[-1] - n_fft) // hop
        positions = torch.arange(n_frames)[:, None] * hop + torch.arange(n_fft)[None, :]
        frames = torch.index_select(x, -1, positions.reshape(-1)).reshape(*x.shape[:-1], n_frames, n_fft)
        if window is not None or win < n_fft:
            w = window if window is not None else torch.ones(win, dtype=x.dtype)
            left = (n_fft - win) // 2
            frames = frames * F.pad(w, (left, n_fft - win - left))
        n_freq = n_fft // 2 + 1 if onesided is None or onesided else n_fft
        jk = torch.arange(n_fft, dtype=torch.int64)[:, None] * torch.arange(n_freq, dtype=torch.int64)[None, :]
        angle = (jk % n_fft).to(torch.float64) * (2 * math.pi / n_fft)
        cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
        real = torch.matmul(frames, cos)
        imag = -torch.matmul(frames, sin)
        out = torch.stack([real, imag], -1).transpose(-2, -3)  # (..., n_freq, n_frames, 2)
        out = out * (n_fft ** -0.5) if normalized else out
        # A complex result is the same real pair to the bridge (it carries complex values so)
        return torch.view_as_complex(out.contiguous()) if return_complex else out

    return fn


# --------------------------------------------------------------------------------------------
# bincount: dynamo scatters with a reduction (ScatterElements add: opset 16) and cannot take
# weights. A one-hot match against 0..n-1 and a sum does both at any opset. Memory is
# len(x) x n.


def _bincount(call) -> Callable:
    def fn(x, weights=None, minlength=0):
        # n = max(max(x) + 1, minlength), also for an empty x (the appended minlength - 1).
        n = torch.cat([x, torch.full((1,), minlength - 1, dtype=x.dtype)]).max() + 1
        hit = x[:, None] == torch.arange(n, dtype=x.dtype)[None, :]
        if weights is None:
            return hit.sum(0)
        zero = torch.zeros((), dtype=weights.dtype)
        counts = torch.where(hit, weights[:, None], zero).sum(0)
        return counts.to(weights.dtype if weights.is_floating_point() else torch.float64)  # torch's result types

    return fn


# --------------------------------------------------------------------------------------------
# The torch.fft transforms: DFT is opset 17 (and dynamo's translation of the complex-to-real
# ones needs it too). Each transformed dim is a product with cos/sin DFT matrices (phases
# reduced exactly in integers, trig in float64), on the real pair (re, im) of the values.


def _dft_matrices(n: int, rows: int, cols: int, dtype) -> tuple:
    jk = torch.arange(rows, dtype=torch.int64)[:, None] * torch.arange(cols, dtype=torch.int64)[None, :]
    angle = (jk % n).to(torch.float64) * (2 * math.pi / n)
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


def _resized(t, n: int):
    # torch.fft's n/s: trim, or pad with zeros, along the last dim
    length = t.shape[-1]
    return t[..., :n] if length >= n else F.pad(t, (0, n - length))


def _c2c(re, im, n: int, inverse: bool):
    # sum_j x_j e^(-+2 pi i jk/n) on the last dim (e^(-i s t) = cos t - i s sin t)
    cos, sin = _dft_matrices(n, n, n, re.dtype)
    sign = -1.0 if inverse else 1.0
    re, im = _resized(re, n), None if im is None else _resized(im, n)
    if im is None:
        return re @ cos, -sign * (re @ sin)
    return re @ cos + sign * (im @ sin), im @ cos - sign * (re @ sin)


def _c2r(re, im, n: int):
    # the real signal of length n whose spectrum's first n//2+1 bins are (re, im): each bin but
    # 0 (and n/2 for an even n) stands for its mirror image too, hence the weight 2
    m = n // 2 + 1
    re, im = _resized(re, m), _resized(im, m)
    cos, sin = _dft_matrices(n, m, n, re.dtype)
    weight = torch.full((m, 1), 2.0, dtype=re.dtype)
    weight[0] = 1.0
    if n % 2 == 0:
        weight[-1] = 1.0
    return re @ (cos * weight) - im @ (sin * weight)


def _fft(kind: str, dims_arg: str) -> Callable:
    """kind: c2c, ic2c (inverse), r2c, c2r, hfft, ihfft; dims_arg: "1" (n, dim), "2" or "n" (s, dim)."""

    def factory(call) -> Callable:
        def fn(x, size=None, dim=None, norm=None):
            if dims_arg == "1":
                dims = [-1 if dim is None else dim]
                sizes = None if size is None else [size]
            else:
                default = [-2, -1] if dims_arg == "2" else None
                dims = list(dim) if dim is not None else default
                if dims is None:
                    dims = list(range(x.dim()))[-len(size):] if size is not None else list(range(x.dim()))
                sizes = None if size is None else list(size)
            dims = [d % x.dim() for d in dims]
            if x.is_complex():
                re, im = torch.view_as_real(x).unbind(-1)
            else:
                re, im = _float_values(x), None
            if kind == "hfft":
                im = -im  # hfft = the complex-to-real transform of the conjugate, unscaled
            last = len(dims) - 1
            # The one-sided dim (the last) goes first, on the real input; the complex-to-real one
            # last. ihfft is conj(rfft(x)) / n: for a real x, the inverse transform, one-sided.
            one_sided = kind in ("r2c", "ihfft")
            order = [last, *range(last)] if one_sided else list(range(len(dims)))
            lengths = []
            for k in order:
                d = dims[k]
                re = re.movedim(d, -1)
                im = None if im is None else im.movedim(d, -1)
                given = None if sizes is None else sizes[k]
                if kind in ("c2r", "hfft") and k == last:
                    n = given if given is not None else 2 * (re.shape[-1] - 1)
                    re, im = _c2r(re, im, n), None
                else:
                    n = given if given is not None else re.shape[-1]
                    re, im = _c2c(re, im, n, inverse=kind in ("ic2c", "c2r", "hfft", "ihfft"))
                    if one_sided and k == last:
                        re, im = re[..., :n // 2 + 1], im[..., :n // 2 + 1]
                re = re.movedim(-1, d)
                im = None if im is None else im.movedim(-1, d)
                lengths.append(n)
            total = math.prod(lengths)
            # hfft, although computed with inverse matrices, is scaled as a forward transform
            inverse = kind in ("ic2c", "c2r", "ihfft")
            scale = {"backward": 1.0 / total if inverse else 1.0, "forward": 1.0 if inverse else 1.0 / total,
                     "ortho": total ** -0.5}[norm or "backward"]
            re = re * scale
            if im is None:
                return re
            return torch.view_as_complex(torch.stack([re, im * scale], -1))

        return fn

    return factory


def _float_values(x):
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


# --------------------------------------------------------------------------------------------
# index_add: adding rows that share an index needs ScatterND's reduction (opset 16). A one-hot
# match of the index against 0..size-1 sums them at any opset. Memory is len(index) x size.


def _index_add(call) -> Callable:
    def fn(x, dim, index, source, alpha=1):
        dim = dim % max(x.dim(), 1)
        hit = index[:, None] == torch.arange(x.shape[dim], dtype=index.dtype)[None, :]  # (n, size)
        moved = source.movedim(dim, -1).unsqueeze(-1)  # (..., n, 1)
        zero = torch.zeros((), dtype=source.dtype)
        added = torch.where(hit, moved, zero).sum(-2)  # (..., size)
        return x + alpha * added.movedim(-1, dim)

    return fn


#: ATen op name -> factory(call) -> fn, for opsets below the newer ONNX op dynamo needs.
LOWERINGS: dict[str, Callable] = {
    "col2im": _col2im,
    "fake_quantize_per_channel_affine": _fake_quantize_per_channel,
    "_upsample_bilinear2d_aa": _antialiased,
    "_upsample_bicubic2d_aa": _antialiased,
    "stft": _stft,
    "bincount": _bincount,
    "index_add": _index_add,
    "fft_fft": _fft("c2c", "1"), "fft_ifft": _fft("ic2c", "1"), "fft_rfft": _fft("r2c", "1"),
    "fft_irfft": _fft("c2r", "1"), "fft_hfft": _fft("hfft", "1"),
    "fft_fft2": _fft("c2c", "2"), "fft_ifft2": _fft("ic2c", "2"), "fft_rfft2": _fft("r2c", "2"),
    "fft_irfft2": _fft("c2r", "2"), "fft_hfft2": _fft("hfft", "2"),
    "fft_fftn": _fft("c2c", "n"), "fft_ifftn": _fft("ic2c", "n"), "fft_rfftn": _fft("r2c", "n"),
    "fft_ihfft": _fft("ihfft", "1"), "fft_ihfft2": _fft("ihfft", "2"), "fft_ihfftn": _fft("ihfft", "n"),
    "fft_irfftn": _fft("c2r", "n"), "fft_hfftn": _fft("hfft", "n"),
}
