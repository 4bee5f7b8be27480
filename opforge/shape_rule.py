"""An op's shape rule written once, in C++, and used by its kernels, its fake impl and ONNX shape
inference.

The rule is a function of the compute core, templated on the dim type::

    template <typename Dim>
    std::string my_op_output_shapes(const MyOpShapes<Dim>& in, std::vector<std::vector<Dim>>& out);

It checks the inputs' shapes and the attributes (returning an error message, or "") and gives each
output's shape. The kernels run it with ``int64_t`` dims before they allocate. The torch library
(on LibTorch's stable ABI, which has no SymInt) also registers it by name with its arguments'
signature (``opforge/torch_shape_rule.h``)::

    OPFORGE_SHAPE_RULE(my_ops, _my_op_output_shapes, "(SymInt[] x, SymInt[]? weight, float alpha)", rule)

and instantiates it on ``opforge::RuleDim``: a dim that is a number, or a handle to one of the
caller's SymInts whose arithmetic, comparisons and printing call back into Python. :class:`ShapeRule`
runs it through the library's C entry point (ctypes), answering those callbacks on torch's SymInts,
so under ``torch.export`` / the dynamo exporter the same C++ code gives the fake impl symbolic
output sizes and adds its comparisons as guards, exactly as a rule on ``c10::SymInt`` did. The
outputs come back flattened as ``[rank0, *dims0, rank1, *dims1, ...]``. :meth:`ShapeRule.__call__`
runs in the fake impl, and :meth:`ShapeRule.onnx_output_shapes` as ``OpSpec.onnx_output_shapes``,
where ONNX's named dims become symbols of a scratch ``ShapeEnv``, so an output dim that is an
input's named dim keeps its name.

``opforge new-op --schema`` generates all of this; docs/your-own-op.md ("One shape rule") shows it.
"""

from __future__ import annotations

import functools
import re
from typing import Optional, Sequence

import torch

__all__ = ["ShapeRule"]

_SIZE_HINT = 720720  # lcm(1..16)


def _unflatten(flat: Sequence) -> list:
    """``[rank0, *dims0, rank1, *dims1, ...]`` -> ``[dims0, dims1, ...]``."""
    shapes, i = [], 0
    while i < len(flat):
        rank = int(flat[i])
        shapes.append(list(flat[i + 1:i + 1 + rank]))
        i += 1 + rank
    return shapes


