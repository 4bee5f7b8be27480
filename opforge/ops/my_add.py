"""my_add(a, b) = 2*a + b, with numpy broadcasting.

Three ways to call it, all the same kernel (opforge/ops/csrc/my_add.cpp, core
opforge/csrc/core/my_add.h):

* ``opforge.my_add(a, b)`` / ``torch.ops.opforge.my_add(a, b)``: the op itself,
  differentiable through its registered autograd, traceable by torch.export;
* ``MyAddFunction.apply(a, b)``: the classic ``torch.autograd.Function`` with a
  ``symbolic`` staticmethod, the flow of the TorchScript-era tutorials;
* ``MyAdd()``: an ``nn.Module``.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import spec as _spec
from ..registration import OpInputError, as_input_error, autograd_function, check_same_device, register_op
from ..shape_rule import ShapeRule
from ._registry import _C

_SUPPORTED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# The kernels' shape rule, core::my_add_output_shapes (broadcasting, at most 16 dims), registered by
# the extension as opforge::_my_add_output_shapes: the fake impl and ONNX shape inference call it.
_shape_rule = ShapeRule("opforge::_my_add_output_shapes", error=OpInputError)


def _fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The kernels' dtype and device checks (same exception types and words), then the shape rule."""
    if a.dtype != b.dtype:
        raise TypeError(f"opforge::my_add: a and b must have the same dtype, got a: {a.dtype} and b: {b.dtype}")
    if a.dtype not in _SUPPORTED:
        raise TypeError(
            f"opforge::my_add: a has dtype {a.dtype}; supported dtypes are float16, bfloat16, float32 and float64"
        )
    check_same_device("opforge::my_add", a=a, b=b)
    return a.new_empty(_shape_rule(a.shape, b.shape)[0])


def _setup_context(ctx, inputs, output) -> None:
    a, b = inputs
    ctx.a_shape, ctx.b_shape = a.shape, b.shape


def _backward(ctx, grad: torch.Tensor):
    # d(2a+b)/da = 2, d/db = 1; broadcast dims are summed back to each input's shape.
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_a = (grad * 2).sum_to_size(ctx.a_shape)
    if ctx.needs_input_grad[1]:
        grad_b = grad.sum_to_size(ctx.b_shape)
    return grad_a, grad_b


def _reference(a: np.ndarray, b: np.ndarray) -> tuple:
    # Same arithmetic as the core: in float32 for 16-bit types, one final rounding.
    acc = np.float32 if a.dtype.itemsize < 4 else a.dtype
    return (((a.astype(acc) + a.astype(acc)) + b.astype(acc)).astype(a.dtype),)


_JIT_DTYPES = {"Float": torch.float32, "Double": torch.float64, "Half": torch.float16, "BFloat16": torch.bfloat16}


def _standard_torchscript(g, a, b):
    # The tutorial's lowering: Mul(a, 2) then Add(., b). The constant takes a's
    # dtype from the traced type (CastLike only exists from opset 15).
    dtype = _JIT_DTYPES.get(a.type().scalarType()) if a.type().kind() == "TensorType" else None
    if dtype is not None:
        two = g.op("Constant", value_t=torch.tensor(2.0, dtype=dtype))
    elif g.opset >= 15:
        two = g.op("CastLike", g.op("Constant", value_t=torch.tensor(2.0)), a)
    else:
        raise TypeError("opforge::my_add: standard-ONNX export below opset 15 needs a's dtype known at export")
    return g.op("Add", g.op("Mul", a, two), b)


def _standard_dynamo(a, b):
    from onnxscript import opset18 as op

    return op.Add(op.Mul(a, op.CastLike(2.0, a)), b)


MY_ADD = _spec.OpSpec(
    name="my_add",
    namespace=_spec.DOMAIN,
    schema="my_add(Tensor a, Tensor b) -> Tensor",
    args=(_spec.TensorArg("a", "A", "first operand, scaled by 2"), _spec.TensorArg("b", "B", "second operand")),
    outputs=("C",),
    doc="C = 2*A + B with numpy-style (multidirectional) broadcasting.",
    fake=_fake, reference=_reference, onnx_output_shapes=_shape_rule.onnx_output_shapes,  # shapes, values
    setup_context=_setup_context, backward=_backward,  # autograd
    standard_torchscript=_standard_torchscript, standard_dynamo=_standard_dynamo,  # the standard-ONNX form
)

my_add_op = register_op(MY_ADD, extension=_C)


def my_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``2*a + b`` (broadcasting; float16/bfloat16/float32/float64), differentiable. Bad input raises
    :class:`opforge.OpInputError` (a ValueError, TypeError and RuntimeError) naming the argument.
    Works in ``torch.jit.script`` (where a bad input raises the kernel's RuntimeError)."""
    if not torch.jit.is_scripting():  # TorchScript compiles only the op call below
        return _my_add_eager(a, b)
    return torch.ops.opforge.my_add(a, b)


def _my_add_eager(a, b):
    try:
        return my_add_op(a, b)
    except RuntimeError as e:  # the kernel's check (a RuntimeError across the stable ABI)
        raise as_input_error("opforge::my_add", e) from None


#: ``MyAddFunction.apply(a, b)``: the op as a ``torch.autograd.Function`` with an ONNX ``symbolic``
#: (the TorchScript-era tutorials' form), built from the spec.
MyAddFunction = autograd_function(MY_ADD, "MyAddFunction", "``MyAddFunction.apply(a, b)``: my_add as an "
                                  "autograd.Function with an ONNX symbolic.", module=__name__)


class MyAdd(torch.nn.Module):
    """Module form of :func:`my_add`: ``MyAdd()(a, b) == 2*a + b``."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return my_add(a, b)
