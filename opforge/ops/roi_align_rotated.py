"""roi_align_rotated: RoI Align over rotated boxes (mmrotate, detectron2's rotated heads, text
detection), with the semantics and argument order of mmcv's ``roi_align_rotated``.

* ``torch.ops.opforge.roi_align_rotated(input, rois, output_height, output_width,
  spatial_scale, sampling_ratio, aligned, clockwise)``: the op, differentiable in ``input``
  (``rois`` has no gradient: declared ``TensorArg(differentiable=False)``, and the backward
  returns None for it, not a zero tensor);
* ``opforge.roi_align_rotated(input, rois, output_size, spatial_scale=1.0, sampling_ratio=0,
  aligned=True, clockwise=False)`` and ``opforge.RoIAlignRotatedFunction.apply(...)``: mmcv's
  call forms (change the import);
* ``opforge.RoIAlignRotated``: mmcv's module (also its deprecated ``out_size`` /
  ``sample_num`` keywords, which mmrotate configs still use).

``input`` is (N, C, H, W); ``rois`` is (K, 6) = (batch index, cx, cy, w, h, angle in radians),
cx, cy, w, h in input-image pixels (times ``spatial_scale`` for the feature map). Each roi is
cut into ``output_size`` bins; each bin is the mean of a grid of bilinear samples
(``sampling_ratio`` per axis, or ceil(bin size) when it is 0 or less), rotated by the angle
(counter-clockwise on screen; ``clockwise=True`` flips it). ``aligned=True`` shifts by half a
pixel (detectron2's alignment); ``aligned=False`` is mmdetection's legacy form, which also
makes every roi at least 1 x 1. Output: (K, C, output_height, output_width).

The kernels check the rois' values before using them (batch index an integer in [0, N),
finite coordinates and angle, sizes not negative with ``aligned``, at most 65536 sampling
points per bin): every one is an :class:`opforge.OpInputError` in torch and an error status in
ONNX Runtime, naming the roi. Export: the ``opforge::roi_align_rotated`` custom node
(libopforge_ort), with K and N dynamic.
"""

from __future__ import annotations

import warnings
from typing import Sequence, Union

import numpy as np
import torch

from .. import spec as _spec
from ..registration import OpInputError, as_input_error, check_same_device, register_op
from ..shape_rule import ShapeRule
from ._registry import _C

_OP = "opforge::roi_align_rotated"
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


# The kernels' shape rule, core::roi_align_rotated_output_shapes, registered by the extension as
# opforge::_roi_align_rotated_output_shapes: the fake impl and ONNX shape inference call it.
_shape_rule = ShapeRule("opforge::_roi_align_rotated_output_shapes", error=OpInputError)


def _fake(input, rois, output_height, output_width, spatial_scale, sampling_ratio, aligned, clockwise):
    """The kernels' checks that need no tensor values: shapes and attributes by the C++ rule, then
    dtypes and devices. The rois' values are checked by the kernels, which have them."""
    (shape,) = _shape_rule(input.shape, rois.shape, output_height, output_width, spatial_scale, sampling_ratio,
                           aligned, clockwise)
    if input.dtype not in _FLOATS:
        raise OpInputError(f"{_OP}: input has dtype {input.dtype}; supported dtypes are float32, float64, float16 "
                           "and bfloat16")
    if rois.dtype != input.dtype:
        raise OpInputError(f"{_OP}: rois has dtype {rois.dtype} but input has dtype {input.dtype}; they must match")
    check_same_device(_OP, input=input, rois=rois)
    return input.new_empty(shape)


def _setup_context(ctx, inputs, output):
    input, rois, *attrs = inputs
    ctx.save_for_backward(rois)
    ctx.input_size = tuple(input.shape)
    ctx.attrs = tuple(attrs)


def _backward(ctx, grad):
    (rois,) = ctx.saved_tensors
    grad_input = None
    if ctx.needs_input_grad[0]:
        grad_input = torch.ops.opforge._roi_align_rotated_backward(grad.contiguous(), rois, list(ctx.input_size),
                                                                   *ctx.attrs)
    return grad_input, None, None, None, None, None, None, None


@torch.library.register_fake("opforge::_roi_align_rotated_backward")
def _backward_fake(grad, rois, input_size, output_height, output_width, spatial_scale, sampling_ratio, aligned,
                   clockwise):
    return grad.new_empty(tuple(input_size))


# The backward is linear in grad_output: its own gradient (the double backward) is the forward
# applied to the incoming gradient-of-gradient, so second-order autograd is exact.
def _backward_setup_context(ctx, inputs, output):
    grad, rois, input_size, *attrs = inputs
    ctx.save_for_backward(rois)
    ctx.attrs = tuple(attrs)


def _double_backward(ctx, grad_grad_input):
    (rois,) = ctx.saved_tensors
    grad_grad_output = torch.ops.opforge.roi_align_rotated(grad_grad_input, rois, *ctx.attrs)
    return grad_grad_output, None, None, None, None, None, None, None, None


