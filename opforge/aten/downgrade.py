"""Step 3 of the ATen bridge: an opset-18 ONNX graph brought down to a target opset.

:class:`Graph` reads the translated model (:mod:`.translation`) as plain :class:`Node` objects
with their value types, shapes and constants. :class:`Downgrade` rewrites it node by node for
the target opset: unchanged where the op's schema is the same, converted where the form changed
(``axes`` inputs back to attributes, ``CastLike`` to ``Cast``, ...), refused with the ONNX op and
opset named where ONNX cannot express it there. :func:`check_valid` holds the result to ONNX's
own type inference and checker at the target opset.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional

import numpy as np
import onnx
import onnx.numpy_helper

from ..spec import ELEM_TYPE_OF
from .errors import BridgeError

_ONNX_TYPE_STR = {elem: onnx_type for onnx_type, elem in ELEM_TYPE_OF.items()}
#: The opset torchlib writes; the graph :mod:`.translation` gives uses these schemas.
SOURCE_OPSET = 18


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


class Graph:
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


class Downgrade:
    """Rewrites the opset-18 nodes for ``opset``; each rewrite keeps the values bit for bit."""

    def __init__(self, graph: Graph, opset: int, op_name: str):
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

    def adapt(d: Downgrade, node: Node, target) -> bool:
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


def _split(d: Downgrade, node: Node, target) -> bool:
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


def _cast_like(d: Downgrade, node: Node) -> bool:
    # CastLike (opset 15) with a known target type is Cast.
    to = d.g.types.get(node.inputs[1])
    if to is None:
        d.refuse(node, "whose target type is not known")
    d.out.append(Node("Cast", node.inputs[:1], {"to": to}, node.outputs))
    return True


def _compare_or_equal(strict: str):
    # GreaterOrEqual/LessOrEqual (opset 12): Or(Greater, Equal) is false for NaN, like them.
    # (Where the old Equal does not take the type, the validity check refuses the graph.)
    def adapt(d: Downgrade, node: Node) -> bool:
        a, b = d.new_name(), d.new_name()
        d.out.append(Node(strict, node.inputs, {}, [a]))
        d.out.append(Node("Equal", node.inputs, {}, [b]))
        d.out.append(Node("Or", [a, b], {}, node.outputs))
        return True

    return adapt


def _shape(d: Downgrade, node: Node, target) -> bool:
    # Shape's start/end (opset 15) -> Shape then Slice.
    if not node.attrs:
        d.out.append(node)
        return True
    full = d.new_name()
    d.out.append(Node("Shape", node.inputs, {}, [full]))
    start, end = node.attrs.get("start", 0), node.attrs.get("end", 2**62)
    _emit_slice(d, full, [start], [end], [0], node.outputs)
    return True


def _emit_slice(d: Downgrade, data: str, starts, ends, axes, outputs) -> None:
    if d.opset >= 10:
        inputs = [data] + [d.constant(np.asarray(v, dtype=np.int64)) for v in (starts, ends, axes)]
        d.out.append(Node("Slice", inputs, {}, outputs))
    else:
        d.out.append(Node("Slice", [data], {"starts": starts, "ends": ends, "axes": axes}, outputs))


def _slice(d: Downgrade, node: Node, target) -> bool:
    if d.opset >= 10:
        return False  # the input form: compatible checks apply
    starts, ends = d.const_input(node, 1), d.const_input(node, 2)
    axes, steps = d.const_input(node, 3), d.const_input(node, 4)
    if steps is not None and np.any(steps != 1):
        d.refuse(node, "with steps, which needs opset 10")
    axes = list(range(len(starts))) if axes is None else axes.tolist()
    _emit_slice(d, node.inputs[0], starts.tolist(), ends.tolist(), axes, node.outputs)
    return True


def _pow(d: Downgrade, node: Node, target) -> bool:
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


def _reshape(d: Downgrade, node: Node, target) -> bool:
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
    def adapt(d: Downgrade, node: Node, target) -> bool:
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


def _softmax(d: Downgrade, node: Node, target) -> bool:
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


def _quantize_linear(d: Downgrade, node: Node, target) -> bool:
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
    def adapt(d: Downgrade, node: Node) -> bool:
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


def check_valid(graph: Graph, nodes: list, opset: int, op_name: str) -> None:
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
