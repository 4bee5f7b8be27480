"""opforge.diagnose and the errors of opforge.export: which op, ATen or not, ONNX equivalent or
not, and which way applies (symbolic, custom op, ATen fallback, or a rewrite)."""

import io

import pytest
import torch

import opforge
from opforge.aten.diagnosis import classify

from helpers import Lambda


@torch.library.custom_op("opforge_test::scale", mutates_args=())
def _scale(x: torch.Tensor) -> torch.Tensor:
    return x * 3


@_scale.register_fake
def _(x):
    return torch.empty_like(x)


class Unsupported(torch.nn.Module):
    def forward(self, x):
        return torch.cummax(x, 1)[0] + torch.asinh(x) + torch.ops.opforge_test.scale(x)


def test_classify_follows_the_flowchart():
    fallback = classify("aten::cummax", 17)
    assert (fallback.is_aten, fallback.onnx_equivalent, fallback.way) == (True, None, "ATen fallback")
    assert "aten_fallback=True" in fallback.advice
    ruled = classify("aten::asinh", 17)
    assert (ruled.is_aten, ruled.way) == (True, "symbolic") and ruled.onnx_equivalent.startswith("Asinh")
    assert "opforge registers a symbolic" in ruled.advice
    later = classify("aten::bitwise_xor", 16)
    assert later.way == "symbolic" and "raise the opset to 18" in later.advice
    assert "bool tensors only" in later.advice  # bitwise_xor on bools exports at 16 too
    custom = classify("mylib::fancy", 17)
    assert (custom.is_aten, custom.onnx_equivalent, custom.way) == (False, None, "custom op")
    lowered = classify("aten::celu", 11)  # torch has Celu from 12; at 11 opforge's bridge lowers it
    assert lowered.way == "symbolic" and "ATen bridge" in lowered.onnx_equivalent
    assert "raise the opset" not in lowered.advice
    too_old = classify("aten::logcumsumexp", 10)  # CumSum is opset 11: the advice is the opset
    assert too_old.way == "symbolic" and "raise the opset to 11" in too_old.advice


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_diagnose_lists_every_unsupported_op(dynamo):
    d = opforge.diagnose(Unsupported(), (torch.randn(3, 4),), dynamo=dynamo, opset_version=17 if not dynamo else 18)
    by_op = {x.op: x for x in d.unsupported}
    assert set(by_op) == {"aten::cummax", "opforge_test::scale"}  # asinh: opforge's rule covers it
    assert by_op["aten::cummax"].way == "ATen fallback"
    assert by_op["opforge_test::scale"].way == "custom op" and not by_op["opforge_test::scale"].is_aten
    text = str(d)
    assert "2 op(s) have no ONNX translation" in text and "ATen op: no" in text


def test_diagnose_ok_model():
    d = opforge.diagnose(torch.nn.Linear(3, 2), (torch.randn(1, 3),))
    assert d.ok and "every op exports" in str(d)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_export_failure_carries_the_diagnosis(dynamo):
    with pytest.raises(opforge.ExportError) as info:
        opforge.export(Unsupported(), (torch.randn(3, 4),), dynamo=dynamo)
    message = str(info.value)
    assert "aten::cummax: ATen op: yes; ONNX equivalent: none; way: ATen fallback" in message
    assert "opforge_test::scale: ATen op: no; ONNX equivalent: none; way: custom op" in message
    assert info.value.diagnosis is not None and info.value.__cause__ is not None


def test_op_declared_in_cpp_without_spec_is_recognised():
    """An op whose package never registered its spec (e.g. a forgotten import) is named as
    such, not as a generic custom op to write."""
    lib = torch.library.Library("opforge_diag_test", "DEF")  # declared, no spec
    lib.define("lonely(Tensor x) -> Tensor")
    d = opforge.aten.diagnosis.classify("opforge_diag_test::lonely", 18)
    assert d.way == "custom op" and "no opforge spec is registered" in d.advice and "register_op" in d.advice
    assert "no opforge spec" not in opforge.aten.diagnosis.classify("mylib::never_declared", 18).advice
    assert "no opforge spec" not in opforge.aten.diagnosis.classify("opforge::my_add", 18).advice


