"""``opforge new-op``: writes a standalone, installable package with one working op.

Without ``--schema`` the op is ``y = x * sigmoid(alpha * x)`` with a float attribute ``alpha`` and
its backward, complete in every piece (compute core, torch CPU/CUDA kernels, ORT CPU/CUDA-EP
kernels, spec with fake impl, autograd, numpy reference and standard-ONNX lowering, tests on
:mod:`opforge.testing`, README), so users start by editing working code. The templates live in
``opforge/templates/new_op`` (``__PKG__``/``__NAME__`` in paths and ``{{PKG}}``, ``{{NAME}}``,
``{{DOMAIN}}`` ... in text are replaced). ``--prototype`` writes the same op as a pure-Python package
instead (``opforge/templates/new_op_prototype``: spec + numpy kernel,
:func:`opforge.register_prototype`).

With ``--schema "NAME(Tensor x, Tensor index, float alpha) -> Tensor"`` the package is written for
that signature (any mix of ``Tensor``, ``Tensor?``, ``int``, ``float``, ``bool``, ``int[]``, ``float[]``
arguments, one or several Tensor outputs; ``--dtypes index=int64`` for inputs of other element
types than the op's float types): the argument list appears once, in the schema, and every other
piece (OpSpec args, checks, fake impl, torch and ORT kernels with the right C++ types, the core's
argument struct, wrapper, module, tests, benchmark) is generated from it
(``opforge/templates/new_op_schema``, over the shared files of ``new_op``). Its math is a
placeholder, stated as such everywhere: every output is the first float input times
``1 + the sum of the float attributes``. ``backward="cpp"`` (``--backward cpp``) writes the backward
as a C++ op of its own (``_NAME_backward``, in the spec's ``helper_ops``) whose autograd kernel
refuses double backward with a clear error; the default is a Python autograd formula.
"""

from __future__ import annotations

import dataclasses
import keyword
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates" / "new_op"
#: ``opforge new-op --prototype``: the same op as a spec + numpy kernel (no C++), run in ONNX
#: Runtime through onnxruntime-extensions.
PROTOTYPE_TEMPLATE_DIR = TEMPLATE_DIR.with_name("new_op_prototype")
_DOMAIN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class NewOp:
    name: str
    package: str
    domain: str
    cuda: bool

    @property
    def camel(self) -> str:
        return "".join(part[:1].upper() + part[1:] for part in self.name.split("_") if part)

    def substitutions(self) -> dict[str, str]:
        from . import __version__

        return {
            "PKG": self.package, "NAME": self.name, "NAME_UPPER": self.name.upper(), "NAME_CAMEL": self.camel,
            "DOMAIN": self.domain, "OPFORGE_VERSION": __version__.split("+")[0],
        }


def _check_identifier(kind: str, value: str) -> None:
    if not value.isidentifier() or keyword.iskeyword(value) or not value.isascii():
        raise ValueError(f"opforge new-op: {kind} {value!r} must be a Python identifier (letters, digits, _)")
    if value != value.lower():
        raise ValueError(f"opforge new-op: {kind} {value!r} should be lower case (torch op and package names are)")


def validate(name: str, package: str, domain: Optional[str]) -> NewOp:
    _check_identifier("op name", name)
    _check_identifier("package", package)
    if package in ("opforge", "torch", "onnx", "onnxruntime", "aten", "prim", "torchvision"):
        raise ValueError(f"opforge new-op: package {package!r} would clash with an existing library or namespace")
    domain = domain or package
    if not _DOMAIN_RE.match(domain):
        raise ValueError(f"opforge new-op: domain {domain!r} is not a valid ONNX domain (e.g. com.example)")
    if domain in ("", "ai.onnx", "ai.onnx.ml", "com.microsoft", "opforge", "org.pytorch.aten"):
        raise ValueError(f"opforge new-op: domain {domain!r} belongs to ONNX, ONNX Runtime or opforge; "
                         "choose your own (e.g. com.yourcompany)")
    return NewOp(name, package, domain, cuda=True)


def render(text: str, subs: dict[str, str]) -> str:
    out = text
    for key, value in subs.items():
        out = out.replace("{{" + key + "}}", value)
    leftover = re.findall(r"\{\{[A-Z_]+\}\}", out)
    if leftover:
        raise RuntimeError(f"opforge new-op: template placeholders left unreplaced: {sorted(set(leftover))}")
    return out


# ---- new-op --schema: the package generated from a torch schema ---------------------------------

#: ``opforge new-op --schema``: the op-specific files for a given signature; the other files
#: (pyproject.toml, setup.py, _ort.py, __init__.py) come from :data:`TEMPLATE_DIR`.
SCHEMA_TEMPLATE_DIR = TEMPLATE_DIR.with_name("new_op_schema")

#: Element types ``--dtypes`` accepts for a tensor input: (C++ element type, ATen scalar type,
#: torch dtype). The op's float inputs need no declaration (float32/64/16, bfloat16).
OWN_DTYPES = {
    "int64": ("int64_t", "at::kLong", "torch.int64"),
    "int32": ("int32_t", "at::kInt", "torch.int32"),
    "int16": ("int16_t", "at::kShort", "torch.int16"),
    "int8": ("int8_t", "at::kChar", "torch.int8"),
    "uint8": ("uint8_t", "at::kByte", "torch.uint8"),
    "bool": ("bool", "at::kBool", "torch.bool"),
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
            return f"{what}, optional" if self.optional else what
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
        """The placeholder's input: the first required float tensor (every output is shaped like it)."""
        return next(a for a in self.args if a.is_float_tensor and not a.optional)

    @property
    def grad_inputs(self) -> tuple:
        """The inputs with a gradient: the required float tensors."""
        return tuple(a for a in self.args if a.is_float_tensor and not a.optional)

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
                 package: Optional[str] = None) -> OpSignature:
    """The :class:`OpSignature` of ``schema`` (a torch schema such as ``NAME(Tensor x, Tensor index,
    float alpha) -> Tensor``), checked for what the generated package supports; ``dtypes``: element
    types of tensor inputs that are not the op's float type (``{"index": "int64"}``)."""
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
    return sig


# ---- the generated code's pieces, each from the signature ----------------------------------------

_CPP_ATTR = {"int": "int64_t", "ints": "std::vector<int64_t>", "float": "float", "floats": "std::vector<float>",
             "bool": "bool"}
_TORCH_ATTR = {"int": "int64_t", "ints": "at::IntArrayRef", "float": "double", "floats": "at::ArrayRef<double>",
               "bool": "bool"}
_PY_ATTR = {"int": "int", "ints": "list[int]", "float": "float", "floats": "list[float]", "bool": "bool"}


