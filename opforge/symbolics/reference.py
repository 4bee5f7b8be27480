"""``onnx.reference`` implementations of the custom domain, derived from each OpSpec.

    sess = opforge.symbolics.reference.evaluator(model)   # ReferenceEvaluator knowing opforge ops
    outputs = sess.run(None, feeds)
"""

from __future__ import annotations

import functools

from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from ..spec import REGISTRY, OpSpec


@functools.lru_cache(maxsize=None)
def reference_op(spec: OpSpec) -> type:
    attr_names = [a.onnx_name for a in spec.attr_args]

    def _run(self, *inputs, **_ignored):
        attrs = {name: getattr(self, name) for name in attr_names}
        return spec.reference(*inputs, **attrs)

    return type(spec.name, (OpRun,), {"op_domain": spec.domain, "_run": _run, "__doc__": spec.doc})


def reference_ops() -> list:
    return [reference_op(spec) for spec in REGISTRY.values()]


def evaluator(model, **kwargs) -> ReferenceEvaluator:
    """A ``ReferenceEvaluator`` for ``model`` (ModelProto or path) with opforge ops added."""
    return ReferenceEvaluator(model, new_ops=reference_ops(), **kwargs)
