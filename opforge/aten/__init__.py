"""The ATen subsystem: exporting ``aten::`` ops that the torch exporters cannot translate, and running them.

* :mod:`.rules`: curated TorchScript symbolics for ATen ops that have an ONNX equivalent but no torch rule
* :mod:`.bridge` (+ :mod:`.samples`, :mod:`.lowerings`): a TorchScript symbolic for any ATen op
  the dynamo exporter translates, brought down to the target opset
* :mod:`.fallback`: ``org.pytorch.aten::ATen`` nodes for the ops ONNX cannot express, and
  :mod:`.policy`, which of them libopforge_aten (built from ``csrc/``) runs
* :mod:`.diagnosis`: why an op does not export and what to do (:func:`opforge.diagnose`)
* :mod:`.coverage`: ``opforge coverage``, measured against the committed ``coverage.json``
"""

from . import bridge, diagnosis, fallback, lowerings, policy, rules, samples
from .diagnosis import Diagnosis, ExportError, diagnose
from .fallback import AtenFallbackWarning
from .policy import AtenOpRefused


def register_all() -> None:
    """The ATen pieces ``import opforge`` adds (each op's own rules come with
    :func:`opforge.register_op`)."""
    fallback.register_schema()
    rules.register_all()


__all__ = [
    "AtenFallbackWarning",
    "AtenOpRefused",
    "Diagnosis",
    "ExportError",
    "bridge",
    "diagnose",
    "diagnosis",
    "fallback",
    "lowerings",
    "policy",
    "register_all",
    "rules",
    "samples",
]
