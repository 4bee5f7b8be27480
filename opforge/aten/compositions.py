"""Curated compositions: torch code the ATen bridge translates instead of an ATen op, at every
opset, where the dynamo exporter's own translation is wrong or missing.

Each entry of :data:`CURATED` takes the op's arguments like the ATen op does and is translated
op by op like any other torch code (:mod:`.translation`); the round-trip tests hold each to
torch's values. Compositions for older opsets only are :mod:`.lowerings`'.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from . import lowerings


def _float_of(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


def _signbit(x):
    # -0.0 counts as negative: 1/-0.0 = -inf. (A NaN's sign bit cannot be read below ONNX
    # opset 26, which has BitCast: NaN counts as positive.)
    if not x.is_floating_point():
        return x < 0
    return (x < 0) | ((x == 0) & (1 / x < 0))


def _heaviside(x, values):
    # torchlib's translation gives 1 for NaN; torch gives 0.
    return torch.where(x == 0, values.to(x.dtype), torch.where(x > 0, torch.ones_like(x), torch.zeros_like(x)))


def _sgn(x):
    # torchlib's translation (Sign) keeps NaN; torch.sgn gives 0.
    if not x.is_floating_point():
        return torch.sign(x)
    return torch.where(torch.isnan(x), torch.zeros_like(x), torch.sign(x))


def _fmax(a, b):
    # dynamo has no translation (prims.fmax): the non-NaN operand wins.
    return torch.where(torch.isnan(a), b, torch.where(torch.isnan(b), a, torch.maximum(a, b)))


def _fmin(a, b):
    return torch.where(torch.isnan(a), b, torch.where(torch.isnan(b), a, torch.minimum(a, b)))


def _angle(x):
    # torchlib's translation gives 0 for NaN; torch keeps NaN.
    x = _float_of(x)
    return torch.where(torch.isnan(x), x, torch.where(x < 0, torch.full_like(x, math.pi), torch.zeros_like(x)))


def _hypot(a, b):
    # dynamo has no translation (prims.hypot). Scaled by the larger magnitude so that
    # squaring neither overflows nor underflows; inf wins over NaN, as in C's hypot.
    a, b = torch.abs(a), torch.abs(b)
    big, small = torch.maximum(a, b), torch.minimum(a, b)
    ratio = torch.where(big == 0, torch.zeros_like(big), small / big)
    out = big * torch.sqrt(1 + ratio * ratio)
    return torch.where(torch.isinf(a) | torch.isinf(b), torch.full_like(out, math.inf), out)


def _copysign(a, b):
    # dynamo has no translation (prims.signbit).
    if not isinstance(b, torch.Tensor):
        b = torch.tensor(b)
    a = _float_of(a) if not isinstance(a, torch.Tensor) or not a.is_floating_point() else a
    dtype = torch.promote_types(a.dtype, b.dtype) if b.is_floating_point() else a.dtype
    magnitude = torch.abs(a.to(dtype))
    return torch.where(_signbit(b), -magnitude, magnitude)


def _take_along_dim(x, indices, dim=None):
    # torch's decomposition broadcasts with sizes it reads from the example inputs: torch.export
    # keeps a dynamic batch a SymInt but fixes it to the traced size, and the graph expands to
    # it (a batch of 1 silently broadcast to 5 rows). Here every broadcast is a Where, which ONNX
    # broadcasts at run time: x against indices' shape and indices against x's, each with `dim`
    # taken from itself (a size-1 slice along dim of the other), then GatherElements.
    if dim is None:
        return torch.gather(x.reshape(-1), 0, indices.reshape(-1))
    dim = dim % x.dim()
    like_indices = torch.zeros_like(indices.narrow(dim, 0, 1), dtype=torch.bool)
    like_x = torch.zeros_like(x.narrow(dim, 0, 1), dtype=torch.bool)
    return torch.gather(torch.where(like_indices, x, x), dim, torch.where(like_x, indices, indices))


#: Chebyshev fit of erfc(z)·exp(z²)·(1 + z/2) in t = 1/(1 + z/2), z >= 0, relative error
#: below 1.2e-7 everywhere (Press et al., Numerical Recipes, "erfcc").
_ERFCX_FIT = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
              1.48851587, -0.82215223, 0.17087277)


def _erfcx_nonnegative(z):
    # The fit's exp(-z²) factor is left out, so nothing underflows: t -> 0 as z -> inf.
    t = 1 / (1 + 0.5 * z)
    poly = torch.full_like(z, _ERFCX_FIT[-1])
    for c in reversed(_ERFCX_FIT[:-1]):
        poly = c + t * poly
    return t * torch.exp(poly)


def _erfcx(x):
    # torchlib writes exp(x²)·erfc(x): NaN at +inf, and all precision lost past x≈4 in float32
    # (erfc is 1 - erf there). Measured over [-30, 30] and at ±1e300 against torch in float64:
    # relative error <= 1.1e-7; below 0, erfcx(x) = 2·exp(x²) - erfcx(-x), inf past x≈-9.3
    # (float32) as in torch.
    x = _float_of(x)
    pos = _erfcx_nonnegative(torch.abs(x))
    return torch.where(x >= 0, pos, 2 * torch.exp(x * x) - pos)


def _log1p_small(u):
    # log(1 + u) for |u| < 1, accurate when u is tiny: ONNX has no Log1p and log(1 + u) keeps
    # only u's part above 1's rounding (Goldberg's correction: scale by u / ((1 + u) - 1)).
    w = 1 + u
    return torch.where(w == 1, u, torch.log(w) * (u / (w - 1)))


def _log_ndtr(x):
    # torchlib's log(ndtr(x)) is NaN at -inf and -inf well before torch's (finite) values for
    # x << 0. With z = |x|/√2 and erfcx: x < 0: log(erfcx(z)/2) - z²; x >= 0:
    # log1p(-erfcx(z)·exp(-z²)/2), which keeps the tiny tail for large x.
    x = _float_of(x)
    z = torch.abs(x) * (1 / math.sqrt(2.0))
    tail = 0.5 * _erfcx_nonnegative(z)
    negative = torch.log(tail) - z * z
    positive = _log1p_small(-tail * torch.exp(-z * z))
    return torch.where(x < 0, negative, positive)


#: Compositions used instead of dynamo's translation where it is wrong or missing. Each is
#: torch code that dynamo translates op by op; the round-trip tests hold them to torch's values.
CURATED: dict[str, Callable] = {
    "signbit": _signbit,
    "heaviside": _heaviside,
    "angle": _angle,
    "hypot": _hypot,
    "copysign": _copysign,
    "sgn": _sgn,
    "fmax": _fmax,
    "fmin": _fmin,
    "special_erfcx": _erfcx,
    "special_log_ndtr": _log_ndtr,
    "take_along_dim": _take_along_dim,
    "scatter_reduce": lowerings.scatter_reduce_one_hot,
    "cross_entropy_loss": lowerings.cross_entropy_one_hot_smoothing,
}
