"""ms_deform_attn: multi-scale deformable attention (Deformable DETR; also DINO, Mask2Former,
BEVFormer), with the semantics of the paper's reference ``ms_deform_attn_core_pytorch`` and
the argument order of mmcv's ``MultiScaleDeformableAttnFunction.apply``.

* ``torch.ops.opforge.ms_deform_attn(value, spatial_shapes, level_start_index,
  sampling_locations, attention_weights, im2col_step)``: the op, differentiable in value,
  sampling_locations and attention_weights;
* ``opforge.ms_deform_attn(...)`` (``im2col_step=64``) and
  ``opforge.MultiScaleDeformableAttnFunction.apply(...)``: the same, for code written
  against mmcv or the Deformable DETR repository (change the import);
* ``opforge.MSDeformAttn``: the Deformable DETR module (same parameter names,
  initialisation and forward signature, so its state_dicts load unchanged).

For each query, head, level and point, the level's H_l x W_l map of ``value`` is sampled
bilinearly at ``sampling_locations`` (normalised (x, y); ``grid_sample``'s
``align_corners=False`` with zeros outside the map), weighted by ``attention_weights`` and
summed over levels and points. ``spatial_shapes`` and ``level_start_index`` are real inputs
(int64), so one exported model serves any image size; the kernels check their values
against ``value`` before using them (in ONNX Runtime they come from the caller).

Export: the ``opforge::ms_deform_attn`` custom node (libopforge_ort); ``standard_onnx=True``
lowers it to GridSample (opset >= 16) for runtimes without opforge's library.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from .. import spec as _spec
from ..registration import OpInputError, as_input_error, autograd_function, check_same_device, register_op
from ..shape_rule import ShapeRule
from ._registry import _C, Untraced

_OP = "opforge::ms_deform_attn"
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


# The kernels' shape rule, core::ms_deform_attn_output_shapes, registered by the extension as
# opforge::_ms_deform_attn_output_shapes: the fake impl and ONNX shape inference call it.
_shape_rule = ShapeRule("opforge::_ms_deform_attn_output_shapes", error=OpInputError)


def _check(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, im2col_step):
    """The kernel's checks that need no tensor values, for fake tensors: shapes by the kernels' own
    C++ rule, then dtypes and devices. The checks of the index tensors' values (levels' sizes summing
    to S, start indices) run in the kernels, which have the values. Returns the output's shape."""
    (out_shape,) = _shape_rule(value.shape, spatial_shapes.shape, level_start_index.shape, sampling_locations.shape,
                               attention_weights.shape, im2col_step)
    if value.dtype not in _FLOATS:
        raise OpInputError(f"{_OP}: value has dtype {value.dtype}; supported dtypes are float32, float64, float16 and "
                           "bfloat16")
    for name, t in (("sampling_locations", sampling_locations), ("attention_weights", attention_weights)):
        if t.dtype != value.dtype:
            raise OpInputError(f"{_OP}: {name} has dtype {t.dtype} but value has dtype {value.dtype}; they must match")
    for name, t in (("spatial_shapes", spatial_shapes), ("level_start_index", level_start_index)):
        if t.dtype != torch.int64:
            raise OpInputError(f"{_OP}: {name} has dtype {t.dtype} but must be int64 (torch.long)")
    check_same_device(_OP, value=value, spatial_shapes=spatial_shapes, level_start_index=level_start_index,
                      sampling_locations=sampling_locations, attention_weights=attention_weights)
    return out_shape


def _fake(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, im2col_step):
    return value.new_empty(_check(value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                                  im2col_step))


def _setup_context(ctx, inputs, output):
    value, spatial_shapes, level_start_index, sampling_locations, attention_weights, im2col_step = inputs
    ctx.save_for_backward(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)
    ctx.im2col_step = im2col_step


def _backward(ctx, grad):
    value, spatial_shapes, level_start_index, sampling_locations, attention_weights = ctx.saved_tensors
    g_value, g_loc, g_attn = torch.ops.opforge._ms_deform_attn_backward(
        grad.contiguous(), value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
        ctx.im2col_step)
    return g_value, None, None, g_loc, g_attn, None


