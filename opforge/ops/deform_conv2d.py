"""deform_conv2d: deformable convolution v1 (offsets) and v2 (offsets + mask),
with exactly torchvision's semantics and argument order.

* ``torch.ops.opforge.deform_conv2d(input, weight, offset, mask, bias, stride_h, stride_w,
  pad_h, pad_w, dilation_h, dilation_w, groups, offset_groups, use_mask)``: the op
  (same schema as ``torchvision::deform_conv2d``), differentiable;
* ``opforge.deform_conv2d(input, offset, weight, bias=None, stride=1, padding=0,
  dilation=1, mask=None)``: ``torchvision.ops.deform_conv2d``'s functional form;
* ``opforge.DeformConv2d``: drop-in for ``torchvision.ops.DeformConv2d`` (same
  parameters and state_dict keys).

Export: opset >= 19 -> standard ONNX ``DeformConv``; below, or with
``standard_onnx=False``, the ``opforge::deform_conv2d`` custom node (run by
libopforge_ort). ``torchvision::deform_conv2d`` gets the same rules.
"""

from __future__ import annotations

import math
import operator
from typing import List, Optional, Tuple, Union

import numpy as np
import torch
from torch.overrides import handle_torch_function, has_torch_function

from .. import spec as _spec
from ..registration import OpInputError, as_input_error, check_same_device, register_op
from ..shape_rule import ShapeRule
from ._registry import _C, Untraced

_INTS = ("stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w", "groups", "offset_groups")


# The kernels' shape rule, core::deform_conv2d_output_shapes (every check of shapes and attributes,
# and the output size), registered by the extension as opforge::_deform_conv2d_output_shapes: the
# fake impl, ONNX shape inference and the torchvision patch call it, with symbolic sizes too.
_shape_rule = ShapeRule("opforge::_deform_conv2d_output_shapes", error=OpInputError)


def _check(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups,
           offset_groups, use_mask):
    """The kernel's argument checks for fake tensors, same exception types and words: shapes and
    attributes by the kernel's own C++ rule, then dtypes, as the kernel does after its shape checks
    (the kernel's and torchvision's order). Returns the output's shape."""
    op = "opforge::deform_conv2d: "
    (out_shape,) = _shape_rule(input.shape, weight.shape, offset.shape, mask.shape, bias.shape, stride_h, stride_w,
                               pad_h, pad_w, dil_h, dil_w, groups, offset_groups, bool(use_mask))
    if input.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        raise OpInputError(f"{op}input has dtype {input.dtype}; supported dtypes are float32, float64, float16 and "
                           "bfloat16")
    for name, t in (("weight", weight), ("offset", offset), ("mask", mask), ("bias", bias)):
        if name == "mask" and not use_mask:
            continue
        if t.dtype != input.dtype:
            raise OpInputError(f"{op}{name} has dtype {t.dtype} but input has dtype {input.dtype}; all must match")
    check_same_device("opforge::deform_conv2d", input=input, weight=weight, offset=offset,
                      mask=mask if use_mask else None, bias=bias)
    return out_shape


def _fake(input, weight, offset, mask, bias, *ints_and_mask):
    return input.new_empty(_check(input, weight, offset, mask, bias, *ints_and_mask))


def _setup_context(ctx, inputs, output):
    input, weight, offset, mask, bias, *rest = inputs
    ctx.save_for_backward(input, weight, offset, mask, bias)
    ctx.params = rest


def _backward(ctx, grad):
    input, weight, offset, mask, bias = ctx.saved_tensors
    use_mask = ctx.params[-1]
    g_in, g_w, g_off, g_mask, g_b = torch.ops.opforge._deform_conv2d_backward(
        grad, input, weight, offset, mask, bias, *ctx.params
    )
    return (g_in, g_w, g_off, g_mask if use_mask else None, g_b) + (None,) * len(ctx.params)


@torch.library.register_fake("opforge::_deform_conv2d_backward")
def _backward_fake(grad, input, weight, offset, mask, bias, *params):
    return (torch.empty_like(input), torch.empty_like(weight), torch.empty_like(offset), torch.empty_like(mask),
            grad.new_empty(bias.shape))