def _wrap(head: str, items, tail: str = "", indent: int = 0, width: int = 110, sep: str = ",") -> str:
    """``head + items joined by sep + " " + tail`` (a call, a signature, adjacent string literals
    with ``sep=""``), its items wrapped onto more lines when it would pass ``width`` at ``indent``
    (the first line's indent, which the caller writes): aligned after ``head``, or, when ``head``
    is long, on lines of their own indented 4 more than the first."""
    items = list(items)
    one = head + f"{sep} ".join(items) + tail
    if indent + len(one) <= width or not items:
        return one
    hanging = len(head) > 48
    column = indent + 4 if hanging else indent + len(head)
    lines, line = ([head.rstrip()], "") if hanging else ([], head)
    for k, item in enumerate(items):
        piece = item + (sep if k < len(items) - 1 else tail)
        if line in ("", head):
            line = (" " * column if line == "" else head) + piece
        elif len(line) + (0 if lines or hanging else indent) + 1 + len(piece) > width:  # the first line's indent
            lines.append(line)
            line = " " * column + piece
        else:
            line = f"{line} {piece}"
    lines.append(line)
    return "\n".join(lines)


def _literal_pieces(text: str, width: int = 60) -> list:
    """``text`` as double-quoted literals of about ``width`` characters, split after spaces (for
    adjacent string literals, which Python and C++ both join)."""
    pieces, current = [], ""
    for word in text.split(" "):
        candidate = f"{current} {word}" if current else word
        if current and len(candidate) > width:
            pieces.append(current + " ")
            current = word
        else:
            current = candidate
    pieces.append(current)
    return ['"' + p.replace("\\", "\\\\").replace('"', '\\"') + '"' for p in pieces]


def _cpp_comment(text: str, indent: int = 2, width: int = 110) -> str:
    """``text`` as C++ ``//`` comment lines at ``indent``, wrapped at ``width``."""
    import textwrap

    prefix = " " * indent + "// "
    return "\n".join(textwrap.wrap(text, width=width, initial_indent=prefix, subsequent_indent=prefix,
                                   break_long_words=False, break_on_hyphens=False))


def _placeholder_math(sig: OpSignature) -> str:
    """The placeholder, in words (docstrings, README, comments)."""
    x = sig.primary.name
    floats = " + ".join(a.name for a in sig.float_attrs)
    formula = f"{x} * (1 + {floats})" if floats else f"{x} * 1 (a copy of {x})"
    every = "every output" if len(sig.outputs) > 1 else "the output"
    unused = [a.name for a in sig.args if a is not sig.primary and a.kind != "float"]
    tail = f"; {', '.join(unused)} unused" if unused else ""
    return f"{every} = {formula}, shaped like {x}{tail}"


def _cpp_scale(sig: OpSignature) -> str:
    return " + ".join(["F(1)"] + [f"static_cast<F>(args.{a.name})" for a in sig.float_attrs])


def _core_blocks(sig: OpSignature, camel: str) -> dict:
    x = sig.primary.name
    fields = []
    for a in sig.args:
        if a.is_tensor:
            element = OWN_DTYPES[a.dtype][0] if a.dtype else "F"
            note = f"{a.declaration}" + (f": {a.dtype}" if a.dtype else "") + \
                (" (present == false when not given)" if a.optional else "")
            fields.append(f"  Input<{element}> {a.name};  // {note}")
        else:
            init = {"int": " = 0", "ints": "", "float": " = 0", "floats": "", "bool": " = false"}[a.kind]
            note = {"float": ": float32, the value ONNX stores (torch rounds its double to it)",
                    "floats": ": float32 values, as ONNX stores them (torch rounds its doubles to them)",
                    "bool": ": an int attribute 0/1 in ONNX"}.get(a.kind, "")
            fields.append(f"  {_CPP_ATTR[a.kind]} {a.name}{init};  // {a.declaration}{note}")
    shape_fields = []
    for a in sig.args:
        if a.is_tensor:
            note = a.declaration + (" (present == false when not given)" if a.optional else "")
            shape_fields.append(f"  Shape<Dim> {a.name};  // {note}")
        else:
            shape_fields.append(fields[sig.args.index(a)])
    shapes_of = [f"  in.{a.name} = {{args.{a.name}.shape, args.{a.name}.present}};" if a.is_tensor else
                 f"  in.{a.name} = args.{a.name};" for a in sig.args]
    every_shape = ", ".join([f"in.{x}.dims"] * len(sig.outputs))
    unused = [a.name for a in sig.args if a is not sig.primary and a.kind != "float"]
    unused_text = f" {', '.join(unused)} {'is' if len(unused) == 1 else 'are'} not used." if unused else ""
    floats = " + ".join(a.name for a in sig.float_attrs)
    scale_words = f"1 + {floats} (the float attributes)" if floats else "1 (there are no float attributes)"
    derivative = (f"and {sig.name}_backward below, its derivative" if sig.backward == "cpp" else
                  f"its derivative is _backward in {sig.name}.py")
    output_ptrs = "\n".join(f"  F* {o} = alloc({k}, shapes[{k}]);" for k, o in enumerate(sig.outputs))
    stores = "\n".join(f"      {o}[i] = scaled;" for o in sig.outputs)
    note = _cpp_comment(f"PLACEHOLDER: replace with the op's math. Each output is {x} * placeholder_scale, with "
                        f"placeholder_scale = {scale_words}, shaped like {x}.{unused_text}")
    forward = f"""  // The outputs' shapes, and every check of shapes and attributes: the shape rule above, which
  // torch's fake impl and ONNX shape inference run too.
  std::vector<std::vector<int64_t>> shapes;
  const std::string error = {sig.name}_output_shapes({sig.name}_shapes(args), shapes);
  if (!error.empty()) return error;
  if (shapes.size() != {len(sig.outputs)})
    return message("{sig.name}_output_shapes gave ", shapes.size(), " shape(s) for {len(sig.outputs)} output(s)");
{note}
  const F placeholder_scale = {_cpp_scale(sig)};
  const F* {x} = args.{x}.data;
{output_ptrs}
  parallel_for(args.{x}.numel(), int64_t(1) << 14, [&](int64_t begin, int64_t end) {{
    for (int64_t i = begin; i < end; ++i) {{
      const F scaled = {x}[i] * placeholder_scale;
{stores}
    }}
  }});
  return "";"""
    blocks = {
        "CORE_ARG_FIELDS": "\n".join(fields),
        "CORE_SHAPE_FIELDS": "\n".join(shape_fields),
        "CORE_SHAPES_OF_BODY": "\n".join(shapes_of),
        "CORE_RULE_OUT": f"  out = {{{every_shape}}};",
        "CORE_FORWARD_BODY": forward,
        "CORE_HEADER_NOTE": _cpp_comment(f"The function to write is {sig.name}_forward ({derivative}). Until you "
                                         f"do, it computes a PLACEHOLDER: {_placeholder_math(sig)}.", 0),
        "CORE_OUTPUT_LIST": ", ".join(f"{k}: {o}" for k, o in enumerate(sig.outputs)),
        "CORE_FORWARD_SIGNATURE": _wrap(f"std::string {sig.name}_forward(", [
            f"const {camel}Args<F>& args", "const Alloc& alloc", "const ParallelFor& parallel_for"], ") {"),
        "CORE_GRADS_STRUCT": "",
        "CORE_BACKWARD": "",
    }
    if sig.backward == "cpp":
        grads = "\n".join(f"  Input<F> {o};" for o in sig.outputs)
        blocks["CORE_GRADS_STRUCT"] = f"""
// The gradients of {sig.name}'s outputs, each shaped like its output (generated from the schema).
template <typename F>
struct {camel}Grads {{
{grads}
}};
"""
        grad_list = ", ".join(f"{k}: {a.name}" for k, a in enumerate(sig.grad_inputs))
        grad_sum = " + ".join(f"grad_{o}[i]" for o in sig.outputs)
        grad_sum = f"({grad_sum})" if len(sig.outputs) > 1 else grad_sum
        others = [a for a in sig.grad_inputs if a is not sig.primary]
        zero_words = (f" {', '.join(a.name for a in others)} {'does' if len(others) == 1 else 'do'} not enter it: "
                      "zero gradients.") if others else ""
        lines = [f"  const F placeholder_scale = {_cpp_scale(sig)};"]
        lines += [f"  const F* grad_{o} = grads.{o}.data;" for o in sig.outputs]
        lines += [f"  F* grad_{a.name} = alloc({k}, args.{a.name}.shape);" for k, a in enumerate(sig.grad_inputs)]
        lines.append(f"  parallel_for(args.{x}.numel(), int64_t(1) << 14, [&](int64_t begin, int64_t end) {{")
        lines.append(f"    for (int64_t i = begin; i < end; ++i) grad_{x}[i] = {grad_sum} * placeholder_scale;")
        lines.append("  });")
        lines += [f"  std::fill(grad_{a.name}, grad_{a.name} + args.{a.name}.numel(), F(0));" for a in others]
        body = "\n".join(lines)
        backward_note = _cpp_comment(f"PLACEHOLDER: the exact derivative of the placeholder forward: each output is "
                                     f"{x} * placeholder_scale, so grad_{x} = (the sum of the outputs' gradients) * "
                                     f"placeholder_scale.{zero_words}")
        backward_doc = "\n".join([
            _cpp_comment(f"{sig.name}'s backward (`--backward cpp`): the gradient of each float input from the "
                         "forward's arguments and the outputs' gradients. Returns \"\" or an error message, like "
                         f"{sig.name}_forward.", 0),
            _cpp_comment(f"  alloc(k, shape) -> F*: allocates the gradient of float input k ({grad_list}), which "
                         "must have that input's shape: contiguous, row-major, uninitialised (write every element).",
                         0)])
        blocks["CORE_BACKWARD"] = f"""
{backward_doc}
// The autograd formula in {sig.name}.py calls it through the op _{sig.name}_backward.
template <typename F, typename Alloc, typename ParallelFor>
{_wrap(f"std::string {sig.name}_backward(", [f"const {camel}Args<F>& args", f"const {camel}Grads<F>& grads",
                                             "const Alloc& alloc", "const ParallelFor& parallel_for"], ") {")}
{backward_note}
{body}
  return "";
}}
"""
    return blocks


