"""``new-op --schema``: the torch schema parsed and checked into an :class:`OpSignature`, the one
description every generated piece is written from (:mod:`.cpp_blocks`, :mod:`.python_blocks`)."""

from __future__ import annotations

import dataclasses
import keyword
from dataclasses import dataclass
from typing import Optional

#: Element types ``--dtypes`` accepts for a tensor input: (C++ element type, torch's scalar type in
#: the stable-ABI glue (opforge/torch_op.h), torch dtype). The op's float inputs need no declaration
#: (float32/64/16, bfloat16).
OWN_DTYPES = {
    "int64": ("int64_t", "opforge::ScalarType::Long", "torch.int64"),
    "int32": ("int32_t", "opforge::ScalarType::Int", "torch.int32"),
    "int16": ("int16_t", "opforge::ScalarType::Short", "torch.int16"),
    "int8": ("int8_t", "opforge::ScalarType::Char", "torch.int8"),
    "uint8": ("uint8_t", "opforge::ScalarType::Byte", "torch.uint8"),
    "bool": ("bool", "opforge::ScalarType::Bool", "torch.bool"),
}

BACKWARDS = ("python", "cpp")

_CPP_KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class
compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype
default delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline
int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public register
reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch template
this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t
while xor xor_eq""".split())
#: Names the generated code uses beside the arguments' (locals, parameters, modules, namespaces).
_GENERATED_NAMES = frozenset("""
acc alloc api args at attrs begin c10 compute core ctx dtype end err F grads i info inputs kOp m np op
opforge ort ort_glue output output_shape outputs parallel_for placeholder_scale result scaled self shapes std T
tag torch torch_glue widened""".split())


@dataclass(frozen=True)
class SchemaArg:
    """One argument of the schema: a tensor (``kind="tensor"``) or an attribute (an
    :class:`opforge.AttrArg` kind: int, ints, float, bool)."""

    name: str
    kind: str
    #: ``Tensor?``: may be None in torch and omitted in ONNX.
    optional: bool = False
    #: A tensor's own element type (``--dtypes``), None for the op's float type.
    dtype: Optional[str] = None
    #: The schema's default as a Python literal, None if it has none.
    default: Optional[str] = None
    #: A float tensor without a gradient (``--no-grad``): ``TensorArg(differentiable=False)``.
    no_grad: bool = False

    @property
    def is_tensor(self) -> bool:
        return self.kind == "tensor"

    @property
    def is_float_tensor(self) -> bool:
        """A tensor of the op's own float type (the outputs' type)."""
        return self.is_tensor and self.dtype is None

    @property
    def declaration(self) -> str:
        """The argument as a schema declares it, without default (``Tensor? w``, ``int[] sizes``)."""
        types = {"int": "int", "ints": "int[]", "float": "float", "floats": "float[]", "bool": "bool"}
        return f"{'Tensor?' if self.optional else 'Tensor'} {self.name}" if self.is_tensor else \
            f"{types[self.kind]} {self.name}"

    @property
    def description(self) -> str:
        """What the argument is, in words (docs, comments)."""
        if self.is_tensor:
            what = f"{self.dtype} tensor" if self.dtype else "float tensor"
            what += ", optional" if self.optional else ""
            return what + (", no gradient (--no-grad)" if self.no_grad else "")
        return {"int": "int attribute", "ints": "int list attribute", "float": "float attribute, float32 in ONNX",
                "floats": "float list attribute, float32 values in ONNX", "bool": "bool attribute, an int 0/1 in ONNX"}[self.kind]


@dataclass(frozen=True)
class OpSignature:
    """What ``new-op --schema`` generates from: the op's name, its schema as torch prints it,
    its arguments, its outputs' names and where its backward lives."""

    name: str
    schema: str
    args: tuple
    outputs: tuple
    backward: str = "python"

    @property
    def tensors(self) -> tuple:
        return tuple(a for a in self.args if a.is_tensor)

    @property
    def attrs(self) -> tuple:
        return tuple(a for a in self.args if not a.is_tensor)

    @property
    def float_tensors(self) -> tuple:
        return tuple(a for a in self.args if a.is_float_tensor)

    @property
    def primary(self) -> SchemaArg:
        """The placeholder's input: the first of :attr:`grad_inputs` (every output is shaped like it)."""
        return self.grad_inputs[0]

    @property
    def grad_inputs(self) -> tuple:
        """The inputs with a gradient: the required float tensors but those given to ``--no-grad``."""
        return tuple(a for a in self.args if a.is_float_tensor and not a.optional and not a.no_grad)

    @property
    def no_grad(self) -> tuple:
        """The names given to ``--no-grad``: float tensors without a gradient."""
        return tuple(a.name for a in self.args if a.no_grad)

    @property
    def float_attrs(self) -> tuple:
        return tuple(a for a in self.args if a.kind == "float")

    @property
    def backward_schema(self) -> str:
        """The C++ backward op's schema (``--backward cpp``): the outputs' gradients, then the
        forward's arguments; returns the gradient of each of :attr:`grad_inputs`."""
        grads = ", ".join(f"Tensor grad_{o}" for o in self.outputs)
        forward = ", ".join(a.declaration for a in self.args)
        n = len(self.grad_inputs)
        returns = "Tensor" if n == 1 else "(" + ", ".join(["Tensor"] * n) + ")"
        return f"_{self.name}_backward({grads}, {forward}) -> {returns}"

    def trailing_optional(self, arg: SchemaArg) -> bool:
        """Whether only optional tensors follow ``arg`` among the tensor inputs: then ONNX Runtime can
        run the op with it left out (the kernel reads inputs by position)."""
        tensors = self.tensors
        return all(t.optional for t in tensors[tensors.index(arg):])