def _reference(input, weight, offset, mask, bias, *, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
               groups, offset_groups, use_mask):
    """Independent numpy implementation (for onnx.reference): explicit bilinear sampling + matmul."""
    n, c, h, w = input.shape
    o, cg, kh, kw = weight.shape
    oh, ow = offset.shape[2:]  # (N, 2*offset_groups*kh*kw, oh, ow): the node's checks hold the output size
    cpg = c // offset_groups
    ys = (np.arange(oh) * stride_h - pad_h)[:, None]
    xs = (np.arange(ow) * stride_w - pad_w)[None, :]
    cols = np.zeros((n, c, kh * kw, oh, ow), dtype=np.float64)
    for b in range(n):
        for g in range(offset_groups):
            img = input[b, g * cpg:(g + 1) * cpg].astype(np.float64)
            for k in range(kh * kw):
                i, j = divmod(k, kw)
                y = ys + i * dilation_h + offset[b, (g * kh * kw + k) * 2]
                x = xs + j * dilation_w + offset[b, (g * kh * kw + k) * 2 + 1]
                inside = (y > -1) & (y < h) & (x > -1) & (x < w)
                y0, x0 = np.floor(y).astype(np.int64), np.floor(x).astype(np.int64)
                val = np.zeros((cpg, oh, ow))
                for dy in (0, 1):
                    for dx in (0, 1):
                        yy, xx = y0 + dy, x0 + dx
                        wt = (1 - np.abs(y - yy)) * (1 - np.abs(x - xx))
                        ok = inside & (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
                        val += np.where(ok, wt, 0) * img[:, np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)]
                if use_mask:
                    val *= mask[b, g * kh * kw + k]
                cols[b, g * cpg:(g + 1) * cpg, k] = val
    og = o // groups
    out = np.empty((n, o, oh, ow), dtype=np.float64)
    for g in range(groups):
        wg = weight[g * og:(g + 1) * og].reshape(og, cg * kh * kw).astype(np.float64)
        cg_cols = cols[:, g * cg:(g + 1) * cg].reshape(n, cg * kh * kw, oh * ow)
        out[:, g * og:(g + 1) * og] = (wg @ cg_cols).reshape(n, og, oh, ow)
    out += bias.reshape(1, o, 1, 1)
    return (out.astype(input.dtype),)


def _standard_torchscript(g, input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h,
                          dilation_w, groups, offset_groups, use_mask):
    inputs = [input, weight, offset, bias] + ([mask] if use_mask else [])
    return g.op("DeformConv", *inputs, dilations_i=[dilation_h, dilation_w], group_i=groups,
                offset_group_i=offset_groups, pads_i=[pad_h, pad_w, pad_h, pad_w], strides_i=[stride_h, stride_w])


def _standard_dynamo(input, weight, offset, mask, bias, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
                     groups, offset_groups, use_mask):
    from onnxscript import opset19 as op

    return op.DeformConv(input, weight, offset, bias, mask if use_mask else None,
                         dilations=[dilation_h, dilation_w], group=groups, offset_group=offset_groups,
                         pads=[pad_h, pad_w, pad_h, pad_w], strides=[stride_h, stride_w])


DEFORM_CONV2D = _spec.OpSpec(
    name="deform_conv2d",
    namespace=_spec.DOMAIN,
    helper_ops=("_deform_conv2d_backward",),
    schema=(
        "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, int stride_h, "
        "int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int groups, int offset_groups, "
        "bool use_mask) -> Tensor"
    ),
    args=(
        _spec.TensorArg("input", "input", "[N, C, H, W]"),
        _spec.TensorArg("weight", "weight", "[O, C/groups, kh, kw]"),
        _spec.TensorArg("offset", "offset", "[N, 2*offset_groups*kh*kw, oh, ow], (dy, dx) per kernel tap"),
        _spec.TensorArg("mask", "mask", "[N, offset_groups*kh*kw, oh, ow] (read only when use_mask=1)"),
        _spec.TensorArg("bias", "bias", "[O]"),
        *(_spec.AttrArg(n, n, "int") for n in _INTS),
        _spec.AttrArg("use_mask", "use_mask", "bool", "1: modulated (DCNv2), 0: DCNv1"),
    ),
    outputs=("output",),
    doc="Deformable convolution v1/v2 with torchvision.ops.deform_conv2d's semantics.",
    fake=_fake, reference=_reference, onnx_output_shapes=_shape_rule.onnx_output_shapes,  # shapes, values
    setup_context=_setup_context, backward=_backward,  # autograd
    standard_torchscript=_standard_torchscript, standard_dynamo=_standard_dynamo,  # the standard-ONNX form
    standard_from_opset=19,
    torch_aliases=("torchvision::deform_conv2d",),
)

register_op(DEFORM_CONV2D, extension=_C)


def _int_pair(name: str, value) -> Tuple[int, int]:
    """stride / padding / dilation: an int or a pair of ints (torchvision's ``_pair``);
    anything else (a float, three values) is refused rather than truncated."""
    items = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(items) == 2:
        try:  # ints, bools and numpy ints pass (as in torchvision); floats and strings do not
            return operator.index(items[0]), operator.index(items[1])
        except TypeError:
            pass
    raise OpInputError(f"opforge::deform_conv2d: {name} must be an int or a pair of ints, got {value!r}")


#: stride / padding / dilation, as TorchScript types them (Union refines by isinstance)
IntOrPair = Union[int, Tuple[int, int], List[int]]


