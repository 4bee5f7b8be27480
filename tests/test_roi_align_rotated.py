"""opforge::roi_align_rotated (mmcv's rotated RoI Align) against independent references: mmcv's
hard-coded cases (outputs and gradients, every dtype), a pure-PyTorch implementation written here
from the op's definition (forward and autograd gradient), the spec's numpy reference, and
torchvision's roi_align at angle 0; geometric identities (a half turn flips the bins, a quarter
turn with w and h swapped rotates them); gradcheck and gradgradcheck; check_op's round trips
(opcheck, references, both exporters, ORT, bad samples); one exported model (with nms_rotated and
batched_nms_rotated) serving other roi and box counts; hostile rois and attributes, which torch
and ONNX Runtime refuse alike, naming the op, the roi and the argument; and the budgets on output
elements and bilinear samples: the red team's calls refused before any work, raised budgets (torch:
opforge.set_budget; ORT: session config entries) running calls past the defaults against an analytic
reference."""

import contextlib
import math
import time
import warnings

import numpy as np
import onnxruntime
import pytest
import torch
import torchvision

import opforge
from opforge.ops.roi_align_rotated import ROI_ALIGN_ROTATED, _reference
from opforge.symbolics.onnx_schema import NodeTypeError
from opforge.testing import BadSample, Sample, op_tests, single_node_model

from helpers import run_in_ort

OP = "opforge::roi_align_rotated"
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
#: rtol = atol of a kernel in that dtype against a float64 reference on the same (rounded) inputs:
#: float32 computes in float32; the 16-bit types compute in float32 and round the result once.
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def close(got, want, dtype, scale=1.0):
    tol = TOL[dtype] * scale
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol)


# ---- an independent reference, in plain PyTorch --------------------------------------------------


def torch_roi_align_rotated(input, rois, output_size, spatial_scale=1.0, sampling_ratio=0, aligned=True,
                            clockwise=False):
    """The op from its definition, in float64 and differentiable in ``input`` by autograd: per roi, the
    sampling points of all its bins form one uniform grid of (oh * gh) x (ow * gw) points over the
    roi, rotated about its centre; bilinear taps by clamping the coordinates into the map (which is
    roi_align's border rule), points outside [-1, H] x [-1, W] masked out; bins = means of blocks."""
    oh, ow = output_size
    x = input.double()
    n, c, h, w = x.shape
    scale = float(np.float32(spatial_scale))  # ONNX stores float attributes as float32; so do the kernels
    offset = 0.5 if aligned else 0.0
    outs = []
    for roi in rois.detach().double().cpu().tolist():
        b = int(roi[0])
        cx, cy = roi[1] * scale - offset, roi[2] * scale - offset
        rw, rh = roi[3] * scale, roi[4] * scale
        if not aligned:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        theta = -roi[5] if clockwise else roi[5]
        gh = sampling_ratio if sampling_ratio > 0 else math.ceil(rh / oh)
        gw = sampling_ratio if sampling_ratio > 0 else math.ceil(rw / ow)
        if gh * gw == 0:
            outs.append(x.new_zeros(c, oh, ow))
            continue
        ys = -rh / 2 + (torch.arange(oh * gh, dtype=torch.float64) + 0.5) * (rh / (oh * gh))
        xs = -rw / 2 + (torch.arange(ow * gw, dtype=torch.float64) + 0.5) * (rw / (ow * gw))
        yy, xx = torch.meshgrid(ys, xs, indexing="ij")
        py = yy * math.cos(theta) - xx * math.sin(theta) + cy
        px = yy * math.sin(theta) + xx * math.cos(theta) + cx
        inside = ((py >= -1) & (py <= h) & (px >= -1) & (px <= w)).double()
        py, px = py.clamp(0, h - 1), px.clamp(0, w - 1)
        y0, x0 = py.floor(), px.floor()
        ly, lx = py - y0, px - x0
        y0, x0 = y0.long(), x0.long()
        y1, x1 = (y0 + 1).clamp(max=h - 1), (x0 + 1).clamp(max=w - 1)
        image = x[b]
        value = (image[:, y0, x0] * (1 - ly) * (1 - lx) + image[:, y0, x1] * (1 - ly) * lx
                 + image[:, y1, x0] * ly * (1 - lx) + image[:, y1, x1] * ly * lx) * inside
        outs.append(value.reshape(c, oh, gh, ow, gw).mean(dim=(2, 4)))
    return torch.stack(outs) if outs else x.new_zeros(0, c, oh, ow)


def numpy_reference(input, rois, output_size, spatial_scale=1.0, sampling_ratio=0, aligned=True, clockwise=False):
    """The spec's numpy reference (float64), on the inputs as the kernel sees them."""
    (out,) = _reference(input.detach().double().numpy(), rois.detach().double().numpy(),
                        output_height=output_size[0], output_width=output_size[1],
                        spatial_scale=float(np.float32(spatial_scale)), sampling_ratio=sampling_ratio,
                        aligned=int(aligned), clockwise=int(clockwise))
    return torch.from_numpy(out)


