"""Which ops export as standard ONNX instead of their custom-domain node.

By default every opforge op exports as one ``opforge::<name>`` node (run by
libopforge_ort). Ops with a standard-ONNX lowering (my_add -> Mul + Add) can
export as that instead, for runtimes without our library:

    with opforge.symbolics.standard_onnx({"my_add"}):   # or True for all
        torch.onnx.export(model, args, "m.onnx", dynamo=False)

``opforge.export(..., standard_onnx=...)`` does this for you (both exporters).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterable, Iterator, Union

from ..spec import REGISTRY, OpSpec

StandardOnnx = Union[bool, Iterable[str], None]

_standard: contextvars.ContextVar[frozenset] = contextvars.ContextVar("opforge_standard_onnx", default=frozenset())


def resolve(standard_onnx: StandardOnnx) -> frozenset:
    """``True`` -> every op that has a lowering; names -> checked set; falsy -> empty."""
    if not standard_onnx:
        return frozenset()
    if standard_onnx is True:
        return frozenset(
            name for name, s in REGISTRY.items() if s.standard_torchscript is not None or s.standard_dynamo is not None
        )
    names = frozenset(standard_onnx)
    for name in names:
        spec = REGISTRY.get(name)
        if spec is None:
            raise ValueError(f"opforge: standard_onnx names unknown op {name!r}; known ops: {sorted(REGISTRY)}")
        if spec.standard_torchscript is None and spec.standard_dynamo is None:
            raise ValueError(f"opforge: {spec.qualname} has no standard-ONNX lowering; export it as the custom op")
    return names


@contextlib.contextmanager
def standard_onnx(ops: StandardOnnx = True) -> Iterator[frozenset]:
    token = _standard.set(resolve(ops))
    try:
        yield _standard.get()
    finally:
        _standard.reset(token)


def use_standard(spec: OpSpec) -> bool:
    return spec.name in _standard.get()
