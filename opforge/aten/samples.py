"""One sample call per ATen op that opforge's bridge exports with the TorchScript exporter.

``opforge coverage`` exports each sample at every opset to measure what is covered, and the
round-trip tests run them in ONNX Runtime against torch. Inputs mix realistic values with the
edge values each op defines (0, -0.0, negatives, +-inf, nan), and binary ops broadcast.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
import torch.nn.functional as F

_EDGE = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 1e-3, -7.25, math.inf, -math.inf, math.nan]


def _edge(dtype, cols: int = 4) -> torch.Tensor:
    """3 x cols, every edge value in it, the rest realistic."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, cols, generator=g, dtype=torch.float64) * 2
    flat = x.view(-1)
    flat[: len(_EDGE)] = torch.tensor(_EDGE[: flat.numel()], dtype=torch.float64)
    return x.to(dtype)


def _real(dtype, *shape, lo=-3.0, hi=3.0, seed=1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(dtype)


def _positive(dtype, *shape, seed=2) -> torch.Tensor:
    return _real(dtype, *shape, lo=0.05, hi=4.0, seed=seed)


def _with_edges(x: torch.Tensor) -> torch.Tensor:
    """x with +-inf and nan at a few places (for ops that only move or add values)."""
    flat = x.reshape(-1).clone()
    flat[[1, 7, 19]] = torch.tensor([math.inf, -math.inf, math.nan], dtype=x.dtype)
    return flat.reshape(x.shape)


def _complex_sample(fn: Callable, *shape: int) -> "Sample":
    """A sample of fn(z) on z = complex(re, im) built in the model (real inputs)."""
    shape = shape or (3, 8)
    return Sample(lambda re, im: fn(torch.complex(re, im)),
                  lambda dt: (_real(dt, *shape), _real(dt, *shape, seed=3)), rtol=1e-4, atol=1e-4)


def _fft_sample(fn: Callable, *shape: int) -> "Sample":
    return Sample(fn, lambda dt: (_real(dt, *shape),), rtol=1e-4, atol=1e-4)


def _nan_holed(x: torch.Tensor) -> torch.Tensor:
    """x with NaN at every fifth place (for the nan* reductions, which skip them)."""
    holes = torch.arange(x.numel()).reshape(x.shape) % 5 == 0
    return x.masked_fill(holes, math.nan)


@dataclasses.dataclass(frozen=True)
class Sample:
    fn: Callable  # fn(*inputs): the torch call whose ATen op is bridged
    inputs: Callable  # inputs(dtype) -> tuple of tensors
    #: Dims of the first input that may vary at run time (exported as dynamic axes).
    dynamic: tuple = (0,)
    #: Edge values (inf, nan) are in the inputs: compare with equal_nan.
    float_only: bool = True
    rtol: float = 1e-5
    atol: float = 1e-6
    #: (opset, dtype) pairs ONNX Runtime has no kernel for (opset None: every opset).
    ort_gaps: frozenset = frozenset()

    def module(self) -> torch.nn.Module:
        """The sample call as a model, which is what the exporters take."""
        return _SampleModule(self.fn)

    def export(self, inputs, opset: int, f) -> tuple:
        """Exports the sample with dynamo=False at ``opset`` into ``f``, the batch dynamic in every
        input that has it (a loss's targets too); returns (input names, dynamic axes)."""
        names = [f"in{k}" for k in range(len(inputs))]
        first = inputs[0]
        dynamic = {n: {0: "batch"} for n, t in zip(names, inputs)
                   if self.dynamic and t.dim() > 0 and t.shape[0] == first.shape[0]}
        torch.onnx.export(self.module(), tuple(inputs), f, dynamo=False, opset_version=opset, input_names=names,
                          dynamic_axes=dynamic)
        return names, dynamic


class _SampleModule(torch.nn.Module):
    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _unary(fn, inputs=None, **kw) -> Sample:
    return Sample(fn, inputs or (lambda dt: (_edge(dt),)), **kw)


def _binary(fn, **kw) -> Sample:
    # (3, 4) with (4,): broadcasting, the second operand with edge values too.
    return Sample(fn, lambda dt: (_edge(dt), _edge(dt)[1].flip(0)), **kw)


def _gaps(opsets, dtype) -> frozenset:
    return frozenset((o, dtype) for o in opsets)


#: Antialiased Resize is opset 18, and ORT's has no double kernel. Below 18 opforge writes two
#: MatMuls (lowerings), which ORT runs in double too.
_RESIZE_AA_GAPS = _gaps((18, 19, 20), torch.float64)
# index_add's rows, row 0 twice (the case torch's own rule gets wrong); made here, not inside the
# traced sample, where torch.tensor makes the tracer warn that it freezes a constant
_INDEX_ADD_ROWS = torch.tensor([0, 2, 0])
#: ORT's Clip-11 kernel is float only (the hinge and margin losses clamp at 0).
_CLIP11_DOUBLE = _gaps((11,), torch.float64)

SAMPLES: dict[str, Sample] = {
    # Elementwise, unary
    "expm1": _unary(torch.expm1),
    "erfc": _unary(torch.erfc, ort_gaps=frozenset({(None, torch.float64)})),  # ORT: no double Erf
    "exp2": _unary(torch.exp2),
    "frac": _unary(torch.frac),
    "deg2rad": _unary(torch.deg2rad),
    "rad2deg": _unary(torch.rad2deg),
    "sinc": _unary(torch.sinc),
    "signbit": _unary(torch.signbit),
    "isposinf": _unary(torch.isposinf),
    "isneginf": _unary(torch.isneginf),
    "angle": _unary(torch.angle),
    "sgn": _unary(torch.sgn),
    "float_power": _unary(lambda x: torch.float_power(x, 2)),
    # Elementwise, binary (broadcasting)
    "logaddexp": _binary(torch.logaddexp),
    "logaddexp2": _binary(torch.logaddexp2),
    "xlogy": _binary(torch.xlogy),
    "heaviside": _binary(torch.heaviside),
    "hypot": _binary(torch.hypot),
    "copysign": _binary(torch.copysign),
    "fmax": _binary(torch.fmax),
    "fmin": _binary(torch.fmin),
    "ldexp": Sample(torch.ldexp, lambda dt: (_edge(dt), torch.tensor([0.0, 1.0, -2.0, 3.0], dtype=dt))),
    "isclose": _binary(lambda a, b: torch.isclose(a, b, rtol=0.1, atol=0.5)),
    "addcdiv": Sample(lambda a, b, c: torch.addcdiv(a, b, c, value=0.5),
                      lambda dt: (_real(dt, 3, 4), _real(dt, 4, seed=3), _positive(dt, 3, 1))),
    # Scans, reductions
    "logcumsumexp": Sample(lambda x: torch.logcumsumexp(x, 1), lambda dt: (_real(dt, 3, 5),)),
    "count_nonzero": Sample(lambda x: torch.count_nonzero(x, 1),
                            lambda dt: (torch.tensor([[0, 1, -0.0, 2], [0, 0, 0, 0], [3, 4, 5, 6]], dtype=dt),)),
    "histc": Sample(lambda x: torch.histc(x, 5, -2.0, 2.0), lambda dt: (_real(dt, 3, 6),), dynamic=()),
    "renorm": Sample(lambda x: torch.renorm(x, 2.0, 0, 1.0), lambda dt: (_real(dt, 3, 4),)),
    "diff": Sample(lambda x: torch.diff(x, dim=1), lambda dt: (_real(dt, 3, 5),)),
    "trapezoid": Sample(lambda x: torch.trapezoid(x, dx=0.5, dim=1), lambda dt: (_real(dt, 3, 5),)),
    # Linear algebra, products
    "addr": Sample(lambda m, a, b: torch.addr(m, a, b, beta=0.5, alpha=2.0),
                   lambda dt: (_real(dt, 3, 4), _real(dt, 3, seed=4), _real(dt, 4, seed=5)), dynamic=()),
    "addmv": Sample(lambda m, a, v: torch.addmv(m, a, v, beta=0.5, alpha=2.0),
                    lambda dt: (_real(dt, 3), _real(dt, 3, 4, seed=4), _real(dt, 4, seed=5)), dynamic=()),
    "addbmm": Sample(lambda m, a, b: torch.addbmm(m, a, b),
                     lambda dt: (_real(dt, 3, 5), _real(dt, 2, 3, 4, seed=4), _real(dt, 2, 4, 5, seed=5)), dynamic=()),
    "bilinear": Sample(lambda a, b, w: F.bilinear(a, b, w),
                       lambda dt: (_real(dt, 2, 3), _real(dt, 2, 4, seed=4), _real(dt, 5, 3, 4, seed=5))),
    "outer": Sample(torch.outer, lambda dt: (_real(dt, 3), _real(dt, 4, seed=4)), dynamic=()),
    "kron": Sample(torch.kron, lambda dt: (_real(dt, 2, 3), _real(dt, 2, 2, seed=4)), dynamic=()),
    "trace": Sample(torch.trace, lambda dt: (_real(dt, 4, 4),), dynamic=()),
    # Shape and indexing
    "rot90": Sample(lambda x: torch.rot90(x, 1, [0, 1]), lambda dt: (_real(dt, 3, 4),)),
    "fliplr": Sample(torch.fliplr, lambda dt: (_real(dt, 3, 4),)),
    "flipud": Sample(torch.flipud, lambda dt: (_real(dt, 3, 4),)),
    "select_scatter": Sample(lambda x, s: torch.select_scatter(x, s, 1, 2),
                             lambda dt: (_real(dt, 3, 4), _real(dt, 3, seed=4)), dynamic=()),
    "slice_scatter": Sample(lambda x, s: torch.slice_scatter(x, s, 1, 1, 3),
                            lambda dt: (_real(dt, 3, 4), _real(dt, 3, 2, seed=4)), dynamic=()),
    "diag_embed": Sample(torch.diag_embed, lambda dt: (_real(dt, 2, 3),)),
    "take_along_dim": Sample(lambda x, i: torch.take_along_dim(x, i, 1),
                             lambda dt: (_real(dt, 3, 4), torch.tensor([[0], [3], [1]])), float_only=False),
    # torch has rules for these from a later opset; below it the bridge lowers them: torch's
    # decompositions of the op (tril/triu via a Range mask, not Trilu-14; einsum via MatMul,
    # not Einsum-12; ...) or opforge's compositions (lowerings).
    "tril": Sample(lambda x: torch.tril(x, -1), lambda dt: (_real(dt, 3, 4),)),
    "triu": Sample(lambda x: torch.triu(x, 1), lambda dt: (_real(dt, 3, 4),)),
    "tile": Sample(lambda x: torch.tile(x, (2, 3)), lambda dt: (_real(dt, 3, 4),)),
    "unflatten": Sample(lambda x: torch.unflatten(x, 1, (2, 2)), lambda dt: (_real(dt, 3, 4),)),
    "celu": _unary(lambda x: torch.celu(x, 0.7)),
    "einsum": Sample(lambda a, b: torch.einsum("bij,bkj->bik", a, b),
                     lambda dt: (_real(dt, 2, 3, 4), _real(dt, 2, 5, 4, seed=4))),
    # torch's rules (13+) write invalid models for float64: the bridge takes those calls
    "diagonal": Sample(lambda x: torch.diagonal(x, -1, 1, 2), lambda dt: (_real(dt, 2, 4, 3),)),
    # both outputs: torch's rule (12+) writes no mask, so the bridge takes calls that use it
    "native_dropout": Sample(lambda x: torch.native_dropout(x, 0.3, False), lambda dt: (_edge(dt),)),
    "scaled_dot_product_attention": Sample(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        lambda dt: (_real(dt, 2, 2, 5, 4), _real(dt, 2, 2, 5, 4, seed=4), _real(dt, 2, 2, 5, 4, seed=5))),
    "grid_sampler": Sample(lambda x, grid: F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros",
                                                         align_corners=False),
                           lambda dt: (_real(dt, 2, 3, 4, 5), _real(dt, 2, 3, 6, 2, lo=-1.2, hi=1.2, seed=4)),
                           rtol=1e-4, atol=1e-5, ort_gaps=_gaps((16, 17, 18, 19), torch.float64)),
    "scatter_reduce": Sample(lambda x, i, src: x.scatter_reduce(1, i, src, "sum"),
                             lambda dt: (_real(dt, 3, 4), torch.tensor([[0, 1], [2, 2], [3, 0]]), _real(dt, 3, 2, seed=4)),
                             dynamic=()),
    "col2im": Sample(lambda x: F.fold(x, (5, 6), (3, 2), dilation=(1, 2), padding=(1, 1), stride=(2, 1)),
                     lambda dt: (_with_edges(_real(dt, 2, 18, 18)),), ort_gaps=_gaps((18, 19, 20), torch.float64)),
    "fake_quantize_per_channel_affine": Sample(
        lambda x, scale, zero_point: torch.fake_quantize_per_channel_affine(x, scale, zero_point, 1, 0, 255),
        lambda dt: (_real(dt, 3, 4, lo=-20, hi=40), torch.tensor([0.1, 0.25, 0.05, 0.2]),
                    torch.tensor([0, 10, 128, 255], dtype=torch.int32)), dynamic=()),
    # real output (return_complex=True: test_aten_lowerings, complex values as real pairs)
    "stft": Sample(lambda x: torch.stft(x, 16, hop_length=4, window=torch.hann_window(16, dtype=x.dtype),
                                        return_complex=False),
                   lambda dt: (_real(dt, 2, 64),), rtol=1e-4, atol=1e-4),
    # data-dependent output sizes
    "bincount": Sample(lambda x: torch.bincount(x, minlength=4), lambda dt: (torch.tensor([0, 1, 1, 3, 7, 1, 0]),),
                       float_only=False),
    "unique_consecutive": Sample(lambda x: torch.unique_consecutive(x, return_inverse=True, return_counts=True),
                                 lambda dt: (torch.tensor([1, 1, 2, 2, 3, 1, 1, -4]),), float_only=False),
    # Losses (nn.functional); nll_loss and nll_loss_nd are separate ATen ops (F.nll_loss records
    # nll_loss_nd), torch has rules for both from opset 12
    "nll_loss": Sample(lambda x, t, w: torch.ops.aten.nll_loss(x, t, w, 1, 2),
                       lambda dt: (_real(dt, 4, 5), torch.tensor([0, 2, 4, 2]), _positive(dt, 5, seed=4))),
    "nll_loss_nd": Sample(lambda x, t: F.nll_loss(x, t, ignore_index=1, reduction="sum"),
                          lambda dt: (_real(dt, 2, 4, 3), torch.tensor([[0, 1, 3], [2, 1, 1]]))),
    "cross_entropy_loss": Sample(lambda x, t: F.cross_entropy(x, t, ignore_index=2),
                                 lambda dt: (_real(dt, 4, 5), torch.tensor([0, 2, 4, 1]))),
    # Losses (nn.functional)
    "l1_loss": Sample(F.l1_loss, lambda dt: (_real(dt, 3, 4), _real(dt, 3, 4, seed=4))),
    "huber_loss": Sample(lambda a, b: F.huber_loss(a, b, delta=0.7), lambda dt: (_real(dt, 3, 4), _real(dt, 3, 4, seed=4))),
    "smooth_l1_loss": Sample(lambda a, b: F.smooth_l1_loss(a, b, beta=0.5),
                             lambda dt: (_real(dt, 3, 4), _real(dt, 3, 4, seed=4))),
    "soft_margin_loss": Sample(F.soft_margin_loss, lambda dt: (_real(dt, 3, 4), torch.sign(_real(dt, 3, 4, seed=4)))),
    "binary_cross_entropy": Sample(F.binary_cross_entropy,
                                   lambda dt: (_real(dt, 3, 4, lo=0.01, hi=0.99), _real(dt, 3, 4, lo=0, hi=1, seed=4))),
    "binary_cross_entropy_with_logits": Sample(F.binary_cross_entropy_with_logits,
                                               lambda dt: (_real(dt, 3, 4), _real(dt, 3, 4, lo=0, hi=1, seed=4))),
    "margin_ranking_loss": Sample(lambda a, b, y: F.margin_ranking_loss(a, b, y, margin=0.2),
                                  lambda dt: (_real(dt, 5), _real(dt, 5, seed=4), torch.sign(_real(dt, 5, seed=5))),
                                  dynamic=(), ort_gaps=_CLIP11_DOUBLE),
    "hinge_embedding_loss": Sample(F.hinge_embedding_loss,
                                   lambda dt: (_real(dt, 3, 4), torch.sign(_real(dt, 3, 4, seed=4))),
                                   ort_gaps=_CLIP11_DOUBLE),
    # Normalisation, activations
    "rms_norm": Sample(lambda x, w: F.rms_norm(x, (4,), w, eps=1e-5), lambda dt: (_real(dt, 3, 4), _positive(dt, 4))),
    "channel_shuffle": Sample(lambda x: F.channel_shuffle(x, 2), lambda dt: (_real(dt, 2, 4, 3, 3),)),
    "_upsample_bicubic2d_aa": Sample(
        lambda x: F.interpolate(x, scale_factor=0.5, mode="bicubic", antialias=True),
        lambda dt: (_real(dt, 1, 2, 8, 8),), dynamic=(), rtol=1e-4, atol=1e-5,
        ort_gaps=_RESIZE_AA_GAPS),
    "__lshift__": Sample(lambda x: x << 3, lambda dt: (torch.tensor([[0, 1, -2, 7], [100, -5, 3, 1]]),),
                         float_only=False),
    "__rshift__": Sample(lambda x: x >> 1, lambda dt: (torch.tensor([[0, 1, -2, 7], [100, -5, 3, 1]]),),
                         float_only=False),
    "_upsample_bilinear2d_aa": Sample(
        lambda x: F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True),
        lambda dt: (_real(dt, 1, 2, 8, 8),), dynamic=(), rtol=1e-4, atol=1e-5,
        ort_gaps=_RESIZE_AA_GAPS),
    # ---- Ops torch decomposes (torch._decomp tables or CompositeImplicitAutograd) that the
    # dynamo exporter handles through those decompositions, and the tracer records by their
    # own name (measured: torch.jit.trace of each sample). Aliases the tracer records as
    # another op are in TRACED_AS.
    # Elementwise
    "positive": _unary(torch.positive),
    "real": _unary(torch.real),  # real tensors: the identity
    "isreal": _unary(torch.isreal),
    "special_entr": _unary(torch.special.entr),
    "special_ndtr": _unary(torch.special.ndtr, ort_gaps=frozenset({(None, torch.float64)})),  # ORT: no double Erf
    # dynamo's translations of these two are wrong (NaN at -inf / +inf, precision lost in the
    # tails): opforge's curated compositions (compositions.CURATED)
    "special_log_ndtr": _unary(torch.special.log_ndtr,
                               inputs=lambda dt: (torch.cat([_edge(dt), _real(dt, 3, 4, lo=-30, hi=12)], 1),)),
    "special_erfcx": _unary(torch.special.erfcx,
                            inputs=lambda dt: (torch.cat([_edge(dt), _real(dt, 3, 4, lo=-9, hi=30)], 1),)),
    "special_xlog1py": _binary(torch.special.xlog1py),
    "isin": Sample(torch.isin, lambda dt: (torch.tensor([[1, 2, 3, 4], [5, 6, 7, 2], [0, -1, 9, 9]]),
                                           torch.tensor([2, 7, 9, -1])), float_only=False),
    # Reductions, statistics (NaN where the op skips it)
    "nansum": Sample(lambda x: torch.nansum(x, 1), lambda dt: (_nan_holed(_real(dt, 3, 8)),)),
    "nanmean": Sample(lambda x: torch.nanmean(x, 1), lambda dt: (_nan_holed(_real(dt, 3, 8)),)),
    "quantile": Sample(lambda x: torch.quantile(x, 0.3, dim=1), lambda dt: (_real(dt, 3, 8),)),
    "nanquantile": Sample(lambda x: torch.nanquantile(x, 0.3, dim=1), lambda dt: (_nan_holed(_real(dt, 3, 8)),)),
    "msort": Sample(torch.msort, lambda dt: (_real(dt, 5, 3),)),
    "dist": Sample(lambda a, b: torch.dist(a, b, 3), lambda dt: (_real(dt, 3, 4), _real(dt, 4, seed=4))),
    # dynamo cannot (NOT_IN_DYNAMO); the bridge lowers torch's decomposition
    "pdist": Sample(F.pdist, lambda dt: (_real(dt, 4, 3),), dynamic=()),
    "cumulative_trapezoid": Sample(lambda x: torch.cumulative_trapezoid(x, dx=0.5, dim=1),
                                   lambda dt: (_real(dt, 3, 5),)),
    "trapz": Sample(lambda x: torch.trapz(x, dim=1), lambda dt: (_real(dt, 3, 5),)),
    "gradient": Sample(lambda x: torch.gradient(x, dim=1), lambda dt: (_real(dt, 3, 5),)),  # Tensor[]
    # Shapes, copies, splits (the splits return Tensor[])
    "hstack": Sample(lambda a, b: torch.hstack([a, b]), lambda dt: (_real(dt, 3, 4), _real(dt, 3, 2, seed=4))),
    "vstack": Sample(lambda a, b: torch.vstack([a, b]), lambda dt: (_real(dt, 3, 4), _real(dt, 2, 4, seed=4))),
    "column_stack": Sample(lambda a, b: torch.column_stack([a, b]), lambda dt: (_real(dt, 3, 4), _real(dt, 3, seed=4))),
    "dstack": Sample(lambda a, b: torch.dstack([a, b]), lambda dt: (_real(dt, 3, 4), _real(dt, 3, 4, seed=4))),
    "hsplit": Sample(lambda x: torch.hsplit(x, 2), lambda dt: (_real(dt, 3, 4),)),
    "vsplit": Sample(lambda x: torch.vsplit(x, [1]), lambda dt: (_real(dt, 3, 4),), dynamic=()),
    "dsplit": Sample(lambda x: torch.dsplit(x, 2), lambda dt: (_real(dt, 2, 3, 4),)),
    "tensor_split": Sample(lambda x: torch.tensor_split(x, 3, 1), lambda dt: (_real(dt, 3, 7),)),
    "split_with_sizes_copy": Sample(lambda x: torch.split_with_sizes_copy(x, [1, 3], 1), lambda dt: (_real(dt, 3, 4),)),
    "unbind_copy": Sample(lambda x: torch.unbind_copy(x, 1), lambda dt: (_real(dt, 3, 4),)),
    "ravel": Sample(torch.ravel, lambda dt: (_real(dt, 3, 4),)),
    "mH": Sample(lambda x: x.mH, lambda dt: (_real(dt, 2, 3, 4),)),
    "matrix_H": Sample(lambda x: x.H, lambda dt: (_real(dt, 3, 4),)),
    "sum_to_size": Sample(lambda x: x.sum_to_size(1, 4), lambda dt: (_real(dt, 3, 4),), dynamic=()),
    "diag": Sample(torch.diag, lambda dt: (_real(dt, 4),), dynamic=()),
    "diagflat": Sample(lambda x: torch.diagflat(x, 1), lambda dt: (_real(dt, 2, 2),), dynamic=()),
    "block_diag": Sample(torch.block_diag, lambda dt: (_real(dt, 2, 3), _real(dt, 1, 2, seed=4)), dynamic=()),
    "cartesian_prod": Sample(torch.cartesian_prod, lambda dt: (_real(dt, 3), _real(dt, 2, seed=4)), dynamic=()),
    "tril_indices": Sample(lambda x: torch.tril_indices(3, 4, 1) + x, lambda dt: (torch.tensor([0]),),
                           float_only=False, dynamic=()),
    "triu_indices": Sample(lambda x: torch.triu_indices(3, 4, -1) + x, lambda dt: (torch.tensor([0]),),
                           float_only=False, dynamic=()),
    "logspace": Sample(lambda x: torch.logspace(-1, 2, 5, base=3.0, dtype=x.dtype) * x, lambda dt: (_real(dt, 5),),
                       dynamic=()),
    "argwhere": Sample(torch.argwhere, lambda dt: (torch.tensor([[0, 1, 0, 2], [3, 0, 0, 4]]),), float_only=False),
    "narrow_copy": Sample(lambda x: torch.narrow_copy(x, 1, 1, 2), lambda dt: (_real(dt, 3, 4),)),
    "permute_copy": Sample(lambda x: torch.permute_copy(x, (1, 0)), lambda dt: (_real(dt, 3, 4),)),
    "transpose_copy": Sample(lambda x: torch.transpose_copy(x, 0, 1), lambda dt: (_real(dt, 3, 4),)),
    "t_copy": Sample(torch.t_copy, lambda dt: (_real(dt, 3, 4),)),
    "expand_copy": Sample(lambda x: torch.expand_copy(x, (2, -1, 4)), lambda dt: (_real(dt, 3, 1),)),
    "squeeze_copy": Sample(lambda x: torch.squeeze_copy(x, 1), lambda dt: (_real(dt, 3, 1, 4),)),
    "unsqueeze_copy": Sample(lambda x: torch.unsqueeze_copy(x, 1), lambda dt: (_real(dt, 3, 4),)),
    "alias_copy": Sample(torch.alias_copy, lambda dt: (_with_edges(_real(dt, 3, 8)),)),
    "unfold_copy": Sample(lambda x: torch.unfold_copy(x, 1, 2, 1), lambda dt: (_real(dt, 3, 4),)),
    "as_strided_copy": Sample(lambda x: torch.as_strided_copy(x, (2, 2), (1, 2)), lambda dt: (_real(dt, 3, 4),),
                              dynamic=()),
    "fft_fftshift": Sample(torch.fft.fftshift, lambda dt: (_real(dt, 3, 5),)),
    "fft_ifftshift": Sample(torch.fft.ifftshift, lambda dt: (_real(dt, 3, 5),)),
    "max_unpool2d": Sample(lambda v, i: torch.ops.aten.max_unpool2d(v, i, [4, 4]),
                           lambda dt: F.max_pool2d(_real(dt, 2, 2, 4, 4), 2, return_indices=True)),
    "max_unpool3d": Sample(lambda v, i: torch.ops.aten.max_unpool3d(v, i, [4, 4, 4], [2, 2, 2], [0, 0, 0]),
                           lambda dt: F.max_pool3d(_real(dt, 2, 2, 4, 4, 4), 2, return_indices=True)),
    # Products
    "inner": Sample(torch.inner, lambda dt: (_real(dt, 3, 4), _real(dt, 2, 4, seed=4))),
    "vdot": Sample(torch.vdot, lambda dt: (_real(dt, 4), _real(dt, 4, seed=4)), dynamic=()),
    "chain_matmul": Sample(torch.chain_matmul, lambda dt: (_real(dt, 3, 4), _real(dt, 4, 2, seed=4), _real(dt, 2, 5, seed=5))),
    "linalg_multi_dot": Sample(lambda a, b, c: torch.linalg.multi_dot([a, b, c]),
                               lambda dt: (_real(dt, 3, 4), _real(dt, 4, 2, seed=4), _real(dt, 2, 5, seed=5))),
    "linalg_vecdot": Sample(torch.linalg.vecdot, lambda dt: (_real(dt, 3, 4), _real(dt, 4, seed=4))),
    "linalg_diagonal": Sample(lambda x: torch.linalg.diagonal(x, offset=1), lambda dt: (_real(dt, 2, 3, 4),)),
    "linalg_matrix_power": Sample(lambda x: torch.linalg.matrix_power(x, 3), lambda dt: (_real(dt, 2, 3, 3),)),
    "tensordot": Sample(lambda a, b: torch.tensordot(a, b, dims=([1], [0])),
                        lambda dt: (_real(dt, 3, 4), _real(dt, 4, 5, seed=4))),
    # Losses, grids
    "cosine_embedding_loss": Sample(lambda a, b, y: F.cosine_embedding_loss(a, b, y, margin=0.1),
                                    lambda dt: (_real(dt, 3, 4), _real(dt, 3, 4, seed=4), torch.tensor([1.0, -1.0, 1.0], dtype=dt)),
                                    ort_gaps=_CLIP11_DOUBLE),
    "triplet_margin_loss": Sample(F.triplet_margin_loss,
                                  lambda dt: (_real(dt, 3, 4), _real(dt, 3, 4, seed=4), _real(dt, 3, 4, seed=5)),
                                  ort_gaps=_CLIP11_DOUBLE),
    "poisson_nll_loss": Sample(F.poisson_nll_loss, lambda dt: (_real(dt, 3, 4), _positive(dt, 3, 4, seed=4))),
    "multi_margin_loss": Sample(F.multi_margin_loss, lambda dt: (_real(dt, 4, 5), torch.tensor([0, 2, 4, 1])),
                                ort_gaps=_CLIP11_DOUBLE),
    "multilabel_margin_loss": Sample(F.multilabel_margin_loss,
                                     lambda dt: (_real(dt, 2, 4), torch.tensor([[3, 0, -1, 1], [1, 2, 3, -1]])),
                                     ort_gaps=_CLIP11_DOUBLE),
    "nll_loss2d": Sample(lambda x, t: torch.ops.aten.nll_loss2d(x, t),
                         lambda dt: (_real(dt, 2, 3, 2, 2), torch.tensor([[[0, 1], [2, 1]], [[1, 1], [0, 2]]]))),
    "affine_grid_generator": Sample(lambda t: F.affine_grid(t, [2, 3, 4, 5], align_corners=False),
                                    lambda dt: (_real(dt, 2, 2, 3),), dynamic=()),
    # torch has rules for these, which refuse these calls (adaptive_avg_pool1d to a size that
    # does not divide the input, threshold other than 0) or compute them wrongly (index_add
    # with a repeated index): the bridge takes them
    "adaptive_avg_pool1d": Sample(lambda x: F.adaptive_avg_pool1d(x, 3), lambda dt: (_real(dt, 2, 3, 7),)),
    "threshold": Sample(lambda x: F.threshold(x, 0.3, -1.0), lambda dt: (_edge(dt),)),
    "index_add": Sample(lambda x, s: x.index_add(1, _INDEX_ADD_ROWS, s, alpha=2),
                        lambda dt: (_real(dt, 3, 4), _real(dt, 3, 3, seed=3))),
    # Complex tensors, inside the model: the bridge carries them as real pairs (dynamo's
    # convention); the model's inputs and outputs are real. float64 makes complex128.
    "complex": _complex_sample(lambda z: z.abs()),
    "polar": Sample(lambda r, t: torch.view_as_real(torch.polar(r, t)),
                    lambda dt: (_positive(dt, 3, 8), _real(dt, 3, 8, seed=3))),
    "view_as_real": _complex_sample(lambda z: torch.view_as_real(z) * 2),
    "view_as_complex": Sample(lambda x: torch.view_as_complex(x).abs(), lambda dt: (_real(dt, 3, 8, 2),)),
    "imag": _complex_sample(lambda z: z.imag),
    "fft_fft": _complex_sample(lambda z: torch.view_as_real(torch.fft.fft(z, n=10, norm="ortho"))),
    "fft_ifft": _complex_sample(lambda z: torch.view_as_real(torch.fft.ifft(z))),
    "fft_rfft": _fft_sample(lambda x: torch.fft.rfft(x).abs(), 3, 12),
    "fft_irfft": _complex_sample(lambda z: torch.fft.irfft(z, n=12)),
    "fft_hfft": _complex_sample(lambda z: torch.fft.hfft(z, norm="forward")),
    "fft_fft2": _complex_sample(lambda z: torch.view_as_real(torch.fft.fft2(z)), 3, 4, 6),
    "fft_ifft2": _complex_sample(lambda z: torch.view_as_real(torch.fft.ifft2(z, s=(3, 8))), 3, 4, 6),
    "fft_fftn": _complex_sample(lambda z: torch.view_as_real(torch.fft.fftn(z, dim=(1, 2))), 3, 4, 6),
    "fft_ifftn": _complex_sample(lambda z: torch.view_as_real(torch.fft.ifftn(z, s=(4, 5), dim=(1, 2))), 3, 4, 6),
    "fft_rfft2": _fft_sample(lambda x: torch.view_as_real(torch.fft.rfft2(x)), 3, 4, 6),
    "fft_rfftn": _fft_sample(lambda x: torch.fft.rfftn(x, dim=(1, 2), norm="ortho").abs(), 3, 4, 6),
    "fft_irfft2": _complex_sample(lambda z: torch.fft.irfft2(z), 3, 4, 6),
    "fft_irfftn": _complex_sample(lambda z: torch.fft.irfftn(z, s=(4, 7), dim=(1, 2)), 3, 4, 6),
    "fft_hfft2": _complex_sample(lambda z: torch.fft.hfft2(z), 3, 4, 6),
    "fft_hfftn": _complex_sample(lambda z: torch.fft.hfftn(z, dim=(1, 2)), 3, 4, 6),
    # dynamo translates ihfft (its result is a conjugate view) but not ihfft2/ihfftn
    # (coverage.NOT_IN_DYNAMO); opforge's DFT-matrix composition does all three
    "fft_ihfft": _fft_sample(lambda x: torch.view_as_real(torch.fft.ihfft(x).resolve_conj()), 3, 12),
    "fft_ihfft2": _fft_sample(lambda x: torch.view_as_real(torch.fft.ihfft2(x, norm="ortho")), 3, 4, 6),
    "fft_ihfftn": _fft_sample(lambda x: torch.fft.ihfftn(x, s=(4, 9), dim=(1, 2)).abs(), 3, 4, 6),
}