def random_case(n=2, c=3, h=7, w=9, k=6, scale=0.5, seed=0, dtype=torch.float64, spread=1.4, angles=True):
    """(input, rois): rois of every image, some centred outside the map, sizes 15..85% of the map's
    extent (in roi units, i.e. before spatial_scale), angles in (-2 pi, 2 pi)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g, dtype=torch.float64)
    extent_w, extent_h = w / scale, h / scale
    u = lambda: torch.rand(k, generator=g, dtype=torch.float64)  # noqa: E731
    b = torch.randint(0, n, (k,), generator=g).double()
    cx, cy = (u() * spread - (spread - 1) / 2) * extent_w, (u() * spread - (spread - 1) / 2) * extent_h
    rw, rh = (u() * 0.7 + 0.15) * extent_w, (u() * 0.7 + 0.15) * extent_h
    angle = (u() - 0.5) * 4 * math.pi if angles else torch.zeros(k, dtype=torch.float64)
    return x.to(dtype), torch.stack([b, cx, cy, rw, rh, angle], dim=1).to(dtype)


CONFIGS = {  # output_size, spatial_scale, sampling_ratio, aligned, clockwise
    "aligned-sr2": ((2, 3), 0.5, 2, True, False),
    "aligned-adaptive-cw": ((3, 2), 0.5, 0, True, True),
    "legacy-sr1-cw": ((2, 2), 1.0, 1, False, True),
    "legacy-adaptive": ((4, 3), 0.25, 0, False, False),
    "scale-not-float32": ((2, 2), 0.7, 3, True, False),
}


# ---- mmcv's hard-coded cases -------------------------------------------------------------------

# (input, rois, output, input gradient of output.sum()); output_size 2 x 2, spatial_scale 1,
# sampling_ratio 2, aligned=True (the figures of mmcv's tests/test_ops/test_roi_align_rotated.py)
_MAP4 = [[1., 2., 5., 6.], [3., 4., 7., 8.], [9., 10., 13., 14.], [11., 12., 15., 16.]]
_GRAD2 = [[3.0625, 0.4375], [0.4375, 0.0625]]
_GRAD4 = [[0.47265625, 0.42968750, 0.42968750, 0.04296875], [0.42968750, 0.39062500, 0.39062500, 0.03906250],
          [0.42968750, 0.39062500, 0.39062500, 0.03906250], [0.04296875, 0.03906250, 0.03906250, 0.00390625]]
MMCV_CASES = [
    ([[[[1., 2.], [3., 4.]]]], [[0., 0.5, 0.5, 1., 1., 0]], [[[[1.0, 1.25], [1.5, 1.75]]]], [[_GRAD2]]),
    ([[[[1., 2.], [3., 4.]]]], [[0., 0.5, 0.5, 1., 1., math.pi / 2]], [[[[1.5, 1], [1.75, 1.25]]]], [[_GRAD2]]),
    ([[[[1., 2.], [3., 4.]], [[4., 3.], [2., 1.]]]], [[0., 0.5, 0.5, 1., 1., 0]],
     [[[[1.0, 1.25], [1.5, 1.75]], [[4.0, 3.75], [3.5, 3.25]]]], [[_GRAD2, _GRAD2]]),
    ([[_MAP4]], [[0., 1.5, 1.5, 3., 3., 0]], [[[[1.9375, 4.75], [7.5625, 10.375]]]], [[_GRAD4]]),
    ([[_MAP4]], [[0., 1.5, 1.5, 3., 3., math.pi / 2]], [[[[7.5625, 1.9375], [10.375, 4.75]]]], [[_GRAD4]]),
]
# every figure above is a short dyadic fraction, exact in each dtype; tolerances allow one rounding
MMCV_TOL = {torch.float64: 1e-12, torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", range(len(MMCV_CASES)))
def test_mmcv_cases(case, dtype):
    inp, rois, out, grad = (torch.tensor(v, dtype=dtype) for v in MMCV_CASES[case])
    x = inp.clone().requires_grad_()
    got = opforge.roi_align_rotated(x, rois, (2, 2), 1.0, 2, True)
    assert got.dtype == dtype and got.shape == out.shape
    got.backward(torch.ones_like(got))
    tol = MMCV_TOL[dtype]
    torch.testing.assert_close(got.detach().double(), out.double(), rtol=tol, atol=tol)
    torch.testing.assert_close(x.grad.double(), grad.double(), rtol=tol, atol=tol)


@pytest.mark.parametrize("case", range(len(MMCV_CASES)))
def test_mmcv_cases_module_and_deprecated_keywords(case):
    inp, rois, out, _ = (torch.tensor(v) for v in MMCV_CASES[case])
    module = opforge.RoIAlignRotated((2, 2), 1.0, 2)
    assert module.output_size == (2, 2) and module.sampling_ratio == 2 and module.aligned and not module.clockwise
    torch.testing.assert_close(module(inp, rois), out, rtol=1e-6, atol=1e-6)
    with pytest.warns(DeprecationWarning) as record:
        old = opforge.RoIAlignRotated(out_size=(2, 2), spatial_scale=1.0, sample_num=2)
    messages = sorted(str(w.message) for w in record if w.category is DeprecationWarning)
    assert messages == ["opforge.RoIAlignRotated: 'out_size' is deprecated (as in mmcv), use 'output_size'",
                        "opforge.RoIAlignRotated: 'sample_num' is deprecated (as in mmcv), use 'sampling_ratio'"]
    assert old.output_size == (2, 2) and old.sampling_ratio == 2
    torch.testing.assert_close(old(inp, rois), module(inp, rois), rtol=0, atol=0)


def test_module_keyword_rules():
    with pytest.raises(TypeError, match="output_size or out_size, not both"):
        with pytest.warns(DeprecationWarning):
            opforge.RoIAlignRotated(2, out_size=2)
    with pytest.raises(TypeError, match="output_size is required"):
        opforge.RoIAlignRotated()
    with pytest.raises(opforge.OpInputError, match=f"{OP}: output_size must be an int or a pair"):
        opforge.RoIAlignRotated((2, 2, 2))
    assert "output_size=(7, 5), spatial_scale=0.25, sampling_ratio=3, aligned=False, clockwise=True" in repr(
        opforge.RoIAlignRotated((7, 5), 0.25, 3, False, True))


# ---- forward against the two references, every dtype -------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_forward_matches_torch_and_numpy_references(config, dtype):
    size, scale, sr, aligned, cw = CONFIGS[config]
    x, rois = random_case(scale=scale, seed=len(config), dtype=dtype)
    got = opforge.roi_align_rotated(x, rois, size, scale, sr, aligned, cw)
    assert got.dtype == dtype and got.shape == (rois.shape[0], x.shape[1], *size)
    want = torch_roi_align_rotated(x, rois, size, scale, sr, aligned, cw)
    assert want.abs().sum() > 1  # the rois do sample the map
    close(got, want, dtype)
    close(got, numpy_reference(x, rois, size, scale, sr, aligned, cw), dtype)
    # the two references agree with each other to float64 rounding
    torch.testing.assert_close(want, numpy_reference(x, rois, size, scale, sr, aligned, cw), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_input_gradient_matches_torch_reference(config):
    size, scale, sr, aligned, cw = CONFIGS[config]
    x, rois = random_case(scale=scale, seed=7 + len(config))
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = opforge.roi_align_rotated(ours, rois, size, scale, sr, aligned, cw)
    grad = torch.randn_like(out)
    out.backward(grad)
    torch_roi_align_rotated(theirs, rois, size, scale, sr, aligned, cw).backward(grad)
    assert theirs.grad.abs().sum() > 1
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_lower_precision_gradients_match_float64(dtype):
    x, rois = random_case(dtype=dtype, seed=3)
    leaf = x.clone().requires_grad_()
    out = opforge.roi_align_rotated(leaf, rois, (2, 3), 0.5, 0, True, False)
    grad = torch.randn(out.shape, dtype=torch.float64).to(dtype)
    out.backward(grad)
    assert leaf.grad.dtype == dtype
    ref = x.double().requires_grad_()
    torch_roi_align_rotated(ref, rois, (2, 3), 0.5, 0, True, False).backward(grad.double())
    close(leaf.grad, ref.grad, dtype, scale=2.0)  # a few sums of products, then one rounding


def test_function_apply_and_torch_op_match_the_functional():
    x, rois = random_case()
    want = opforge.roi_align_rotated(x, rois, (2, 3), 0.5, 2, False, True)
    torch.testing.assert_close(torch.ops.opforge.roi_align_rotated(x, rois, 2, 3, 0.5, 2, False, True), want,
                               rtol=0, atol=0)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_a = opforge.RoIAlignRotatedFunction.apply(a, rois, (2, 3), 0.5, 2, False, True)
    torch.testing.assert_close(out_a, want, rtol=0, atol=0)
    grad = torch.randn_like(want)
    out_a.backward(grad)
    opforge.roi_align_rotated(b, rois, (2, 3), 0.5, 2, False, True).backward(grad)
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
    # mmcv's defaults: sampling_ratio=0, aligned=True, clockwise=False; an int output_size
    torch.testing.assert_close(opforge.RoIAlignRotatedFunction.apply(x, rois, 2, 0.5),
                               opforge.roi_align_rotated(x, rois, (2, 2), 0.5, 0, True, False), rtol=0, atol=0)


# ---- gradients: gradcheck, gradgradcheck, rois have none ---------------------------------------


@pytest.mark.parametrize("sampling_ratio", [0, 2])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "legacy"])
@pytest.mark.parametrize("clockwise", [False, True], ids=["ccw", "cw"])
def test_gradcheck_and_gradgradcheck(clockwise, aligned, sampling_ratio):
    x, _ = random_case(n=2, c=2, h=5, w=6, scale=1.0)
    rois = torch.tensor([[0, 2.2, 1.9, 3.1, 2.3, 0.4],
                         [1, 4.6, 3.3, 2.7, 4.1, -1.1],
                         [1, -0.4, 5.2, 3.3, 2.6, 2.5],  # partly left of and below the map
                         [0, 5.9, 0.3, 4.4, 1.7, -2.9]], dtype=torch.float64)  # partly right of and above
    x.requires_grad_()

    def fn(t):
        return opforge.roi_align_rotated(t, rois, (2, 3), 1.0, sampling_ratio, aligned, clockwise)

    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))
    # both images receive gradient
    (g,) = torch.autograd.grad(fn(x).sum(), x)
    assert g[0].abs().sum() > 0 and g[1].abs().sum() > 0


def test_rois_that_require_grad_get_none():
    x, rois = random_case()
    x.requires_grad_()
    rois.requires_grad_()
    out = opforge.roi_align_rotated(x, rois, 2, 0.5)
    out.sum().backward()
    assert rois.grad is None  # no gradient, not a zero tensor
    assert x.grad is not None and x.grad.abs().sum() > 0
    # the function form too
    x.grad = None
    opforge.RoIAlignRotatedFunction.apply(x, rois, 2, 0.5).sum().backward()
    assert rois.grad is None and x.grad.abs().sum() > 0
    # only rois requiring grad: asking for their gradient gives none
    out = opforge.roi_align_rotated(x.detach(), rois, 2, 0.5)
    (g,) = torch.autograd.grad(out.sum(), rois, allow_unused=True)
    assert g is None


# ---- torchvision's roi_align at angle 0; the geometry of rotations --------------------------------


@pytest.mark.parametrize("scale", [1.0, 0.5, 0.25])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "legacy"])
def test_angle_zero_is_torchvision_roi_align(aligned, sampling_ratio, scale):
    x, rois = random_case(h=8, w=7, k=8, scale=scale, seed=int(scale * 8) + sampling_ratio, angles=False)
    b, cx, cy, w, h = rois[:, :5].unbind(1)
    boxes = torch.stack([b, cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=1)
    if not aligned:  # the legacy clamp works on the size, torchvision's on the extent: the same above 1 pixel
        assert bool(((w * scale) > 1).all() and ((h * scale) > 1).all())
    ours, tv = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = opforge.roi_align_rotated(ours, rois, (3, 2), scale, sampling_ratio, aligned)
    want = torchvision.ops.roi_align(tv, boxes, (3, 2), scale, sampling_ratio, aligned)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(want)
    out.backward(grad)
    want.backward(grad)
    torch.testing.assert_close(ours.grad, tv.grad, rtol=1e-10, atol=1e-10)
    # at angle 0 the turning direction does not matter
    torch.testing.assert_close(opforge.roi_align_rotated(x, rois, (3, 2), scale, sampling_ratio, aligned, True), out,
                               rtol=0, atol=0)


@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_half_and_quarter_turns(sampling_ratio):
    """A half turn samples each point's mirror image through the centre: the bins flipped both ways.
    A quarter turn with w and h (and the output sizes) swapped samples the same points as angle 0:
    the bins rotated by 90 degrees."""
    x, rois = random_case(h=9, w=8, k=5, scale=1.0, angles=False, spread=1.0, seed=11)
    out = opforge.roi_align_rotated(x, rois, (3, 4), 1.0, sampling_ratio)
    half = rois.clone()
    half[:, 5] = math.pi
    torch.testing.assert_close(opforge.roi_align_rotated(x, half, (3, 4), 1.0, sampling_ratio), out.flip(-1, -2),
                               rtol=1e-9, atol=1e-9)
    quarter = rois[:, [0, 1, 2, 4, 3, 5]].clone()
    quarter[:, 5] = math.pi / 2
    torch.testing.assert_close(opforge.roi_align_rotated(x, quarter, (4, 3), 1.0, sampling_ratio),
                               out.flip(-2).transpose(-1, -2), rtol=1e-9, atol=1e-9)
    # a full turn, and clockwise with the angle negated, are the same rois
    full = rois.clone()
    full[:, 5] = 2 * math.pi
    torch.testing.assert_close(opforge.roi_align_rotated(x, full, (3, 4), 1.0, sampling_ratio), out,
                               rtol=1e-9, atol=1e-9)
    _, turned = random_case(h=9, w=8, k=5, scale=1.0, seed=12)
    negated = turned.clone()
    negated[:, 5] = -negated[:, 5]
    torch.testing.assert_close(opforge.roi_align_rotated(x, turned, (3, 4), 1.0, sampling_ratio, True, True),
                               opforge.roi_align_rotated(x, negated, (3, 4), 1.0, sampling_ratio, True, False),
                               rtol=0, atol=0)


# ---- documented results at the edges ----------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_no_rois(dtype):
    x, rois = random_case(dtype=dtype)
    leaf = x.clone().requires_grad_()
    out = opforge.roi_align_rotated(leaf, rois[:0], (2, 3), 0.5)
    assert out.shape == (0, 3, 2, 3) and out.dtype == dtype
    out.sum().backward()
    assert leaf.grad.shape == x.shape and leaf.grad.dtype == dtype and not leaf.grad.any()
    # no images either, when there are no rois
    empty = opforge.roi_align_rotated(x[:0], rois[:0], 2, 0.5)
    assert empty.shape == (0, 3, 2, 2) and empty.dtype == dtype
    for n in (0, 2):
        ort_out = run_in_ort(ROI_ALIGN_ROTATED, (x[:n], rois[:0], 2, 3, 0.5, 0, True, False))
        assert ort_out.shape == (0, 3, 2, 3) and ort_out.dtype == dtype


def test_negative_sizes_are_clamped_without_aligned():
    x, _ = random_case(scale=1.0)
    rois = torch.tensor([[0, 3.3, 2.1, -3.0, 0.2, 0.4], [1, 4.2, 5.1, 0.0, -7.5, -1.0]], dtype=torch.float64)
    unit = rois.clone()
    unit[:, 3:5] = 1.0
    want = opforge.roi_align_rotated(x, unit, 2, 1.0, 0, False)
    assert want.abs().sum() > 0
    torch.testing.assert_close(opforge.roi_align_rotated(x, rois, 2, 1.0, 0, False), want, rtol=0, atol=0)
    torch.testing.assert_close(want, torch_roi_align_rotated(x, unit, (2, 2), 1.0, 0, False), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(run_in_ort(ROI_ALIGN_ROTATED, (x, rois, 2, 2, 1.0, 0, False, False)), want,
                               rtol=0, atol=0)


def test_zero_sizes():
    """aligned: a 0 x 0 roi has an adaptive grid of no points (zeros), or a fixed grid of points all
    at its centre (the bilinear value there, in every bin)."""
    x, _ = random_case(scale=1.0)
    rois = torch.tensor([[0, 3.3, 2.1, 0.0, 0.0, 0.4], [1, 4.2, 5.1, 0.0, 0.0, -1.0]], dtype=torch.float64)
    zeros = opforge.roi_align_rotated(x, rois, 2, 1.0, 0, True)
    assert zeros.shape == (2, 3, 2, 2) and not zeros.any()
    torch.testing.assert_close(run_in_ort(ROI_ALIGN_ROTATED, (x, rois, 2, 2, 1.0, 0, True, False)), zeros,
                               rtol=0, atol=0)
    centre = opforge.roi_align_rotated(x, rois, 2, 1.0, 2, True)
    for k, (b, cx, cy) in enumerate(((0, 2.8, 1.6), (1, 3.7, 4.6))):  # the centre minus half a pixel
        y0, x0 = int(cy), int(cx)
        ly, lx = cy - y0, cx - x0
        img = x[b]
        value = (img[:, y0, x0] * (1 - ly) * (1 - lx) + img[:, y0, x0 + 1] * (1 - ly) * lx
                 + img[:, y0 + 1, x0] * ly * (1 - lx) + img[:, y0 + 1, x0 + 1] * ly * lx)
        torch.testing.assert_close(centre[k], value[:, None, None].expand(3, 2, 2), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("angle", [1e30, -1e30])
def test_huge_angles_are_valid(angle, dtype):
    x, rois = random_case(k=3, scale=1.0, dtype=dtype)
    rois[:, 5] = angle
    got = opforge.roi_align_rotated(x, rois, 2, 1.0, 2)
    assert torch.isfinite(got).all() and got.abs().sum() > 0
    a = float(rois[0, 5])  # as the kernel sees it
    reduced = rois.clone()
    reduced[:, 5] = math.atan2(math.sin(a), math.cos(a))  # the same direction, in (-pi, pi]
    close(got, torch_roi_align_rotated(x, reduced, (2, 2), 1.0, 2), dtype, scale=10.0)
    close(run_in_ort(ROI_ALIGN_ROTATED, (x, rois, 2, 2, 1.0, 2, True, False)), got, dtype)


def test_many_rois_on_a_tiny_map():
    """200,000 rois of a 1 x 1 x 2 x 2 map: memory and time in proportion, values right."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, 2, 2, generator=g)
    k = 200_000
    rois = torch.rand(k, 6, generator=g) * torch.tensor([0, 3, 3, 2, 2, 7]) - torch.tensor([0, 0.5, 0.5, 0, 0, 3.5])
    got = opforge.roi_align_rotated(x, rois, 2, 1.0, 0)
    assert got.shape == (k, 1, 2, 2) and torch.isfinite(got).all()
    some = torch.tensor([0, 1, 12_345, 99_999, k - 1])
    close(got[some], torch_roi_align_rotated(x, rois[some], (2, 2), 1.0, 0), torch.float32)
    torch.testing.assert_close(run_in_ort(ROI_ALIGN_ROTATED, (x, rois, 2, 2, 1.0, 0, True, False)), got,
                               rtol=0, atol=0)