def _torch_blocks(sig: OpSignature, pkg: str, camel: str) -> dict:
    x = sig.primary.name
    check_params = [f"const at::Tensor& {t.name}" for t in sig.tensors]

    def check(condition: str, *message: str) -> str:
        return "  " + _wrap("TORCH_CHECK_TYPE(", [condition, "kOp", *message], ");", indent=2)

    checks = [check(f"opforge::is_supported_float({x}.scalar_type())", f'": {x} has dtype "', f"{x}.scalar_type()",
                    '"; supported dtypes are float32, float64, float16 and bfloat16"')]
    for t in sig.tensors:
        if t is sig.primary:
            continue
        given = f"!{t.name}.defined() || " if t.optional else ""
        if t.dtype is None:
            checks.append(check(f"{given}{t.name}.scalar_type() == {x}.scalar_type()", f'": {t.name} has dtype "',
                                f"{t.name}.scalar_type()", f'" but {x} has dtype "', f"{x}.scalar_type()",
                                '"; they must match"'))
        else:
            checks.append(check(f"{given}{t.name}.scalar_type() == {OWN_DTYPES[t.dtype][1]}",
                                f'": {t.name} has dtype "', f"{t.name}.scalar_type()", f'" but must be {t.dtype}"'))
    checks.append("  " + _wrap("opforge::check_same_device(kOp, {", [f'{{"{t.name}", &{t.name}}}' for t in sig.tensors],
                               "});", indent=2))

    core_params = [f"const at::Tensor& {a.name}" if a.is_tensor else f"{_TORCH_ATTR[a.kind]} {a.name}"
                   for a in sig.args]
    def attr_lines(a, target: str) -> list:
        """The attribute as the core takes it, in ``target`` (``args``, ``in``)."""
        if a.kind == "ints":
            return [f"  {target}.{a.name} = {a.name}.vec();"]
        if a.kind == "float":
            note = ["  // ONNX stores float attributes as float32: compute with that value"] \
                if a is sig.float_attrs[0] else []
            return note + [f"  {target}.{a.name} = static_cast<float>({a.name});"]
        if a.kind == "floats":
            return [f"  {target}.{a.name}.assign({a.name}.begin(), {a.name}.end());  // each rounded to float32, "
                    "as ONNX stores it"]
        return [f"  {target}.{a.name} = {a.name};"]

    body = []
    for a in sig.args:
        if a.is_tensor:
            element = OWN_DTYPES[a.dtype][0] if a.dtype else "F"
            body.append(f"  args.{a.name} = torch_glue::input<{element}>({a.name});")
        else:
            body += attr_lines(a, "args")

    rule_params, rule_body, rule_schema = [], [], []
    for a in sig.args:
        if a.is_tensor:
            rule_params.append(f"std::optional<c10::SymIntArrayRef> {a.name}" if a.optional else
                               f"c10::SymIntArrayRef {a.name}")
            rule_body.append(f"  in.{a.name} = torch_glue::shape({a.name});")
            rule_schema.append(f"SymInt[]{'?' if a.optional else ''} {a.name}")
        else:
            rule_params.append(f"{_TORCH_ATTR[a.kind]} {a.name}")
            rule_body += attr_lines(a, "in")
            rule_schema.append(a.declaration)
    rule_op = f"_{sig.name}_output_shapes"
    rule_def = _canonical(f"{rule_op}({', '.join(rule_schema)}) -> SymInt[]")
    rule = f"""{_cpp_comment(f"{sig.name}'s shape rule (core::{sig.name}_output_shapes) as a tensor-free torch op, "
                          f"{pkg}::{rule_op}: each tensor argument is its shape, with c10::SymInt dims (symbolic "
                          "under dynamic shapes); it returns the outputs' shapes flattened, [rank0, dims0..., rank1, "
                          f"...]. The fake impl and ONNX shape inference call it (opforge.ShapeRule in {sig.name}.py), "
                          "so they check and size exactly as the kernels do.", 0)}
{_wrap(f"std::vector<c10::SymInt> {sig.name}_output_shapes(", rule_params, ") {")}
  core::{camel}Shapes<c10::SymInt> in;
{chr(10).join(rule_body)}
  std::vector<std::vector<c10::SymInt>> out;
  const std::string err = core::{sig.name}_output_shapes(in, out);
  TORCH_CHECK_VALUE(err.empty(), kOp, ": ", err);
  return torch_glue::flattened(out, {len(sig.outputs)}, kOp);
}}
"""

    def params(a):
        if a.is_tensor:
            return f"const std::optional<at::Tensor>& {a.name}" if a.optional else f"const at::Tensor& {a.name}"
        return f"{_TORCH_ATTR[a.kind]} {a.name}"

    forward_params = [params(a) for a in sig.args]
    check_call = ", ".join(f"{t.name}.value_or(at::Tensor())" if t.optional else t.name for t in sig.tensors)
    prepared = "\n".join(
        f"  const at::Tensor {t.name}_in = torch_glue::prepared({t.name}{'' if t.dtype else ', compute'});"
        for t in sig.tensors)
    core_call = _wrap("core_args<scalar_t>(", [f"{a.name}_in" if a.is_tensor else a.name for a in sig.args], "),",
                      indent=8)

    def returns(n):
        return "at::Tensor" if n == 1 else "std::tuple<" + ", ".join(["at::Tensor"] * n) + ">"

    def converted(n):
        items = [f"outputs[{k}].to(dtype)" for k in range(n)]
        return items[0] if n == 1 else "{" + ", ".join(items) + "}"

    n_out = len(sig.outputs)
    forward = f"""{_cpp_comment(f"The CPU kernel of {pkg}::{sig.name}: checks, then the core on contiguous tensors "
                             "(float ones in the compute type), the outputs converted back to the inputs' dtype.", 0)}
{_wrap(f"{returns(n_out)} {sig.name}_cpu(", forward_params, ") {")}
  check_args({check_call});
  const at::ScalarType dtype = {x}.scalar_type(), compute = torch_glue::compute_type(dtype);
{prepared}
  std::vector<at::Tensor> outputs({n_out});
  AT_DISPATCH_FLOATING_TYPES(compute, "{pkg}::{sig.name}", [&] {{
    const std::string err = core::{sig.name}_forward(
        {core_call}
        torch_glue::Allocator<scalar_t>{{&outputs, {x}.options().dtype(compute), kOp, "{sig.name}_forward"}},
        torch_glue::ParallelFor{{}});
    TORCH_CHECK_VALUE(err.empty(), kOp, ": ", err);
  }});
  torch_glue::check_allocated(outputs, kOp, "{sig.name}_forward");
  return {converted(n_out)};
}}
"""
    blocks = {
        "TORCH_CHECK_SIGNATURE": _wrap("void check_args(", check_params, ") {"),
        "TORCH_CHECKS": "\n".join(checks),
        "TORCH_CORE_ARGS_SIGNATURE": _wrap(f"core::{camel}Args<F> core_args(", core_params, ") {"),
        "TORCH_CORE_ARGS_BODY": "\n".join(body),
        "TORCH_FORWARD": forward.rstrip("\n"),
        "TORCH_SHAPE_RULE": rule.rstrip("\n"),
        "TORCH_DEF_SHAPE_RULE": "\n  " + _wrap("m.def(", _literal_pieces(rule_def, 98),
                                               f", &{pkg}::{sig.name}_output_shapes);", indent=2, sep=""),
        "TORCH_BACKWARD": "",
        "TORCH_BACKWARD_NOTE": "",
        "TORCH_DEF": _def_line(sig.schema),
        "TORCH_DEF_BACKWARD": "",
        "TORCH_IMPL_BACKWARD": "",
    }
    if sig.backward == "cpp":
        n_grad = len(sig.grad_inputs)
        grad_params = [f"const at::Tensor& grad_{o}" for o in sig.outputs]
        grad_prepared = "\n".join(f"  const at::Tensor grad_{o}_in = torch_glue::prepared(grad_{o}, compute);"
                                  for o in sig.outputs)
        grads_set = "\n".join(f"    grads.{o} = torch_glue::input<scalar_t>(grad_{o}_in);" for o in sig.outputs)
        names = ", ".join(a.name for a in sig.grad_inputs)
        blocks["TORCH_BACKWARD"] = f"""
constexpr const char* kBackwardOp = "{pkg}::_{sig.name}_backward";

{_cpp_comment(f"The CPU kernel of {pkg}::_{sig.name}_backward: the gradients of {names} from the outputs' "
             f"gradients (core::{sig.name}_backward). Autograd calls it; it has no derivative of its own.", 0)}
{_wrap(f"{returns(n_grad)} {sig.name}_backward_cpu(", grad_params + forward_params, ") {")}
  check_args({check_call});
  const at::ScalarType dtype = {x}.scalar_type(), compute = torch_glue::compute_type(dtype);
{prepared}
{grad_prepared}
  std::vector<at::Tensor> outputs({n_grad});
  AT_DISPATCH_FLOATING_TYPES(compute, "{pkg}::_{sig.name}_backward", [&] {{
    core::{camel}Grads<scalar_t> grads;
{grads_set}
    const std::string err = core::{sig.name}_backward(
        {core_call[:-1]}, grads,
        torch_glue::Allocator<scalar_t>{{&outputs, {x}.options().dtype(compute), kBackwardOp, "{sig.name}_backward"}},
        torch_glue::ParallelFor{{}});
    TORCH_CHECK_VALUE(err.empty(), kBackwardOp, ": ", err);
  }});
  torch_glue::check_allocated(outputs, kBackwardOp, "{sig.name}_backward");
  return {converted(n_grad)};
}}
"""
        blocks["TORCH_BACKWARD_NOTE"] = f"\n// Also the backward op _{sig.name}_backward and its CPU kernel (--backward cpp)."
        blocks["TORCH_DEF_BACKWARD"] = "\n  " + _def_line(_canonical(sig.backward_schema))
        blocks["TORCH_IMPL_BACKWARD"] = f'\n  m.impl("_{sig.name}_backward", &{pkg}::{sig.name}_backward_cpu);'
    return blocks