#: User-facing ATen ops dynamo translates whose translation opforge does not bridge, and why.
#: (Ops torch's TorchScript exporter already handles never get a bridge: it never shadows them.)
NOT_BRIDGED: dict[str, str] = {
    "cumprod": "dynamo cannot translate it (prims.prod); use the ATen fallback (opforge.export(..., aten_fallback=True))",
    "cummax": "dynamo cannot translate it; use the ATen fallback",
    "allclose": "returns a Python bool, not a tensor: nothing to export",
    "equal": "returns a Python bool, not a tensor: nothing to export",
    "is_nonzero": "returns a Python bool, not a tensor: nothing to export",
}

#: User-facing ATen ops in torch's decomposition tables that the tracer records as another op
#: (an alias, or a composite it traces through); that op is what needs a rule. Measured with
#: torch.jit.trace: the op -> what the tracer records.
TRACED_AS: dict[str, str] = {
    "conj": "_conj",  # on complex tensors (on real ones the tracer records nothing)
    "absolute": "abs", "arccos": "acos", "arccosh": "acosh", "arcsin": "asin", "arcsinh": "asinh",
    "arctan": "atan", "arctanh": "atanh", "arctan2": "atan2", "clip": "clamp", "fix": "trunc",
    "negative": "neg", "not_equal": "ne", "row_stack": "vstack", "moveaxis": "movedim",
    "swapaxes": "transpose", "swapdims": "transpose", "adjoint": "mH", "ger": "outer",
    "linalg_matmul": "matmul", "matrix_power": "linalg_matrix_power",
    "special_expit": "sigmoid", "special_exp2": "exp2", "special_log1p": "log1p",
    "special_round": "round", "special_logit": "logit", "special_xlogy": "xlogy",
    "special_logsumexp": "logsumexp", "special_i0": "i0", "special_digamma": "digamma",
    "special_psi": "digamma", "special_gammaln": "lgamma", "special_erfinv": "erfinv",
    "special_multigammaln": "mvlgamma", "special_polygamma": "polygamma", "special_gammainc": "igamma",
    "special_gammaincc": "igammac", "rnn_tanh_cell": "linear, tanh", "rnn_relu_cell": "linear, relu",
    "gru_cell": "linear, sigmoid, tanh, unsafe_chunk",
}