torch.library.register_autograd("opforge::_roi_align_rotated_backward", _double_backward,
                                setup_context=_backward_setup_context)


def _reference(input, rois, *, output_height, output_width, spatial_scale, sampling_ratio, aligned, clockwise):
    """Independent numpy implementation (for onnx.reference and tests), in float64: every sampling
    point of every bin as an array, then the border rule and the four taps by fancy indexing."""
    n, c, h, w = input.shape
    x = input.astype(np.float64)
    out = np.zeros((rois.shape[0], c, output_height, output_width))
    scale = float(np.float32(spatial_scale))
    for k, roi in enumerate(rois.astype(np.float64)):
        b = int(roi[0])
        offset = 0.5 if aligned else 0.0
        cx, cy = roi[1] * scale - offset, roi[2] * scale - offset
        rw, rh = roi[3] * scale, roi[4] * scale
        theta = -roi[5] if clockwise else roi[5]
        if not aligned:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bin_h, bin_w = rh / output_height, rw / output_width
        gh = sampling_ratio if sampling_ratio > 0 else int(np.ceil(bin_h))
        gw = sampling_ratio if sampling_ratio > 0 else int(np.ceil(bin_w))
        if gh * gw == 0:
            continue
        # (ph, iy) rows and (pw, ix) columns of sampling points, relative to the roi's centre
        yy = -rh / 2 + (np.arange(output_height)[:, None] * bin_h + (np.arange(gh)[None, :] + 0.5) * bin_h / gh)
        xx = -rw / 2 + (np.arange(output_width)[:, None] * bin_w + (np.arange(gw)[None, :] + 0.5) * bin_w / gw)
        yy, xx = yy[:, :, None, None], xx[None, None, :, :]  # (oh, gh, ow, gw)
        py = yy * np.cos(theta) - xx * np.sin(theta) + cy
        px = yy * np.sin(theta) + xx * np.cos(theta) + cx
        inside = (py >= -1) & (py <= h) & (px >= -1) & (px <= w)
        py, px = np.clip(py, 0, None), np.clip(px, 0, None)
        y0, x0 = np.floor(py).astype(np.int64), np.floor(px).astype(np.int64)
        top, left = y0 >= h - 1, x0 >= w - 1
        y0, x0 = np.where(top, h - 1, y0), np.where(left, w - 1, x0)
        py, px = np.where(top, y0, py), np.where(left, x0, px)
        y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
        ly, lx = py - y0, px - x0
        image = x[b]  # (C, H, W)
        value = (image[:, y0, x0] * ((1 - ly) * (1 - lx)) + image[:, y0, x1] * ((1 - ly) * lx)
                 + image[:, y1, x0] * (ly * (1 - lx)) + image[:, y1, x1] * (ly * lx))  # (C, oh, gh, ow, gw)
        value = np.where(inside, value, 0.0)
        out[k] = value.sum(axis=(2, 4)) / (gh * gw)
    return (out.astype(input.dtype),)


ROI_ALIGN_ROTATED = _spec.OpSpec(
    name="roi_align_rotated",
    namespace=_spec.DOMAIN,
    helper_ops=("_roi_align_rotated_backward",),
    schema=("roi_align_rotated(Tensor input, Tensor rois, int output_height, int output_width, float spatial_scale, "
            "int sampling_ratio, bool aligned, bool clockwise) -> Tensor"),
    args=(
        _spec.TensorArg("input", doc="(N, C, H, W) feature map"),
        _spec.TensorArg("rois", doc="(K, 6): batch index, cx, cy, w, h, angle (radians)", differentiable=False),
        _spec.AttrArg("output_height", kind="int", doc="bins per roi along its height"),
        _spec.AttrArg("output_width", kind="int", doc="bins per roi along its width"),
        _spec.AttrArg("spatial_scale", kind="float", doc="feature-map pixels per roi unit (e.g. 1/16)"),
        _spec.AttrArg("sampling_ratio", kind="int", doc="samples per bin and axis; 0 or less: ceil(bin size)"),
        _spec.AttrArg("aligned", kind="bool", doc="half-pixel alignment (False: mmdetection's legacy form)"),
        _spec.AttrArg("clockwise", kind="bool", doc="angles turn clockwise on screen"),
    ),
    outputs=("output",),
    doc="Rotated RoI Align (mmcv's roi_align_rotated): (K, C, output_height, output_width).",
    fake=_fake, reference=_reference, onnx_output_shapes=_shape_rule.onnx_output_shapes,  # shapes, values
    setup_context=_setup_context, backward=_backward,  # autograd
)

roi_align_rotated_op = register_op(ROI_ALIGN_ROTATED, extension=_C)


