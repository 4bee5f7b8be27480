"""A TorchScript symbolic for any ATen op the dynamo exporter can translate.

The TorchScript exporter (``dynamo=False``) has no rule for many ATen ops that the dynamo
exporter handles (through torchlib's onnxscript functions or through torch's decompositions).
For those, :func:`symbolic` derives a rule from the dynamo side at export time:

1. From the TorchScript node: its exact overload (``node.schema()``), its tensor inputs (dtype
   and shape, dynamic dims included) and its constant arguments.
2. The op alone, with those inputs, goes through the dynamo exporter's own pipeline
   (``torch.export`` -> torch's decompositions -> torchlib), giving an opset-18 ONNX graph.
   Functions are inlined. The result is cached per signature.
3. That graph is brought to the target opset node by node (:class:`_Downgrade`): unchanged where
   the op's schema is the same, converted where the form changed (``axes`` inputs back to
   attributes, ``CastLike`` to ``Cast``, ...), refused with the ONNX op and opset named where
   ONNX cannot express it at that opset. A refused graph is retried in the other forms (:class:`Form`):
   torch's decompositions of the op, then opforge's compositions for older opsets
   (:mod:`.aten_lowerings`). What is kept must pass ONNX's checker at the target opset.
4. Its nodes are written into the TorchScript graph with ``g.op``, typed.

Where torch has its own rule, :func:`torch_rule_then_bridge` keeps it first and hands the bridge
only the calls it refuses.

Nothing here runs unless a bridged op is exported: torchlib's registry (about a second to
build) is loaded on first use, so models that need no bridge export exactly as fast as before.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import math
import threading
from typing import Any, Callable, Optional, Sequence

import numpy as np
import onnx
import onnx.numpy_helper
import torch

from . import lowerings, rules

_LOCK = threading.RLock()

#: TorchScript scalar type names -> torch dtypes.
_DTYPES = {
    "Float": torch.float32, "Double": torch.float64, "Half": torch.float16, "BFloat16": torch.bfloat16,
    "Long": torch.int64, "Int": torch.int32, "Short": torch.int16, "Char": torch.int8,
    "Byte": torch.uint8, "Bool": torch.bool,
    # Complex values travel through the ONNX graph as real pairs (a trailing dim of 2), the
    # dynamo exporter's convention; only ops the bridge translates may touch them (see
    # _check_complex_consumers).
    "ComplexFloat": torch.complex64, "ComplexDouble": torch.complex128,
}
_COMPLEX_SCALAR_TYPES = frozenset({"ComplexFloat", "ComplexDouble", "ComplexHalf"})
_ONNX_TYPE_STR = {
    onnx.TensorProto.FLOAT: "tensor(float)", onnx.TensorProto.DOUBLE: "tensor(double)",
    onnx.TensorProto.FLOAT16: "tensor(float16)", onnx.TensorProto.BFLOAT16: "tensor(bfloat16)",
    onnx.TensorProto.INT64: "tensor(int64)", onnx.TensorProto.INT32: "tensor(int32)",
    onnx.TensorProto.INT16: "tensor(int16)", onnx.TensorProto.INT8: "tensor(int8)",
    onnx.TensorProto.UINT8: "tensor(uint8)", onnx.TensorProto.BOOL: "tensor(bool)",
}
#: The opset torchlib writes; the graph from step 2 uses these schemas.
SOURCE_OPSET = 18
#: Size given to a dynamic dim when the op is traced (not 0 or 1: torch.export specialises those).
_DYNAMIC_DIM_HINT = 5


class BridgeError(RuntimeError):
    """The bridge cannot export this call; the message names the op and the reason."""


# --------------------------------------------------------------------------------------------
# Step 1: the call, from the TorchScript node


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    dtype: torch.dtype
    shape: tuple  # ints, None for a dynamic dim

    def example(self, hint: int = _DYNAMIC_DIM_HINT) -> torch.Tensor:
        shape = [d if d is not None else hint for d in self.shape]
        if self.dtype == torch.bool:
            return torch.zeros(shape, dtype=torch.bool)
        return torch.ones(shape, dtype=self.dtype)


@dataclasses.dataclass(frozen=True)
class Call:
    """One ATen call: the overload, and per schema argument a TensorInfo, a tuple of them
    (Tensor[]), or a constant."""

    overload: str  # "aten::logcumsumexp" or "aten::xlogy.Scalar_Self"
    args: tuple
    keyword: tuple = ()  # names of the keyword-only arguments, in order, at the end of args

    @property
    def name(self) -> str:
        return self.overload.split("::")[1].split(".")[0]

    @property
    def op(self) -> torch._ops.OpOverload:
        name, _, overload = self.overload.partition(".")
        packet = getattr(torch.ops.aten, name.split("::")[1])
        return getattr(packet, overload or "default")


def _is_tensor_type(t) -> bool:
    if t.kind() == "OptionalType":
        t = t.getElementType()
    return t.kind() == "TensorType"


def _is_tensor_list_type(t) -> bool:
    return t.kind() == "ListType" and t.getElementType().kind() in ("TensorType", "OptionalType")


def _tensor_info(value, op: str, arg: str) -> TensorInfo:
    t = value.type()
    if t.kind() != "TensorType" or t.scalarType() is None:
        raise BridgeError(f"{op}: the dtype of argument '{arg}' is unknown in the traced graph; "
                          "opforge's bridge needs typed inputs (export with example inputs of the real dtype)")
    sizes = t.varyingSizes()
    if sizes is None:
        raise BridgeError(f"{op}: the rank of argument '{arg}' is unknown in the traced graph")
    if t.scalarType() not in _DTYPES:
        raise BridgeError(f"{op}: argument '{arg}' has dtype {t.scalarType()}, which the bridge does not handle")
    return TensorInfo(_DTYPES[t.scalarType()], tuple(sizes))


def _constant(value, arg_type, op: str, arg: str):
    from torch.onnx import symbolic_helper

    if symbolic_helper._is_none(value):
        return None
    node = value.node()
    kind = node.kind()
    if kind == "prim::ListConstruct":
        elem = arg_type.getElementType() if arg_type.kind() == "ListType" else arg_type
        return tuple(_constant(v, elem, op, arg) for v in node.inputs())
    if kind == "onnx::Constant":
        # Strings (einsum's equation, scatter_reduce's reduce) are string attributes.
        python = node.s("value") if node.kindOf("value") == "s" else node.t("value").tolist()
    elif kind == "prim::Constant":
        python = value.toIValue()
        if isinstance(python, torch.Tensor):
            python = python.tolist()
    else:
        raise BridgeError(f"{op}: argument '{arg}' is computed in the graph (from {kind}); opforge's bridge "
                          "needs it as a constant (a Python number, not a tensor value)")
    type_str = str(arg_type).rstrip("?")
    if isinstance(python, list) and not type_str.endswith("[]") and type_str.find("[") < 0:
        python = python[0] if len(python) == 1 else python
    if type_str in ("int", "SymInt") and isinstance(python, (int, float, bool)):
        return int(python)
    if type_str == "float" and isinstance(python, (int, float)):
        return float(python)
    if type_str == "bool" and isinstance(python, (int, bool)):
        return bool(python)
    if isinstance(python, list):
        return tuple(python)
    return python


def _is_constant(value) -> bool:
    from torch.onnx import symbolic_helper

    kind = value.node().kind()
    if kind == "prim::ListConstruct":
        return all(_is_constant(v) for v in value.node().inputs())
    return kind in ("onnx::Constant", "prim::Constant") or symbolic_helper._is_none(value)


def _overloads(kind: str, original_schema: str) -> list:
    """Candidate schemas for a node, best first: the one the tracer recorded when it is known;
    else the ATen fallback's dispatcher order (default, Tensor, the rest; never out= or in-place)."""
    from .fallback import dispatch_order

    if original_schema != "(no schema)":
        schema = torch._C.parse_schema(original_schema)
        # By the time symbolics run, an int argument is a 0-d tensor constant, and TorchScript's
        # schema lookup may then match an out= overload (squeeze_copy(x, 1) as squeeze_copy.out):
        # never the call the model made.
        if not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            return [schema]
    return [op._schema for op in dispatch_order(getattr(torch.ops.aten, kind.split("::")[1]))]