def test_sampling_ratio_bounds():
    x, rois = random_case(k=2, scale=1.0)
    # 256 x 256 points per bin is the most allowed
    close(opforge.roi_align_rotated(x, rois, 1, 1.0, 256), torch_roi_align_rotated(x, rois, (1, 1), 1.0, 256),
          torch.float64)
    # negative: adaptive, as 0
    torch.testing.assert_close(opforge.roi_align_rotated(x, rois, 2, 1.0, -3), opforge.roi_align_rotated(x, rois, 2),
                               rtol=0, atol=0)
    # the adaptive-grid bound is per bin, and a fixed grid lifts it
    big = torch.tensor([[0, 3.0, 3.0, 1e7, 1.0, 0.3]], dtype=torch.float64)
    with pytest.raises(opforge.OpInputError, match="needs an adaptive sampling grid"):
        opforge.roi_align_rotated(x, big, 1, 1.0, 0)
    assert torch.isfinite(opforge.roi_align_rotated(x, big, 1, 1.0, 4)).all()
    # 65536 points per bin: allowed (w = 2^16 pixels in one bin)
    edge = torch.tensor([[0, 3.0, 3.0, 65536.0, 1.0, 0.0]], dtype=torch.float64)
    close(opforge.roi_align_rotated(x, edge, 1, 1.0, 0), torch_roi_align_rotated(x, edge, (1, 1), 1.0, 0),
          torch.float64)
    edge[0, 3] = 65537.0
    with pytest.raises(opforge.OpInputError, match=r"grid of 1 x more than 65536 points per bin; at most 65536"):
        opforge.roi_align_rotated(x, edge, 1, 1.0, 0)
    square = torch.tensor([[0, 3.0, 3.0, 300.0, 300.0, 0.0]], dtype=torch.float64)  # 90,000 points, each axis 300
    with pytest.raises(opforge.OpInputError, match=r"rois row 0 \(w = 300\.0+, h = 300\.0+\) needs an adaptive "
                                                   r"sampling grid of 300 x 300 points per bin; at most 65536"):
        opforge.roi_align_rotated(x, square, 1, 1.0, 0)
    assert opforge.roi_align_rotated(x, square, 2, 1.0, 0).shape == (1, 3, 2, 2)  # 150 x 150 per bin


