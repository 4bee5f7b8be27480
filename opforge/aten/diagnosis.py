"""Why won't my model export, and what do I do about it?

The decision users walk through by hand (see the reference documents): for each op the
exporter cannot translate,

1. is it an ATen op?                 (``aten::`` namespace vs ``torchvision::``, ``mylib::``)
2. does standard ONNX have an equivalent at this opset?
3. so which way:
   * **symbolic**      — ATen op with an ONNX equivalent: a symbolic maps it (opforge ships
                         the ones torch lacks: :mod:`opforge.aten.rules`);
   * **ATen fallback** — ATen op without an ONNX equivalent: ``opforge.export(...,
                         aten_fallback=True)`` + ``libopforge_aten`` in ONNX Runtime;
   * **custom op**     — not an ATen op: give it an ONNX custom-domain op and an ORT kernel
                         (an opforge ``OpSpec``), or a symbolic composing standard ONNX ops.

:func:`diagnose` answers for every op of a model at once; :func:`opforge.export` attaches
the same answer to its error when an export fails (:class:`ExportError`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import warnings
from typing import Optional

import onnx
import torch

from ..spec import TORCHSCRIPT_OPSETS


@dataclasses.dataclass(frozen=True)
class OpDiagnosis:
    op: str  # "aten::cummax", "torchvision::roi_align"
    is_aten: bool
    onnx_equivalent: Optional[str]  # "Asinh (opset 9+)" or None
    way: str  # "symbolic" | "ATen fallback" | "custom op" | "rewrite"
    advice: str

    def __str__(self) -> str:
        eq = self.onnx_equivalent or "none"
        return (f"{self.op}: ATen op: {'yes' if self.is_aten else 'no'}; ONNX equivalent: {eq}; "
                f"way: {self.way} -- {self.advice}")


@dataclasses.dataclass
class Diagnosis:
    exporter: str
    opset: int
    unsupported: list

    @property
    def ok(self) -> bool:
        return not self.unsupported

    def __str__(self) -> str:
        if self.ok:
            return f"opforge.diagnose: every op exports with the {self.exporter} exporter at opset {self.opset}"
        lines = [f"opforge.diagnose: {len(self.unsupported)} op(s) have no ONNX translation "
                 f"({self.exporter} exporter, opset {self.opset}):"]
        lines += [f"  - {d}" for d in self.unsupported]
        return "\n".join(lines)


@functools.lru_cache(maxsize=None)
def _onnx_since() -> dict:
    since: dict = {}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain == "":
            since[s.name] = min(since.get(s.name, 10**6), s.since_version)
    return since


def onnx_equivalent(aten_name: str) -> Optional[tuple[str, int]]:
    """``"asinh"`` -> ``("Asinh", 9)``: a standard ONNX op of the same name (case/underscores
    ignored) and the opset it appeared in, or None."""
    key = aten_name.replace("_", "").lower()
    for name, since in _onnx_since().items():
        if name.lower() == key:
            return name, since
    return None


def _declared_without_spec(namespace: str, name: str) -> bool:
    from ..registration import spec_of

    if spec_of(f"{namespace}::{name}") is not None:
        return False
    return any(n.split(".")[0] == f"{namespace}::{name}" for n in torch._C._dispatch_get_all_op_names())


@functools.lru_cache(maxsize=1)
def bridge_coverage() -> dict:
    """``{op: [opsets]}``: where opforge's ATen bridge exports each bridged op, as measured by
    ``opforge coverage`` (the committed snapshot the coverage test holds it to)."""
    import json

    from .coverage import SNAPSHOT
    from .samples import SAMPLES

    snapshot = json.loads(SNAPSHOT.read_text())
    return {name: sorted(int(o) for o, ops in snapshot.items() if name in ops) for name in SAMPLES}


def classify(op: str, opset: int) -> OpDiagnosis:
    from . import rules

    namespace, _, rest = op.partition("::")
    name = rest.split(".")[0]
    if namespace != "aten" and _declared_without_spec(namespace, name):
        return OpDiagnosis(op, False, None, "custom op",
                           f"declared in C++ (TORCH_LIBRARY({namespace})) but no opforge spec is registered for it: "
                           "write an OpSpec and call opforge.register_op(spec), or import the package whose spec "
                           "module does (without it the op has no fake impl, autograd or export rules)")
    if namespace != "aten":
        return OpDiagnosis(op, False, None, "custom op",
                           "define it as an ONNX custom-domain op with an ORT kernel (an opforge OpSpec + "
                           "compute core), or write a symbolic that composes standard ONNX ops; for "
                           "torchvision::deform_conv2d, `import opforge` already does")
    ruled = {r.aten: r for r in rules.RULES}
    bridged = bridge_coverage().get(name)
    if bridged:
        first = bridged[0]
        return OpDiagnosis(op, True, f"opforge's ATen bridge (opset {first}+)", "symbolic",
                           f"opforge exports it with standard ONNX from opset {first} on (the dynamo exporter's "
                           "translation, lowered to the opset)"
                           + ("" if opset >= first else f"; raise the opset to {first} or more, or use "
                              "aten_fallback=True at this opset"))
    eq = onnx_equivalent(name)
    if name in ruled:
        rule = ruled[name]
        first, last = rule.opsets[0], rule.opsets[-1]
        where = (f"opforge registers a symbolic for opsets {first}..{last} on `import opforge`"
                 + (f" (torch's own from {last + 1})" if last < 20 else ""))
        if first < rule.since:  # bool tensors from `first`, every dtype from `since`
            where += f"; below opset {rule.since} it takes bool tensors only"
        return OpDiagnosis(op, True, f"{rule.onnx} (opset {rule.since}+)", "symbolic",
                           where + ("" if opset >= rule.since else f"; raise the opset to {rule.since} or more"))
    if eq is not None and name not in rules.NOT_RULED:
        onnx_name, since = eq
        if opset >= since:
            return OpDiagnosis(op, True, f"{onnx_name} (opset {since}+)", "symbolic",
                               f"register a symbolic mapping it to {onnx_name} "
                               f"(torch.onnx.register_custom_op_symbolic('aten::{name}', fn, opset))")
        return OpDiagnosis(op, True, f"{onnx_name} (opset {since}+)", "symbolic",
                           f"export at opset {since} or more, or use aten_fallback=True at opset {opset}")
    from . import policy

    refused = policy.committed()[1].get(name)
    if refused is not None:  # the fallback would export it, but libopforge_aten refuses it by default
        return OpDiagnosis(op, True, None, "ATen fallback",
                           f"libopforge_aten refuses it by default ({refused}): export with "
                           f"opforge.export(..., aten_fallback=True, allow_aten={{'{name}'}}) and run it with "
                           f"opforge.ort_session(model, allow_aten={{'{name}'}}) only for a model you trust, or "
                           "rewrite it with supported ops")
    return OpDiagnosis(op, True, None, "ATen fallback",
                       "export with opforge.export(..., aten_fallback=True) and run it with "
                       "opforge.ort_session (registers libopforge_aten), or rewrite it with supported ops")


def complex_input_diagnosis(op: str, opset: int) -> OpDiagnosis:
    """An op that torch has a rule for, given a complex tensor its rule cannot read (opforge
    carries complex values as real pairs only through the ops dynamo translates for them)."""
    # (not the ATen fallback: ONNX Runtime has no complex tensors for it to take either)
    return OpDiagnosis(op, True, None, "rewrite",
                       f"it takes a complex tensor, which opforge carries (as real pairs) only through the ops "
                       f"the dynamo exporter translates for complex tensors, and {op} is not one at opset {opset}: "
                       "convert to real values before it (torch.view_as_real, .abs(), .real, .imag), or rewrite "
                       "it with those ops")


def _torchscript_complex_misreads(graph, opset) -> list[str]:
    # What the bridge refuses at export: an op that would read a complex value's real pair
    # as a plain tensor.
    from . import binding, bridge

    found = []
    for node in graph.nodes():
        kind = node.kind()
        if (kind.startswith("aten::") and kind not in found and any(binding.is_complex(v) for v in node.inputs())
                and not bridge.handles_complex(kind, opset)):
            found.append(kind)
    return found


def _torchscript_unsupported(model, args, opset) -> tuple[list[str], list[str]]:
    from torch.onnx._internal.torchscript_exporter import registration, utils

    utils._trigger_symbolic_function_registration()
    registry = registration.registry
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.trace is what the TorchScript exporter uses too
        traced = torch.jit.trace(model, args, check_trace=False, strict=False)
    graph = traced.inlined_graph
    missing = []
    for node in graph.nodes():
        kind = node.kind()
        if kind.startswith(("prim::", "onnx::")) or kind in missing:
            continue
        bridged = bridge_coverage().get(kind.split("::")[-1]) if kind.startswith("aten::") else None
        if not registry.is_registered_op(kind, opset) or (bridged is not None and opset not in bridged):
            missing.append(kind)
    return missing, [k for k in _torchscript_complex_misreads(graph, opset) if k not in missing]


def _dynamo_unsupported(model, args, kwargs, dynamic_shapes) -> list[str]:
    from ..symbolics import dynamo
    from . import fallback_dynamo

    exported = model if isinstance(model, torch.export.ExportedProgram) else torch.export.export(
        model, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes)
    _, ops, others = fallback_dynamo.decompose_keeping_fallbacks(exported, dynamo.translation_table(), strict=False)
    return _op_names([*ops, *others])


def _dynamo_untranslated(decomposed, registry) -> list[str]:
    """The ops of the dynamo exporter's own decomposed program that its ``registry`` does not
    translate: what a failed export's diagnosis lists, read from the program the exporter failed
    on (exporter_cache.recorded_decomposition) instead of exporting and decomposing again
    (measured: D-FINE's failed export, 26 s with the second export, 8 s without)."""
    from . import fallback_dynamo

    ops, others, _ = fallback_dynamo.untranslatable_ops(decomposed, registry.is_registered, strict=False)
    return _op_names([*sorted(ops, key=str), *others.values()])


def _op_names(ops) -> list[str]:
    names = []
    for op in ops:
        s = op._schema
        names.append(s.name + (f".{s.overload_name}" if s.overload_name else ""))
    return names


def diagnose(model, args: tuple, *, dynamo: bool = False, opset_version: Optional[int] = None,
             kwargs: Optional[dict] = None, dynamic_shapes=None) -> Diagnosis:
    """Lists every op of ``model(*args)`` the chosen exporter cannot translate (with opforge's
    rules registered), each with the way to export it."""
    # (opforge's rules are registered: importing this module imported opforge first)
    if not isinstance(args, tuple):
        args = (args,)
    if dynamo:
        opset = opset_version or 18
        ops = _dynamo_unsupported(model, args, kwargs, dynamic_shapes)
    else:
        opset = opset_version or TORCHSCRIPT_OPSETS[-1]
        ops, complex_misreads = _torchscript_unsupported(model, args, opset)
        return Diagnosis("TorchScript", opset, [classify(op, opset) for op in ops]
                         + [complex_input_diagnosis(op, opset) for op in complex_misreads])
    return Diagnosis("dynamo", opset, [classify(op, opset) for op in ops])


class ExportError(RuntimeError):
    """An export failed on ops with no ONNX translation; the message (and .diagnosis) says what to do."""

    def __init__(self, message: str, diagnosis: Optional[Diagnosis] = None):
        super().__init__(message)
        self.diagnosis = diagnosis


_OP_IN_MESSAGE = re.compile(r"(?:operator '|namespace |operator )([\w.]+::[\w.]+)")


def explain_failure(exc: BaseException, model, args, *, dynamo: bool, opset: int, kwargs=None,
                    dynamic_shapes=None, decomposed=None) -> Optional[ExportError]:
    """An ExportError explaining ``exc`` (an exporter failure), or None if it is not about
    unsupported ops. ``decomposed``: what the dynamo exporter recorded before it failed
    ({"program", "registry"} or {"failed"}: exporter_cache.recorded_decomposition), read instead
    of exporting the model again."""
    try:
        if dynamo and decomposed and "program" in decomposed:
            ops = _dynamo_untranslated(decomposed["program"], decomposed["registry"])
            diagnosis = Diagnosis("dynamo", opset, [classify(op, opset) for op in ops])
        elif dynamo and decomposed and decomposed.get("failed"):
            diagnosis = None  # the exporter's decomposition failed: the diagnosis's own, the same, would too
        else:
            diagnosis = diagnose(model, args, dynamo=dynamo, opset_version=opset, kwargs=kwargs,
                                 dynamic_shapes=dynamic_shapes)
    except Exception:  # the diagnosis must never hide the real error
        diagnosis = None
    if diagnosis is None or diagnosis.ok:
        names = _OP_IN_MESSAGE.findall(str(exc))
        if not names:
            return None
        diagnosis = Diagnosis("dynamo" if dynamo else "TorchScript", opset, [classify(n, opset) for n in names])
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    return ExportError(f"opforge.export failed: {first}\n{diagnosis}", diagnosis)