def _binds(schema, values) -> bool:
    from torch.onnx import symbolic_helper

    if len(schema.arguments) != len(values):
        return False
    for a, v in zip(schema.arguments, values):
        if _is_tensor_type(a.type):
            if symbolic_helper._is_none(v) and a.type.kind() != "OptionalType":
                return False
        elif _is_tensor_list_type(a.type):
            if v.node().kind() != "prim::ListConstruct":
                return False
        elif not _is_constant(v):
            return False
    return True


def call_of(node, values: Sequence) -> Call:
    """The Call a TorchScript ``aten::`` node makes; ``values`` are its inputs as the symbolic
    receives them (in the graph being built)."""
    from torch.onnx import symbolic_helper

    kind = node.kind()
    candidates = _overloads(kind, node.schema())
    # A constant can be a Tensor argument too (a Python number traced into a 0-d tensor); the
    # overload that takes the most constants as numbers is the one the call meant.
    fitting = [s for s in candidates if _binds(s, values)]
    parsed = min(fitting, key=lambda s: sum(
        1 for a, v in zip(s.arguments, values) if _is_tensor_type(a.type) and _is_constant(v)), default=None)
    if parsed is None:
        raise BridgeError(f"{kind}: no overload takes these inputs as constants where it needs numbers "
                          "(an argument computed at run time where the op needs a Python number?)")
    op = parsed.name + (f".{parsed.overload_name}" if parsed.overload_name else "")
    args = []
    for value, original, a in zip(values, node.inputs(), parsed.arguments):
        # A complex input arrives as the real pair the bridge wrote for it; the traced graph
        # still has its complex dtype and shape, which is the call the model made.
        if _is_tensor_type(a.type):
            args.append(None if symbolic_helper._is_none(value) else
                        _tensor_info(original if _is_complex(original) else value, op, a.name))
        elif _is_tensor_list_type(a.type):
            items = symbolic_helper._unpack_list(value)
            if _is_complex(original) and original.node().kind() == "prim::ListConstruct":
                items = list(original.node().inputs())
            args.append(tuple(_tensor_info(v, op, a.name) for v in items))
        else:
            args.append(_constant(value, a.type, op, a.name))
    return Call(op, tuple(args), tuple(a.name for a in parsed.arguments if a.kwarg_only))


def tensor_inputs(call: Call, values: Sequence) -> list:
    """The call's tensor Values, in the order :func:`translate` numbers its graph inputs."""
    from torch.onnx import symbolic_helper

    out = []
    for a, value in zip(call.args, values):
        if isinstance(a, TensorInfo):
            out.append(value)
        elif isinstance(a, tuple) and a and isinstance(a[0], TensorInfo):
            out.extend(symbolic_helper._unpack_list(value))
    return out


# --------------------------------------------------------------------------------------------
# Step 2: the dynamo exporter's translation of the call


@functools.lru_cache(maxsize=1)
def torchlib_registry():
    """torchlib's registry (what ``dynamo=True`` translates with); built once, on first use."""
    from torch.onnx._internal.exporter import _registration

    with _LOCK:
        return _registration.ONNXRegistry.from_torchlib()


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


class _CallModule(torch.nn.Module):
    """``forward(*tensors)`` makes the Call, with its constants baked in; ``fn`` replaces the
    op (a curated composition, or a lowering for older opsets)."""

    def __init__(self, call: Call, fn: Optional[Callable] = None):
        super().__init__()
        self.call = call
        # The curated compositions are written for real tensors (angle, sgn); on complex ones
        # dynamo's own translation is the one to use.
        curated = None if any(i.dtype.is_complex for i in _flat_tensors(call)) else CURATED.get(call.name)
        self.fn = fn or curated or call.op

    def forward(self, *tensors):
        it = iter(tensors)
        args = []
        for a in self.call.args:
            if isinstance(a, TensorInfo):
                args.append(next(it))
            elif isinstance(a, tuple) and a and isinstance(a[0], TensorInfo):
                args.append([next(it) for _ in a])
            else:
                args.append(list(a) if isinstance(a, tuple) else a)
        n = len(args) - len(self.call.keyword)
        return self.fn(*args[:n], **dict(zip(self.call.keyword, args[n:])))


def _flat_tensors(call: Call) -> list[TensorInfo]:
    out = []
    for a in call.args:
        if isinstance(a, TensorInfo):
            out.append(a)
        elif isinstance(a, tuple) and a and isinstance(a[0], TensorInfo):
            out.extend(a)
    return out


class Form(enum.IntEnum):
    """Which form of the op :func:`translate` hands to torchlib, tried in this order.

    Torchlib writes the newest ONNX op for an ATen op (Trilu, Einsum, NegativeLogLikelihoodLoss,
    GridSample, ...). Torch's own decompositions of the op into simpler ATen ops often need
    only older ONNX ops, which is what an opset below the newer op's needs."""

    DIRECT = 0  # the op itself: torchlib's translation (fewest nodes)
    DECOMPOSED = 1  # torch's decomposition of the op
    CORE_ATEN = 2  # everything decomposed down to core ATen
    DEEP = 3  # core ATen, then the ops core ATen keeps by their own decompositions
    LOWERING = 4  # opforge's composition for older opsets (lowerings.LOWERINGS)


def _decompose(call: Call, program, form: Form):
    from torch._decomp import core_aten_decompositions, decomposition_table

    core = core_aten_decompositions()
    if form == Form.DECOMPOSED:
        fn = core.get(call.op) or decomposition_table.get(call.op)
        if fn is None:
            raise BridgeError(f"{call.overload}: torch has no decomposition of it")
        return program.run_decompositions({call.op: fn})
    program = program.run_decompositions(dict(core))
    if form == Form.DEEP:
        # One level further (grid_sampler_2d, ...). The whole table at once would reach prims,
        # which the exporter cannot take.
        kept = {n.target for n in program.graph.nodes if n.op == "call_function"}
        deeper = {op: decomposition_table[op] for op in kept if op in decomposition_table}
        if not deeper:
            raise BridgeError(f"{call.overload}: torch has no further decomposition of it")
        program = program.run_decompositions(deeper)
    return program