# ---- hostile rois and attributes: torch and ORT refuse them alike --------------------------------

_COLUMNS = ["cx", "cy", "w", "h", "angle"]


def _hostile_rois():
    base = [[0, 2.5, 2.5, 3.0, 2.0, 0.3], [1, 4.0, 3.0, 2.0, 3.0, -0.5], [0, 3.0, 4.0, 2.5, 2.5, 1.0]]
    for col, name in enumerate(_COLUMNS, start=1):
        for value in (math.nan, math.inf, -math.inf):
            rois = [row[:] for row in base]
            rois[2][col] = value
            yield f"{name}={value}", rois, rf"rois row 2 has a non-finite {name} \({'-' if value < 0 else ''}" \
                                           rf"{'nan' if math.isnan(value) else 'inf'}\)"
    for value, shown in ((-1, r"-1\.0+"), (2, r"2\.0+"), (0.5, r"0\.50+"), (1e30, r"1000000015047466219876688855040\.0+"),
                         (math.nan, "nan"), (math.inf, "inf")):
        rois = [row[:] for row in base]
        rois[1][0] = value
        yield f"batch={value}", rois, rf"rois row 1 has batch index {shown}, but input has N = 2 images: the index " \
                                      r"must be an integer in \[0, 2\)"
    rois = [row[:] for row in base]
    rois[1][3] = -2.0
    yield "negative-w", rois, r"rois row 1 has a negative size \(w = -2\.0+, h = 3\.0+\); with aligned=True sizes " \
                              r"must be >= 0"
    rois = [row[:] for row in base]
    rois[0][4] = -0.5
    yield "negative-h", rois, r"rois row 0 has a negative size"
    rois = [row[:] for row in base]
    rois[2][3] = 1e7
    yield "adaptive-grid", rois, r"rois row 2 \(w = 10000000\.0+, h = 2\.50+\) needs an adaptive sampling grid of 2 " \
                                 r"x more than 65536 points per bin; at most 65536 are allowed"