class ShapeRule:
    """The shape rule of one op, registered by its torch library as ``qualname``
    (``"my_ops::_my_op_output_shapes"``): one ``SymInt[]`` (``SymInt[]?`` for an optional tensor)
    per tensor input, then the attributes, all in the op's schema order, named as the op names them.
    ``error``: the exception class a refused call raises (e.g. :class:`opforge.OpInputError`, as
    opforge's own ops do); by default the kernel's own (a ValueError).
    """

    def __init__(self, qualname: str, *, error: Optional[type] = None):
        namespace, sep, name = qualname.partition("::")
        if not sep or not namespace or not name:
            raise ValueError(f"ShapeRule: {qualname!r} is not a qualified op name (namespace::name)")
        self.qualname = qualname
        self._namespace, self._name = namespace, name
        self._error = error

    @functools.cached_property
    def _library(self):
        """The loaded torch library (opforge.load_torch_library) that carries this rule, or None when
        the rule is a torch op instead (``qualname(SymInt[] x, ...) -> SymInt[]``, e.g. defined in
        Python with torch.library, or by an extension on torch's C++ API)."""
        from .torch_library import loaded_torch_libraries

        for library in loaded_torch_libraries():
            if library.shape_rule_signature(self.qualname) is not None:
                return library
        return None

    @functools.cached_property
    def _op(self):
        try:
            return getattr(getattr(torch.ops, self._namespace), self._name).default
        except (AttributeError, RuntimeError):
            raise RuntimeError(f"ShapeRule: {self.qualname} is not registered: no loaded torch library has this "
                               "shape rule (load its library first with opforge.load_torch_library; it registers "
                               "the rule with OPFORGE_SHAPE_RULE, opforge/torch_shape_rule.h), and no torch op has "
                               "this name") from None

    @functools.cached_property
    def _arguments(self) -> list:
        """(name, kind) of the rule's arguments: kind "shape" (a tensor's, ``SymInt[]``),
        "optional_shape" (``SymInt[]?``), "bool", "float", "int", "ints" (``int[]``), "floats"
        (``float[]``); for a rule that is a torch op, any other type is "value", handed over as is."""
        kinds = {"SymInt[]": "shape", "SymInt[]?": "optional_shape", "bool": "bool", "float": "float",
                 "int": "int", "int[]": "ints", "float[]": "floats"}
        if self._library is not None:
            text = self._library.shape_rule_signature(self.qualname)
            declared = []  # (name, type) from "(SymInt[] x, float alpha)"
            for part in filter(None, (p.strip() for p in text.strip().strip("()").split(","))):
                type_, _, name = part.rpartition(" ")
                declared.append((name, type_))
            unknown = [f"{t} {n}" for n, t in declared if t not in kinds]
            if unknown:
                raise RuntimeError(f"ShapeRule: {self.qualname} declares {', '.join(unknown)}; a rule takes SymInt[], "
                                   "SymInt[]?, int, int[], float, float[] and bool arguments")
        else:
            # A torch op: the declarations from its schema's text (the parsed types say int for SymInt).
            text = str(self._op._schema)
            declared = []
            for arg in self._op._schema.arguments:
                found = re.search(rf"([\w\[\]?]+) {re.escape(arg.name)}(?=[=,)])", text)
                declared.append((arg.name, found.group(1) if found else str(arg.type)))
        out = [(name, kinds.get(t, "value")) for name, t in declared]
        if not any(kind in ("shape", "optional_shape") for _, kind in out):
            raise RuntimeError(f"ShapeRule: {self.qualname} has no SymInt[] argument (a tensor's shape): {text}")
        return out

    def __call__(self, *shapes_and_attrs) -> list:
        """The outputs' shapes (lists of ints or SymInts) from the op's arguments in schema order, each
        tensor replaced by its shape (``x.shape``; None for an absent optional tensor). A rule error
        raises as the kernel raises it (ValueError, "<op>: <message>"), or as ``error``."""
        from torch.utils._python_dispatch import _disable_current_modes

        values = [None if v is None else list(v) if isinstance(v, (torch.Size, tuple)) else v
                  for v in shapes_and_attrs]
        kinds = [kind for _, kind in self._arguments]
        if len(values) != len(kinds):
            raise TypeError(f"ShapeRule {self.qualname}: takes {len(kinds)} arguments "
                            f"({', '.join(n for n, _ in self._arguments)}), got {len(values)}")
        # A computation on sizes, not tensor work: outside any dispatch mode (fake, functionalisation).
        with _disable_current_modes():
            try:
                if self._library is None:
                    return _unflatten(self._op(*values))
                return _unflatten(self._library.run_shape_rule(self.qualname, kinds, values))
            except ValueError as exc:
                if self._error is None or isinstance(exc, self._error):
                    raise
                raise self._error(str(exc)) from None

    def onnx_output_shapes(self, shapes: list, attrs: dict) -> Optional[list]:
        """``OpSpec.onnx_output_shapes``: the outputs' shapes from the tensor inputs' ONNX shapes (dims
        int, named str, or None; a shape None when unknown or absent) and the attributes by name.
        Named and unknown dims are symbols while the rule runs: an output dim that is exactly an input's
        named dim keeps its name, a constant stays a number, anything else is unknown (None). None (no
        shapes) when a required input's rank is unknown or the rule refuses the node.

        Every distinct name is first a distinct size. Exporters name one size several ways, though
        (the TorchScript exporter gives each traced value's dynamic dims names of their own), so a
        rule that needs an unknown dim equal to another dim or to a number would refuse a valid node.
        Where the comparison that refused it says such a dim differs (``s3 != 2``, ``s1 != s0``), the
        rule runs again assuming them equal, as they are in any node ORT runs (its kernels check at
        run time): the outputs keep the inputs' names and ranks instead of becoming unknown. Any
        other refusal (an attribute, a rank, a sum of dims) leaves the shapes unknown."""
        assumed: dict = {}  # dim key -> the dim (key) or number it is taken to equal
        for _ in range(1 + sum(len(shape) for shape in shapes if shape)):
            out, refusal = self._symbolic_output_shapes(shapes, attrs, assumed)
            if out is not None or refusal is None or not _assume_equal(refusal, assumed):
                return out
        return None

    def _symbolic_output_shapes(self, shapes: list, attrs: dict, assumed: dict):
        """(the outputs' ONNX shapes, None) or (None, the last comparison the rule made, as a sympy
        relation, and its outcome) when it refused; (None, None) when it cannot run."""
        from torch._dynamo.source import ConstantSource

        env = _recording_shape_env_class()()
        symbol_of: dict = {}  # dim key -> SymInt
        names: dict = {}  # sympy symbol -> (dim key, ONNX name or None)

        def dim(d, where):
            if isinstance(d, int):
                return d
            key = _find(assumed, d if isinstance(d, str) else where)
            if isinstance(key, int):
                return key
            if key not in symbol_of:
                # Distinct large hints that every small group count divides (720720 = lcm(1..16)):
                # the rule's comparisons between unknown dims are decided on them.
                hint = _SIZE_HINT * (2 + len(names))
                symbol = env.create_symbol(hint, ConstantSource(f"onnx_dim_{len(names)}"))
                symbol_of[key] = env.create_symintnode(symbol, hint=hint)
                names[symbol] = (key, key if not key.startswith("?") else None)
            return symbol_of[key]

        tensor_shapes = iter(shapes)
        values = []
        for i, (name, kind) in enumerate(self._arguments):
            if kind in ("shape", "optional_shape"):
                shape = next(tensor_shapes, None)
                if shape is None and kind == "shape":
                    return None, None
                values.append(None if shape is None else [dim(d, f"?{i}.{j}") for j, d in enumerate(shape)])
            else:
                value = attrs.get(name)
                if value is None:
                    return None, None
                values.append(bool(value) if kind == "bool" else value)
        try:
            out = self(*values)
        except Exception:  # an invalid node, or one whose dims were taken for different sizes
            return None, (env.last, names)

        def onnx_dim(d):
            if isinstance(d, int):
                return d
            expr = d.node.expr
            if expr.is_number:
                return int(expr)
            return names[expr][1] if expr in names else None

        return [[onnx_dim(d) for d in shape] for shape in out], None