def translate(call: Call, form: Form = Form.DIRECT) -> onnx.ModelProto:
    """The dynamo exporter's ONNX graph for ``call`` in ``form`` (opset 18, functions inlined,
    shapes inferred). Its inputs are the call's tensors in order; BridgeError if dynamo cannot.
    Cached per (call, form), failures too: a refusal is asked again at every lower opset."""
    result = _translate_cached(call, form)
    if isinstance(result, BridgeError):
        raise BridgeError(str(result))
    return result


@functools.lru_cache(maxsize=1024)
def _translate_cached(call: Call, form: Form):
    try:
        return _translate(call, form)
    except BridgeError as exc:
        return exc


translate.cache_info = _translate_cached.cache_info


def _translate(call: Call, form: Form) -> onnx.ModelProto:
    infos = _flat_tensors(call)
    dynamic = tuple({d: torch.export.Dim.AUTO for d, s in enumerate(i.shape) if s is None} for i in infos)
    # A dynamic dim's traced size is not in the graph. Try a neutral size; then the static sizes
    # of the other inputs (a dynamic dim must often match one of them, as in addr's vectors);
    # then a size above each integer argument (stft's n_fft, a kernel size: the dim must be at
    # least that long). (size, whether the dim must come out still dynamic)
    sizes = sorted({d for i in infos for d in i.shape if d not in (None, _DYNAMIC_DIM_HINT)})
    above = sorted({4 * c + 1 for c in _int_constants(call.args) if c > 1} - {_DYNAMIC_DIM_HINT, *sizes})
    hints = [(_DYNAMIC_DIM_HINT, True)] + [(d, False) for d in sizes] + [(d, True) for d in above]
    if not any(dynamic):
        hints = hints[:1]
    fn = None
    if form == Form.LOWERING:
        if call.name not in lowerings.LOWERINGS:
            raise BridgeError(f"{call.overload}: opforge has no composition of it for older opsets")
        fn = lowerings.LOWERINGS[call.name](call)  # eagerly: it may precompute constants
    with _LOCK, _quiet_exporter():
        for attempt, (hint, must_stay_dynamic) in enumerate(hints):
            try:
                proto, specialised = _exported(call, fn, form, hint, dynamic, must_stay_dynamic)
                if specialised and _nodes_of(proto) != _nodes_of(
                        _exported(call, fn, form, hint + 2, dynamic, must_stay_dynamic)[0]):
                    # the size hint is in the graph: it would be wrong for every other size
                    raise BridgeError(f"{call.overload}: a dynamic dim of its inputs is fixed in its translation; "
                                      "export it with static sizes")
                break
            except BridgeError:
                raise
            except Exception as exc:  # noqa: BLE001 - reported with the op's name below
                if attempt == len(hints) - 1:
                    raise BridgeError(f"{call.overload}: the dynamo exporter cannot translate it either "
                                      f"({_first_line(exc)})") from exc
    if len(proto.graph.input) != len(infos):
        raise BridgeError(f"{call.overload}: the translated graph has {len(proto.graph.input)} inputs, "
                          f"expected {len(infos)}")
    try:
        return onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except onnx.shape_inference.InferenceError as exc:
        # (measured: torchlib's fft_fft with n= on complex input declares a complex64 value)
        raise BridgeError(f"{call.overload}: the dynamo exporter's translation is not valid ONNX "
                          f"({_first_line(exc)})") from None


def _exported(call: Call, fn, form: Form, hint: int, dynamic, must_stay_dynamic: bool) -> tuple:
    """(the ONNX model of ``call`` traced with dynamic dims of size ``hint``, whether torch.export
    specialised a dynamic dim to that size)."""
    from onnxscript import ir
    from onnxscript import optimizer
    from onnxscript.ir.passes import common as passes
    from torch.onnx._internal.exporter import _core

    examples = tuple(i.example(hint) for i in _flat_tensors(call))
    program = torch.export.export(_CallModule(call, fn), examples, dynamic_shapes=(dynamic,), strict=False)
    specialised = _check_still_dynamic(call, program, dynamic) if must_stay_dynamic else False
    if form in (Form.DECOMPOSED, Form.CORE_ATEN, Form.DEEP):
        program = _decompose(call, program, form)
    model = _core.exported_program_to_ir(program, registry=torchlib_registry())
    passes.InlinePass()(model)
    passes.RemoveUnusedFunctionsPass()(model)
    # Folding constants (as the dynamo exporter's optimize() does) turns computed axes and
    # shapes into constants, which older opsets need as attributes.
    optimizer.fold_constants(model)
    optimizer.remove_unused_nodes(model)
    return ir.serde.serialize_model(model), specialised


def _nodes_of(proto: onnx.ModelProto) -> list:
    # the computation, without the graph inputs' (possibly static) shapes
    return [n.SerializeToString() for n in proto.graph.node] + [t.SerializeToString() for t in proto.graph.initializer]


def _int_constants(args) -> set:
    found = set()
    for a in args:
        if isinstance(a, bool):
            continue
        if isinstance(a, int):
            found.add(a)
        elif isinstance(a, tuple):
            found |= _int_constants(a)
    return found


def _check_still_dynamic(call: Call, program, dynamic) -> bool:
    # A dim that torch.export specialised to the neutral size would be baked into the graph
    # as 5: wrong at run time. (Sizes taken from other inputs, tried later, are specialised
    # because the op ties the dim to that input's static size: right.)
    # The call's tensors only: constants the module lifts (a lowering's weights) come first.
    # A SymInt whose value is a constant (take_along_dim's, chain_matmul's) may or may not be in
    # the graph: True tells the caller to compare with another size.
    from torch.fx.experimental.symbolic_shapes import is_concrete_int

    user_inputs = set(program.graph_signature.user_inputs)
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in user_inputs]
    specialised = False
    for index, (node, dims) in enumerate(zip(placeholders, dynamic)):
        val = node.meta.get("val")
        for d in dims:
            if val is not None and isinstance(val.shape[d], torch.SymInt) and is_concrete_int(val.shape[d]):
                specialised = True
            elif val is not None and not isinstance(val.shape[d], torch.SymInt):
                raise BridgeError(f"{call.overload}: dim {d} of tensor input {index} is dynamic in the graph, "
                                  "but the op's translation needs it static; export it with a static size")
    return specialised


