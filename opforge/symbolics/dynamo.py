"""Dynamo-exporter (``torch.onnx.export(..., dynamo=True)``) translations.

``translation_table()`` maps each registered op's ``torch.ops.<namespace>.<op>.default``
to an onnxscript (traced) function emitting the ``<domain>::<op>`` node, or, for ops
listed in ``standard_onnx``, the op's standard-ONNX lowering. Pass it as
``custom_translation_table``; ``opforge.export`` does that for you.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Optional, Sequence

import torch

from ..spec import REGISTRY, AttrArg, OpSpec
from . import lowering

_ANNOTATION = {"int": int, "ints": Sequence[int], "float": float, "floats": Sequence[float], "bool": bool}


def _with_signature(fn: Callable, spec: OpSpec) -> Callable:
    # The exporter infers each translation's ONNX signature from the Python
    # signature + annotations (tensors unannotated, attributes typed), so give
    # the generic *values function the op's real parameter list.
    fn.__signature__ = spec.signature()
    fn.__annotations__ = {a.name: _ANNOTATION[a.kind] for a in spec.args if isinstance(a, AttrArg)}
    return fn


@functools.lru_cache(maxsize=None)
def custom_translation(spec: OpSpec) -> Callable:
    """Translation emitting one node of the custom domain (needs the OpSchema registered)."""
    # onnxscript (with onnx_ir and sympy) takes about a second to import: paid by the first
    # dynamo export, not by every `import opforge` (ORT-only and eager-only processes too)
    from onnxscript import values as onnxscript_values

    opset = onnxscript_values.Opset(spec.domain, spec.domain_version)

    def translation(*values):
        inputs, attrs = spec.split_args(values)
        return getattr(opset, spec.name)(*inputs, **attrs)

    translation.__name__ = f"{spec.name}_custom"
    return _with_signature(translation, spec)


@functools.lru_cache(maxsize=None)
def standard_translation(spec: OpSpec, opset: Optional[int] = None) -> Callable:
    if spec.standard_dynamo is None:
        raise ValueError(f"opforge: {spec.qualname} has no standard-ONNX lowering")
    # a lowering whose ONNX ops changed between opsets asks for the export opset (keyword-only `opset`)
    parameter = inspect.signature(spec.standard_dynamo).parameters.get("opset")
    wants_opset = parameter is not None and parameter.kind is inspect.Parameter.KEYWORD_ONLY
    extra = {"opset": opset} if wants_opset else {}

    def translation(*values):
        return spec.standard_dynamo(*values, **extra)

    translation.__name__ = f"{spec.name}_standard"
    return _with_signature(translation, spec)


def _torch_op(qualname: str):
    namespace, name = qualname.split("::")
    try:
        return getattr(getattr(torch.ops, namespace), name).default
    except (AttributeError, RuntimeError):  # e.g. torchvision not imported: nothing to translate
        return None


def translation_table(standard_onnx: lowering.StandardOnnx = None, opset_version: int = 18) -> dict:
    """``{torch op: translation}`` for every registered op, built-in or not (and aliases, e.g.
    torchvision::deform_conv2d when torchvision is loaded) at ``opset_version``."""
    policy = lowering.resolve(standard_onnx)
    table = {}
    for spec in REGISTRY.values():
        fn = (standard_translation(spec, opset_version) if policy.use_standard(spec, opset_version)
              else custom_translation(spec))
        for qualname in (spec.torch_qualname, *spec.torch_aliases):
            op = _torch_op(qualname)
            if op is not None:
                table[op] = fn
    return table