def _def_line(schema: str, indent: int = 2) -> str:
    """``m.def("<schema>");``, the schema split into adjacent literals when the line would be long."""
    return _wrap("m.def(", _literal_pieces(schema, 100 - indent), ");", indent=indent, sep="")


def _canonical(schema: str) -> str:
    """``schema`` as torch prints it (what TORCH_LIBRARY declares and register_op compares)."""
    import torch

    return str(torch._C.parse_schema(schema))


def _ort_blocks(sig: OpSignature) -> dict:
    members, reads = [], []
    if any(t.optional for t in sig.tensors):
        listed = [f'{{"{t.name}", {"true" if t.optional else "false"}}}' for t in sig.tensors]
        reads.append("    " + _wrap("ort_glue::check_node_inputs(info, kOp, {", listed, f"}}, {len(sig.outputs)});",
                                    indent=4))
    else:
        reads.append("    " + _wrap("opforge::ort::check_node_arity(info, kOp, {", [f'"{t.name}"' for t in sig.tensors],
                                    f"}}, {len(sig.outputs)});", indent=4))
    for a in sig.attrs:
        if a.kind == "float":
            members.append(f"  float {a.name} = 0;  // float32 in ONNX; the torch kernel rounds its double to the same value")
            reads.append(f'    {a.name} = opforge::ort::node_attribute<float>(info, kOp, "{a.name}");')
        elif a.kind == "int":
            members.append(f"  int64_t {a.name} = 0;")
            reads.append(f'    {a.name} = opforge::ort::node_attribute<int64_t>(info, kOp, "{a.name}");')
        elif a.kind == "ints":
            members.append(f"  std::vector<int64_t> {a.name};")
            reads.append(f'    {a.name} = ort_glue::node_ints(info, kOp, "{a.name}");')
        elif a.kind == "floats":
            members.append(f"  std::vector<float> {a.name};")
            reads.append(f'    {a.name} = ort_glue::node_floats(info, kOp, "{a.name}");')
        else:
            members.append(f"  bool {a.name} = false;  // an int attribute 0/1 in ONNX")
            reads.append(f'    {a.name} = ort_glue::node_bool(info, kOp, "{a.name}");')
    params = ["OrtKernelContext* ctx"]
    body = []
    for t in sig.tensors:
        element = OWN_DTYPES[t.dtype][0] if t.dtype else "T"
        tensor = f"Ort::Custom::Tensor<{element}>"
        params.append(f"std::optional<const {tensor}*> {t.name}" if t.optional else f"const {tensor}& {t.name}")
        body.append(f"    args.{t.name} = ort_glue::float_input({t.name}, widened);" if not t.dtype else
                    f"    args.{t.name} = ort_glue::typed_input({t.name});")
    body += [f"    args.{a.name} = {a.name};" for a in sig.attrs]
    params += [f"Ort::Custom::Tensor<T>& {o}" for o in sig.outputs]
    return {
        "ORT_ATTR_MEMBERS": "\n".join(members) + ("\n" if members else ""),
        "ORT_ATTR_READS": "\n".join(reads),
        "ORT_COMPUTE_SIGNATURE": _wrap("Ort::Status Compute(", params, ") {", indent=2),
        "ORT_ARGS_BODY": "\n".join(body),
        "ORT_OUTPUT_PTRS": "{" + ", ".join(f"&{o}" for o in sig.outputs) + "}",
    }