class _quiet_exporter:
    # The dynamo exporter logs a warning per node about module stacks our one-op module lacks;
    # onnx_ir one per empty list attribute (max_unpool's empty padding) it must guess a type for;
    # torch.export one when a size hint of 1 specialises a dim (_translate then tries the next).
    def __enter__(self):
        self.loggers = [logging.getLogger(n) for n in ("torch.onnx._internal.exporter._core", "torch.export",
                                                       "onnx_ir", "torch._export.non_strict_utils")]
        self.levels = [lg.level for lg in self.loggers]
        for lg in self.loggers:
            lg.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        for lg, level in zip(self.loggers, self.levels):
            lg.setLevel(level)


def _first_line(exc: BaseException) -> str:
    while exc.__cause__ is not None and not str(exc).strip():
        exc = exc.__cause__
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    text = str(root).strip().splitlines()
    return f"{type(root).__name__}: {text[0][:200]}" if text else type(root).__name__


# --------------------------------------------------------------------------------------------
# Step 3: down to the target opset


@dataclasses.dataclass
class Node:
    """A node to emit: op type, input names ("" for an omitted optional), attributes as
    Python values, output names."""

    op_type: str
    inputs: list
    attrs: dict
    outputs: list


def _attr_value(a: onnx.AttributeProto):
    if a.type == onnx.AttributeProto.GRAPH or a.type == onnx.AttributeProto.GRAPHS:
        raise BridgeError("control flow (If/Loop/Scan with a subgraph)")
    value = onnx.helper.get_attribute_value(a)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode() for v in value]
    return value


class _Graph:
    """The translated graph as plain Nodes, with its value types and constants known."""

    def __init__(self, proto: onnx.ModelProto):
        g = proto.graph
        self.inputs = [i.name for i in g.input]
        self.outputs = [o.name for o in g.output]
        self.types: dict[str, int] = {}
        self.shapes: dict[str, list] = {}  # dims: int, or None where not static
        for vi in [*g.input, *g.value_info, *g.output]:
            if vi.type.HasField("tensor_type"):
                self.types[vi.name] = vi.type.tensor_type.elem_type
                if vi.type.tensor_type.HasField("shape"):
                    self.shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None
                                            for d in vi.type.tensor_type.shape.dim]
        self.constants: dict[str, np.ndarray] = {}
        self.nodes: list[Node] = []
        for init in g.initializer:
            arr = onnx.numpy_helper.to_array(init)
            self.nodes.append(Node("Constant", [], {"value": arr}, [init.name]))
            self.constants[init.name] = arr
            self.types[init.name] = init.data_type
        for n in g.node:
            if n.domain not in ("", "ai.onnx"):
                raise BridgeError(f"the translation uses {n.domain}::{n.op_type}, which is not standard ONNX")
            attrs = {a.name: _attr_value(a) for a in n.attribute}
            node = Node(n.op_type, list(n.input), attrs, list(n.output))
            if n.op_type == "Constant":
                node = Node("Constant", [], {"value": _constant_node_value(attrs)}, node.outputs)
                self.constants[n.output[0]] = node.attrs["value"]
                self.types[n.output[0]] = onnx.helper.np_dtype_to_tensor_dtype(node.attrs["value"].dtype)
            self.nodes.append(node)


def _constant_node_value(attrs: dict) -> np.ndarray:
    # Constant's value_float/value_ints/... forms need opset 12: keep one form, a tensor.
    (name, value), = attrs.items()
    if name == "value":
        return np.asarray(value)
    dtype = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
             "value_ints": np.int64}.get(name)
    if dtype is None:
        raise BridgeError(f"a Constant with {name}")
    return np.asarray(value, dtype=dtype)


def _schema(op_type: str, opset: int) -> Optional[onnx.defs.OpSchema]:
    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


@functools.lru_cache(maxsize=None)
def _first_opset(op_type: str) -> Optional[int]:
    for opset in range(1, onnx.defs.onnx_opset_version() + 1):
        if _schema(op_type, opset) is not None:
            return opset
    return None


def _type_allowed(schema: onnx.defs.OpSchema, index: int, elem_type: Optional[int], outputs=False) -> bool:
    formals = schema.outputs if outputs else schema.inputs
    if not formals:
        return True
    formal = formals[min(index, len(formals) - 1)]
    if elem_type is None or elem_type not in _ONNX_TYPE_STR:
        return True  # unknown here: ORT's own check still applies
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}.get(formal.type_str)
    if allowed is None:  # a fixed type, e.g. tensor(int64)
        return formal.type_str == _ONNX_TYPE_STR[elem_type]
    return _ONNX_TYPE_STR[elem_type] in allowed


class _Downgrade:
    """Rewrites the opset-18 nodes for ``opset``; each rewrite keeps the values bit for bit."""

    def __init__(self, graph: _Graph, opset: int, op_name: str):
        self.g = graph
        self.opset = opset
        self.op_name = op_name
        self.out: list[Node] = []
        self.fresh = 0

    def new_name(self) -> str:
        self.fresh += 1
        return f"__bridge_{self.fresh}"

    def constant(self, arr: np.ndarray) -> str:
        name = self.new_name()
        self.g.constants[name] = arr
        self.g.types[name] = onnx.helper.np_dtype_to_tensor_dtype(arr.dtype)
        self.out.append(Node("Constant", [], {"value": arr}, [name]))
        return name

    def const_input(self, node: Node, index: int) -> Optional[np.ndarray]:
        if index >= len(node.inputs) or not node.inputs[index]:
            return None
        name = node.inputs[index]
        if name not in self.g.constants:
            raise BridgeError(f"{node.op_type} at opset {self.opset} takes its input {index} as an attribute, "
                              "and the translation computes it at run time")
        return self.g.constants[name]

    def refuse(self, node: Node, why: str):
        raise BridgeError(f"{self.op_name} at opset {self.opset}: its ONNX translation uses {node.op_type}, "
                          f"{why}")

    def run(self) -> list[Node]:
        for node in self.g.nodes:
            self.convert(node)
        if self.opset < 11:
            for node in self.out:
                self.non_negative_axes(node)
        return self.out

    def non_negative_axes(self, node: Node) -> None:
        # Negative axis/axes attributes are ONNX from opset 11 on; below, count from the front.
        for attr in ("axis", "axes"):
            value = node.attrs.get(attr)
            values = value if isinstance(value, list) else [value]
            if value is None or all(v >= 0 for v in values):
                continue
            shape = self.g.shapes.get(node.outputs[0] if node.op_type == "Unsqueeze" else node.inputs[0])
            if shape is None:
                self.refuse(node, f"with a negative {attr} on a tensor of unknown rank, which needs opset 11")
            fixed = [v % len(shape) for v in values]
            node.attrs[attr] = fixed if isinstance(value, list) else fixed[0]

    def convert(self, node: Node) -> None:
        if node.op_type == "Constant":
            self.out.append(node)
            return
        source = _schema(node.op_type, SOURCE_OPSET)
        target = _schema(node.op_type, self.opset)
        adapter = _ADAPTERS.get(node.op_type)
        if adapter is not None and target is not None and source is not None \
                and target.since_version != source.since_version and adapter(self, node, target):
            return
        if target is None:
            adapter_for_missing = _MISSING_ADAPTERS.get(node.op_type)
            if adapter_for_missing is not None and adapter_for_missing(self, node):
                return
            first = _first_opset(node.op_type)
            self.refuse(node, f"which ONNX has from opset {first} on" if first else "which ONNX does not have")
        if source is not None and target.since_version != source.since_version:
            self.check_compatible(node, source, target)
        self.out.append(node)

    def check_compatible(self, node: Node, source, target) -> None:
        # The op exists at the target opset in another version. Same form (inputs, attributes)
        # and types the older version accepts -> same meaning (ONNX versions its ops when
        # either changes); anything else is refused.
        variadic = any(f.option == onnx.defs.OpSchema.FormalParameterOption.Variadic for f in target.inputs)
        max_inputs = 10**6 if variadic else len(target.inputs)
        if len(node.inputs) > max_inputs:
            self.refuse(node, f"whose opset-{target.since_version} version takes at most {max_inputs} inputs")
        for name in list(node.attrs):
            if name not in target.attributes:
                default = source.attributes[name].default_value if name in source.attributes else None
                if default is not None and default.name and _attr_value(default) == node.attrs[name]:
                    del node.attrs[name]  # the default, which is what the older version does
                    continue
                self.refuse(node, f"whose opset-{target.since_version} version has no attribute '{name}'")
        for i, name in enumerate(node.inputs):
            if name and not _type_allowed(target, i, self.g.types.get(name)):
                elem = onnx.TensorProto.DataType.Name(self.g.types[name]).lower()
                self.refuse(node, f"whose opset-{target.since_version} version does not take {elem}")
        for i, name in enumerate(node.outputs):
            if name and not _type_allowed(target, i, self.g.types.get(name), outputs=True):
                elem = onnx.TensorProto.DataType.Name(self.g.types[name]).lower()
                self.refuse(node, f"whose opset-{target.since_version} version does not give {elem}")