@functools.lru_cache(maxsize=None)
def _recording_shape_env_class() -> type:
    """A ShapeEnv that remembers the last comparison the rule made (defined once, on first use:
    torch.fx's symbolic shapes are imported only when ONNX shape inference needs them)."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    class RecordingShapeEnv(ShapeEnv):
        last = None

        def evaluate_expr(self, orig_expr, *args, **kwargs):
            result = super().evaluate_expr(orig_expr, *args, **kwargs)
            self.last = (orig_expr, result)
            return result

    return RecordingShapeEnv


def _find(assumed: dict, key):
    """What ``key`` is taken to equal: another dim's key, a number, or itself."""
    while isinstance(key, str) and key in assumed:
        key = assumed[key]
    return key


def _assume_equal(refusal, assumed: dict) -> bool:
    """Records, from the comparison that made a rule refuse, that an unknown dim equals another dim
    or a number, when that comparison found them different; False when it says nothing of the kind."""
    import sympy

    (last, names) = refusal
    if last is None:
        return False
    expr, outcome = last
    differ = (isinstance(expr, sympy.Ne) and bool(outcome)) or (isinstance(expr, sympy.Eq) and not bool(outcome))
    if not differ:
        return False
    difference = expr.lhs - expr.rhs
    for symbol in sorted(difference.free_symbols & names.keys(), key=str, reverse=True):
        try:
            solved = sympy.solve(difference, symbol)
        except NotImplementedError:  # e.g. a floor division: not an equality of two dims
            continue
        if len(solved) != 1:
            continue
        value = solved[0]
        if value.is_Integer and int(value) >= 0:
            assumed[names[symbol][0]] = int(value)
            return True
        if value.is_Symbol and value in names:
            assumed[names[symbol][0]] = names[value][0]
            return True
    return False