HOSTILE_ROIS = list(_hostile_rois())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("rois,match", [(r, m) for _, r, m in HOSTILE_ROIS], ids=[n for n, _, _ in HOSTILE_ROIS])
def test_hostile_rois_are_refused_in_torch_and_ort(rois, match, dtype):
    x = torch.randn(2, 3, 5, 6, dtype=dtype)
    rois = torch.tensor(rois, dtype=dtype)
    if "1000000015047466219876688855040" in match and dtype == torch.float64:
        match = match.replace("1000000015047466219876688855040", "1000000000000000019884624838656")
    with pytest.raises(opforge.OpInputError, match=f"^{OP}: {match}"):
        opforge.roi_align_rotated(x, rois, 2, 1.0, 0, True)
    with pytest.raises(RuntimeError, match=f"^{OP}: {match}"):
        torch.ops.opforge.roi_align_rotated(x, rois, 2, 2, 1.0, 0, True, False)
    # the backward op indexes the gradient by the same rois: it checks them too
    with pytest.raises(RuntimeError, match=f"^{OP}: {match}"):
        torch.ops.opforge._roi_align_rotated_backward(torch.ones(3, 3, 2, 2, dtype=dtype), rois, [2, 3, 5, 6], 2, 2,
                                                      1.0, 0, True, False)
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument,
                       match=f"INVALID_ARGUMENT.*{OP}: {match}"):
        run_in_ort(ROI_ALIGN_ROTATED, (x, rois, 2, 2, 1.0, 0, True, False))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_hostile_rois_in_16_bit(dtype):
    x = torch.randn(1, 2, 5, 6, dtype=dtype)
    for rois, match in (([[0, 2.5, 2.5, 3.0, math.inf, 0.3]], r"rois row 0 has a non-finite h \(inf\)"),
                        ([[1, 2.5, 2.5, 3.0, 2.0, 0.3]], r"rois row 0 has batch index 1\.0+, but input has N = 1"),
                        ([[0, 2.5, 2.5, 60000.0, 2.0, 0.3], [0, 2.5, 2.5, 2.0, 2.0, 0.3]],
                         r"rois row 0 .* needs an adaptive sampling grid")):
        rois = torch.tensor(rois, dtype=dtype)
        with pytest.raises(opforge.OpInputError, match=f"^{OP}: {match}"):
            opforge.roi_align_rotated(x, rois, 1, 1.0, 0)
        with pytest.raises(Exception, match=f"INVALID_ARGUMENT.*{OP}: {match}"):
            run_in_ort(ROI_ALIGN_ROTATED, (x, rois, 1, 1, 1.0, 0, True, False))


_ATTRS = [  # (output_height, output_width, spatial_scale, sampling_ratio), message
    ((0, 2, 1.0, 0), r"output_size must be in \[1, 1024\] per axis, got \(0, 2\)"),
    ((2, 5000, 1.0, 0), r"output_size must be in \[1, 1024\] per axis, got \(2, 5000\)"),
    ((-1, 2, 1.0, 0), r"output_size must be in \[1, 1024\] per axis, got \(-1, 2\)"),
    ((2, 2, 0.0, 0), r"spatial_scale must be a finite positive number, got 0\.0+"),
    ((2, 2, -1.0, 0), r"spatial_scale must be a finite positive number, got -1\.0+"),
    ((2, 2, math.inf, 0), r"spatial_scale must be a finite positive number, got inf"),
    ((2, 2, math.nan, 0), r"spatial_scale must be a finite positive number, got nan"),
    ((2, 2, 1e-46, 0), r"spatial_scale must be a finite positive number, got 0\.0+"),  # 0 as float32
    ((2, 2, 1.0, 1000), r"sampling_ratio must be at most 256 \(points per bin and axis; 0 or less: adaptive\), "
                        r"got 1000"),
]


@pytest.mark.parametrize("attrs,match", _ATTRS, ids=["oh0", "ow5000", "oh-1", "scale0", "scale-1", "scale-inf",
                                                      "scale-nan", "scale-underflow", "sr1000"])
def test_bad_attributes_are_refused_in_torch_and_ort(attrs, match):
    x, rois = random_case(dtype=torch.float32)
    oh, ow, scale, sr = attrs
    with pytest.raises(opforge.OpInputError, match=f"^{OP}: {match}"):
        opforge.roi_align_rotated(x, rois, (oh, ow), scale, sr)
    with pytest.raises(opforge.OpInputError, match=f"^{OP}: {match}"):
        opforge.RoIAlignRotated((oh, ow), scale, sr)(x, rois)
    # with no rois the attributes are still checked
    with pytest.raises(RuntimeError, match=f"^{OP}: {match}"):
        torch.ops.opforge.roi_align_rotated(x, rois[:0], oh, ow, scale, sr, True, False)
    # ORT: attribute rules are checked when the kernel is created
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    with pytest.raises(Exception, match=f"{OP}: {match}"):
        opforge.ort_session(single_node_model(ROI_ALIGN_ROTATED, (x, rois, oh, ow, scale, sr, True, False)), options)


@pytest.mark.parametrize("shape_x,shape_rois,match", [
    ((2, 3, 0, 6), (2, 6), r"input has an empty feature map \(H x W = 0 x 6\): there is nothing to sample"),
    ((2, 3, 5, 0), (0, 6), r"input has an empty feature map \(H x W = 5 x 0\)"),
    ((3, 5, 6), (2, 6), r"input must be 4-D \(N, C, H, W\), got shape \[3, 5, 6\]"),
    ((2, 3, 5, 6), (2, 5), r"rois must be 2-D \(K, 6\), one \(batch index, cx, cy, w, h, angle\) row per roi, got "
                           r"shape \[2, 5\]"),
    ((2, 3, 5, 6), (6,), r"rois must be 2-D \(K, 6\)"),
], ids=["empty-h", "empty-w-no-rois", "input-3d", "rois-5-cols", "rois-1d"])
def test_bad_shapes_are_refused_in_torch_and_ort(shape_x, shape_rois, match):
    x = torch.randn(shape_x)
    rois = torch.zeros(shape_rois)
    if rois.dim() == 2 and rois.shape[0] and rois.shape[1] == 6:
        rois[:, 3:5] = 2.0
    with pytest.raises(opforge.OpInputError, match=f"^{OP}: {match}"):
        opforge.roi_align_rotated(x, rois, 2)
    with pytest.raises(Exception, match=f"INVALID_ARGUMENT.*{OP}: {match}"):
        run_in_ort(ROI_ALIGN_ROTATED, (x, rois, 2, 2, 1.0, 0, True, False))