def _axes_to_attribute(index: int, attr: str = "axes"):
    """ReduceX (axes input since 13/18), Squeeze/Unsqueeze (13): a constant input back to the
    attribute of the older version."""

    def adapt(d: _Downgrade, node: Node, target) -> bool:
        if attr in target.attributes and (len(target.inputs) <= index):
            value = d.const_input(node, index)
            attrs = dict(node.attrs)
            if value is not None:
                attrs[attr] = [int(v) for v in np.asarray(value).reshape(-1)]
            elif attrs.get("noop_with_empty_axes"):
                d.refuse(node, "with noop_with_empty_axes, which older versions lack")
            attrs.pop("noop_with_empty_axes", None)
            d.check_compatible(Node(node.op_type, node.inputs[:index], attrs, node.outputs),
                               _schema(node.op_type, SOURCE_OPSET), target)
            d.out.append(Node(node.op_type, node.inputs[:index], attrs, node.outputs))
            return True
        return False

    return adapt


def _split(d: _Downgrade, node: Node, target) -> bool:
    if "num_outputs" in node.attrs:
        d.refuse(node, "with num_outputs, which needs opset 18")
    attrs = dict(node.attrs)
    if "split" in target.attributes:  # opset < 13: sizes as an attribute
        sizes = d.const_input(node, 1)
        if sizes is not None:
            attrs["split"] = [int(v) for v in sizes.reshape(-1)]
        d.out.append(Node("Split", node.inputs[:1], attrs, node.outputs))
        return True
    d.out.append(node)
    return True


def _cast_like(d: _Downgrade, node: Node) -> bool:
    # CastLike (opset 15) with a known target type is Cast.
    to = d.g.types.get(node.inputs[1])
    if to is None:
        d.refuse(node, "whose target type is not known")
    d.out.append(Node("Cast", node.inputs[:1], {"to": to}, node.outputs))
    return True


def _compare_or_equal(strict: str):
    # GreaterOrEqual/LessOrEqual (opset 12): Or(Greater, Equal) is false for NaN, like them.
    # (Where the old Equal does not take the type, the validity check refuses the graph.)
    def adapt(d: _Downgrade, node: Node) -> bool:
        a, b = d.new_name(), d.new_name()
        d.out.append(Node(strict, node.inputs, {}, [a]))
        d.out.append(Node("Equal", node.inputs, {}, [b]))
        d.out.append(Node("Or", [a, b], {}, node.outputs))
        return True

    return adapt


def _shape(d: _Downgrade, node: Node, target) -> bool:
    # Shape's start/end (opset 15) -> Shape then Slice.
    if not node.attrs:
        d.out.append(node)
        return True
    full = d.new_name()
    d.out.append(Node("Shape", node.inputs, {}, [full]))
    start, end = node.attrs.get("start", 0), node.attrs.get("end", 2**62)
    _emit_slice(d, full, [start], [end], [0], node.outputs)
    return True


def _emit_slice(d: _Downgrade, data: str, starts, ends, axes, outputs) -> None:
    if d.opset >= 10:
        inputs = [data] + [d.constant(np.asarray(v, dtype=np.int64)) for v in (starts, ends, axes)]
        d.out.append(Node("Slice", inputs, {}, outputs))
    else:
        d.out.append(Node("Slice", [data], {"starts": starts, "ends": ends, "axes": axes}, outputs))


def _slice(d: _Downgrade, node: Node, target) -> bool:
    if d.opset >= 10:
        return False  # the input form: compatible checks apply
    starts, ends = d.const_input(node, 1), d.const_input(node, 2)
    axes, steps = d.const_input(node, 3), d.const_input(node, 4)
    if steps is not None and np.any(steps != 1):
        d.refuse(node, "with steps, which needs opset 10")
    axes = list(range(len(starts))) if axes is None else axes.tolist()
    _emit_slice(d, node.inputs[0], starts.tolist(), ends.tolist(), axes, node.outputs)
    return True


def _pow(d: _Downgrade, node: Node, target) -> bool:
    # Pow before opset 12 wants the exponent in the base's type: cast it (the exponents
    # torchlib writes as int64 are small whole numbers, exact in any float type).
    base, exponent = (d.g.types.get(n) for n in node.inputs[:2])
    if base is None or exponent is None or base == exponent:
        return False
    cast = d.new_name()
    d.out.append(Node("Cast", [node.inputs[1]], {"to": base}, [cast]))
    d.g.types[cast] = base
    fixed = Node("Pow", [node.inputs[0], cast], node.attrs, node.outputs)
    d.check_compatible(fixed, _schema("Pow", SOURCE_OPSET), target)
    d.out.append(fixed)
    return True


def _reshape(d: _Downgrade, node: Node, target) -> bool:
    # torchlib writes allowzero=1 (opset 14). It only matters when the shape holds a 0: then
    # allowzero=1 means "size 0", the old Reshape "copy the input's dim". A constant shape
    # without 0 is the same either way; a computed one holds 0 only for an empty tensor, where
    # TorchScript's own Reshape rules behave the same way as this.
    shape = d.g.constants.get(node.inputs[1])
    if node.attrs.get("allowzero") and shape is not None and (shape == 0).any():
        d.refuse(node, "with allowzero=1 and a 0 in its shape, which needs opset 14")
    fixed = Node("Reshape", node.inputs, {k: v for k, v in node.attrs.items() if k != "allowzero"}, node.outputs)
    d.check_compatible(fixed, _schema("Reshape", SOURCE_OPSET), target)
    d.out.append(fixed)
    return True