def _example_value(sig: OpSignature, a: SchemaArg, index: int) -> str:
    """The expression example_args gives for argument ``a`` (``index``: its place among its kind)."""
    if a.is_tensor:
        if a.dtype == "bool":
            value = "torch.randint(0, 2, (6,), generator=g).bool()"
            note = "bool"
        elif a.dtype:
            extra = "" if a.dtype == "int64" else f", dtype={OWN_DTYPES[a.dtype][2]}"
            value = f"torch.randint(0, 4, (6,), generator=g{extra})"
            note = f"{a.dtype}, values in [0, 4)"
        else:
            value = "torch.randn(*shape, generator=g)"
            note = "float"
        if a.optional and sig.trailing_optional(a):
            return f"{value} if variant == 0 else None,  # {a.name}: {note}, optional (None in variant 1)"
        return f"{value},  # {a.name}: {note}" + (", optional" if a.optional else "")
    if a.kind == "float":
        first, second = 0.5 + 0.25 * index, -(0.25 + 0.125 * index)
        return f"{first!r} if variant == 0 else {second!r},  # {a.name}"
    if a.kind == "int":
        return f"2 if variant == 0 else 3,  # {a.name}"
    if a.kind == "ints":
        return f"[1, 2] if variant == 0 else [3],  # {a.name}"
    if a.kind == "floats":
        return f"[0.5, -1.5] if variant == 0 else [2.0],  # {a.name}"
    return f"variant == 0,  # {a.name}"


def _suffix_defaults(params: list) -> list:
    """(name, annotation, default) -> with defaults kept only on the trailing run that has them all
    (Python needs every parameter after a defaulted one to have a default)."""
    out, defaulted = [], True
    for name, annotation, default in reversed(params):
        defaulted = defaulted and default is not None
        out.append((name, annotation, default if defaulted else None))
    return list(reversed(out))


def _py_params(params: list) -> list:
    """Python parameters ``name: annotation[ = default]`` (defaults on the trailing run only)."""
    return [f"{n}: {t}" + (f" = {d}" if d is not None else "") for n, t, d in _suffix_defaults(params)]


def _doc(text: str, indent: int = 4, width: int = 100) -> str:
    """``text`` wrapped for a docstring whose lines start at ``indent`` (the first line's indent is the
    caller's)."""
    import textwrap

    return textwrap.fill(text, width=width, subsequent_indent=" " * indent, break_long_words=False,
                         break_on_hyphens=False)


def _raise_type_error(condition: str, *message: str) -> list:
    """``if condition: raise TypeError(f"..." f"...")`` lines, the message's literals wrapped."""
    inner = "".join(m[2:-1] if m.startswith("f") else m[1:-1] for m in message)
    merged = ("f" if any(m.startswith("f") for m in message) else "") + f'"{inner}"'
    if len(f"        raise TypeError({merged})") <= 110:
        message = (merged,)
    return [f"    if {condition}:", "        " + _wrap("raise TypeError(", message, ")", indent=8, sep="")]