def test_diagnose_knows_the_bridge_coverage():
    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.logcumsumexp(x, 1) + torch.hypot(x, x)

    x = torch.randn(2, 3)
    assert opforge.diagnose(Model(), (x,), opset_version=17).ok
    low = opforge.diagnose(Model(), (x,), opset_version=10)
    assert [d.op for d in low.unsupported] == ["aten::logcumsumexp", "aten::hypot"]
    text = str(low)
    assert "opforge's ATen bridge (opset 11+)" in text and "raise the opset to 11" in text


def test_diagnose_knows_which_ops_carry_complex_values():
    class Spectrum(torch.nn.Module):
        def forward(self, x):
            return torch.fft.rfft(x).abs()

    class Exp(torch.nn.Module):
        def forward(self, x):
            return torch.fft.rfft(x).exp().abs()

    x = torch.randn(2, 16)
    assert opforge.diagnose(Spectrum(), (x,), opset_version=11).ok
    found = opforge.diagnose(Exp(), (x,), opset_version=11)
    # aten::exp has a torch rule, which would read the complex value's real pair as a tensor
    assert [(d.op, d.way) for d in found.unsupported] == [("aten::exp", "rewrite")]
    assert "complex tensor" in str(found) and "view_as_real" in str(found)
    with pytest.raises(torch.onnx.errors.SymbolicValueError, match="aten::exp takes the complex result"):
        torch.onnx.export(Exp(), (x,), io.BytesIO(), dynamo=False, opset_version=11)


def _counting(monkeypatch, owner, name) -> list:
    calls, original = [], getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)
    monkeypatch.setattr(owner, name, counted)
    return calls


def test_a_failed_dynamo_export_is_explained_from_the_program_the_exporter_failed_on(monkeypatch):
    # the diagnosis reads the exporter's decomposed program (exporter_cache.recorded_decomposition):
    # the model is captured once, by the exporter, and the ops listed are those opforge.diagnose finds
    expected = [x.op for x in opforge.diagnose(Unsupported(), (torch.randn(3, 4),), dynamo=True).unsupported]
    captures = _counting(monkeypatch, torch.export, "export")
    with pytest.raises(opforge.ExportError) as info:
        opforge.export(Unsupported(), (torch.randn(3, 4),), dynamo=True)
    assert len(captures) == 1
    assert [x.op for x in info.value.diagnosis.unsupported] == expected == ["aten::cummax", "opforge_test::scale"]


@pytest.mark.parametrize("fn,rounds,kept", [
    (lambda x: torch.cummax(x, 1), 1, ["aten.cummax.default"]),  # found as itself: nothing to plan again
    (lambda x: torch.frexp(x), 2, ["aten.frexp.Tensor"]),  # found as the source of prims.frexp: kept, then checked
], ids=["cummax", "frexp"])
def test_fallback_planning_decomposes_again_only_for_ops_found_as_sources(monkeypatch, fn, rounds, kept):
    from opforge.aten import fallback_dynamo
    from opforge.symbolics import dynamo

    exported = torch.export.export(Lambda(fn), (torch.randn(3, 4),))
    decompositions = _counting(monkeypatch, torch.export.ExportedProgram, "run_decompositions")
    program, fallbacks = fallback_dynamo.decompose_keeping_fallbacks(exported, dynamo.translation_table())
    assert len(decompositions) == rounds and [str(op) for op in fallbacks] == kept
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert set(kept) <= targets and not any(t.startswith("prims.") for t in targets)


def test_a_dynamo_export_whose_decomposition_fails_is_not_decomposed_again(monkeypatch):
    # (the diagnosis would decompose the same program with the same table: it raises the exporter's error at once)
    from torch.onnx._internal.exporter import _fx_passes

    def failing(program, registry):
        raise RuntimeError("Failed to decompose: a stand-in for torch's failure")
    monkeypatch.setattr(_fx_passes, "decompose_with_registry", failing)
    captures = _counting(monkeypatch, torch.export, "export")
    with pytest.raises(Exception, match="Failed to decompose") as info:
        opforge.export(Unsupported(), (torch.randn(3, 4),), dynamo=True)
    assert len(captures) == 1 and not isinstance(info.value, opforge.ExportError)
