"""An op's shape rule written once, in C++, and used by its kernels, its fake impl and ONNX shape
inference.

The rule is a function of the compute core, templated on the dim type::

    template <typename Dim>
    std::string my_op_output_shapes(const MyOpShapes<Dim>& in, std::vector<std::vector<Dim>>& out);

It checks the inputs' shapes and the attributes (returning an error message, or "") and gives each
output's shape. The kernels run it with ``int64_t`` dims before they allocate. The torch extension
also registers it as a tensor-free op whose tensor arguments are shapes, with ``c10::SymInt`` dims::

    _my_op_output_shapes(SymInt[] x, SymInt[]? weight, float alpha) -> SymInt[]

It returns the outputs' shapes flattened as ``[rank0, *dims0, rank1, *dims1, ...]``. c10::SymInt
computes with torch's symbolic sizes, so under ``torch.export`` / the dynamo exporter the same C++
code gives the fake impl symbolic output sizes (and adds its comparisons as guards). :class:`ShapeRule`
calls that op from Python: :meth:`ShapeRule.__call__` in the fake impl, and
:meth:`ShapeRule.onnx_output_shapes` as ``OpSpec.onnx_output_shapes``, where ONNX's named dims become
symbols of a scratch ``ShapeEnv``, so an output dim that is an input's named dim keeps its name.

``opforge new-op --schema`` generates all of this; docs/your-own-op.md ("One shape rule") shows it.
"""

from __future__ import annotations

import functools
import re
from typing import Optional, Sequence

import torch

__all__ = ["ShapeRule"]


def _unflatten(flat: Sequence) -> list:
    """``[rank0, *dims0, rank1, *dims1, ...]`` -> ``[dims0, dims1, ...]``."""
    shapes, i = [], 0
    while i < len(flat):
        rank = int(flat[i])
        shapes.append(list(flat[i + 1:i + 1 + rank]))
        i += 1 + rank
    return shapes


class ShapeRule:
    """The shape rule of one op, registered by its torch extension as ``qualname``
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
    def _op(self):
        try:
            return getattr(getattr(torch.ops, self._namespace), self._name).default
        except (AttributeError, RuntimeError) as exc:
            raise RuntimeError(f"ShapeRule: the op {self.qualname} is not registered; its torch extension "
                               "(TORCH_LIBRARY) must be loaded first") from exc

    @functools.cached_property
    def _arguments(self) -> list:
        """(name, kind) of the rule op's arguments: kind "shape" (a tensor's, ``SymInt[]``),
        "optional_shape" (``SymInt[]?``), "bool" or "value" (an attribute, ``int[]`` included)."""
        # The argument types as the schema declares them: the parsed schema's types say int for
        # SymInt, so read the declarations from its text.
        text = str(self._op._schema)
        out = []
        for arg in self._op._schema.arguments:
            found = re.search(rf"([\w\[\]?]+) {re.escape(arg.name)}(?=[=,)])", text)
            declared = found.group(1) if found else str(arg.type)
            if declared == "SymInt[]?":
                out.append((arg.name, "optional_shape"))
            elif declared == "SymInt[]":
                out.append((arg.name, "shape"))
            elif declared == "bool":
                out.append((arg.name, "bool"))
            else:
                out.append((arg.name, "value"))
        if not any(kind != "value" and kind != "bool" for _, kind in out):
            raise RuntimeError(f"ShapeRule: {self.qualname} has no SymInt[] argument (a tensor's shape): {text}")
        return out

    def __call__(self, *shapes_and_attrs) -> list:
        """The outputs' shapes (lists of ints or SymInts) from the op's arguments in schema order, each
        tensor replaced by its shape (``x.shape``; None for an absent optional tensor). A rule error
        raises as the kernel raises it (ValueError, "<op>: <message>"), or as ``error``."""
        from torch.utils._python_dispatch import _disable_current_modes

        values = [None if v is None else list(v) if isinstance(v, (torch.Size, tuple)) else v
                  for v in shapes_and_attrs]
        # A computation on sizes, not tensor work: outside any dispatch mode (fake, functionalisation).
        with _disable_current_modes():
            try:
                return _unflatten(self._op(*values))
            except ValueError as exc:
                if self._error is None or isinstance(exc, self._error):
                    raise
                raise self._error(str(exc)) from None

    def onnx_output_shapes(self, shapes: list, attrs: dict) -> Optional[list]:
        """``OpSpec.onnx_output_shapes``: the outputs' shapes from the tensor inputs' ONNX shapes (dims
        int, named str, or None; a shape None when unknown or absent) and the attributes by name.
        Named and unknown dims are symbols while the rule runs: an output dim that is exactly an input's
        named dim keeps its name, a constant stays a number, anything else is unknown (None). None (no
        shapes) when a required input's rank is unknown or the rule refuses the node."""
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        from torch._dynamo.source import ConstantSource

        env = ShapeEnv()
        symbols: dict = {}  # dim name -> SymInt
        names: dict = {}  # sympy symbol -> dim name (None for an unnamed dim)

        def dim(d):
            if isinstance(d, int):
                return d
            if isinstance(d, str) and d in symbols:
                return symbols[d]
            # Distinct, large hints: a comparison the rule makes between two unknown dims is decided
            # on them; where that refuses the node, the shapes are just left unknown.
            hint = 1_000_003 + 2 * len(names)
            symbol = env.create_symbol(hint, ConstantSource(f"onnx_dim_{len(names)}"))
            value = env.create_symintnode(symbol, hint=hint)
            names[symbol] = d if isinstance(d, str) else None
            if isinstance(d, str):
                symbols[d] = value
            return value

        tensor_shapes = iter(shapes)
        values = []
        for name, kind in self._arguments:
            if kind in ("shape", "optional_shape"):
                shape = next(tensor_shapes, None)
                if shape is None and kind == "shape":
                    return None
                values.append(None if shape is None else [dim(d) for d in shape])
            else:
                value = attrs.get(name)
                if value is None:
                    return None
                values.append(bool(value) if kind == "bool" else value)
        try:
            out = self(*values)
        except Exception:  # an invalid node: no shapes, rather than wrong ones (the checker and ORT say why)
            return None

        def onnx_dim(d):
            if isinstance(d, int):
                return d
            expr = d.node.expr
            if expr.is_number:
                return int(expr)
            return names.get(expr)

        return [[onnx_dim(d) for d in shape] for shape in out]