def test_dtype_mismatches_are_refused():
    x, rois = random_case(dtype=torch.float32)
    with pytest.raises(opforge.OpInputError, match=rf"^{OP}: rois has dtype (torch\.float64|Double) but input has "
                                                   rf"dtype (torch\.float32|Float); they must match"):
        opforge.roi_align_rotated(x, rois.double(), 2)
    with pytest.raises(opforge.OpInputError, match=rf"^{OP}: rois has dtype (torch\.float16|Half) but input"):
        opforge.roi_align_rotated(x, rois.half(), 2)
    with pytest.raises(opforge.OpInputError, match=rf"^{OP}: input has dtype (torch\.int64|Long); supported dtypes "
                                                   rf"are float32, float64, float16 and bfloat16"):
        opforge.roi_align_rotated(x.long(), rois.long(), 2)
    with pytest.raises(NodeTypeError, match=r"gets input 'rois' of type tensor\(double\) but 'input' of type "
                                            r"tensor\(float\); they share one element type"):
        opforge.ort_session(single_node_model(ROI_ALIGN_ROTATED, (x, rois.double(), 2, 2, 1.0, 0, True, False)))


def test_an_ort_session_survives_bad_rois():
    x, rois = random_case(dtype=torch.float32)
    sess = opforge.ort_session(single_node_model(ROI_ALIGN_ROTATED, (x, rois, 2, 3, 0.5, 0, True, False)))
    bad = rois.clone()
    bad[4, 0] = 7
    with pytest.raises(Exception, match=f"INVALID_ARGUMENT.*{OP}: rois row 4 has batch index 7"):
        sess.run(None, {"input": x.numpy(), "rois": bad.numpy()})
    (got,) = sess.run(None, {"input": x.numpy(), "rois": rois.numpy()})
    np.testing.assert_array_equal(got, opforge.roi_align_rotated(x, rois, (2, 3), 0.5).numpy())


# ---- check_op: opcheck, gradcheck, references, both exporters, ORT, bad samples -----------------

_x1, _rois1 = random_case(n=1, c=3, h=7, w=8, k=5, scale=0.5, seed=21)  # rois: the batch, so one image (index 0)
_x2, _rois2 = random_case(n=2, c=2, h=6, w=5, k=4, scale=1.0, seed=22)  # input: the batch, rois of both images
SAMPLES = [
    Sample(_x1, _rois1, 2, 3, 0.5, 2, True, False, batch=("rois",), name="rois-batch-aligned-sr2"),
    Sample(_x2, _rois2, 3, 2, 1.0, 0, False, True, batch=("input",), name="input-batch-legacy-adaptive-cw"),
    Sample(_x2, _rois2[:0], 2, 2, 0.7, 1, True, True, batch=(), name="no-rois"),
]
_bad_rois = _rois2.clone()
_bad_rois[2, 1] = math.nan
_far = _rois2.clone()
_far[3, 0] = 2
BAD = [
    BadSample(_x2, _bad_rois, 2, 2, 1.0, 0, True, False, match=rf"{OP}: rois row 2 has a non-finite cx \(nan\)",
              name="nan-cx"),
    BadSample(_x2, _far, 2, 2, 1.0, 0, True, False, match=rf"{OP}: rois row 3 has batch index 2\.0+, but input has "
              r"N = 2 images", name="batch-index"),
    BadSample(_x2, _rois2, 2, 2, 0.0, 0, True, False, match=rf"{OP}: spatial_scale must be a finite positive",
              name="scale"),
    BadSample(_x2, _rois2, 2, 1025, 1.0, 0, True, False, match=rf"{OP}: output_size must be in \[1, 1024\]",
              name="output-size"),
    BadSample(_x2, _rois2, 2, 2, 1.0, 257, True, False, match=rf"{OP}: sampling_ratio must be at most 256",
              name="sampling-ratio"),
    BadSample(_x2[0], _rois2, 2, 2, 1.0, 0, True, False, match=rf"{OP}: input must be 4-D", name="input-3d"),
    BadSample(_x2[:, :, :0], _rois2, 2, 2, 1.0, 0, True, False, match=rf"{OP}: input has an empty feature map",
              name="empty-map"),
]
test_check_op = op_tests(ROI_ALIGN_ROTATED, SAMPLES, bad_samples=BAD)


# ---- export: one model with the three ops, other roi and box counts --------------------------------


class Detector(torch.nn.Module):
    """A rotated detector's tail: pool the rois, pick boxes class-agnostic and per class."""

    def __init__(self):
        super().__init__()
        self.pool = opforge.RoIAlignRotated((2, 3), 0.5, 2)

    def forward(self, feat, rois, boxes, scores, labels):
        pooled = self.pool(feat, rois)
        keep = opforge.nms_rotated(boxes, scores, 0.3)
        keep_per_class = opforge.batched_nms_rotated(boxes, scores, labels, 0.3)
        return pooled.mean(dim=(2, 3)), keep, keep_per_class


_NAMES = ["feat", "rois", "boxes", "scores", "labels"]


def detector_inputs(k, n, seed):
    g = torch.Generator().manual_seed(seed)
    feat, rois = random_case(n=2, c=4, h=10, w=12, k=k, scale=0.5, seed=seed, dtype=torch.float32)
    boxes = torch.rand(n, 5, generator=g) * torch.tensor([30, 30, 8, 8, 6.0]) + torch.tensor([0, 0, 2, 2, -3.0])
    scores = torch.rand(n, generator=g)
    labels = torch.randint(0, 3, (n,), generator=g)
    return feat, rois, boxes, scores, labels