def _schema_error(schema: str, why: str) -> ValueError:
    return ValueError(f"opforge new-op: --schema {schema!r}: {why}")


def parse_names(values) -> tuple:
    """``--no-grad`` values (names, comma-separated or repeated) -> the names, each once, in order."""
    out: list = []
    for value in [values] if isinstance(values, str) else values or ():
        for item in str(value).split(","):
            if item.strip() and item.strip() not in out:
                out.append(item.strip())
    return tuple(out)


def parse_dtypes(values) -> dict:
    """``--dtypes`` values (each ``name=dtype``, comma-separated or repeated) -> {name: dtype}."""
    out: dict = {}
    for value in values or ():
        for item in str(value).split(","):
            item = item.strip()
            if not item:
                continue
            name, sep, dtype = (part.strip() for part in item.partition("="))
            if not sep or not name or not dtype:
                raise ValueError(f"opforge new-op: --dtypes {item!r}: expected NAME=DTYPE, e.g. index=int64")
            if name in out and out[name] != dtype:
                raise ValueError(f"opforge new-op: --dtypes gives {name!r} twice ({out[name]} and {dtype})")
            out[name] = dtype
    return out


def parse_schema(name: str, schema: str, dtypes: Optional[dict] = None, *, backward: str = "python",
                 package: Optional[str] = None, no_grad=()) -> OpSignature:
    """The :class:`OpSignature` of ``schema`` (a torch schema such as ``NAME(Tensor x, Tensor index,
    float alpha) -> Tensor``), checked for what the generated package supports; ``dtypes``: element
    types of tensor inputs that are not the op's float type (``{"index": "int64"}``); ``no_grad``:
    names of float tensor inputs without a gradient (``--no-grad``)."""
    import torch

    dtypes = dict(dtypes or {})
    if backward not in BACKWARDS:
        raise ValueError(f"opforge new-op: --backward must be one of {', '.join(BACKWARDS)}, got {backward!r}")
    text = schema.strip()
    head, paren, rest = text.partition("(")
    if package and head.strip().startswith(f"{package}::"):
        text = head.strip()[len(package) + 2:] + paren + rest  # the namespace is the package's: drop it
    try:
        parsed = torch._C.parse_schema(text)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _schema_error(schema, f"not a torch schema ({first})") from None
    if "::" in parsed.name:
        raise _schema_error(schema, f"give the op without namespace ({name}(...) -> ...): the namespace is the "
                                    "package")
    if parsed.name != name or parsed.overload_name:
        raise _schema_error(schema, f"the schema must declare the op {name!r} (no overload name), "
                                    f"e.g. \"{name}(Tensor x, float alpha) -> Tensor\"")
    if "SymInt" in text:
        raise _schema_error(schema, "SymInt arguments are not supported; declare them int (int[])")
    supported = "supported: Tensor, Tensor?, int, float, bool, int[], float[]"
    args = []
    for arg in parsed.arguments:
        where = f"argument {arg.name!r}"
        if arg.kwarg_only:
            raise _schema_error(schema, f"{where} is keyword-only ('*'): opforge ops take every argument positionally")
        if arg.alias_info is not None:
            raise _schema_error(schema, f"{where} has an alias annotation (in-place or view ops are not supported)")
        t = arg.type
        default = None if arg.default_value is None else repr(arg.default_value)
        if isinstance(t, torch.TensorType):
            args.append(SchemaArg(arg.name, "tensor", default=default))
        elif isinstance(t, torch.OptionalType) and isinstance(t.getElementType(), torch.TensorType):
            args.append(SchemaArg(arg.name, "tensor", optional=True, default="None"))
        elif isinstance(t, (torch.IntType, torch.FloatType, torch.BoolType)):
            kind = {torch.IntType: "int", torch.FloatType: "float", torch.BoolType: "bool"}[type(t)]
            args.append(SchemaArg(arg.name, kind, default=default))
        elif isinstance(t, torch.ListType) and isinstance(t.getElementType(), torch.IntType):
            args.append(SchemaArg(arg.name, "ints", default=default))
        elif isinstance(t, torch.ListType) and isinstance(t.getElementType(), torch.FloatType):
            args.append(SchemaArg(arg.name, "floats", default=default))
        else:
            raise _schema_error(schema, f"{where} has type {t}; {supported}")
    if not parsed.returns:
        raise _schema_error(schema, "the op must return at least one Tensor")
    outputs = []
    for k, ret in enumerate(parsed.returns):
        if not isinstance(ret.type, torch.TensorType) or ret.alias_info is not None:
            raise _schema_error(schema, f"output {k} is {ret.type}{' (aliased)' if ret.alias_info else ''}; "
                                        "outputs must be plain Tensors (-> Tensor, -> (Tensor, Tensor))")
        outputs.append(ret.name or ("out" if len(parsed.returns) == 1 else f"out{k}"))

    by_name = {a.name: a for a in args}
    for arg_name, dtype in dtypes.items():
        if arg_name not in by_name or not by_name[arg_name].is_tensor:
            tensors = [a.name for a in args if a.is_tensor]
            raise ValueError(f"opforge new-op: --dtypes {arg_name}={dtype}: {arg_name!r} is not a tensor input of "
                             f"the schema (its tensor inputs: {', '.join(tensors) or 'none'})")
        if dtype not in OWN_DTYPES:
            raise ValueError(f"opforge new-op: --dtypes {arg_name}={dtype}: the element type must be one of "
                             f"{', '.join(OWN_DTYPES)} (float tensors take the op's float types without "
                             "declaring them)")
        by_name[arg_name] = dataclasses.replace(by_name[arg_name], dtype=dtype)
    for arg_name in parse_names(no_grad):
        floats = [a.name for a in by_name.values() if a.is_float_tensor]
        if arg_name not in by_name or not by_name[arg_name].is_float_tensor:
            arg = by_name.get(arg_name)
            what = "not an argument" if arg is None else (
                f"a tensor of its own type ({arg.dtype}), which has no gradient anyway" if arg.is_tensor
                else f"an attribute ({arg.declaration})")
            raise ValueError(f"opforge new-op: --no-grad {arg_name}: {arg_name!r} is {what}; --no-grad takes float "
                             f"tensor inputs of the schema (here: {', '.join(floats)})")
        by_name[arg_name] = dataclasses.replace(by_name[arg_name], no_grad=True)
    args = [by_name[a.name] for a in args]

    names = [a.name for a in args] + outputs
    if len(set(names)) != len(names):
        raise _schema_error(schema, f"argument and output names must differ: {names}")
    derived = {f"{t.name}_in" for t in args if t.is_tensor} | {f"grad_{n}" for n in outputs} | \
        {f"grad_{a.name}" for a in args if a.is_float_tensor} | {f"grad_{n}_in" for n in outputs}
    for n in names:
        if keyword.iskeyword(n) or n in _CPP_KEYWORDS or n in _GENERATED_NAMES or n in derived or n.startswith("_"):
            raise _schema_error(schema, f"the name {n!r} would clash with Python, C++ or the generated code; "
                                        "rename it")
    sig = OpSignature(name, str(parsed), tuple(args), tuple(outputs), backward)
    if not any(a.is_float_tensor and not a.optional for a in args):
        raise _schema_error(schema, "the op needs a required float Tensor input (the outputs take its element type); "
                                    "declare index inputs with --dtypes NAME=int64")
    if not sig.grad_inputs:
        required = [a.name for a in args if a.is_float_tensor and not a.optional]
        raise ValueError(f"opforge new-op: --no-grad {','.join(sig.no_grad)}: that leaves no float input with a "
                         f"gradient (the required ones: {', '.join(required)}); keep at least one differentiable "
                         "(new-op --schema writes a differentiable op)")
    return sig