def _py_blocks(sig: OpSignature, pkg: str) -> dict:
    x = sig.primary.name
    names = [a.name for a in sig.args]
    tensors = sig.tensors
    checks = _raise_type_error(f"{x}.dtype not in _FLOATS", f'f"{{_OP}}: {x} has dtype {{{x}.dtype}}; "',
                               '"supported dtypes are float32, float64, float16 and bfloat16"')
    for t in tensors:
        if t is sig.primary:
            continue
        given = f"{t.name} is not None and " if t.optional else ""
        if t.dtype is None:
            checks += _raise_type_error(f"{given}{t.name}.dtype != {x}.dtype",
                                        f'f"{{_OP}}: {t.name} has dtype {{{t.name}.dtype}} "',
                                        f'f"but {x} has dtype {{{x}.dtype}}; they must match"')
        else:
            checks += _raise_type_error(f"{given}{t.name}.dtype != {OWN_DTYPES[t.dtype][2]}",
                                        f'f"{{_OP}}: {t.name} has dtype {{{t.name}.dtype}} "',
                                        f'"but must be {t.dtype}"')
    checks.append("    " + _wrap("opforge.check_same_device(", ["_OP"] + [f"{t.name}={t.name}" for t in tensors], ")",
                                 indent=4))
    rule_args = [(f"None if {a.name} is None else {a.name}.shape" if a.optional else f"{a.name}.shape")
                 if a.is_tensor else a.name for a in sig.args]
    n_out = len(sig.outputs)
    fake_return = f"{x}.new_empty(shapes[0])" if n_out == 1 else f"tuple({x}.new_empty(output_shape) for output_shape in shapes)"

    grad_names_list = [f"grad_{o}" for o in sig.outputs]
    grads = ", ".join(grad_names_list)

    def unpacked(targets: list, source: str) -> str:
        """``a, b = source`` (parenthesised and wrapped when long)."""
        line = ", ".join(targets) + ("," if len(targets) == 1 else "") + f" = {source}"
        return "    " + (line if len(line) <= 100 else _wrap("(", targets, f") = {source}", indent=4))

    setup = ["def _setup_context(ctx, inputs, output) -> None:", unpacked(names, "inputs"),
             "    # every tensor input: what a backward reads",
             "    " + _wrap("ctx.save_for_backward(", [t.name for t in tensors], ")", indent=4)]
    if sig.attrs:
        setup.append("    " + _wrap("ctx.attrs = (", [a.name for a in sig.attrs], ",)" if len(sig.attrs) == 1 else ")",
                                    indent=4))
    unpack = [unpacked([t.name for t in tensors], "ctx.saved_tensors")]
    if sig.attrs:
        unpack.append(unpacked([a.name for a in sig.attrs], "ctx.attrs"))

    def returning(items: list) -> str:
        line = "return " + ", ".join(items)
        return line if len(line) <= 100 else _wrap("return (", items, ")", indent=4)

    if sig.backward == "python":
        grad_sum = " + ".join(f"grad_{o}" for o in sig.outputs)
        grad_sum = f"({grad_sum})" if n_out > 1 else grad_sum
        scale = " + ".join(["1.0"] + [f"_float32({a.name})" for a in sig.float_attrs])
        returned = returning([f"{grad_sum} * placeholder_scale" if a is sig.primary else "None" for a in sig.args])
        autograd = "\n".join(setup) + f'''


def _backward(ctx, {grads}):
    """The inputs' gradients (None where there is none) from the outputs' gradients.

    PLACEHOLDER: the exact derivative of the placeholder math: each output is {x} * placeholder_scale,
    so d/d{x} is (the sum of the outputs' gradients) * placeholder_scale, and no other input enters it.
    Written with torch ops, it runs on every device and is itself differentiable (double backward);
    for speed, move it into a C++ op (what `opforge new-op --backward cpp` writes)."""
''' + "\n".join(unpack) + f'''
    placeholder_scale = {scale}
    {returned}
'''
    else:
        bw_call = ", ".join(a.name for a in sig.args)
        results = ", ".join(f"grad_{a.name}" for a in sig.grad_inputs) + ("," if len(sig.grad_inputs) == 1 else "")
        if len(sig.grad_inputs) == 1:
            results = f"grad_{sig.grad_inputs[0].name}"
        returned = returning([f"grad_{a.name}" if a in sig.grad_inputs else "None" for a in sig.args])
        fake_grads = [f"{a.name}.new_empty({a.name}.shape)" for a in sig.grad_inputs]
        fake_grads = fake_grads[0] if len(fake_grads) == 1 else _wrap("(", fake_grads, ")", indent=11)
        grad_names = ", ".join(a.name for a in sig.grad_inputs)
        autograd = "\n".join(setup) + f'''


def _backward(ctx, {grads}):
    """{_doc(f"The gradients of {grad_names} from the C++ op {pkg}::_{sig.name}_backward ({sig.name}_backward "
            f"in csrc/{sig.name}.h); None for the other inputs.")}"""
''' + "\n".join(unpack) + f'''
    {_wrap(f"{results} = torch.ops.{pkg}._{sig.name}_backward(", grad_names_list + names, ")", indent=4)}
    {returned}


@torch.library.register_fake("{pkg}::_{sig.name}_backward")
{_wrap("def _backward_fake(", grad_names_list + names, "):")}
    return {fake_grads}


def _no_double_backward(ctx, *grads):
    raise RuntimeError(f"{{_OP}}: double backward (a gradient of its gradient) is not implemented: its backward is "
                       "the C++ op {pkg}::_{sig.name}_backward, which has no derivative of its own. The first "
                       "gradients are exact, so use them directly (no create_graph=True through this op), or give "
                       "_{sig.name}_backward an autograd formula")


# The backward op's own backward: a clear error instead of autograd's "not differentiable" warning and None.
torch.library.register_autograd("{pkg}::_{sig.name}_backward", _no_double_backward,
                                setup_context=lambda ctx, inputs, output: None)
'''
    # Optional inputs left out at the end of an ONNX node are not handed over at all (onnx.reference): None
    reference_params = [n + ("=None" if d else "") for n, _, d in
                        _suffix_defaults([(t.name, "", "None" if t.optional else None) for t in tensors])]
    if sig.attrs:
        reference_params += ["*"] + [a.name for a in sig.attrs]
    numpy_scale = " + ".join(["acc(1)"] + [f"acc({a.name})" for a in sig.float_attrs])
    reference_return = "(result,)" if n_out == 1 else f"tuple(result.copy() for _ in range({n_out}))"
    float_index = {a.name: i for i, a in enumerate(sig.float_attrs)}
    examples = "\n".join("        " + _example_value(sig, a, float_index.get(a.name, 0)) for a in sig.args)

    spec_args = []
    for a in sig.args:
        if a.is_tensor:
            extra = (f', dtypes=("{a.dtype}",)' if a.dtype else "") + (", optional=True" if a.optional else "")
            spec_args.append(f'        opforge.TensorArg("{a.name}"{extra}, doc="{a.declaration}: {a.description}"),')
        else:
            spec_args.append(f'        opforge.AttrArg("{a.name}", kind="{a.kind}", doc="{a.declaration}: '
                             f'{a.description}"),')
    outputs = ", ".join(f'"{o}"' for o in sig.outputs) + ("," if n_out == 1 else "")

    def annotation(a):
        if a.is_tensor:
            return "Optional[torch.Tensor]" if a.optional else "torch.Tensor"
        return _PY_ATTR[a.kind]

    wrapper = [(a.name, annotation(a), a.default) for a in sig.args]
    init = [(a.name, annotation(a), a.default) for a in sig.attrs]
    init_body = "".join(f"\n        self.{a.name} = {'list(' + a.name + ')' if a.kind in ('ints', 'floats') else a.name}"
                        for a in sig.attrs)
    forward = [(t.name, annotation(t), "None" if t.optional else None) for t in tensors]
    call = [a.name if a.is_tensor else f"self.{a.name}" for a in sig.args]
    returns = " -> torch.Tensor" if n_out == 1 else " -> tuple[" + ", ".join(["torch.Tensor"] * n_out) + "]"
    grad_text = ", ".join(a.name for a in sig.grad_inputs)
    return {
        "PY_TYPING_IMPORT": "from typing import Optional, Sequence" if any(t.optional for t in tensors)
        else "from typing import Sequence",
        "OUTPUT_LIST": ", ".join(sig.outputs),
        "TENSOR_LIST": ", ".join(t.name for t in tensors),
        "PY_FAKE_DEF": _wrap("def _fake(", names, "):"),
        "PY_CHECK_DEF": _wrap("def _check(", [t.name for t in tensors], ") -> None:"),
        "PY_CHECK_CALL": _wrap("_check(", [t.name for t in tensors], ")", indent=4),
        "PY_WRAPPER_RETURN": _wrap(f"return torch.ops.{pkg}.{sig.name}(", names, ")", indent=4),
        "PY_MODULE_RETURN": _wrap(f"return torch.ops.{pkg}.{sig.name}(", call, ")", indent=8),
        "PY_DOC_SCHEMA": _doc(sig.schema, indent=8),
        "PY_DOC_PLACEHOLDER": _doc(f"PLACEHOLDER math, until you write the op's: {_placeholder_math(sig)}.", 0),
        "PY_REFERENCE_PLACEHOLDER": _doc(f"PLACEHOLDER: {_placeholder_math(sig)}."),
        "PY_SPEC_SCHEMA": _wrap("schema=", _literal_pieces(sig.schema, 96), ",", indent=4, sep=""),
        "PY_SPEC_DOC": _wrap("doc=", _literal_pieces(f"{sig.name} (PLACEHOLDER math: {_placeholder_math(sig)})", 96),
                             ",", indent=4, sep=""),
        "PY_CHECKS": "\n".join(checks),
        "PY_FAKE_SHAPES": _wrap("shapes = _shape_rule(", rule_args, ")", indent=4),
        "PY_FAKE_RETURN": fake_return,
        "PY_AUTOGRAD": autograd,
        "PY_REFERENCE_DEF": _wrap("def _reference(", reference_params, ") -> tuple:"),
        "PY_NUMPY_SCALE": numpy_scale,
        "PY_REFERENCE_RETURN": reference_return,
        "PY_EXAMPLE_ARGS": examples,
        "PY_SPEC_ARGS": "\n".join(spec_args),
        "PY_SPEC_OUTPUTS": outputs,
        "PY_SPEC_HELPER_OPS": f'\n    helper_ops=("_{sig.name}_backward", "_{sig.name}_output_shapes"),  # C++ '
                              "helper ops, never exported" if sig.backward == "cpp" else
        f'\n    helper_ops=("_{sig.name}_output_shapes",),  # the shape rule op, never exported',
        "PY_WRAPPER_DEF": _wrap(f"def {sig.name}(", _py_params(wrapper), f"){returns}:"),
        "PY_MODULE_INIT_DEF": _wrap("def __init__(", ["self"] + _py_params(init), "):", indent=4),
        "PY_MODULE_INIT_BODY": init_body,
        "PY_MODULE_FORWARD_DEF": _wrap("def forward(", ["self"] + _py_params(forward), f"){returns}:", indent=4),
        "GRAD_INPUT_TEXT": _doc(grad_text),
        "BACKWARD_TODO": (f"\n* ``{sig.name}_backward`` in csrc/{sig.name}.h: its derivative (the C++ op "
                          f"``_{sig.name}_backward``);") if sig.backward == "cpp" else
        "\n* ``_backward`` below: its derivative (an autograd formula in torch ops);",
    }