def _script_pair(value: IntOrPair) -> List[int]:
    """_int_pair for TorchScript (where the types are already checked)."""
    if isinstance(value, int):
        return [value, value]
    elif isinstance(value, list):
        return value
    else:
        return [value[0], value[1]]


def _compatible_bias(bias: Optional[torch.Tensor], input: torch.Tensor,
                     out_channels: int) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """torchvision's bias rule on top of the op's strict one ([O], input's dtype).

    torchvision adds the bias as ``out + bias.view(1, O, 1, 1)``, so it takes any
    shape with O elements, and any dtype, with type promotion (a float64 bias
    makes a float32 input's output float64). Returns the bias for the op, and the
    bias to add afterwards when its dtype differs (None on the usual path)."""
    if bias is None:
        return torch.zeros(out_channels, device=input.device, dtype=input.dtype), None
    if not torch.jit.is_tracing() and bias.numel() != out_channels:  # (traced: checked by _plan, untraced)
        raise OpInputError(f"opforge::deform_conv2d: bias must have out_channels = {out_channels} elements, "
                           f"got shape {list(bias.shape)}")
    if bias.dtype == input.dtype:
        return (bias if bias.dim() == 1 else bias.reshape(out_channels)), None
    return (torch.zeros(out_channels, device=input.device, dtype=input.dtype),
            bias.reshape(1, out_channels, 1, 1))


def _plan(input: torch.Tensor, offset: torch.Tensor, weight: torch.Tensor,
          bias: Optional[torch.Tensor]) -> Tuple[int, int, int]:
    """(groups, offset_groups, out_channels), inferred as torchvision does, and the checks
    that inference needs (TorchScript-compatible); the op checks the rest."""
    if input.dim() != 4:  # the ranks are needed here to infer groups and offset_groups
        raise OpInputError(f"opforge::deform_conv2d: input must be 4-D [N, C, H, W], got shape {list(input.shape)}")
    if weight.dim() != 4:
        raise OpInputError(
            f"opforge::deform_conv2d: weight must be 4-D [O, C/groups, kh, kw], got shape {list(weight.shape)}")
    if offset.dim() != 4:
        raise OpInputError("opforge::deform_conv2d: the shape of the offset tensor at dimension 1 is not valid: "
                           f"offset must be 4-D [N, 2*offset_groups*kh*kw, oh, ow], got shape {list(offset.shape)}")
    out_channels, kh, kw = weight.shape[0], weight.shape[2], weight.shape[3]
    if kh * kw == 0:
        raise OpInputError(f"opforge::deform_conv2d: weight has an empty kernel, shape {list(weight.shape)}")
    offset_groups = offset.shape[1] // (2 * kh * kw)
    if offset_groups == 0:
        raise OpInputError("opforge::deform_conv2d: the shape of the offset tensor at dimension 1 is not valid: "
                           f"offset has {offset.shape[1]} channels, fewer than 2*kh*kw = {2 * kh * kw}")
    # torchvision's inference of groups; no channels at all (C = 0) means one group
    groups = input.shape[1] // weight.shape[1] if weight.shape[1] > 0 else 1
    if bias is not None and bias.numel() != out_channels:
        raise OpInputError(f"opforge::deform_conv2d: bias must have out_channels = {out_channels} elements, "
                           f"got shape {list(bias.shape)}")
    return groups, offset_groups, out_channels


def _deform_conv2d(input: torch.Tensor, offset: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   stride: List[int], padding: List[int], dilation: List[int],
                   mask: Optional[torch.Tensor], plan: Optional[Tuple[int, int, int]] = None) -> torch.Tensor:
    """The functional's body, TorchScript-compatible: infers groups and offset groups
    (``plan``, when the caller has them) and calls the op; the op checks the rest."""
    if len(stride) != 2 or len(padding) != 2 or len(dilation) != 2:
        raise OpInputError("opforge::deform_conv2d: stride, padding and dilation must be ints or pairs of ints")
    if plan is None:
        plan = _plan(input, offset, weight, bias)
    groups, offset_groups, out_channels = plan
    use_mask = mask is not None
    if mask is None:
        mask = torch.zeros((input.shape[0], 1), device=input.device, dtype=input.dtype)
    bias_for_op, bias_after = _compatible_bias(bias, input, out_channels)
    out = torch.ops.opforge.deform_conv2d(input, weight, offset, mask, bias_for_op, stride[0], stride[1], padding[0],
                                          padding[1], dilation[0], dilation[1], groups, offset_groups, use_mask)
    return out if bias_after is None else out + bias_after