#: User-facing ATen ops in torch's decomposition tables that the dynamo exporter cannot export
#: either (measured on torch 2.14 with dynamo=True: torchlib has no translation for what they
#: decompose into, or torch.export fails), so they are outside the coverage table. The ATen
#: fallback (``opforge.export(..., aten_fallback=True)``) exports them.
NEITHER_EXPORTER: dict[str, str] = {
    **dict.fromkeys(["digamma", "lgamma", "erfinv", "i0", "polygamma", "mvlgamma", "igamma", "igammac", "special_i0e",
                     "special_i1", "special_i1e", "special_ndtri", "special_bessel_j0", "special_bessel_j1",
                     "special_spherical_bessel_j0", "special_zeta", "frexp", "nextafter", "gcd", "lcm"],
                    "special function or integer op: torchlib has no translation and torch no decomposition to ops it has"),
    **dict.fromkeys(["linalg_inv", "inverse", "linalg_solve", "linalg_solve_ex", "linalg_cholesky", "linalg_eigh",
                     "linalg_eigvalsh", "linalg_svd", "linalg_svdvals", "svd", "linalg_pinv", "pinverse",
                     "linalg_matrix_rank", "linalg_cond", "linalg_slogdet", "slogdet", "linalg_lu_factor",
                     "linalg_tensorinv", "linalg_tensorsolve", "matrix_exp", "nuclear_norm"],
                    "matrix factorisation: ONNX has no such op, and torchlib none"),
    **dict.fromkeys(["cov", "corrcoef", "ctc_loss", "histogramdd"], "torch.export fails (data-dependent shapes or values)"),
    **dict.fromkeys(["combinations", "vander", "linalg_vander", "diagonal_scatter", "as_strided_scatter",
                     "native_channel_shuffle"], "torchlib cannot translate what torch decomposes it into"),
    "linalg_eigvals": "complex dtypes, and dynamo cannot",
    "istft": "dynamo writes an invalid model (ORT: Type Error in its graph)",
}

