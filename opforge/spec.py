"""The op spec: one plain description per op, from which every other piece is derived.

An :class:`OpSpec` names the op, its torch schema (declared in C++ by
``TORCH_LIBRARY(opforge, ...)``, checked against this one at import), how each
torch argument maps onto ONNX (a tensor input, or an attribute), the custom ONNX
domain/version and the opsets each exporter supports, plus the op's few
hand-written behaviours (fake impl, autograd formulas, numpy reference, and an
optional lowering to standard ONNX).

From it the project derives, explicitly and in one place each:

* torch: fake impl + autograd registration  -> :func:`opforge.ops._registry.register_torch_op`
* TorchScript symbolic, every opset         -> :mod:`opforge.symbolics.torchscript`
* dynamo (onnxscript) translation            -> :mod:`opforge.symbolics.dynamo`
* ``onnx.defs.OpSchema`` of the custom domain -> :mod:`opforge.symbolics.onnx_schema`
* ``onnx.reference`` op implementation        -> :mod:`opforge.symbolics.reference`
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Literal, Optional, Union

#: The custom ONNX domain (and its version) of every opforge op. The ORT
#: library registers its kernels under the same name (ort_common.h: kDomain).
DOMAIN = "opforge"
DOMAIN_VERSION = 1

#: ONNX element types the kernels accept, by the names OpSchema uses.
FLOAT_TYPES = ("tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)")

#: Opsets for which the TorchScript exporter gets a registered symbolic
#: (torch 2.14's TorchScript exporter supports 9..20).
TORCHSCRIPT_OPSETS = range(9, 21)


@dataclasses.dataclass(frozen=True)
class TensorArg:
    """A torch Tensor argument that becomes an ONNX input."""

    name: str
    onnx_name: str
    doc: str = ""
    optional: bool = False


AttrKind = Literal["int", "ints", "float", "bool"]


@dataclasses.dataclass(frozen=True)
class AttrArg:
    """A torch scalar/list argument that becomes an ONNX attribute."""

    name: str
    onnx_name: str
    kind: AttrKind
    doc: str = ""


Arg = Union[TensorArg, AttrArg]


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str
    #: The TORCH_LIBRARY schema, without namespace, exactly as printed by torch.
    schema: str
    args: tuple[Arg, ...]
    #: ONNX output names (one per torch output).
    outputs: tuple[str, ...]
    doc: str
    #: Fake (meta) implementation: shapes/dtypes only, also raises on bad input.
    fake: Callable[..., Any]
    #: ``torch.library.register_autograd`` pair; also reused by the op's autograd.Function.
    setup_context: Callable[..., None]
    backward: Callable[..., Any]
    #: Numpy implementation for ``onnx.reference`` (inputs as arrays, attributes as kwargs).
    reference: Callable[..., tuple]
    #: Optional standard-ONNX lowerings: ``(g, *args) -> Value`` for TorchScript,
    #: ``(*args) -> tensor`` (onnxscript, traced) for dynamo.
    standard_torchscript: Optional[Callable[..., Any]] = None
    standard_dynamo: Optional[Callable[..., Any]] = None
    #: ONNX shape inference: ``(input shapes, attrs) -> output shapes``; a shape is a
    #: list of dims (int, symbolic name str, or None) or None for unknown rank.
    onnx_output_shapes: Optional[Callable[[list, dict], list]] = None
    #: Export as the standard-ONNX lowering by default from this opset on (e.g. 19 for
    #: DeformConv); None: custom node unless standard_onnx asks otherwise.
    standard_from_opset: Optional[int] = None
    #: Other torch ops with this op's exact schema and semantics, exported by the same
    #: rules (e.g. "torchvision::deform_conv2d").
    torch_aliases: tuple[str, ...] = ()
    #: The element types accepted (ONNX type strings) and which input's type the output has.
    onnx_types: tuple[str, ...] = FLOAT_TYPES
    domain: str = DOMAIN
    domain_version: int = DOMAIN_VERSION
    torchscript_opsets: range = TORCHSCRIPT_OPSETS

    @property
    def qualname(self) -> str:
        """``opforge::my_add``: the torch op name and the ONNX ``domain::name``."""
        return f"{self.domain}::{self.name}"

    @property
    def tensor_args(self) -> tuple[TensorArg, ...]:
        return tuple(a for a in self.args if isinstance(a, TensorArg))

    @property
    def attr_args(self) -> tuple[AttrArg, ...]:
        return tuple(a for a in self.args if isinstance(a, AttrArg))

    def signature(self, leading: tuple = ()) -> inspect.Signature:
        """The op's Python signature (torch argument names), after ``leading`` parameters.

        Exporter helpers introspect it (parse_args for names, the dynamo
        dispatcher for the ONNX signature), so generic ``*values`` rule
        functions carry the real parameter list.
        """
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        return inspect.Signature([inspect.Parameter(n, kind) for n in leading + tuple(a.name for a in self.args)])

    def split_args(self, values) -> tuple[list, dict]:
        """Splits positional torch-order values into (ONNX inputs, {onnx attr name: value});
        bool attributes become ints (ONNX has no bool attribute)."""
        if len(values) != len(self.args):
            raise TypeError(f"{self.qualname}: expected {len(self.args)} arguments, got {len(values)}")
        inputs, attrs = [], {}
        for arg, value in zip(self.args, values):
            if isinstance(arg, TensorArg):
                inputs.append(value)
            else:
                attrs[arg.onnx_name] = int(value) if arg.kind == "bool" else value
        return inputs, attrs


Dim = Union[int, str, None]


def broadcast_dims(*shapes: Optional[list]) -> Optional[list]:
    """Numpy broadcasting over possibly symbolic dims (for ONNX shape inference)."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out: list = []
    for i in range(rank):
        dims = [s[i - (rank - len(s))] for s in shapes if i - (rank - len(s)) >= 0]
        known = [d for d in dims if d != 1]
        if not known:
            out.append(1)
        elif len(set(known)) == 1:
            out.append(known[0])
        else:
            ints = {d for d in known if isinstance(d, int)}
            # One concrete size > 1 fixes the dim (a symbol must equal it or be 1).
            out.append(ints.pop() if len(ints) == 1 else None)
    return out


#: Every op, in registration order. Filled by opforge.ops.* at import.
REGISTRY: dict[str, OpSpec] = {}


def add(spec: OpSpec) -> OpSpec:
    if spec.name in REGISTRY:
        raise ValueError(f"opforge: op {spec.name!r} is defined twice")
    REGISTRY[spec.name] = spec
    return spec
