"""Export rules for every opforge op, for both torch exporters.

* :mod:`.torchscript`: symbolics for ``torch.onnx.export(..., dynamo=False)``
* :mod:`.dynamo`: the ``custom_translation_table`` for ``dynamo=True``
* :mod:`.onnx_schema`: ``OpSchema`` of the ``opforge`` ONNX domain
* :mod:`.reference`: ``onnx.reference`` implementations
* :mod:`.lowering`: choose standard ONNX instead of the custom node
* :mod:`.aten_rules`, :mod:`.aten_bridge` (+ :mod:`.aten_samples`), :mod:`.aten_fallback`: ATen
  ops torch's TorchScript exporter has no rule for
"""

from . import aten_bridge, aten_fallback, aten_rules, aten_samples, dynamo, lowering, onnx_schema, reference, torchscript
from .dynamo import translation_table
from .lowering import standard_onnx


def register_all() -> None:
    """The ATen pieces ``import opforge`` adds (each op's own rules come with
    :func:`opforge.register_op`)."""
    aten_fallback.register_schema()
    aten_rules.register_all()


__all__ = [
    "aten_fallback",
    "aten_rules",
    "dynamo",
    "lowering",
    "onnx_schema",
    "reference",
    "torchscript",
    "translation_table",
    "standard_onnx",
    "register_all",
]
