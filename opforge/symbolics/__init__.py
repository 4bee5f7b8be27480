"""Export rules for every opforge op, for both torch exporters.

* :mod:`.torchscript`: symbolics for ``torch.onnx.export(..., dynamo=False)``
* :mod:`.dynamo`: the ``custom_translation_table`` for ``dynamo=True``
* :mod:`.onnx_schema`: ``OpSchema`` of the ``opforge`` ONNX domain
* :mod:`.reference`: ``onnx.reference`` implementations
* :mod:`.lowering`: choose standard ONNX instead of the custom node

(ATen ops torch's exporters have no rule for are :mod:`opforge.aten`'s.)
"""

from . import dynamo, lowering, onnx_schema, reference, torchscript
from .dynamo import translation_table
from .lowering import standard_onnx

__all__ = [
    "dynamo",
    "lowering",
    "onnx_schema",
    "reference",
    "torchscript",
    "translation_table",
    "standard_onnx",
]
