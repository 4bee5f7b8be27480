"""The ATen subsystem: ``aten::`` ops the torch exporters have no rule for, exported and run.

Export, TorchScript exporter (``dynamo=False``):

* :mod:`.rules`: curated symbolics for ATen ops that have an ONNX equivalent but no torch rule.
* :mod:`.bridge`: a symbolic for any ATen op the dynamo exporter translates, in four steps:
  :mod:`.binding` (the node's ATen call), :mod:`.translation` (dynamo's ONNX graph for it, with
  :mod:`.compositions` where dynamo's own translation is wrong), :mod:`.downgrade` (that graph
  at the target opset; :mod:`.lowerings` where only a composition of older ops will do), then
  written into the graph and registered (:mod:`.bridge` itself). :mod:`.samples` holds one
  call per bridged op (what gets registered, measured and tested); :mod:`.errors` the
  ``BridgeError`` all of them raise.

Export and run, any exporter:

* :mod:`.fallback`: ``org.pytorch.aten::ATen`` nodes for the ops ONNX cannot express
  (``opforge.export(..., aten_fallback=True)``), made runnable by ``libopforge_aten``, the ONNX
  Runtime library built from ``csrc/``; :mod:`.policy`: which ATen operators it runs by default.

Tools:

* :mod:`.diagnosis`: why an op does not export and what to do (``opforge.diagnose``).
* :mod:`.coverage`: ``opforge coverage``, held to the committed ``coverage.json``.

Layers, lowest first (a module imports only modules of earlier lines): errors, policy, samples,
rules; lowerings, fallback; binding, compositions, downgrade, fallback_dynamo; translation; bridge; coverage;
diagnosis. ``import opforge`` calls :func:`register_all`.
"""

from . import bridge, diagnosis, fallback, lowerings, policy, rules, samples
from .diagnosis import Diagnosis, ExportError, diagnose
from .fallback import AtenFallbackWarning
from .policy import AtenOpRefused


def register_all() -> None:
    """The ATen pieces ``import opforge`` adds (each op's own rules come with
    :func:`opforge.register_op`), in this order: the ``org.pytorch.aten::ATen`` schema, the
    curated rules, then the bridge for every other sampled op."""
    fallback.register_schema()
    rules.register_all()
    bridge.register_all()


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