def _max_min(greater: str):
    # Max/Min take integers from opset 12 on. Below, for integers (no NaN to propagate),
    # Where(a > b, a, b) is the same, pairwise.
    def adapt(d: _Downgrade, node: Node, target) -> bool:
        if all(_type_allowed(target, 0, d.g.types.get(i)) for i in node.inputs):
            return False
        result = node.inputs[0]
        for i, other in enumerate(node.inputs[1:], 2):
            cond = d.new_name()
            d.out.append(Node(greater, [result, other], {}, [cond]))
            out = node.outputs[0] if i == len(node.inputs) else d.new_name()
            d.out.append(Node("Where", [cond, result, other], {}, [out]))
            result = out
        if len(node.inputs) == 1:
            d.out.append(Node("Identity", node.inputs, {}, node.outputs))
        return True

    return adapt


def _softmax(d: _Downgrade, node: Node, target) -> bool:
    # Before opset 13, Softmax/LogSoftmax/Hardmax flatten the input to 2-D at `axis` and
    # normalise over everything after it: the same as opset 13 only for the last axis. Any
    # other axis is swapped to the end and back.
    shape = d.g.shapes.get(node.inputs[0])
    rank = None if shape is None else len(shape)
    if rank is None:
        d.refuse(node, f"whose opset-{target.since_version} version flattens the input, and its rank is not known")
    axis = node.attrs.get("axis", -1) % rank
    attrs = {**node.attrs, "axis": rank - 1}
    if axis == rank - 1:
        d.out.append(Node(node.op_type, node.inputs, attrs, node.outputs))
        return True
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    swapped, normalised = d.new_name(), d.new_name()
    d.out.append(Node("Transpose", node.inputs, {"perm": perm}, [swapped]))
    d.out.append(Node(node.op_type, [swapped], attrs, [normalised]))
    d.out.append(Node("Transpose", [normalised], {"perm": perm}, node.outputs))
    return True


def _quantize_linear(d: _Downgrade, node: Node, target) -> bool:
    # Before opset 13 (Quantize|Dequantize)Linear is per-tensor only and has no `axis`: dropping
    # axis as a default would silently apply a per-channel scale the wrong way. Scalars only.
    if target.since_version >= 13:
        return False
    for i in node.inputs[1:3]:
        shape = d.g.shapes.get(i) if i else []
        if shape is None or any(s != 1 for s in shape):
            d.refuse(node, f"per channel, which its opset-{target.since_version} version cannot do (per-tensor "
                           "only until opset 13)")
    return False  # scalars: the usual compatibility checks apply


_REDUCE_18 = ("ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")
_ADAPTERS: dict[str, Callable] = {
    **{op: _axes_to_attribute(1) for op in _REDUCE_18},
    "ReduceSum": _axes_to_attribute(1),
    "Squeeze": _axes_to_attribute(1),
    "Unsqueeze": _axes_to_attribute(1),
    "Split": _split,
    "Shape": _shape,
    "Slice": _slice,
    "Pow": _pow,
    "Reshape": _reshape,
    "Max": _max_min("Greater"),
    "Min": _max_min("Less"),
    "QuantizeLinear": _quantize_linear,
    "DequantizeLinear": _quantize_linear,
    "Softmax": _softmax,
    "LogSoftmax": _softmax,
    "Hardmax": _softmax,
}


def _bitwise(logical: str):
    # Bitwise ops are opset 18. On bool tensors they are the logical ops. x & (2**k - 1) on
    # integers is x mod 2**k (floor mod, as two's complement has it): decompositions test
    # parity this way (grid_sample's reflection padding).
    def adapt(d: _Downgrade, node: Node) -> bool:
        types = [d.g.types.get(i) for i in node.inputs]
        if all(t == onnx.TensorProto.BOOL for t in types):
            d.out.append(Node(logical, node.inputs, {}, node.outputs))
            return True
        if node.op_type != "BitwiseAnd" or d.opset < 10:
            return False
        for x, mask in (node.inputs, node.inputs[::-1]):
            value = d.g.constants.get(mask)
            if value is None or value.size != 1:
                continue
            m = int(value.reshape(-1)[0])
            if m > 0 and (m & (m + 1)) == 0 and m + 1 <= np.iinfo(value.dtype).max:
                modulus = d.constant(np.asarray(m + 1, dtype=value.dtype))
                d.out.append(Node("Mod", [x, modulus], {"fmod": 0}, node.outputs))
                return True
        return False

    return adapt


_MISSING_ADAPTERS: dict[str, Callable] = {
    "BitwiseAnd": _bitwise("And"),
    "BitwiseOr": _bitwise("Or"),
    "BitwiseXor": _bitwise("Xor"),
    "CastLike": _cast_like,
    "GreaterOrEqual": _compare_or_equal("Greater"),
    "LessOrEqual": _compare_or_equal("Less"),
}


def _check_valid(graph: _Graph, nodes: list, opset: int, op_name: str) -> None:
    # The lowered nodes as an ONNX model of their own, through ONNX's type and shape inference
    # (strict) and its checker at the target opset: an adapter's slip (a type an older op does
    # not take, an attribute it lacks) is a refusal here, not an invalid model later.
    def value_info(name):
        return onnx.helper.make_tensor_value_info(name, graph.types.get(name, 0), graph.shapes.get(name))

    def attr(v):
        return onnx.numpy_helper.from_array(np.array(v, copy=True, order="C")) if isinstance(v, np.ndarray) else v

    protos = []
    for n in nodes:
        proto = onnx.helper.make_node(n.op_type, n.inputs, n.outputs,
                                      **{k: attr(v) for k, v in n.attrs.items() if not (isinstance(v, list) and not v)})
        for k, v in n.attrs.items():
            if isinstance(v, list) and not v:  # an empty list has no element to tell its type: ints
                proto.attribute.append(onnx.helper.make_attribute(k, [], attr_type=onnx.AttributeProto.INTS))
        protos.append(proto)
    model = onnx.helper.make_model(
        onnx.helper.make_graph(protos, "bridged", [value_info(i) for i in graph.inputs],
                               [value_info(o) for o in graph.outputs]),
        opset_imports=[onnx.helper.make_opsetid("", opset)])
    for output in model.graph.output:
        output.type.tensor_type.shape.SetInParent()  # the checker wants a shape field; values unchecked
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BridgeError(f"{op_name} at opset {opset}: the lowered graph is not valid ONNX there ({first})") from None


