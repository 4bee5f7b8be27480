"""Which ops export as standard ONNX instead of their custom-domain node.

Every opforge op can export as one ``opforge::<name>`` node (run by
libopforge_ort). Ops with a standard-ONNX lowering can export as that instead,
for runtimes without our library:

* ``standard_onnx=None`` (default, "auto"): custom node, except ops whose spec
  sets ``standard_from_opset`` (deform_conv2d -> ``DeformConv`` from opset 19)
  when the export opset reaches it;
* ``False``: the custom node for every op, at any opset;
* ``True``: the standard lowering wherever one exists at the export opset;
* a set of op names (``{"my_add"}``, or ``"domain::name"`` where a bare name is
  ambiguous): those ops standard (an error where the opset has no equivalent), the others auto.

    with opforge.symbolics.standard_onnx({"my_add"}):
        torch.onnx.export(model, args, "m.onnx", dynamo=False)

``opforge.export(..., standard_onnx=...)`` does this for you (both exporters).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Iterable, Iterator, Optional, Union

from ..spec import OpSpec, find

StandardOnnx = Union[bool, Iterable[str], None]


@dataclasses.dataclass(frozen=True)
class Policy:
    forced_standard: frozenset = frozenset()  # named explicitly: standard or error
    prefer_standard: bool = False  # True: standard wherever the opset allows
    force_custom: bool = False  # False: custom everywhere

    def use_standard(self, spec: OpSpec, opset: Optional[int]) -> bool:
        has_lowering = spec.standard_torchscript is not None or spec.standard_dynamo is not None
        min_opset = spec.standard_min_opset or spec.standard_from_opset
        available = has_lowering and (min_opset is None or (opset or 0) >= min_opset)
        if spec.onnx_qualname in self.forced_standard:
            if not available:
                raise ValueError(
                    f"opforge: {spec.qualname} has no standard-ONNX equivalent at opset {opset} "
                    f"(needs opset >= {min_opset}); export it as the custom op or raise the opset"
                )
            return True
        if self.force_custom:
            return False
        if self.prefer_standard:
            return available
        return spec.standard_from_opset is not None and available and (opset or 0) >= spec.standard_from_opset


def resolve(standard_onnx: StandardOnnx) -> Policy:
    if standard_onnx is None:
        return Policy()
    if standard_onnx is False:
        return Policy(force_custom=True)
    if standard_onnx is True:
        return Policy(prefer_standard=True)
    if isinstance(standard_onnx, Policy):
        return standard_onnx
    names = [standard_onnx] if isinstance(standard_onnx, str) else list(standard_onnx)
    keys = set()
    for name in names:
        try:
            spec = find(name)
        except KeyError as exc:
            raise ValueError(f"opforge: standard_onnx names unknown op {name!r}: {exc.args[0]}") from None
        if spec.standard_torchscript is None and spec.standard_dynamo is None:
            raise ValueError(f"opforge: {spec.qualname} has no standard-ONNX lowering; export it as the custom op")
        keys.add(spec.onnx_qualname)
    return Policy(forced_standard=frozenset(keys))


_policy: contextvars.ContextVar[Policy] = contextvars.ContextVar("opforge_standard_onnx", default=Policy())


@contextlib.contextmanager
def standard_onnx(ops: StandardOnnx = True) -> Iterator[Policy]:
    token = _policy.set(resolve(ops))
    try:
        yield _policy.get()
    finally:
        _policy.reset(token)


def use_standard(spec: OpSpec, opset: Optional[int]) -> bool:
    """For the TorchScript exporter: decided per node, from the active policy and g.opset."""
    return _policy.get().use_standard(spec, opset)