def _pair(output_size) -> tuple:
    if isinstance(output_size, int) and not isinstance(output_size, bool):
        return output_size, output_size
    if isinstance(output_size, (tuple, list)) and len(output_size) == 2 and \
            all(isinstance(v, int) and not isinstance(v, bool) for v in output_size):
        return tuple(output_size)
    raise OpInputError(f"{_OP}: output_size must be an int or a pair of ints (height, width), got {output_size!r}")


def roi_align_rotated(input: torch.Tensor, rois: torch.Tensor, output_size: Union[int, Sequence[int]],
                      spatial_scale: float = 1.0, sampling_ratio: int = 0, aligned: bool = True,
                      clockwise: bool = False) -> torch.Tensor:
    """Rotated RoI Align: ``(K, C, output_height, output_width)``. Arguments and semantics of
    mmcv's ``roi_align_rotated`` (see the module docstring); differentiable in ``input``. Bad
    input raises :class:`opforge.OpInputError` naming the argument, and so does a call over the
    op's budgets of output elements and bilinear samples (docs/ops.md; :func:`opforge.set_budget`
    raises them)."""
    oh, ow = _pair(output_size)
    try:
        return roi_align_rotated_op(input, rois, oh, ow, float(spatial_scale), int(sampling_ratio), bool(aligned),
                                    bool(clockwise))
    except (RuntimeError, ValueError, TypeError) as e:  # the kernels' errors about our arguments
        raise as_input_error(_OP, e) from None


class RoIAlignRotatedFunction(torch.autograd.Function):
    """``RoIAlignRotatedFunction.apply(input, rois, output_size, spatial_scale, sampling_ratio=0,
    aligned=True, clockwise=False)``: mmcv's autograd.Function, backed by opforge's kernels, with
    an ONNX symbolic (the ``opforge::roi_align_rotated`` node)."""

    @staticmethod
    def forward(input, rois, output_size, spatial_scale, sampling_ratio=0, aligned=True, clockwise=False):
        oh, ow = _pair(output_size)
        return roi_align_rotated_op(input, rois, oh, ow, float(spatial_scale), int(sampling_ratio), bool(aligned),
                                    bool(clockwise))

    @staticmethod
    def setup_context(ctx, inputs, output):
        input, rois, output_size, spatial_scale, *rest = inputs
        sampling_ratio, aligned, clockwise = (list(rest) + [0, True, False][len(rest):])[:3]
        _setup_context(ctx, (input, rois, *_pair(output_size), float(spatial_scale), int(sampling_ratio),
                             bool(aligned), bool(clockwise)), output)

    @staticmethod
    def backward(ctx, grad):
        grad_input = _backward(ctx, grad)[0]
        return grad_input, None, None, None, None, None, None

    @staticmethod
    def symbolic(g, input, rois, output_size, spatial_scale, sampling_ratio=0, aligned=True, clockwise=False):
        from ..symbolics import torchscript

        oh, ow = _pair(output_size)
        return torchscript.symbolic(ROI_ALIGN_ROTATED)(g, input, rois, oh, ow, float(spatial_scale),
                                                        int(sampling_ratio), bool(aligned), bool(clockwise))


class RoIAlignRotated(torch.nn.Module):
    """mmcv's ``RoIAlignRotated(output_size, spatial_scale, sampling_ratio=0, aligned=True,
    clockwise=False)`` on opforge's op; ``forward(input, rois)``. mmcv's deprecated keywords
    ``out_size`` and ``sample_num`` (mmrotate's configs) are accepted with a warning."""

    def __init__(self, output_size: Union[int, Sequence[int], None] = None, spatial_scale: float = 1.0,
                 sampling_ratio: int = 0, aligned: bool = True, clockwise: bool = False, *, out_size=None,
                 sample_num=None):
        super().__init__()
        for old, new, value in (("out_size", "output_size", out_size), ("sample_num", "sampling_ratio", sample_num)):
            if value is not None:
                warnings.warn(f"opforge.RoIAlignRotated: '{old}' is deprecated (as in mmcv), use '{new}'",
                              DeprecationWarning, stacklevel=2)
        if out_size is not None:
            if output_size is not None:
                raise TypeError("opforge.RoIAlignRotated: give output_size or out_size, not both")
            output_size = out_size
        if sample_num is not None:
            sampling_ratio = sample_num
        if output_size is None:
            raise TypeError("opforge.RoIAlignRotated: output_size is required")
        self.output_size = _pair(output_size)
        self.spatial_scale = float(spatial_scale)
        self.sampling_ratio = int(sampling_ratio)
        self.aligned = bool(aligned)
        self.clockwise = bool(clockwise)

    def forward(self, input: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        return roi_align_rotated(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio,
                                 self.aligned, self.clockwise)

    def extra_repr(self) -> str:
        return (f"output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
                f"sampling_ratio={self.sampling_ratio}, aligned={self.aligned}, clockwise={self.clockwise}")
