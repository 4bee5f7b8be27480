"""The op spec: one plain description per op, from which every other piece is derived.

An :class:`OpSpec` names the op, its torch schema (declared in C++ by
``TORCH_LIBRARY(opforge, ...)``, checked against this one at import), how each
torch argument maps onto ONNX (a tensor input, or an attribute), the custom ONNX
domain/version and the opsets each exporter supports, plus the op's few
hand-written behaviours (fake impl, autograd formulas, numpy reference, and an
optional lowering to standard ONNX).

From it the project derives, explicitly and in one place each:

* torch: fake impl + autograd registration  -> :func:`opforge.register_op`
* TorchScript symbolic, every opset         -> :mod:`opforge.symbolics.torchscript`
* dynamo (onnxscript) translation            -> :mod:`opforge.symbolics.dynamo`
* ``onnx.defs.OpSchema`` of the custom domain -> :mod:`opforge.symbolics.onnx_schema`
* ``onnx.reference`` op implementation        -> :mod:`opforge.symbolics.reference`
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any, Callable, Literal, Optional, Union

#: The torch namespace and custom ONNX domain (and its version) of opforge's own
#: ops. libopforge_ort registers its kernels under the same domain name.
DOMAIN = "opforge"
#: The domain of ATen nodes (the TorchScript exporter's ATen fallback), served by libopforge_aten.
ATEN_DOMAIN = "org.pytorch.aten"
DOMAIN_VERSION = 1

#: ONNX element types the kernels accept, by the names OpSchema uses.
FLOAT_TYPES = ("tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)")

#: Opsets for which the TorchScript exporter gets a registered symbolic
#: (torch 2.14's TorchScript exporter supports 9..20).
TORCHSCRIPT_OPSETS = range(9, 21)


#: Element-type names for :class:`TensorArg` ``dtypes`` (torch's names) -> ONNX type strings.
#: The one table of the tensor element types opforge handles: torch dtype name (also numpy's,
#: but for bfloat16, which numpy lacks), ONNX type string, and ONNX element type (the value of
#: onnx.TensorProto.<NAME>, stable in the ONNX spec, written here so this module needs no onnx).
#: Every other dtype mapping in opforge is derived from it.
ELEMENT_TYPES = (
    ("float32", "tensor(float)", 1), ("float64", "tensor(double)", 11), ("float16", "tensor(float16)", 10),
    ("bfloat16", "tensor(bfloat16)", 16), ("int64", "tensor(int64)", 7), ("int32", "tensor(int32)", 6),
    ("int16", "tensor(int16)", 5), ("int8", "tensor(int8)", 3), ("uint8", "tensor(uint8)", 2),
    ("bool", "tensor(bool)", 9),
)
#: torch dtype name -> ONNX type string.
ONNX_TYPE_OF = {name: onnx_type for name, onnx_type, _ in ELEMENT_TYPES}
#: ONNX type string -> torch dtype name (``getattr(torch, name)``), the inverse of ONNX_TYPE_OF.
DTYPE_NAME_OF = {onnx_type: name for name, onnx_type in ONNX_TYPE_OF.items()}
#: ONNX type string -> ONNX element type (onnx.TensorProto.FLOAT, ...).
ELEM_TYPE_OF = {onnx_type: elem for _, onnx_type, elem in ELEMENT_TYPES}
#: ONNX element type -> torch dtype name.
DTYPE_NAME_OF_ELEM = {elem: name for name, _, elem in ELEMENT_TYPES}


@dataclasses.dataclass(frozen=True)
class TensorArg:
    """A torch Tensor argument that becomes an ONNX input (named ``onnx_name``, default ``name``).

    ``dtypes``: the element types this input takes, by torch's names (``("int64",)`` for an
    index tensor; keys of :data:`ONNX_TYPE_OF`), when they are not the op's own float types.
    Default (None): one of the spec's ``onnx_types``, the same type as every other such input
    and as the outputs. Inputs declaring the same ``dtypes`` share one ONNX type variable;
    check_op does not cast them to the dtype it sweeps.

    An output is declared the same way in ``OpSpec.outputs`` when its type is not the op's own:
    ``TensorArg("indices", dtypes=("int64",))``. It shares the type variable of the inputs that
    declare the same ``dtypes`` (and takes their type), or gets its own.

    ``differentiable=False``: a float input the op has no gradient for (roi_align_rotated's rois):
    its backward returns None there, and check_op's gradcheck and opcheck leave it out."""

    name: str
    onnx_name: Optional[str] = None
    doc: str = ""
    optional: bool = False
    dtypes: Optional[tuple[str, ...]] = None
    differentiable: bool = True

    def __post_init__(self) -> None:
        if self.onnx_name is None:
            object.__setattr__(self, "onnx_name", self.name)
        if self.dtypes is not None:
            dtypes = (self.dtypes,) if isinstance(self.dtypes, str) else tuple(self.dtypes)
            unknown = [d for d in dtypes if d not in ONNX_TYPE_OF]
            if unknown or not dtypes:
                raise ValueError(f"TensorArg {self.name!r}: dtypes {list(dtypes)}: each must be one of "
                                 f"{sorted(ONNX_TYPE_OF)}")
            object.__setattr__(self, "dtypes", dtypes)

    @property
    def own_types(self) -> bool:
        """Whether the input declares its own element types (``dtypes``) rather than the op's."""
        return self.dtypes is not None


AttrKind = Literal["int", "ints", "float", "floats", "bool"]
ATTR_KINDS = ("int", "ints", "float", "floats", "bool")


@dataclasses.dataclass(frozen=True)
class AttrArg:
    """A torch scalar/list argument that becomes an ONNX attribute (``onnx_name``, default ``name``).

    ``kind``: ``int`` (torch ``int``), ``ints`` (``int[]``), ``float`` (``float``; ONNX stores
    it as float32, so kernels should compute with the float32 value: opforge's glue hands
    them a C++ ``float``), ``floats`` (``float[]``, float32 values likewise) or ``bool`` (an
    int attribute 0/1 in ONNX).
    """

    name: str
    onnx_name: Optional[str] = None
    kind: Optional[AttrKind] = None
    doc: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ATTR_KINDS:
            raise ValueError(f"AttrArg {self.name!r}: kind must be one of {ATTR_KINDS}, got {self.kind!r}")
        if self.onnx_name is None:
            object.__setattr__(self, "onnx_name", self.name)


Arg = Union[TensorArg, AttrArg]


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """Everything opforge needs to know about one op; :func:`opforge.register_op` derives
    the torch registrations and both exporters' rules from it.

    ``namespace`` is the torch library namespace (``TORCH_LIBRARY(namespace, m)``, so
    ``torch.ops.<namespace>.<name>``) and ``domain`` the custom ONNX domain of the node and
    of its ORT kernel. Either defaults to the other; a domain that is no Python identifier
    (``com.example``, ``ai.onnx.contrib``) needs an explicit namespace.
    """

    name: str
    #: The TORCH_LIBRARY schema, without namespace, exactly as printed by torch.
    schema: str
    args: tuple[Arg, ...]
    #: ONNX output names (one per torch output), or ``TensorArg(name, dtypes=(...))`` for an
    #: output whose element type is not the op's own (an index output).
    outputs: tuple[Union[str, TensorArg], ...]
    doc: str
    #: Fake (meta) implementation: shapes/dtypes only, also raises on bad input.
    fake: Callable[..., Any]
    #: ``torch.library.register_autograd`` pair; also reused by the op's autograd.Function.
    #: None: the op is not differentiable.
    setup_context: Optional[Callable[..., None]] = None
    backward: Optional[Callable[..., Any]] = None
    #: Numpy implementation for ``onnx.reference`` (inputs as arrays, attributes as kwargs;
    #: float attributes arrive as float32 values, as ONNX stores them).
    reference: Optional[Callable[..., tuple]] = None
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
    #: The lowering needs at least this opset (e.g. 16 for GridSample) even when asked for;
    #: None: ``standard_from_opset``, or any opset. A ``standard_dynamo`` with a keyword-only
    #: ``opset`` parameter is told the export opset.
    standard_min_opset: Optional[int] = None
    #: Other torch ops with this op's exact schema and semantics, exported by the same
    #: rules (e.g. "torchvision::deform_conv2d").
    torch_aliases: tuple[str, ...] = ()
    #: The element types accepted (ONNX type strings) and which input's type the output has.
    onnx_types: tuple[str, ...] = FLOAT_TYPES
    #: ONNX domain of the node (and of its ORT kernel library); default: ``namespace``.
    domain: Optional[str] = None
    domain_version: int = DOMAIN_VERSION
    torchscript_opsets: range = TORCHSCRIPT_OPSETS
    #: torch namespace of the op (``torch.ops.<namespace>.<name>``); default: ``domain``.
    namespace: Optional[str] = None
    #: Other ops of ``namespace`` that only this op uses (e.g. its backward,
    #: "_deform_conv2d_backward"): never exported, exempt from the "every op has a spec" check.
    helper_ops: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        namespace, domain = self.namespace or self.domain, self.domain or self.namespace
        if namespace is None:
            raise TypeError(f"OpSpec {self.name!r}: give a torch namespace (namespace=) and/or an ONNX domain (domain=)")
        if not namespace.isidentifier():
            example = re.sub(r"\W", "_", namespace)
            raise ValueError(
                f"OpSpec {self.name!r}: torch namespace {namespace!r} is not a Python identifier; ONNX domain "
                f"{domain!r} needs an explicit namespace= (e.g. namespace={example!r})"
            )
        if not self.name.isidentifier():
            raise ValueError(f"OpSpec: op name {self.name!r} is not an identifier")
        object.__setattr__(self, "namespace", namespace)
        object.__setattr__(self, "domain", domain)
        if not self.schema.startswith(self.name + "("):
            raise ValueError(f"OpSpec {self.torch_qualname}: schema {self.schema!r} must start with '{self.name}('")
        if (self.setup_context is None) != (self.backward is None):
            raise TypeError(f"OpSpec {self.torch_qualname}: give both setup_context and backward, or neither")
        names = [a.name for a in self.args]
        if len(set(names)) != len(names):
            raise ValueError(f"OpSpec {self.torch_qualname}: duplicate argument names {names}")
        if isinstance(self.outputs, (str, TensorArg)):
            raise TypeError(f"OpSpec {self.torch_qualname}: outputs must be a tuple of names or TensorArgs, got "
                            f"{self.outputs!r}")
        inputs = {a.onnx_name for a in self.tensor_args}
        for out in self.outputs:
            if isinstance(out, TensorArg):
                if out.optional:
                    raise ValueError(f"OpSpec {self.torch_qualname}: output {out.name!r} cannot be optional")
                if out.own_types and out.onnx_name in inputs:
                    raise ValueError(f"OpSpec {self.torch_qualname}: output {out.name!r} declares dtypes and has the "
                                     "name of an input; give it another name")
            elif not isinstance(out, str):
                raise TypeError(f"OpSpec {self.torch_qualname}: output {out!r} must be a name or a TensorArg")
        if len(set(self.output_names)) != len(self.output_names):
            raise ValueError(f"OpSpec {self.torch_qualname}: duplicate output names {list(self.output_names)}")

    @property
    def torch_qualname(self) -> str:
        """``namespace::name``: the torch op (``torch.ops.namespace.name``)."""
        return f"{self.namespace}::{self.name}"

    @property
    def onnx_qualname(self) -> str:
        """``domain::name``: the ONNX node (and the registry key)."""
        return f"{self.domain}::{self.name}"

    @property
    def differentiable(self) -> bool:
        return self.backward is not None

    @property
    def qualname(self) -> str:
        """The torch op name, ``namespace::name`` (what error messages and torch.library use)."""
        return self.torch_qualname

    @property
    def tensor_args(self) -> tuple[TensorArg, ...]:
        return tuple(a for a in self.args if isinstance(a, TensorArg))

    @property
    def attr_args(self) -> tuple[AttrArg, ...]:
        return tuple(a for a in self.args if isinstance(a, AttrArg))

    @property
    def output_args(self) -> tuple[TensorArg, ...]:
        """The outputs as TensorArgs (a plain name: an output of the op's own element type)."""
        return tuple(o if isinstance(o, TensorArg) else TensorArg(o) for o in self.outputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        """The ONNX output names."""
        return tuple(o.onnx_name for o in self.output_args)

    @property
    def typed_args(self) -> tuple[TensorArg, ...]:
        """The tensor inputs of the op's own element type (``onnx_types``), which the outputs share."""
        return tuple(a for a in self.tensor_args if not a.own_types)

    def onnx_types_of(self, arg: TensorArg) -> tuple[str, ...]:
        """The ONNX type strings input ``arg`` accepts."""
        return tuple(ONNX_TYPE_OF[d] for d in arg.dtypes) if arg.own_types else self.onnx_types

    def type_variables(self) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
        """``{type variable: (ONNX types, ONNX input and output names)}``: ``T`` for the op's own
        type (its inputs and the outputs that declare no dtypes), one more per distinct ``dtypes``
        of the other inputs and outputs."""
        variables = {"T": (self.onnx_types, tuple(a.onnx_name for a in self.typed_args))}
        for arg in self.tensor_args + self.output_args:
            if not arg.own_types:
                continue
            types = self.onnx_types_of(arg)
            name = next((v for v, (t, _) in variables.items() if v != "T" and t == types), None)
            if name is None:
                name = f"T_{arg.onnx_name}"
                while name in variables:
                    name += "_"
                variables[name] = (types, (arg.onnx_name,))
            else:
                variables[name] = (types, variables[name][1] + (arg.onnx_name,))
        return variables

    def output_elem_type(self, index: int, input_types: list) -> Optional[str]:
        """Output ``index``'s ONNX type string, given the tensor inputs' (ONNX type strings, None
        where unknown or absent): an own-typed input's of the same type variable, else the
        variable's only type; None when it cannot be known."""
        out = self.output_args[index]
        variable = self.type_variable_of(out) if out.own_types else "T"
        types, names = self.type_variables()[variable]
        for arg, t in zip(self.tensor_args, input_types):
            if t is not None and arg.onnx_name in names and (arg.own_types or variable == "T"):
                return t
        return types[0] if len(types) == 1 else None

    def output_type_input(self) -> Optional[int]:
        """The position, among the tensor inputs, of the one whose element type the outputs take."""
        return next((i for i, a in enumerate(self.tensor_args) if not a.own_types), None)

    def type_variable_of(self, arg: TensorArg) -> str:
        return next(v for v, (_, names) in self.type_variables().items() if arg.onnx_name in names)

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


#: Every registered op (built-in or not) by ``domain::name``, in registration order.
#: Filled by :func:`opforge.register_op`.
REGISTRY: dict[str, OpSpec] = {}


def add(spec: OpSpec) -> OpSpec:
    """Adds ``spec`` to the registry (idempotent for the same spec); :func:`opforge.register_op`
    calls it, after the torch side checked out."""
    known = REGISTRY.get(spec.onnx_qualname)
    if known is not None and known is not spec:
        raise ValueError(f"opforge: ONNX op {spec.onnx_qualname} is defined twice (torch ops {known.torch_qualname} "
                         f"and {spec.torch_qualname}); give one of them another name or domain")
    for other in REGISTRY.values():
        if other is not spec and other.torch_qualname == spec.torch_qualname:
            raise ValueError(f"opforge: torch op {spec.torch_qualname} already has a spec (ONNX {other.onnx_qualname})")
    REGISTRY[spec.onnx_qualname] = spec
    return spec


def find(name: str) -> OpSpec:
    """The spec named ``domain::name``, ``namespace::name`` or a bare name (if unique)."""
    if name in REGISTRY:
        return REGISTRY[name]
    hits = [s for s in REGISTRY.values() if name in (s.torch_qualname, s.name)]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise KeyError(f"opforge: no op named {name!r}; known ops: {sorted(REGISTRY)}")
    raise KeyError(f"opforge: {name!r} is ambiguous: {sorted(s.onnx_qualname for s in hits)}; use domain::name")