def _test_blocks(sig: OpSignature) -> dict:
    batch = ", ".join(f'"{t.name}"' for t in sig.float_tensors) + ("," if len(sig.float_tensors) == 1 else "")
    bad = [f'    _bad({sig.args.index(sig.primary)}, torch.int32, "{sig.primary.name}-int32"),']
    for t in sig.tensors:
        if t.dtype:
            wrong = "int64" if t.dtype == "int32" else "int32"
            bad.append(f'    _bad({sig.args.index(t)}, torch.{wrong}, "{t.name}-{wrong}"),')
    return {
        "TEST_BATCH": batch,
        "TEST_BAD_SAMPLES": "\n".join(bad),
        "TEST_OP_TESTS_OPTIONS": ", gradgrad=False" if sig.backward == "cpp" else "",
        "BENCH_BACKWARD_DOC": ", and forward + backward",
    }


def _readme_blocks(sig: OpSignature, spec: NewOp, dtypes: dict) -> dict:
    flags = f" --domain {spec.domain}" if spec.domain != spec.package else ""
    if dtypes:
        flags += " --dtypes " + ",".join(f"{k}={v}" for k, v in dtypes.items())
    if sig.backward == "cpp":
        flags += " --backward cpp"
    pkg, name = spec.package, sig.name
    if sig.backward == "cpp":
        row = (f"\n| `src/{pkg}/csrc/{name}.h`: `{name}_backward` | its derivative: the gradient of each float input "
               f"(the C++ op `_{name}_backward`) |")
        gradgrad = f"; first order only: `_{name}_backward` has no derivative of its own, so the tests pass `gradgrad=False`"
    else:
        row = f"\n| `src/{pkg}/{name}.py`: `_backward` | its derivative (an autograd formula in torch ops) |"
        gradgrad = " and gradgradcheck"
    return {
        "README_GENERATE_FLAGS": flags,
        "README_CALL_ARGS": ", ".join(a.name for a in sig.args),
        "README_BACKWARD_ROW": row,
        "README_GRADGRAD": gradgrad,
        "README_TORCH_BACKWARD": f", backward op `_{name}_backward`" if sig.backward == "cpp" else "",
        "README_ARGUMENTS": "\n".join(f"- `{a.name}`: {a.description}" for a in sig.args) + "\n\nOutputs: " +
        ", ".join(f"`{o}`" for o in sig.outputs) + " (the float inputs' dtype).",
    }