@torch.library.register_fake("opforge::_ms_deform_attn_backward")
def _backward_fake(grad, value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                   im2col_step):
    return torch.empty_like(value), torch.empty_like(sampling_locations), torch.empty_like(attention_weights)


def _no_double_backward(ctx, *grads):
    raise RuntimeError(f"{_OP}: double backward (a gradient of its gradient) is not implemented; the first "
                       "gradients are exact, so use them directly (e.g. no create_graph=True through this op)")


# The backward op's own backward: a clear error instead of autograd's "not differentiable" warning and None.
torch.library.register_autograd("opforge::_ms_deform_attn_backward", _no_double_backward,
                                setup_context=lambda ctx, inputs, output: None)


def _bilinear_zeros(level_map: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """grid_sample(align_corners=False, padding zeros) of ``level_map`` (N, H, W, M, D) at pixel
    coordinates x, y (N, Lq, M, P); returns (N, Lq, M, P, D)."""
    n, h, w, m, d = level_map.shape
    out = np.zeros(x.shape + (d,))
    finite = np.isfinite(x) & np.isfinite(y)
    x0, y0 = np.floor(np.where(finite, x, -2)), np.floor(np.where(finite, y, -2))
    b = np.arange(n)[:, None, None, None]
    head = np.arange(m)[None, None, :, None]
    for dy in (0, 1):
        for dx in (0, 1):
            xi, yi = x0 + dx, y0 + dy
            weight = (1 - np.abs(x - xi)) * (1 - np.abs(y - yi))
            inside = finite & (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
            corner = level_map[b, np.clip(yi, 0, h - 1).astype(np.int64), np.clip(xi, 0, w - 1).astype(np.int64), head]
            out += np.where(inside, weight, 0.0)[..., None] * corner
    return out


def _reference(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, *, im2col_step):
    """Independent numpy implementation (for onnx.reference): per level, explicit bilinear
    sampling with zero padding, in float64."""
    n, s, m, d = value.shape
    _, lq, _, levels, points, _ = sampling_locations.shape
    out = np.zeros((n, lq, m, d))
    for level in range(levels):
        h, w = (int(v) for v in spatial_shapes[level])
        start = int(level_start_index[level])
        level_map = value[:, start:start + h * w].astype(np.float64).reshape(n, h, w, m, d)
        loc = sampling_locations[:, :, :, level].astype(np.float64)
        sampled = _bilinear_zeros(level_map, loc[..., 0] * w - 0.5, loc[..., 1] * h - 0.5)
        out += np.einsum("nqmpd,nqmp->nqmd", sampled, attention_weights[:, :, :, level].astype(np.float64))
    return (out.reshape(n, lq, m * d).astype(value.dtype),)


# ---- standard-ONNX lowering: one GridSample per level (opset >= 16) -----------------------------


class _TorchScriptEmitter:
    """Node building for the TorchScript exporter (``g.op``, typed attribute suffixes)."""

    def __init__(self, g):
        self.g, self.opset = g, g.opset

    def op(self, name, *inputs, **attrs):
        suffix = {int: "i", float: "f", str: "s", list: "i"}
        return self.g.op(name, *inputs, **{f"{k}_{suffix[type(v)]}": v for k, v in attrs.items()})

    def ints(self, values):
        return self.g.op("Constant", value_t=torch.tensor(values, dtype=torch.int64))

    def float_like(self, value, like):
        return self.g.op("CastLike", self.g.op("Constant", value_t=torch.tensor(value, dtype=torch.float32)), like)


class _OnnxScriptEmitter:
    """Node building for the dynamo exporter (onnxscript, traced)."""

    def __init__(self, opset: int):
        import onnxscript

        self.opset = opset
        self.ops = getattr(onnxscript, f"opset{opset}")

    def op(self, name, *inputs, **attrs):
        return getattr(self.ops, name)(*inputs, **attrs)

    def ints(self, values):
        return self.ops.Constant(value_ints=list(values)) if isinstance(values, list) else \
            self.ops.Constant(value_int=values)

    def float_like(self, value, like):
        return self.ops.CastLike(self.ops.Constant(value_float=value), like)


def _lower(emit, levels: int, value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
    """The op as standard ONNX: per level, slice the level's rows of value (start and size read
    from the index inputs at run time), reshape to (N*M, D, H_l, W_l) and GridSample it at
    2*loc - 1 (align_corners=0, zeros outside); weight the (N*M, D, Lq, L*P) samples by the
    attention weights and sum. The number of levels must be known when exporting."""
    value_shape, loc_shape, attn_shape = (emit.op("Shape", t) for t in (value, sampling_locations, attention_weights))

    def dims(shape, begin, end):
        return emit.op("Slice", shape, emit.ints([begin]), emit.ints([end]))

    mode = "linear" if emit.opset >= 20 else "bilinear"  # GridSample-20 renamed the mode
    grid_shape = emit.op("Concat", emit.ints([-1]), dims(loc_shape, 1, 2), dims(loc_shape, 4, 6), axis=0)
    samples = []
    for level in range(levels):
        hw = emit.op("Gather", spatial_shapes, emit.ints(level), axis=0)  # (2,): H_l, W_l
        start = emit.op("Gather", level_start_index, emit.ints([level]), axis=0)  # (1,)
        end = emit.op("Add", start, emit.op("ReduceProd", hw, keepdims=1))
        rows = emit.op("Slice", value, start, end, emit.ints([1]))  # (N, H*W, M, D)
        maps = emit.op("Reshape", emit.op("Transpose", rows, perm=[0, 2, 3, 1]),
                       emit.op("Concat", emit.ints([-1]), dims(value_shape, 3, 4), hw, axis=0))  # (N*M, D, H, W)
        loc = emit.op("Transpose", emit.op("Gather", sampling_locations, emit.ints(level), axis=3), perm=[0, 2, 1, 3, 4])
        grid = emit.op("Sub", emit.op("Mul", emit.op("Reshape", loc, grid_shape), emit.float_like(2.0, loc)),
                       emit.float_like(1.0, loc))  # (N*M, Lq, P, 2) in [-1, 1]
        samples.append(emit.op("GridSample", maps, grid, align_corners=0, mode=mode, padding_mode="zeros"))
    sampled = emit.op("Concat", *samples, axis=3) if levels > 1 else samples[0]  # (N*M, D, Lq, L*P)
    weights_shape = emit.op("Concat", emit.ints([-1, 1]), dims(attn_shape, 1, 2),
                            emit.op("Mul", dims(attn_shape, 3, 4), dims(attn_shape, 4, 5)), axis=0)
    weights = emit.op("Reshape", emit.op("Transpose", attention_weights, perm=[0, 2, 1, 3, 4]), weights_shape)
    summed = emit.op("ReduceSum", emit.op("Mul", sampled, weights), emit.ints([3]), keepdims=0)  # (N*M, D, Lq)
    per_batch = emit.op("Reshape", summed, emit.op("Concat", dims(value_shape, 0, 1), emit.ints([-1]),
                                                    dims(loc_shape, 1, 2), axis=0))  # (N, M*D, Lq)
    return emit.op("Transpose", per_batch, perm=[0, 2, 1])


def _static_levels(sizes) -> int:
    if sizes is None or len(sizes) != 2 or not isinstance(sizes[0], int):
        raise ValueError(f"{_OP}: the standard-ONNX lowering needs the number of levels (spatial_shapes' dim 0) "
                         "known when exporting; export the custom node (standard_onnx=False) instead")
    return sizes[0]


def _standard_torchscript(g, value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                          im2col_step):
    sizes = spatial_shapes.type().varyingSizes() if spatial_shapes.type().kind() == "TensorType" else None
    return _lower(_TorchScriptEmitter(g), _static_levels(sizes), value, spatial_shapes, level_start_index,
                  sampling_locations, attention_weights)


def _standard_dynamo(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, im2col_step,
                     *, opset=None):
    shape = getattr(spatial_shapes, "shape", None)
    sizes = [d if isinstance(d, int) else None for d in shape] if shape is not None else None
    return _lower(_OnnxScriptEmitter(max(16, opset or 18)), _static_levels(sizes), value, spatial_shapes,
                  level_start_index, sampling_locations, attention_weights)


MS_DEFORM_ATTN = _spec.OpSpec(
    name="ms_deform_attn",
    namespace=_spec.DOMAIN,
    helper_ops=("_ms_deform_attn_backward",),
    schema=("ms_deform_attn(Tensor value, Tensor spatial_shapes, Tensor level_start_index, Tensor sampling_locations, "
            "Tensor attention_weights, int im2col_step) -> Tensor"),
    args=(
        _spec.TensorArg("value", doc="(N, S, M, D): the levels' feature maps, flattened and concatenated"),
        _spec.TensorArg("spatial_shapes", doc="(L, 2) int64: (H_l, W_l) per level", dtypes=("int64",)),
        _spec.TensorArg("level_start_index", doc="(L,) int64: where each level starts in S", dtypes=("int64",)),
        _spec.TensorArg("sampling_locations", doc="(N, Lq, M, L, P, 2): normalised (x, y) in [0, 1]"),
        _spec.TensorArg("attention_weights", doc="(N, Lq, M, L, P)"),
        _spec.AttrArg("im2col_step", kind="int", doc="mmcv's batching step: accepted (> 0) for compatibility, unused"),
    ),
    outputs=("output",),
    doc="Multi-scale deformable attention (Deformable DETR): (N, Lq, M*D).",
    fake=_fake, reference=_reference, onnx_output_shapes=_shape_rule.onnx_output_shapes,  # shapes, values
    setup_context=_setup_context, backward=_backward,  # autograd
    standard_torchscript=_standard_torchscript, standard_dynamo=_standard_dynamo,  # the standard-ONNX form
    standard_min_opset=16,  # GridSample
)

ms_deform_attn_op = register_op(MS_DEFORM_ATTN, extension=_C)


def ms_deform_attn(value: torch.Tensor, spatial_shapes: torch.Tensor, level_start_index: torch.Tensor,
                   sampling_locations: torch.Tensor, attention_weights: torch.Tensor,
                   im2col_step: int = 64) -> torch.Tensor:
    """Multi-scale deformable attention: ``(N, Lq, M*D)``. Arguments and semantics of mmcv's
    ``MultiScaleDeformableAttnFunction.apply`` (see the module docstring); differentiable. Bad
    input raises :class:`opforge.OpInputError` naming the argument. Works in ``torch.jit.script``
    (where a bad input raises the kernel's RuntimeError)."""
    if not torch.jit.is_scripting():  # TorchScript compiles only the op call below
        return _ms_deform_attn_eager(value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                                     im2col_step)
    return torch.ops.opforge.ms_deform_attn(value, spatial_shapes, level_start_index, sampling_locations,
                                            attention_weights, im2col_step)


def _ms_deform_attn_eager(value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                          im2col_step):
    try:
        return ms_deform_attn_op(value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
                                 im2col_step)
    except (RuntimeError, ValueError, TypeError) as e:  # the kernels' errors about our arguments
        raise as_input_error(_OP, e) from None


#: ``MultiScaleDeformableAttnFunction.apply(value, spatial_shapes, level_start_index, sampling_locations,
#: attention_weights, im2col_step)``: mmcv's / Deformable DETR's autograd.Function, built from the spec.
MultiScaleDeformableAttnFunction = autograd_function(
    MS_DEFORM_ATTN, "MultiScaleDeformableAttnFunction",
    "``MultiScaleDeformableAttnFunction.apply(value, spatial_shapes, level_start_index, sampling_locations, "
    "attention_weights, im2col_step)``: mmcv's / Deformable DETR's autograd.Function, backed by opforge's kernels, "
    "with an ONNX symbolic.", module=__name__)

#: The Deformable DETR repository's name for the same Function.
MSDeformAttnFunction = MultiScaleDeformableAttnFunction


class MSDeformAttn(torch.nn.Module):
    """Deformable DETR's multi-scale deformable attention module, on opforge's op.

    Same constructor, parameters (``sampling_offsets``, ``attention_weights``, ``value_proj``,
    ``output_proj``), initialisation and ``forward(query, reference_points, input_flatten,
    input_spatial_shapes, input_level_start_index, input_padding_mask=None)`` as the original,
    so a state_dict of that module (or of mmcv's / HF's, which use the same names) loads unchanged.
    ``reference_points``: (N, Lq, L, 2) normalised points, or (N, Lq, L, 4) boxes (cx, cy, w, h)."""

    def __init__(self, d_model: int = 256, n_levels: int = 4, n_heads: int = 8, n_points: int = 4):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"opforge.MSDeformAttn: d_model must be divisible by n_heads, got {d_model} and {n_heads}")
        self.im2col_step = 64
        self.d_model, self.n_levels, self.n_heads, self.n_points = d_model, n_levels, n_heads, n_points
        self.sampling_offsets = torch.nn.Linear(d_model, n_heads * n_levels * n_points * 2)
        self.attention_weights = torch.nn.Linear(d_model, n_heads * n_levels * n_points)
        self.value_proj = torch.nn.Linear(d_model, d_model)
        self.output_proj = torch.nn.Linear(d_model, d_model)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        # The original's: offsets start as a ring of n_heads directions (one per head), the k-th point
        # k+1 steps out; uniform attention; Xavier projections with zero biases.
        torch.nn.init.zeros_(self.sampling_offsets.weight)
        angles = torch.arange(self.n_heads, dtype=torch.float32) * (2.0 * math.pi / self.n_heads)
        directions = torch.stack([angles.cos(), angles.sin()], -1)
        directions = directions / directions.abs().max(-1, keepdim=True)[0]
        steps = torch.arange(1, self.n_points + 1, dtype=torch.float32).view(1, 1, self.n_points, 1)
        ring = directions.view(self.n_heads, 1, 1, 2) * steps  # (heads, 1, points, 2)
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(ring.expand(self.n_heads, self.n_levels, self.n_points, 2).reshape(-1))
        torch.nn.init.zeros_(self.attention_weights.weight)
        torch.nn.init.zeros_(self.attention_weights.bias)
        torch.nn.init.xavier_uniform_(self.value_proj.weight)
        torch.nn.init.zeros_(self.value_proj.bias)
        torch.nn.init.xavier_uniform_(self.output_proj.weight)
        torch.nn.init.zeros_(self.output_proj.bias)

    def forward(self, query: torch.Tensor, reference_points: torch.Tensor, input_flatten: torch.Tensor,
                input_spatial_shapes: torch.Tensor, input_level_start_index: torch.Tensor,
                input_padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        n, lq, _ = query.shape
        n_in, s, _ = input_flatten.shape
        value = self.value_proj(input_flatten)
        if input_padding_mask is not None:
            value = value.masked_fill(input_padding_mask[..., None], 0.0)
        value = value.view(n_in, s, self.n_heads, self.d_model // self.n_heads)
        offsets = self.sampling_offsets(query).view(n, lq, self.n_heads, self.n_levels, self.n_points, 2)
        weights = self.attention_weights(query).view(n, lq, self.n_heads, self.n_levels * self.n_points)
        weights = weights.softmax(-1).view(n, lq, self.n_heads, self.n_levels, self.n_points)
        if torch.jit.is_scripting():
            coords = reference_points.shape[-1]
        else:
            coords = _coordinate_count(reference_points)
        if coords == 2:
            # offsets are in pixels of each level: normalise by (W_l, H_l)
            normaliser = torch.stack([input_spatial_shapes[..., 1], input_spatial_shapes[..., 0]], -1).to(offsets.dtype)
            locations = (reference_points[:, :, None, :, None, :]
                         + offsets / normaliser[None, None, None, :, None, :])
        elif coords == 4:
            # offsets are fractions of the reference box's half size, per point
            locations = (reference_points[:, :, None, :, None, :2]
                         + offsets / self.n_points * reference_points[:, :, None, :, None, 2:] * 0.5)
        else:
            raise ValueError("opforge.MSDeformAttn: reference_points must end in 2 (points) or 4 (boxes) "
                             "coordinates, got shape " + str(reference_points.shape))
        if torch.jit.is_scripting():
            out = torch.ops.opforge.ms_deform_attn(value, input_spatial_shapes, input_level_start_index, locations,
                                                   weights, self.im2col_step)
        else:
            out = ms_deform_attn_op(value, input_spatial_shapes, input_level_start_index, locations, weights,
                                    self.im2col_step)
        return self.output_proj(out)


def _coordinate_count(reference_points: torch.Tensor) -> int:
    """The last dim of ``reference_points`` (2: points, 4: boxes), which picks MSDeformAttn's
    formula: read untraced, so a traced graph holds the formula taken, not a shape lookup."""
    with Untraced():
        return reference_points.shape[-1]