@functools.lru_cache(maxsize=1024)
def lowered(call: Call, opset: int) -> tuple:
    """``(inputs, nodes, outputs, types)`` of ``call`` at ``opset``; BridgeError if ONNX cannot
    express it. ``types``: value name -> (ONNX elem type, dims) where inferred."""
    first_error = None
    # torchlib's direct translation first (fewest nodes); where it needs an ONNX op newer than
    # the opset, the other forms in turn. The error reported is the direct form's: it names
    # the ONNX op that is too new.
    for form in Form:
        try:
            graph = _Graph(translate(call, form))
            nodes = _Downgrade(graph, opset, call.overload).run()
            _check_valid(graph, nodes, opset, call.overload)
            types = {n: (t, graph.shapes.get(n)) for n, t in graph.types.items()}
            return graph.inputs, nodes, graph.outputs, types
        except BridgeError as exc:
            if not str(exc).startswith(call.overload):
                exc = BridgeError(f"{call.overload} at opset {opset}: {exc}")
            if first_error is None:
                first_error = exc
            if form == Form.LOWERING and call.name in lowerings.LOWERINGS:
                # opforge has a composition for older opsets and it failed: its reason matters.
                raise BridgeError(f"{first_error}; opforge's composition for older opsets: "
                                  f"{str(exc).removeprefix(call.overload + ': ')}") from None
    raise first_error


# --------------------------------------------------------------------------------------------
# Step 4: into the TorchScript graph


def _g_attrs(attrs: dict) -> dict:
    out = {}
    for name, v in attrs.items():
        if isinstance(v, np.ndarray):
            out[f"{name}_t"] = torch.from_numpy(np.array(v, copy=True, order="C"))  # (ascontiguousarray makes 0-d 1-d)
        elif isinstance(v, bool):
            out[f"{name}_i"] = int(v)
        elif isinstance(v, int):
            out[f"{name}_i"] = v
        elif isinstance(v, float):
            out[f"{name}_f"] = v
        elif isinstance(v, str):
            out[f"{name}_s"] = v
        elif isinstance(v, (list, tuple)):
            if all(isinstance(x, int) for x in v):
                out[f"{name}_i"] = list(v)
            elif all(isinstance(x, (int, float)) for x in v):
                out[f"{name}_f"] = [float(x) for x in v]
            elif all(isinstance(x, str) for x in v):
                out[f"{name}_s"] = list(v)
            else:
                raise BridgeError(f"attribute {name} of kind {type(v[0]).__name__} list")
        else:
            raise BridgeError(f"attribute {name} of kind {type(v).__name__}")
    return out


def emit(g, call: Call, values: Sequence) -> Any:
    """Write ``call`` into ``g`` at ``g.opset`` with ``values`` as its tensor inputs."""
    inputs, nodes, outputs, types = lowered(call, g.opset)
    env = dict(zip(inputs, values))
    for node in nodes:
        args = [env[i] if i else None for i in node.inputs]
        while args and args[-1] is None:
            args.pop()
        if any(a is None for a in args):
            from torch.onnx import symbolic_helper

            args = [a if a is not None else symbolic_helper._optional_input_placeholder_tensor(g) for a in args]
        result = g.op(node.op_type, *args, outputs=len(node.outputs), **_g_attrs(node.attrs))
        for name, v in zip(node.outputs, result if len(node.outputs) > 1 else (result,)):
            env[name] = v
            _set_type(v, types.get(name))
    results = [env[o] for o in outputs]
    return results[0] if len(results) == 1 else tuple(results)


_TORCH_DTYPES = {onnx.helper.np_dtype_to_tensor_dtype(torch.empty((), dtype=t).numpy().dtype): t
                 for t in _DTYPES.values() if t != torch.bfloat16 and not t.is_complex}


def _set_type(value, known) -> None:
    # g.op outputs are untyped; the TorchScript exporter's scalar-type pass then treats a 0-d
    # untyped value as a float scalar and casts it (nll_loss's float64 result came out float32).
    # The translated graph knows each value's type and shape: give them to TorchScript.
    if known is None or known[0] not in _TORCH_DTYPES:
        return
    dtype, dims = _TORCH_DTYPES[known[0]], known[1]
    t = value.type()
    if t.kind() != "TensorType":
        return
    t = t.with_dtype(dtype)
    if dims is not None:
        t = t.with_sizes(dims)
    value.setType(t)


def _is_complex(value) -> bool:
    t = value.type()
    if t.kind() == "TensorType":
        return t.scalarType() in _COMPLEX_SCALAR_TYPES
    if t.kind() == "ListType":  # a Tensor[] argument (its ListConstruct) or result (its ListUnpack)
        if value.node().kind() == "prim::ListConstruct":
            return any(_is_complex(v) for v in value.node().inputs())
        return any(_is_complex(v) for use in value.uses() if use.user.kind() == "prim::ListUnpack"
                   for v in use.user.outputs())
    return False


def touches_complex(node) -> bool:
    """Whether a traced node takes or gives a complex tensor (a Tensor[] of them included)."""
    return any(_is_complex(v) for v in (*node.inputs(), *node.outputs()))


def _complex_consumers(value):
    """The nodes that use a complex value, through lists and tuples built or unpacked."""
    for use in value.uses():
        user = use.user
        if user.kind() in ("prim::ListConstruct", "prim::TupleConstruct", "prim::ListUnpack", "prim::TupleUnpack"):
            for out in user.outputs():
                yield from _complex_consumers(out)
        else:
            yield user


def handles_complex(kind: str, opset: int) -> bool:
    """Whether the symbolic registered for ``kind`` at ``opset`` sends complex calls to the bridge."""
    group = rules._torch_registry().get_function_group(kind)
    fn = group.get(opset) if group is not None else None
    return fn is symbolic or getattr(fn, "opforge_complex_aware", False)


def _check_complex_consumers(node, opset: int) -> None:
    # The bridge writes a complex result as a real pair. An op that reads it with torch's rule
    # (which knows nothing of the pair) would compute a silently wrong answer: refuse first.
    op = node.kind()
    for out in node.outputs():
        if not _is_complex(out):
            continue
        for user in _complex_consumers(out):
            if user.kind() == "prim::Return":
                raise BridgeError(f"the model returns the complex result of {op}; ONNX Runtime has no complex "
                                  "tensors, and opforge carries them as real pairs only inside the model: return "
                                  "torch.view_as_real(...) (or .abs(), .real, .imag) instead")
            if not user.kind().startswith("aten::") or not handles_complex(user.kind(), opset):
                raise BridgeError(f"{user.kind()} takes the complex result of {op}; opforge carries complex "
                                  "tensors (as real pairs) only through the ops the dynamo exporter translates "
                                  f"for them, and {user.kind()} is not one at opset {opset}: convert to real "
                                  "values first (torch.view_as_real, .abs(), .real, .imag) or use dynamo=True")