#: torchlib entries that are not user-facing ATen ops: the tracer never records them in a
#: TorchScript graph (dynamo-internal, decomposition products, or private kernels behind a
#: public op that has a TorchScript rule), so they need no rule.
INTERNAL: dict[str, str] = {
    "_to_copy": "dynamo's functional form of Tensor.to (the tracer records aten::to)",
    "_unsafe_view": "dynamo's view of a copy (the tracer records aten::view/reshape)",
    "_unsafe_index": "dynamo's indexing decomposition (the tracer records aten::index)",
    "_unsafe_index_put": "dynamo's index_put decomposition (the tracer records aten::index_put)",
    "_softmax": "kernel behind softmax (the tracer records aten::softmax)",
    "_native_batch_norm_legit": "kernel behind batch_norm (the tracer records aten::batch_norm)",
    "_native_batch_norm_legit_functional": "kernel behind batch_norm (the tracer records aten::batch_norm)",
    "_native_batch_norm_legit_no_training": "kernel behind batch_norm (the tracer records aten::batch_norm)",
    "native_batch_norm": "kernel behind batch_norm (the tracer records aten::batch_norm)",
    "native_group_norm": "kernel behind group_norm (the tracer records aten::group_norm)",
    "nll_loss_forward": "kernel behind nll_loss (the tracer records aten::nll_loss_nd)",
    "_prelu_kernel": "kernel behind prelu (the tracer records aten::prelu)",
    "_embedding_bag": "kernel behind embedding_bag (the tracer records aten::embedding_bag)",
    "_embedding_bag_forward_only": "kernel behind embedding_bag (the tracer records aten::embedding_bag)",
    "_scaled_dot_product_efficient_attention": "kernel behind scaled_dot_product_attention, which has a rule",
    "_scaled_dot_product_flash_attention": "kernel behind scaled_dot_product_attention, which has a rule",
    "_scaled_dot_product_flash_attention_for_cpu": "kernel behind scaled_dot_product_attention, which has a rule",
    "_grouped_mm": "CUDA grouped GEMM kernel, reached only through torch.compile paths",
    "_linalg_det": "kernel behind linalg_det, which has a rule",
    "_local_scalar_dense": "Tensor.item(): the tracer records a constant",
    "_fft_c2c": "kernel behind the torch.fft transforms (the tracer records aten::fft_*)",
    "_fft_c2r": "kernel behind the torch.fft transforms (the tracer records aten::fft_*)",
    "_fft_r2c": "kernel behind the torch.fft transforms (the tracer records aten::fft_*)",
    "sym_size": "symbolic shape query of dynamo graphs (the tracer records aten::size)",
    "sym_storage_offset": "symbolic shape query of dynamo graphs",
    "copy": "dynamo's functional copy_ (the tracer records aten::copy_)",
    "lift_fresh_copy": "dynamo's constant lifting",
    "empty_strided": "dynamo's allocation (the tracer records aten::empty/zeros)",
    "new_empty_strided": "dynamo's allocation (the tracer records aten::new_empty)",
    "normal_functional": "dynamo's functional normal_ (random: no value round trip)",
    "hardtanh_backward": "a backward kernel: export is inference",
    "diagonal_copy": "functionalised view (the tracer records aten::diagonal)",
    "view_copy": "functionalised view (the tracer records aten::view)",
    "view_as_complex_copy": "functionalised view of complex tensors",
    "view_as_real_copy": "functionalised view of complex tensors",
    "mT": "exports already: the tracer records aten::mT and torch decomposes it into transpose",
    "concat": "alias of aten::cat, which the tracer records instead",
    "concatenate": "alias of aten::cat, which the tracer records instead",
    "divide": "alias of aten::div, which the tracer records instead",
    "multiply": "alias of aten::mul, which the tracer records instead",
    "subtract": "alias of aten::sub, which the tracer records instead",
    "greater": "alias of aten::gt, which the tracer records instead",
    "greater_equal": "alias of aten::ge, which the tracer records instead",
    "less": "alias of aten::lt, which the tracer records instead",
    "less_equal": "alias of aten::le, which the tracer records instead",
    "special_erf": "alias of aten::erf, which the tracer records instead",
    "special_erfc": "alias of aten::erfc, which the tracer records instead",
    "special_expm1": "alias of aten::expm1, which the tracer records instead",
    "special_sinc": "alias of aten::sinc, which the tracer records instead",
    "special_log_softmax": "alias of aten::log_softmax, which the tracer records instead",
    "special_softmax": "alias of aten::softmax, which the tracer records instead",
    "det": "exports already: the tracer records aten::linalg_det, which has a rule",
    "blackman_window": "exports already: torch traces it into elementary ops",
    "hamming_window": "exports already: torch traces it into elementary ops",
    "grid_sampler_2d": "kernel behind grid_sample (the tracer records aten::grid_sampler, which has a rule)",
}