def export_detector(dynamo):
    args = detector_inputs(5, 9, 0)
    if dynamo:
        k, n = torch.export.Dim("k"), torch.export.Dim("n")
        kw = dict(dynamic_shapes=(None, {0: k}, {0: n}, {0: n}, {0: n}))
    else:
        kw = dict(dynamic_axes={"rois": {0: "k"}, "boxes": {0: "n"}, "scores": {0: "n"}, "labels": {0: "n"},
                                "pooled": {0: "k"}, "keep": {0: "m"}, "keep_per_class": {0: "mc"}})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*shares the same shape constraints")
        return opforge.export(Detector(), args, dynamo=dynamo, opset_version=18 if dynamo else 17, input_names=_NAMES,
                              output_names=["pooled", "keep", "keep_per_class"], **kw)


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_one_exported_detector_serves_other_counts(dynamo):
    proto = export_detector(dynamo)
    custom = sorted(n.op_type for n in proto.graph.node if n.domain == "opforge")
    assert custom == ["batched_nms_rotated", "nms_rotated", "roi_align_rotated"]
    node = next(n for n in proto.graph.node if n.op_type == "roi_align_rotated")
    attrs = {a.name: a for a in node.attribute}
    assert (attrs["output_height"].i, attrs["output_width"].i, attrs["sampling_ratio"].i, attrs["aligned"].i,
            attrs["clockwise"].i) == (2, 3, 2, 1, 0)
    assert attrs["spatial_scale"].f == 0.5
    nms_node = next(n for n in proto.graph.node if n.op_type == "nms_rotated")
    assert abs(next(a.f for a in nms_node.attribute if a.name == "iou_threshold") - 0.3) < 1e-7
    sessions = {"opforge.ort_session": opforge.ort_session(proto)}
    options = onnxruntime.SessionOptions()
    options.register_custom_ops_library(opforge.ort_library_path())  # plain ORT, the library registered by hand
    sessions["plain onnxruntime"] = onnxruntime.InferenceSession(proto.SerializeToString(), options,
                                                                 providers=["CPUExecutionProvider"])
    model = Detector()
    for k, n, seed in ((5, 9, 0), (13, 40, 1), (1, 1, 2), (0, 0, 3)):
        args = detector_inputs(k, n, seed)
        with torch.no_grad():
            want = model(*args)
        for label, sess in sessions.items():
            got = sess.run(None, {name: t.numpy() for name, t in zip(_NAMES, args)})
            assert got[0].shape == (k, 4), label
            np.testing.assert_allclose(got[0], want[0].numpy(), rtol=1e-5, atol=1e-6, err_msg=label)
            for g, w in zip(got[1:], want[1:]):
                assert g.dtype == np.int64
                np.testing.assert_array_equal(g, w.numpy(), err_msg=label)
    assert len(want[1]) == 0 and len(want[2]) == 0  # the last count was 0 rois and 0 boxes


class _ApplyModel(torch.nn.Module):
    def forward(self, feat, rois):
        return opforge.RoIAlignRotatedFunction.apply(feat, rois, (3, 2), 0.25, 0, False, True) * 2


def test_function_apply_exports_with_its_symbolic():
    feat, rois = random_case(n=2, c=3, h=8, w=9, k=4, scale=0.25, seed=5, dtype=torch.float32)
    proto = opforge.export(_ApplyModel(), (feat, rois), dynamo=False, opset_version=17, input_names=["feat", "rois"],
                           output_names=["out"], dynamic_axes={"rois": {0: "k"}, "out": {0: "k"}})
    node = next(n for n in proto.graph.node if n.domain == "opforge")
    assert node.op_type == "roi_align_rotated"
    attrs = {a.name: (a.f if a.name == "spatial_scale" else a.i) for a in node.attribute}
    assert attrs == dict(output_height=3, output_width=2, spatial_scale=0.25, sampling_ratio=0, aligned=0, clockwise=1)
    sess = opforge.ort_session(proto)
    _, more = random_case(n=2, c=3, h=8, w=9, k=11, scale=0.25, seed=6, dtype=torch.float32)
    for r in (rois, more):
        (got,) = sess.run(None, {"feat": feat.numpy(), "rois": r.numpy()})
        want = 2 * torch_roi_align_rotated(feat, r, (3, 2), 0.25, 0, False, True)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


# ---- budgets: output elements and bilinear samples, refused before any work ----------------------

MAX_OUT = "opforge.roi_align_rotated.max_output_elements"
MAX_SAMPLES = "opforge.roi_align_rotated.max_samples"
_OUT_HINT = rf" output elements; a trusted caller raises it with '{MAX_OUT}' \(an ONNX Runtime session config entry"
_SAMPLES_HINT = rf" samples; a trusted caller raises it with '{MAX_SAMPLES}' \(an ONNX Runtime session config entry"


def _hostile_budget_cases():
    """The red team's three calls, each within the shape and attribute rules: (name, input, rois, output
    size, sampling_ratio, message). One roi of 1024 x 1024 bins x 256 x 256 samples on a 1 x 1 map ran 370 s;
    36,000 adaptive rois of 1,792 px (864 KB of rois) ran past 60 s; 300 rois of 1024 x 1024 make 1.2 GB."""
    one = torch.zeros(1, 1, 1, 1)
    roi = torch.tensor([[0, 0.5, 0.5, 1.0, 1.0, 0.3]])
    yield ("samples-fixed", one, roi, 1024, 256,
           r"the call would take 68719476736 bilinear samples \(K x C x output_height x output_width x "
           r"sampling_ratio\^2 = 1 x 1 x 1024 x 1024 x 65536\), over the budget of 2147483648" + _SAMPLES_HINT)
    big = torch.tensor([[0, 0.5, 0.5, 1792.0, 1792.0, 0.3]]).repeat(36_000, 1)
    yield ("samples-adaptive", one, big, 7, 0,
           r"the call would take 115605504000 bilinear samples \(K x C x output_height x output_width x points per "
           r"bin, each roi's adaptive grid counted: 36000 x 1 x 7 x 7 x up to 256 x 256\), over the budget of "
           r"2147483648" + _SAMPLES_HINT)
    yield ("output", one, roi.repeat(300, 1), 1024, 1,
           r"the output \(K, C, output_height, output_width\) = \[300, 1, 1024, 1024\] has 314572800 elements, over "
           r"the budget of 67108864" + _OUT_HINT)


BUDGET_CASES = list(_hostile_budget_cases())
_BUDGET_IDS = [c[0] for c in BUDGET_CASES]


class _Quick:
    """Asserts that the block took under a second: the budget refuses before the work (which took minutes)."""

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        assert time.perf_counter() - self.start < 1.0, "the refusal took the time of the work"


@pytest.mark.parametrize("name,x,rois,size,sr,match", BUDGET_CASES, ids=_BUDGET_IDS)
def test_budgets_refuse_the_hostile_calls_in_torch_quickly(name, x, rois, size, sr, match):
    with _Quick(), pytest.raises(opforge.OpInputError, match=f"^{OP}: {match}"):
        opforge.roi_align_rotated(x, rois, size, 1.0, sr)
    with _Quick(), pytest.raises(RuntimeError, match=f"^{OP}: {match}"):
        torch.ops.opforge.roi_align_rotated(x, rois, size, size, 1.0, sr, True, False)
    # the backward takes the same samples (its output is the input's size)
    grad = torch.ones(1, 1, 1, 1).expand(rois.shape[0], 1, size, size)
    if name != "output":
        with _Quick(), pytest.raises(RuntimeError, match=f"^{OP}: {match}"):
            torch.ops.opforge._roi_align_rotated_backward(grad, rois, [1, 1, 1, 1], size, size, 1.0, sr, True, False)


def _roi_session(x, rois, size, sr, entries=()):
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    for key, value in entries:
        options.add_session_config_entry(key, str(value))  # before the library is registered
    return opforge.ort_session(single_node_model(ROI_ALIGN_ROTATED, (x, rois, size, size, 1.0, sr, True, False)),
                               options)