def symbolic(g, *args):
    """The TorchScript symbolic of every bridged op (registered by :func:`register`)."""
    node = g.original_node
    try:
        if any(_is_complex(v) and v.node().kind() == "prim::Param" for v in node.inputs()):
            raise BridgeError("a model input is a complex tensor; ONNX Runtime has no complex tensors: pass "
                              "torch.view_as_real(z) and call torch.view_as_complex on it inside the model")
        call = call_of(node, args)
        if any(_is_complex(v) for v in node.outputs()):
            _check_complex_consumers(node, g.opset)
        result = emit(g, call, tensor_inputs(call, args))
    except BridgeError as exc:
        from torch.onnx import errors

        raise errors.SymbolicValueError(f"opforge's ATen bridge cannot export {node.kind()}: {exc}",
                                        list(node.outputs())[0]) from None
    outputs = list(node.outputs())
    if len(outputs) == 1 and outputs[0].type().kind() == "ListType":
        # A Tensor[] result (hsplit, unbind_copy, gradient, ...) is one list value in the traced
        # graph; the exporter resolves the prim::ListUnpack that follows against this list.
        return g.op("prim::ListConstruct", *(result if isinstance(result, tuple) else (result,)))
    return result


#: Inputs for which torch's own rule writes a model ONNX Runtime rejects (measured: the If
#: branches of its diagonal disagree on float64; its per-channel QuantizeLinear takes no
#: float64) or one that computes wrong values (its index_add keeps one of the rows that share
#: an index instead of adding them all, with only a Python warning): the bridge handles those
#: calls instead.
_TORCH_RULE_INVALID_FOR: dict[str, Callable] = {
    "diagonal": lambda args: rules._scalar_type(args[0]) == "Double",
    "fake_quantize_per_channel_affine": lambda args: rules._scalar_type(args[0]) == "Double",
    "index_add": lambda args: True,
}


#: Follows torch's own refusal where the bridge cannot take the call either (opforge coverage
#: reads it: torch alone cannot export such a call).
BRIDGE_REFUSED_TOO = "and opforge's ATen bridge cannot export it either"


def torch_rule_then_bridge(name: str, torch_rule: Callable) -> Callable:
    """At an opset where torch has its own rule for ``aten::<name>``: torch's rule, always first;
    the bridge only where torch's rule refuses the call's arguments (cross_entropy's
    label_smoothing, scatter_reduce's mean and include_self=False, ...), leaves an output the
    model uses unwritten (native_dropout's mask), or is known to write an invalid model."""

    @functools.wraps(torch_rule)
    def symbolic_with_bridge(g, *args, **kwargs):
        from torch.onnx import errors

        invalid = _TORCH_RULE_INVALID_FOR.get(name)
        if invalid is not None and invalid(args):
            return symbolic(g, *args)
        written = len(g.new_nodes)
        try:
            result = torch_rule(g, *args, **kwargs)
        except errors.OnnxExporterError as exc:
            _discard_nodes_since(g, written)
            try:
                return symbolic(g, *args)
            except errors.SymbolicValueError as bridge_exc:
                reason = str(bridge_exc).split("  [Caused")[0].removeprefix("opforge's ATen bridge cannot export ")
                raise errors.SymbolicValueError(f"{str(exc).split('  [Caused')[0]} ({BRIDGE_REFUSED_TOO}: {reason})",
                                                list(g.original_node.outputs())[0]) from None
        outputs = list(g.original_node.outputs())
        results = result if isinstance(result, (tuple, list)) else (result,)
        if len(outputs) > 1 and any(r is None and o.uses() for r, o in zip(results, outputs)):
            _discard_nodes_since(g, written)
            return symbolic(g, *args)
        return result

    symbolic_with_bridge.opforge_bridge_fallback = True
    return symbolic_with_bridge


def _discard_nodes_since(g, written: int) -> None:
    # Nodes torch's rule wrote before the bridge took over would stay in the model, unused.
    # (g.op records every node it adds in g.new_nodes.)
    for node in reversed(g.new_nodes[written:]):
        node.destroy()
    del g.new_nodes[written:]


#: Ops torch has TorchScript rules for that the dynamo exporter also translates for complex
#: tensors (its translations checked against torch in ONNX Runtime: tests/test_aten_bridge.py).
#: Their rules are wrapped so that a call on complex tensors goes to the bridge. Ops not listed
#: here (unsqueeze, select, exp, pow, where, ...: dynamo cannot either) refuse a complex input.
COMPLEX_CARRIERS: tuple[str, ...] = (
    "abs", "add", "sub", "mul", "div", "neg", "reciprocal", "sum", "mean", "matmul",
    "slice", "transpose", "permute", "reshape", "view", "flatten", "squeeze", "flip", "roll",
    "cat", "stack", "clone", "contiguous", "stft", "_conj", "resolve_conj", "resolve_neg",
    "t", "numpy_T", "size",
)


def _complex_size(g, rule: Callable, self, dim=None):
    # x.size(d) of a complex x, on its real pair: a negative d counts from the dim before the
    # pair's (the tracer records one aten::size per dim a model reads).
    from torch.onnx import errors, symbolic_helper

    d = None if dim is None else symbolic_helper._maybe_get_const(dim, "i")
    if not isinstance(d, int):
        raise errors.SymbolicValueError("opforge's ATen bridge: aten::size of a complex tensor needs a constant dim",
                                        list(g.original_node.outputs())[0])
    return rule(g, self, g.op("Constant", value_t=torch.tensor(d - 1 if d < 0 else d)))


def complex_to_bridge(name: str, rule: Callable) -> Callable:
    """``rule`` for real tensors; the bridge for a call that takes or gives complex ones."""

    @functools.wraps(rule)
    def symbolic_complex_aware(g, *args, **kwargs):
        if touches_complex(g.original_node):
            return _complex_size(g, rule, *args) if name == "size" else symbolic(g, *args)
        return rule(g, *args, **kwargs)

    symbolic_complex_aware.opforge_bridge_fallback = True  # rules.torch_rule() unwraps it
    symbolic_complex_aware.opforge_complex_aware = True
    return symbolic_complex_aware


def register_complex_carriers(opsets: Sequence[int]) -> None:
    """Wraps the rule of each of :data:`COMPLEX_CARRIERS` (torch's, or opforge's wrapper of it)."""
    registry = rules._torch_registry()
    for name in COMPLEX_CARRIERS:
        group = registry.get_function_group(f"aten::{name}")
        for opset in opsets:
            fn = group.get(opset) if group is not None else None
            if fn is None or fn is symbolic or getattr(fn, "opforge_complex_aware", False):
                continue
            torch.onnx.register_custom_op_symbolic(f"aten::{name}", complex_to_bridge(name, fn), opset)


def register(names: Sequence[str], opsets: Sequence[int]) -> None:
    """For ``aten::<name>`` at each opset: :func:`symbolic` where torch has no rule; where it has
    one, that rule wrapped by :func:`torch_rule_then_bridge` (torch's rule stays first)."""
    for name in names:
        for opset in opsets:
            fn = rules.torch_rule(name, opset)
            torch.onnx.register_custom_op_symbolic(
                f"aten::{name}", symbolic if fn is None else torch_rule_then_bridge(name, fn), opset)
