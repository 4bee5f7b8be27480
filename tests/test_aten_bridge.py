"""opforge's ATen bridge: TorchScript-exporter (dynamo=False) rules derived from the dynamo
exporter's translations. Every bridged op is exported at opsets 11, 17 and 20 and run in ONNX
Runtime against torch (edge values, float32/float64, broadcasting, dynamic axes)."""

import io
import json
import subprocess
import sys

import onnx
import onnxruntime as ort
import pytest
import torch

import opforge
from opforge import coverage
from opforge.symbolics import aten_bridge, aten_rules, aten_samples
from opforge.symbolics.aten_samples import SAMPLES

OPSETS = (11, 17, 20)
CASES = [(name, opset, dtype) for name, s in sorted(SAMPLES.items()) for opset in OPSETS
         for dtype in ((torch.float32, torch.float64) if s.float_only else (torch.int64,))]


def _export(sample, inputs, opset):
    f = io.BytesIO()
    names, dynamic = sample.export(inputs, opset, f)
    return f.getvalue(), names, dynamic


@pytest.mark.parametrize("name,opset,dtype", CASES, ids=[f"{n}-opset{o}-{str(d)[6:]}" for n, o, d in CASES])
def test_round_trip_matches_torch(name, opset, dtype):
    sample = SAMPLES[name]
    _check_round_trip(sample, sample.inputs(dtype), opset, dtype)


def _check_round_trip(sample, inputs, opset, dtype):
    model, names, dynamic = _export(sample, inputs, opset)
    assert onnx.load_from_string(model).opset_import[0].version == opset
    gap = (opset, dtype) in sample.ort_gaps or (None, dtype) in sample.ort_gaps
    if gap:  # ONNX Runtime has no kernel for this dtype: say so, don't count it as a pass
        with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
            ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        return
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    runs = [inputs]
    if dynamic:  # another batch size than the traced one
        runs.append(tuple(torch.cat([t, t.flip(0)]) if n in dynamic else t for n, t in zip(names, inputs)))
    for args in runs:
        got = session.run(None, {n: t.numpy() for n, t in zip(names, args)})
        expected = sample.fn(*args)
        expected = expected if isinstance(expected, (tuple, list)) else (expected,)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            torch.testing.assert_close(torch.from_numpy(g), e, rtol=sample.rtol, atol=sample.atol, equal_nan=True)


# Below 11 (the floor) the coverage table still counts ops: each one it counts is run
# too, and is valid ONNX at that opset (negative axes, per-tensor quantize, ...); the others
# must refuse.
SNAPSHOT = json.loads(coverage.SNAPSHOT.read_text())
OLD_CASES = [(name, opset) for name in sorted(SAMPLES) for opset in (9, 10)]


@pytest.mark.parametrize("name,opset", OLD_CASES, ids=[f"{n}-opset{o}" for n, o in OLD_CASES])
def test_below_opset_11_what_the_table_counts_runs_and_the_rest_refuses(name, opset):
    sample = SAMPLES[name]
    dtype = torch.float32 if sample.float_only else torch.int64
    inputs = sample.inputs(dtype)
    if name not in SNAPSHOT[str(opset)]:
        with pytest.raises((torch.onnx.errors.SymbolicValueError, torch.onnx.errors.UnsupportedOperatorError)):
            _export(sample, inputs, opset)
        return
    model, _, _ = _export(sample, inputs, opset)
    onnx.checker.check_model(onnx.load_from_string(model), full_check=True)
    _check_round_trip(sample, inputs, opset, dtype)


def test_edge_values_are_in_the_elementwise_samples():
    x = aten_samples._edge(torch.float32)
    assert torch.isnan(x).any() and torch.isposinf(x).any() and torch.isneginf(x).any()
    assert ((x == 0) & torch.signbit(x)).any() and (x < 0).any()


def test_bridge_never_shadows_a_torch_rule():
    registry = aten_rules._torch_registry()
    for name in SAMPLES:
        for opset in range(9, 21):
            fn = registry.get_function_group(f"aten::{name}")
            fn = fn.get(opset) if fn is not None else None
            if fn is aten_bridge.symbolic:
                assert not aten_rules.has_torch_rule(name, opset), (name, opset)
    # logit, for one, has a torch rule: it is not bridged anywhere.
    assert "logit" not in SAMPLES and aten_rules.has_torch_rule("logit", 17)


def test_no_op_is_both_bridged_and_excluded():
    overlap = set(SAMPLES) & (set(aten_samples.NOT_BRIDGED) | set(aten_samples.INTERNAL))
    assert not overlap


def test_curated_compositions_hold_the_edge_values():
    # Where dynamo's own translation is wrong (heaviside/sgn/angle at NaN, signbit at -0.0) or
    # missing (hypot, copysign, fmax, fmin), the composition must match torch exactly.
    x = torch.tensor([0.0, -0.0, 1.5, -2.0, float("inf"), float("-inf"), float("nan"), 1e30, -1e-30])
    y = torch.tensor([0.5, -1.0, float("nan"), 0.0, -0.0, 3.0, 2.0, 1e30, float("inf")])
    for name, ref in [("signbit", torch.signbit), ("sgn", torch.sgn), ("angle", torch.angle)]:
        torch.testing.assert_close(aten_bridge.CURATED[name](x), ref(x), equal_nan=True)
    for name, ref in [("heaviside", torch.heaviside), ("hypot", torch.hypot), ("copysign", torch.copysign),
                      ("fmax", torch.fmax), ("fmin", torch.fmin)]:
        torch.testing.assert_close(aten_bridge.CURATED[name](x, y), ref(x, y), equal_nan=True)
    assert torch.signbit(aten_bridge.CURATED["copysign"](x, y)).tolist() == torch.signbit(torch.copysign(x, y)).tolist()


def test_refusal_names_the_op_the_onnx_op_and_the_opset():
    sample = SAMPLES["logcumsumexp"]
    with pytest.raises(torch.onnx.errors.SymbolicValueError) as info:
        _export(sample, sample.inputs(torch.float32), 10)
    text = str(info.value)
    assert "aten::logcumsumexp" in text and "CumSum" in text and "opset 11" in text and "opset 10" in text


def test_models_without_bridged_ops_do_not_load_the_bridge():
    # The bridge's cost (torchlib's registry, torch.export) is paid only by models that use it.
    code = (
        "import io, time, torch, opforge\n"
        "from opforge.symbolics import aten_bridge\n"
        "m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())\n"
        "torch.onnx.export(m, (torch.randn(2, 4),), io.BytesIO(), dynamo=False, opset_version=17)\n"
        "assert aten_bridge.torchlib_registry.cache_info().currsize == 0\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_export_time_is_cached_per_signature():
    sample = SAMPLES["expm1"]
    inputs = sample.inputs(torch.float32)
    _export(sample, inputs, 17)  # torch.export + translation, once per signature
    misses = aten_bridge.translate.cache_info().misses
    _export(sample, inputs, 17)
    _export(sample, inputs, 20)  # another opset: the same translation, lowered again
    assert aten_bridge.translate.cache_info().misses == misses