def schema_substitutions(sig: OpSignature, spec: NewOp, dtypes: Optional[dict] = None) -> dict:
    """Every ``{{KEY}}`` of the ``new_op_schema`` templates for ``sig`` (beside :meth:`NewOp.substitutions`)."""
    subs = dict(spec.substitutions())
    subs.update(SCHEMA=sig.schema, PLACEHOLDER_MATH=_placeholder_math(sig), PRIMARY=sig.primary.name)
    subs.update(_core_blocks(sig, spec.camel))
    subs.update(_torch_blocks(sig, spec.package, spec.camel))
    subs.update(_ort_blocks(sig))
    subs.update(_py_blocks(sig, spec.package))
    subs.update(_test_blocks(sig))
    subs.update(_readme_blocks(sig, spec, dtypes or {}))
    return subs


def _template_files(prototype: bool, schema: bool, cuda: bool) -> dict:
    """{relative output path (still with __PKG__/__NAME__): template file} for the package kind."""
    if prototype:
        return {t.relative_to(PROTOTYPE_TEMPLATE_DIR).as_posix()[: -len(".tmpl")]: t
                for t in sorted(PROTOTYPE_TEMPLATE_DIR.rglob("*.tmpl"))}
    files = {t.relative_to(TEMPLATE_DIR).as_posix()[: -len(".tmpl")]: t for t in sorted(TEMPLATE_DIR.rglob("*.tmpl"))}
    if not cuda:
        files = {rel: t for rel, t in files.items() if "/cuda/" not in f"/{rel}"}
    if schema:  # the op-specific files for the schema, over the shared ones (pyproject, setup.py, _ort.py, __init__)
        files.update({t.relative_to(SCHEMA_TEMPLATE_DIR).as_posix()[: -len(".tmpl")]: t
                      for t in sorted(SCHEMA_TEMPLATE_DIR.rglob("*.tmpl"))})
    return dict(sorted(files.items()))


def new_op(name: str, package: str, directory: Optional[os.PathLike] = None, *, domain: Optional[str] = None,
           cuda: bool = True, force: bool = False, prototype: bool = False, schema: Optional[str] = None,
           dtypes=None, backward: Optional[str] = None, log: Callable[[str], None] = print) -> Path:
    """Writes the package ``package`` with the op ``name`` into ``directory`` (default
    ``./<package>``) and returns that directory. ``cuda=False`` leaves out the CUDA kernels;
    ``prototype=True`` writes a pure-Python package instead (spec + numpy kernel, ONNX Runtime
    through onnxruntime-extensions; see :func:`opforge.register_prototype`).

    ``schema``: the op's torch schema (``"NAME(Tensor x, Tensor index, float alpha) -> Tensor"``):
    the package is generated for that signature, with placeholder math (CPU kernels only).
    ``dtypes``: element types of its non-float tensor inputs, ``{"index": "int64"}`` or
    ``["index=int64", ...]`` (``--dtypes``); ``backward``: ``"python"`` (default: an autograd formula
    in the spec) or ``"cpp"`` (a C++ backward op, ``_NAME_backward``)."""
    spec = validate(name, package, domain)
    signature = None
    if schema is None:
        if dtypes or backward is not None:
            raise ValueError("opforge new-op: --dtypes and --backward describe a --schema op; give --schema too")
    else:
        if prototype:
            raise ValueError("opforge new-op: --schema writes compiled kernels; it does not combine with --prototype")
        dtypes = dict(dtypes) if isinstance(dtypes, dict) else parse_dtypes(dtypes)
        signature = parse_schema(name, schema, dtypes, backward=backward or "python", package=package)
        cuda = False  # the schema's kernels are CPU only (the README says how to add CUDA)
    if prototype:
        cuda = False
    spec = NewOp(spec.name, spec.package, spec.domain, cuda)
    dest = Path(directory) if directory is not None else Path.cwd() / package
    if dest.exists() and any(dest.iterdir()) and not force:
        raise FileExistsError(f"opforge new-op: {dest} exists and is not empty (use --force to write into it)")
    subs = schema_substitutions(signature, spec, dtypes) if signature else spec.substitutions()
    written = []
    for rel, template in _template_files(prototype, signature is not None, cuda).items():
        target = dest / rel.replace("__PKG__", package).replace("__NAME__", name)
        text = render(template.read_text(), subs)
        if target.name == "setup.py" and not cuda:
            why = "new-op --schema: CPU kernels only" if signature else "generated --no-cuda"
            text = text.replace(f'CUDA_SOURCES = ["src/{package}/csrc/cuda/*.cu"]', f"CUDA_SOURCES = []  # {why}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        written.append(target.relative_to(dest).as_posix())
    if signature:
        kind = f", from the schema {signature.schema}; PLACEHOLDER math, CPU kernels only"
    else:
        kind = ", prototype: numpy kernel, no C++" if prototype else (", CUDA kernels" if cuda else ", CPU only")
    log(f"opforge new-op: wrote package {package!r} with op {package}::{name} (ONNX {spec.domain}::{name}{kind}) "
        f"to {dest}:")
    for w in written:
        log(f"  {w}")
    what = "pure Python, nothing to compile" if prototype else f"builds the torch extension and lib{package}_ort.so"
    log("next:\n"
        f"  pip install --no-build-isolation -e {dest}   # {what}\n"
        f"  python -m pytest {dest}                        # the op end to end")
    if signature:
        bw = f"csrc/{name}.h: {name}_backward, " if signature.backward == "cpp" else f"{name}.py: _backward, "
        log(f"then replace the PLACEHOLDER math: csrc/{name}.h: {name}_forward, {bw}"
            f"csrc/{name}.h: {name}_output_shapes, {name}.py: _reference, example_args (see {dest / 'README.md'})")
    return dest


__all__ = ["OWN_DTYPES", "OpSignature", "PROTOTYPE_TEMPLATE_DIR", "SCHEMA_TEMPLATE_DIR", "SchemaArg", "TEMPLATE_DIR", "new_op", "parse_dtypes",
           "parse_schema", "schema_substitutions", "validate"]