def deform_conv2d(input: torch.Tensor, offset: torch.Tensor, weight: torch.Tensor,
                  bias: Optional[torch.Tensor] = None, stride: IntOrPair = 1, padding: IntOrPair = 0,
                  dilation: IntOrPair = 1, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``torchvision.ops.deform_conv2d`` with opforge's kernel: same arguments, inputs
    accepted and result. Bad input raises :class:`opforge.OpInputError` (a
    RuntimeError as in torchvision, and a ValueError / TypeError).

    Works in ``torch.jit.script`` (stride, padding, dilation: int or pair) and is
    one node in ``torch.fx`` graphs (through ``__torch_function__``, like
    ``torch.nn.functional``), however it was imported."""
    if not torch.jit.is_scripting():  # TorchScript parses this block but compiles none of it
        return _deform_conv2d_eager(input, offset, weight, bias, stride, padding, dilation, mask)
    return _deform_conv2d(input, offset, weight, bias, _script_pair(stride), _script_pair(padding),
                          _script_pair(dilation), mask)


def _deform_conv2d_eager(input, offset, weight, bias, stride, padding, dilation, mask):
    tensors = tuple(t for t in (input, offset, weight, bias, mask) if t is not None)
    if has_torch_function(tensors):  # e.g. torch.fx proxies: record one call to the functional
        return handle_torch_function(deform_conv2d, tensors, input, offset, weight, bias=bias, stride=stride,
                                     padding=padding, dilation=dilation, mask=mask)
    pairs = _int_pair("stride", stride), _int_pair("padding", padding), _int_pair("dilation", dilation)
    try:
        plan = None
        if torch.jit.is_tracing():
            with Untraced():
                plan = _plan(input, offset, weight, bias)
        return _deform_conv2d(input, offset, weight, bias, *pairs, mask, plan)
    except (RuntimeError, ValueError, TypeError) as e:  # the kernels' errors about our arguments
        raise as_input_error("opforge::deform_conv2d", e) from None


def _module_class() -> type:
    """opforge.DeformConv2d, made on first use: a subclass of
    ``torchvision.ops.DeformConv2d`` when torchvision is installed (so isinstance
    checks, weight-init code and torchvision's feature extraction, which keeps
    torchvision.ops modules as leaves, treat it as torchvision's), else of
    ``torch.nn.Module``. Made lazily so ``import opforge`` does not import
    torchvision."""
    try:
        import torchvision.ops

        base = torchvision.ops.DeformConv2d
    except ImportError:
        base = torch.nn.Module

    class DeformConv2d(base):
        """Drop-in for ``torchvision.ops.DeformConv2d``: same constructor, parameters
        (``weight``, ``bias``), initialisation, state_dict, repr and
        ``forward(input, offset, mask=None)``; scriptable and FX-traceable."""

        def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                     groups: int = 1, bias: bool = True):
            torch.nn.Module.__init__(self)  # torchvision's __init__ would also log API usage
            if in_channels % groups != 0:
                raise ValueError("in_channels must be divisible by groups")
            if out_channels % groups != 0:
                raise ValueError("out_channels must be divisible by groups")
            self.in_channels, self.out_channels = in_channels, out_channels
            self.kernel_size = _int_pair("kernel_size", kernel_size)
            self.stride = _int_pair("stride", stride)
            self.padding = _int_pair("padding", padding)
            self.dilation = _int_pair("dilation", dilation)
            self.groups = groups
            self.weight = torch.nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size))
            if bias:
                self.bias = torch.nn.Parameter(torch.empty(out_channels))
            else:
                self.register_parameter("bias", None)
            self.reset_parameters()

        def reset_parameters(self) -> None:
            torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
            if self.bias is not None:
                fan_in, _ = torch.nn.init._calculate_fan_in_and_fan_out(self.weight)
                bound = 1 / math.sqrt(fan_in)
                torch.nn.init.uniform_(self.bias, -bound, bound)

        def forward(self, input: torch.Tensor, offset: torch.Tensor,
                    mask: Optional[torch.Tensor] = None) -> torch.Tensor:
            return deform_conv2d(input, offset, self.weight, self.bias, stride=self.stride, padding=self.padding,
                                 dilation=self.dilation, mask=mask)

        __repr__ = torch.nn.Module.__repr__  # torchvision's class defines its own; same text through extra_repr

        def extra_repr(self) -> str:
            s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
            s += f", padding={self.padding}" if self.padding != (0, 0) else ""
            s += f", dilation={self.dilation}" if self.dilation != (1, 1) else ""
            s += f", groups={self.groups}" if self.groups != 1 else ""
            s += ", bias=False" if self.bias is None else ""
            return s

    DeformConv2d.__module__, DeformConv2d.__qualname__ = __name__, "DeformConv2d"  # pickles by this name
    return DeformConv2d


def __getattr__(name: str):
    if name == "DeformConv2d":
        cls = globals()["DeformConv2d"] = _module_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