@pytest.mark.parametrize("name,x,rois,size,sr,match", BUDGET_CASES, ids=_BUDGET_IDS)
def test_budgets_refuse_the_hostile_calls_in_ort_quickly(name, x, rois, size, sr, match):
    sess = _roi_session(x, rois, size, sr)
    with _Quick(), pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument,
                                 match=f"INVALID_ARGUMENT.*{OP}: {match}"):
        sess.run(None, {"input": x.numpy(), "rois": rois.numpy()})


def test_budgets_are_listed_and_checked_in_torch():
    assert opforge.budgets() == {MAX_OUT: (1 << 26, 1 << 26), MAX_SAMPLES: (1 << 31, 1 << 31)}
    with pytest.raises(ValueError, match=r"no budget named 'opforge.roi_align_rotated.max_sample'; this library's "
                                         r"budgets:\nopforge.roi_align_rotated.max_output_elements\t67108864"):
        opforge.set_budget("opforge.roi_align_rotated.max_sample", 10)
    for bad in (0, -3, 2 ** 63, 1.5, True):
        with pytest.raises(ValueError, match="must be a positive integer"):
            opforge.set_budget(MAX_SAMPLES, bad)
    assert opforge.budgets()[MAX_SAMPLES] == (1 << 31, 1 << 31)


def test_ort_budget_entries_are_checked_when_the_library_is_registered():
    x, rois = torch.zeros(1, 1, 1, 1), torch.tensor([[0, 0.5, 0.5, 1.0, 1.0, 0.3]])
    for value in ("0", "-1", "12abc", "", "99999999999999999999"):
        with pytest.raises(Exception, match=rf"session config entry '{MAX_SAMPLES}' must be a positive integer, got "
                                            rf"'{value}'"):
            _roi_session(x, rois, 2, 1, [(MAX_SAMPLES, value)])


def linear_case(k, c, size, seed=0):
    """(input, rois, reference): a map linear in (y, x) per channel, a_c y + b_c x + d_c with small-integer
    values (exact in float32), and rotated rois well inside it. Bilinear sampling is exact on such a map
    and a bin's points are symmetric about its centre, so every bin is the map's value at the rotated bin
    centre: an analytic reference that stays cheap for outputs of millions of bins (check_linear)."""
    g = torch.Generator().manual_seed(seed)
    h = w = 64
    a, b, d = (torch.randint(-3, 4, (c,), generator=g).double() for _ in range(3))
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
    x = (a[:, None, None] * ys + b[:, None, None] * xs + d[:, None, None]).float().unsqueeze(0)
    angle = torch.rand(k, generator=g, dtype=torch.float64) * 6 - 3
    cx, cy = 32.5 + torch.rand(k, generator=g, dtype=torch.float64), 32.5 + torch.rand(k, generator=g, dtype=torch.float64)
    # 40 x 30 px: corners within 25 px of (32, 32), so no sample is clamped or outside
    rois = torch.stack([torch.zeros(k, dtype=torch.float64), cx, cy, torch.full((k,), 40.0, dtype=torch.float64),
                        torch.full((k,), 30.0, dtype=torch.float64), angle], 1)
    centre = (torch.arange(size, dtype=torch.float64) + 0.5) / size - 0.5  # bin centres, in roi units
    yy, xx = centre[None, :, None] * 30.0, centre[None, None, :] * 40.0
    cos, sin = angle.cos()[:, None, None], angle.sin()[:, None, None]
    py = yy * cos - xx * sin + (cy - 0.5)[:, None, None]  # aligned: the half-pixel offset
    px = yy * sin + xx * cos + (cx - 0.5)[:, None, None]
    return x, rois.float(), (a.float(), b.float(), d.float(), py.float(), px.float())


def check_linear(got, reference, atol=2e-3):
    """got (K, C, size, size) against linear_case's reference, one channel at a time (no 4-D temporaries)."""
    a, b, d, py, px = reference
    got = torch.as_tensor(got)
    assert got.shape == (py.shape[0], a.shape[0], *py.shape[1:])
    for c in range(got.shape[1]):
        err = (got[:, c] - (a[c] * py + b[c] * px + d[c])).abs().max().item()
        assert err <= atol, f"channel {c}: max |diff| {err}"


@contextlib.contextmanager
def budget(name, value):
    old = opforge.set_budget(name, value)
    try:
        yield
    finally:
        opforge.set_budget(name, old)


_OVER_OUT = r"has 68157440 elements, over the budget of 67108864"


def test_a_raised_output_budget_runs_a_larger_call_in_torch():
    # 1 x 65 x 1024 x 1024 = 68,157,440 elements: 1.6% over the default
    x, rois, reference = linear_case(1, 65, 1024)
    with pytest.raises(opforge.OpInputError, match=_OVER_OUT):
        opforge.roi_align_rotated(x, rois, 1024, 1.0, 1)
    with budget(MAX_OUT, 70_000_000):
        got = opforge.roi_align_rotated(x, rois, 1024, 1.0, 1)
    assert opforge.budgets()[MAX_OUT] == (1 << 26, 1 << 26)  # restored
    check_linear(got, reference)


def test_a_raised_output_budget_runs_a_larger_call_in_ort():
    x, rois, reference = linear_case(1, 65, 1024)
    feeds = {"input": x.numpy(), "rois": rois.numpy()}
    with pytest.raises(Exception, match=f"INVALID_ARGUMENT.*{OP}: .*{_OVER_OUT}"):
        _roi_session(x, rois, 1024, 1).run(None, feeds)
    (got,) = _roi_session(x, rois, 1024, 1, [(MAX_OUT, 70_000_000)]).run(None, feeds)
    check_linear(got, reference)


def test_a_raised_samples_budget_runs_a_larger_call_in_torch_and_ort():
    # 8 x 256 x 64 x 64 x 17^2 = 2.42e9 samples: 1.13x the default
    x, rois, reference = linear_case(8, 256, 64)
    match = r"the call would take 2424307712 bilinear samples .* over the budget of 2147483648"
    with pytest.raises(opforge.OpInputError, match=match):
        opforge.roi_align_rotated(x, rois, 64, 1.0, 17)
    with budget(MAX_SAMPLES, 3 << 30):
        check_linear(opforge.roi_align_rotated(x, rois, 64, 1.0, 17), reference)
    # ORT: per SessionOptions; another session keeps the default
    feeds = {"input": x.numpy(), "rois": rois.numpy()}
    (got,) = _roi_session(x, rois, 64, 17, [(MAX_SAMPLES, 3 << 30)]).run(None, feeds)
    check_linear(got, reference)
    with pytest.raises(Exception, match=f"INVALID_ARGUMENT.*{OP}: {match}"):
        _roi_session(x, rois, 64, 17).run(None, feeds)
    # a lowered budget refuses what the default allows (the same library, another registration)
    with pytest.raises(Exception, match=r"the call would take 16384 bilinear samples .* over the budget of 1000"):
        _roi_session(x, rois[:1], 4, 2, [(MAX_SAMPLES, 1000)]).run(None, {"input": x.numpy(),
                                                                         "rois": rois[:1].numpy()})
