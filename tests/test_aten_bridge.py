"""opforge's ATen bridge: TorchScript-exporter (dynamo=False) rules derived from the dynamo
exporter's translations. Every bridged op is exported at opsets 11, 17 and 20 and run in ONNX
Runtime against torch (edge values, float32/float64, broadcasting, dynamic axes)."""

import io
import json
import math
import os

import onnx
import onnxruntime as ort
import pytest
import torch

import opforge
from opforge.aten import binding, bridge, compositions, coverage, errors, rules, samples, translation
from opforge.aten.samples import SAMPLES

from preloaded_python import run_python
from helpers import Lambda

OPSETS = (11, 17, 20)
#: The quick tier (`-m "not slow"`) runs these samples, one of each way a call reaches ONNX:
#: torchlib's translation as is, a curated composition, torch's decompositions where the direct
#: form needs a newer op (tril: Trilu), opforge's lowerings for older opsets (einsum, nll_loss),
#: a scatter composition, complex values as real pairs, integer inputs, a dynamic dim kept
#: dynamic. Every other sample is in the full suite (CI).
QUICK = {"logaddexp", "heaviside", "tril", "einsum", "nll_loss", "scatter_reduce", "fft_rfft", "__lshift__",
         "take_along_dim"}


def _tier(name):
    # one worker runs every case of a sample, so its translations are made once (tests/conftest.py)
    return (pytest.mark.xdist_group(f"aten:{name}"),) + (() if name in QUICK else (pytest.mark.slow,))


CASES = [pytest.param(name, opset, dtype, marks=_tier(name), id=f"{name}-opset{opset}-{str(dtype)[6:]}")
         for name, s in sorted(SAMPLES.items()) for opset in OPSETS
         for dtype in ((torch.float32, torch.float64) if s.float_only else (torch.int64,))]


def _export(sample, inputs, opset):
    f = io.BytesIO()
    names, dynamic = sample.export(inputs, opset, f)
    return f.getvalue(), names, dynamic


@pytest.mark.parametrize("name,opset,dtype", CASES)
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
OLD_CASES = [pytest.param(name, opset, marks=_tier(name), id=f"{name}-opset{opset}")
             for name in sorted(SAMPLES) for opset in (9, 10)]


@pytest.mark.parametrize("name,opset", OLD_CASES)
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


def test_the_quick_tier_samples_exist():
    assert QUICK <= set(SAMPLES), QUICK - set(SAMPLES)


def test_edge_values_are_in_the_elementwise_samples():
    x = samples._edge(torch.float32)
    assert torch.isnan(x).any() and torch.isposinf(x).any() and torch.isneginf(x).any()
    assert ((x == 0) & torch.signbit(x)).any() and (x < 0).any()


def test_bridge_never_shadows_a_torch_rule():
    registry = rules._torch_registry()
    for name in SAMPLES:
        for opset in range(9, 21):
            fn = registry.get_function_group(f"aten::{name}")
            fn = fn.get(opset) if fn is not None else None
            if fn is bridge.symbolic:
                assert not rules.has_torch_rule(name, opset), (name, opset)
    # logit, for one, has a torch rule: it is not bridged anywhere.
    assert "logit" not in SAMPLES and rules.has_torch_rule("logit", 17)


def test_no_op_is_both_bridged_and_excluded():
    excluded = [samples.NOT_BRIDGED, samples.INTERNAL, samples.TRACED_AS, samples.NEITHER_EXPORTER]
    for k, group in enumerate(excluded):
        assert not set(SAMPLES) & set(group)
        for other in excluded[k + 1:]:
            assert not set(group) & set(other)


def test_curated_compositions_hold_the_edge_values():
    # Where dynamo's own translation is wrong (heaviside/sgn/angle at NaN, signbit at -0.0) or
    # missing (hypot, copysign, fmax, fmin), the composition must match torch exactly.
    x = torch.tensor([0.0, -0.0, 1.5, -2.0, float("inf"), float("-inf"), float("nan"), 1e30, -1e-30])
    y = torch.tensor([0.5, -1.0, float("nan"), 0.0, -0.0, 3.0, 2.0, 1e30, float("inf")])
    for name, ref in [("signbit", torch.signbit), ("sgn", torch.sgn), ("angle", torch.angle)]:
        torch.testing.assert_close(compositions.CURATED[name](x), ref(x), equal_nan=True)
    for name, ref in [("heaviside", torch.heaviside), ("hypot", torch.hypot), ("copysign", torch.copysign),
                      ("fmax", torch.fmax), ("fmin", torch.fmin)]:
        torch.testing.assert_close(compositions.CURATED[name](x, y), ref(x, y), equal_nan=True)
    assert torch.signbit(compositions.CURATED["copysign"](x, y)).tolist() == torch.signbit(torch.copysign(x, y)).tolist()


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
        "from opforge import exporter_cache\n"
        "m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())\n"
        "torch.onnx.export(m, (torch.randn(2, 4),), io.BytesIO(), dynamo=False, opset_version=17)\n"
        "assert exporter_cache.built_registries() == []\n"
        "print('ok')\n"
    )
    out = run_python(["-c", code], cwd="/")
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_export_time_is_cached_per_signature():
    sample = SAMPLES["expm1"]
    inputs = sample.inputs(torch.float32)
    _export(sample, inputs, 17)  # torch.export + translation, once per signature
    misses = translation.translate.cache_info().misses
    _export(sample, inputs, 17)
    _export(sample, inputs, 20)  # another opset: the same translation, lowered again
    assert translation.translate.cache_info().misses == misses


def test_translations_persist_across_processes_in_the_disk_cache(tmp_path):
    # OPFORGE_ATEN_CACHE_DIR: the second process reads the translation instead of running
    # torch.export (it never even loads torchlib) and writes the same model.
    code = (
        "import hashlib, io, torch, opforge\n"
        "from opforge import exporter_cache\n"
        "from opforge.aten.samples import SAMPLES\n"
        "s = SAMPLES['logaddexp']; f = io.BytesIO(); s.export(s.inputs(torch.float32), 13, f)\n"
        "print(len(exporter_cache.built_registries()), hashlib.sha256(f.getvalue()).hexdigest())\n"
    )
    env = dict(os.environ, OPFORGE_ATEN_CACHE_DIR=str(tmp_path / "cache"))
    runs = [run_python(["-c", code], cwd="/", env=env) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr[-2000:]
    (loaded_first, model_first), (loaded_second, model_second) = (r.stdout.split() for r in runs)
    assert (loaded_first, loaded_second) == ("1", "0") and model_first == model_second
    assert len(list((tmp_path / "cache").glob("*.onnx"))) == 1


def test_disk_cache_keeps_refusals_skips_inexact_keys_and_misses_on_damage(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_ATEN_CACHE_DIR", str(tmp_path))
    cache = translation.DiskCache.from_env()
    call = binding.Call("aten::expm1", (binding.TensorInfo(torch.float32, (None, 3)),))
    key = cache.key(call, translation.Form.DIRECT)
    assert key != cache.key(call, translation.Form.DECOMPOSED)
    assert key != cache.key(binding.Call("aten::expm1", (binding.TensorInfo(torch.float64, (None, 3)),)),
                            translation.Form.DIRECT)
    cache.put(key, errors.BridgeError("aten::expm1: refused"))
    found = cache.get(key)
    assert isinstance(found, errors.BridgeError) and str(found) == "aten::expm1: refused"
    (tmp_path / f"{key}.refused").unlink()
    (tmp_path / f"{key}.onnx").write_bytes(b"not a model")
    assert cache.get(key) is None
    # a constant without an exact text form (an object's repr holds its address) is never kept
    assert cache.key(binding.Call("aten::expm1", (object(),)), translation.Form.DIRECT) is None
    assert not list(tmp_path.glob(".part-*"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_erfcx_and_log_ndtr_compositions_hold_the_tails(dtype):
    # dynamo's exp(x²)·erfc(x) and log(ndtr(x)) give NaN at ±inf and lose the tails; the curated
    # compositions stay within float32's precision everywhere (the fit's 1.2e-7 bound in float64).
    x = torch.cat([torch.linspace(-40, 40, 16001, dtype=torch.float64),
                   torch.tensor([1e3, 1e30, -1e30, math.inf, -math.inf, math.nan, 0.0, -0.0, 1e-30, -1e-30],
                                dtype=torch.float64)]).to(dtype)
    truth_dtype = torch.float64
    for name, ref in [("special_erfcx", torch.special.erfcx), ("special_log_ndtr", torch.special.log_ndtr)]:
        got = compositions.CURATED[name](x)
        assert got.dtype == dtype
        # atol: log_ndtr's right tail (-ndtr(-x)) underflows into subnormals, which carry no precision
        torch.testing.assert_close(got, ref(x), rtol=2e-5 if dtype == torch.float32 else 2e-7,
                                   atol=torch.finfo(dtype).tiny, equal_nan=True)
        truth = ref(x.to(truth_dtype))
        finite = torch.isfinite(truth) & (truth.abs() > 1e-30)
        rel = ((got.to(truth_dtype) - truth).abs() / truth.abs())[finite]
        own = ((ref(x).to(truth_dtype) - truth).abs() / truth.abs())[finite]  # torch's own error in dtype
        assert rel.max() <= max(2 * own.max().item(), 2e-7), (name, rel.max().item(), own.max().item())


def _single_op_sample(name):
    # a call of the public function, method or alias with a float input (and a second one for
    # the binary aliases)
    x, y = torch.rand(3, 4) * 0.8 + 0.1, torch.rand(4) * 0.8 + 0.1
    calls = {
        "arctan2": lambda: (torch.arctan2, (x, y)), "not_equal": lambda: (torch.not_equal, (x, y)),
        "special_xlogy": lambda: (torch.special.xlogy, (x, y)), "ger": lambda: (torch.ger, (x[0], y)),
        "special_gammainc": lambda: (torch.special.gammainc, (x, y)),
        "special_gammaincc": lambda: (torch.special.gammaincc, (x, y)),
        "special_polygamma": lambda: (lambda t: torch.special.polygamma(1, t), (x,)),
        "special_multigammaln": lambda: (lambda t: torch.special.multigammaln(t + 2, 2), (x,)),
        "special_logsumexp": lambda: (lambda t: torch.special.logsumexp(t, 1), (x,)),
        "special_logit": lambda: (lambda t: torch.special.logit(t, 1e-3), (x,)),
        "clip": lambda: (lambda t: torch.clip(t, 0.2, 0.5), (x,)),
        "moveaxis": lambda: (lambda t: torch.moveaxis(t, 0, 1), (x,)),
        "swapaxes": lambda: (lambda t: torch.swapaxes(t, 0, 1), (x,)),
        "swapdims": lambda: (lambda t: torch.swapdims(t, 0, 1), (x,)),
        "row_stack": lambda: (lambda t: torch.row_stack([t, t]), (x,)),
        "linalg_matmul": lambda: (torch.linalg.matmul, (x, x.T)),
        "matrix_power": lambda: (lambda t: torch.matrix_power(t, 2), (x[:, :3],)),
        "rnn_tanh_cell": lambda: (lambda t: torch.rnn_tanh_cell(t, x[:, :3], x[:3], x[:3, :3]), (x,)),
        "rnn_relu_cell": lambda: (lambda t: torch.rnn_relu_cell(t, x[:, :3], x[:3], x[:3, :3]), (x,)),
        "gru_cell": lambda: (lambda t: torch.gru_cell(t, x[:, :1], x[:3], x[:3, :1]), (x,)),
        "conj": lambda: (lambda t: torch.view_as_real(torch.complex(t, t).conj().resolve_conj()), (x,)),
    }
    if name in calls:
        return calls[name]()
    if name.startswith("special_"):
        return getattr(torch.special, name[len("special_"):]), (x,)
    return getattr(torch, name), (x,)


@pytest.mark.parametrize("name", sorted(samples.TRACED_AS))
def test_aliases_are_traced_as_the_op_they_name(name):
    fn, args = _single_op_sample(name)
    graph = torch.jit.trace(Lambda(fn), args, check_trace=False).graph
    # in-place forms (gru_cell records sigmoid_/tanh_) count as the op they update with
    recorded = {n.kind()[len("aten::"):].rstrip("_") for n in graph.nodes() if n.kind().startswith("aten::")}
    assert name not in recorded
    assert {op.strip() for op in samples.TRACED_AS[name].split(",")} <= recorded, recorded


def test_list_results_inside_a_model_at_opset_11():
    # Tensor[] results (hsplit, unbind_copy, gradient) used by later ops in one model
    model = Lambda(lambda x: torch.hsplit(x, 2)[1] * torch.gradient(x, dim=0)[0][:, 2:]
                   + torch.stack(torch.unbind_copy(x, 1)[:2], 1))
    x = torch.randn(5, 4)
    f = io.BytesIO()
    torch.onnx.export(model, (x,), f, dynamo=False, opset_version=11, input_names=["x"],
                      dynamic_axes={"x": {0: "n"}})
    session = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
    for t in (x, torch.randn(7, 4)):
        torch.testing.assert_close(torch.from_numpy(session.run(None, {"x": t.numpy()})[0]), model(t))


def test_an_int_argument_never_resolves_to_an_out_overload():
    # squeeze_copy(x, 1): by the time symbolics run, 1 is a 0-d tensor constant, and TorchScript's
    # schema lookup then names squeeze_copy.out (whose dynamo translation fails)
    graph = torch.jit.trace(Lambda(lambda x: torch.squeeze_copy(x, 1)), (torch.rand(3, 1, 4),)).graph
    assert any(n.kind() == "aten::squeeze_copy" for n in graph.nodes())
    f = io.BytesIO()
    x = torch.rand(3, 1, 4)
    torch.onnx.export(Lambda(lambda x: torch.squeeze_copy(x, 1)), (x,), f, dynamo=False, opset_version=17,
                      input_names=["x"])
    assert "Squeeze" in [n.op_type for n in onnx.load_from_string(f.getvalue()).graph.node]
    got = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    torch.testing.assert_close(torch.from_numpy(got), x[:, 0])


def _complex_chain(fn, opset, *inputs):
    f = io.BytesIO()
    torch.onnx.export(Lambda(fn), inputs, f, dynamo=False, opset_version=opset)
    session = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)})[0]


@pytest.mark.parametrize("opset", [11, 20])
def test_complex_values_cross_torch_ruled_ops_as_real_pairs(opset):
    # mul, cat, sum, matmul, numpy_T, _conj, size: ops torch has rules for, which would read the
    # real pair as a real tensor; on complex tensors they go to the bridge
    a, b = torch.randn(3, 8), torch.randn(3, 8)

    def fn(re, im):
        z = torch.complex(re, im)
        power = (z * z.conj()).real
        gram = (z @ z.T.conj()).abs()
        halves = torch.view_as_real(torch.cat([z, z.conj()], -1).sum(-1))
        return power.sum(-1) + gram.sum(-1) + halves.sum(-1) + z.abs()[:, 0] * z.shape[-1]

    torch.testing.assert_close(torch.from_numpy(_complex_chain(fn, opset, a, b)), fn(a, b), rtol=1e-4, atol=1e-4)


def test_complex_values_that_torch_rules_would_misread_are_refused():
    # The pair must never reach an op that would read it as a real tensor (a silently wrong
    # model); the refusal names both ops.
    a = torch.randn(2, 64)
    window = torch.hann_window(16)
    cases = [
        (lambda x: torch.stft(x, 16, 4, window=window, return_complex=True).unsqueeze(0).abs(),
         "aten::unsqueeze takes the complex result of aten::stft"),
        (lambda x: torch.complex(x, x), "the model returns the complex result of aten::complex"),
        (lambda x: torch.fft.rfft(x).exp().abs(), "aten::exp takes the complex result of aten::fft_rfft"),
    ]
    for fn, message in cases:
        with pytest.raises(torch.onnx.errors.SymbolicValueError, match=message):
            torch.onnx.export(Lambda(fn), (a,), io.BytesIO(), dynamo=False, opset_version=17)
    with pytest.raises(torch.onnx.errors.SymbolicValueError, match=r"aten::abs: a model input is a complex tensor"):
        torch.onnx.export(Lambda(torch.abs), (torch.complex(a, a),), io.BytesIO(), dynamo=False, opset_version=17)


_CARRIER_CALLS = {
    "abs": lambda z, w: z.abs(), "add": lambda z, w: z + w, "sub": lambda z, w: z - w, "mul": lambda z, w: z * w,
    "div": lambda z, w: z / w, "neg": lambda z, w: -z, "reciprocal": lambda z, w: z.reciprocal(),
    "sum": lambda z, w: z.sum(1), "mean": lambda z, w: z.mean(1), "matmul": lambda z, w: z @ w.transpose(0, 1),
    "slice": lambda z, w: z[:, 1:5], "transpose": lambda z, w: z.transpose(0, 1), "permute": lambda z, w: z.permute(1, 0),
    "reshape": lambda z, w: z.reshape(-1), "view": lambda z, w: z.view(6, 4), "flatten": lambda z, w: z.flatten(),
    "squeeze": lambda z, w: z[:1].squeeze(0), "flip": lambda z, w: z.flip(1), "roll": lambda z, w: z.roll(3, 1),
    "cat": lambda z, w: torch.cat([z, w], 1), "stack": lambda z, w: torch.stack([z, w], -1),
    "clone": lambda z, w: z.clone(), "contiguous": lambda z, w: z.t().contiguous(),
    "stft": lambda z, w: torch.stft(z.real.reshape(-1), 8, 2, window=torch.hann_window(8, dtype=z.real.dtype),
                                    return_complex=True),
    "_conj": lambda z, w: z.conj().resolve_conj(), "resolve_conj": lambda z, w: z.conj().resolve_conj(),
    "resolve_neg": lambda z, w: torch.resolve_neg(z),
    "t": lambda z, w: z.t(), "numpy_T": lambda z, w: z.T, "size": lambda z, w: z.abs() * z.shape[-1],
}


@pytest.mark.parametrize("name", bridge.COMPLEX_CARRIERS)
def test_each_op_torch_rules_that_carries_complex_values_matches_torch(name):
    # each op of COMPLEX_CARRIERS is recorded on complex tensors and exports to a model that
    # gives torch's values (opset 11: the oldest the issue asks for)
    call = _CARRIER_CALLS[name]
    a, b = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)

    def fn(re, im):
        out = call(torch.complex(re, im), torch.complex(im, re))
        return torch.view_as_real(out) if out.is_complex() else out

    graph = torch.jit.trace(Lambda(fn), (a, b), check_trace=False).graph
    assert f"aten::{name}" in {n.kind() for n in graph.nodes()}
    torch.testing.assert_close(torch.from_numpy(_complex_chain(fn, 11, a, b)), fn(a, b), rtol=1e-6, atol=1e-6)


def test_torch_own_index_add_rule_is_wrong_with_a_repeated_index():
    # Why every index_add goes to the bridge (bridge._TORCH_RULE_INVALID_FOR): without
    # opforge, torch's rule keeps one of the rows that share an index. If a torch upgrade fixes
    # it, this fails, and the override can go.
    code = (
        "import io, json, warnings, torch, onnxruntime as ort\n"
        "warnings.simplefilter('ignore')\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x, s):\n"
        "        return x.index_add(1, torch.tensor([0, 2, 0]), s)\n"
        "x, s = torch.zeros(2, 4), torch.ones(2, 3)\n"
        "f = io.BytesIO()\n"
        "torch.onnx.export(M(), (x, s), f, dynamo=False, opset_version=17)\n"
        "sess = ort.InferenceSession(f.getvalue(), providers=['CPUExecutionProvider'])\n"
        "got = sess.run(None, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), (x, s))})[0]\n"
        "print(json.dumps([got[0].tolist(), M()(x, s)[0].tolist()]))\n"
    )
    out = run_python(["-c", code], cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    torch_alone, eager = json.loads(out.stdout.strip().splitlines()[-1])
    assert eager == [2.0, 0.0, 1.0, 0.0]  # both rows for index 0 added
    assert torch_alone == [1.0, 0.0, 1.0, 0.0]  # one of them kept
    sample = SAMPLES["index_add"]
    _check_round_trip(sample, sample.inputs(torch.float32), 17, torch.float32)  # with opforge: right


def _clear_bridge_caches():
    translation._translate_cached.cache_clear()
    translation._traced.cache_clear()
    translation._core_decomposed.cache_clear()
    bridge.lowered.cache_clear()


def test_a_dynamic_dim_fixed_in_the_translation_is_refused(monkeypatch):
    # torch.export keeps take_along_dim's batch a SymInt but fixes its value, and torch's
    # decomposition expands to that size: a model that would be wrong for every other batch
    # (a batch of 1 silently broadcast to the traced size). Without opforge's composition the
    # bridge compares the translations at two sizes and refuses.
    monkeypatch.delitem(compositions.CURATED, "take_along_dim")
    # this translation must neither come from nor go into the suite's shared translation cache
    monkeypatch.delenv("OPFORGE_ATEN_CACHE_DIR", raising=False)
    _clear_bridge_caches()
    fn = lambda x, i: torch.take_along_dim(x, i, 1)
    x, i = torch.arange(12).reshape(3, 4), torch.tensor([[0], [3], [1]])
    try:
        with pytest.raises(torch.onnx.errors.SymbolicValueError, match="a dynamic dim of its inputs is fixed"):
            torch.onnx.export(Lambda(fn), (x, i), io.BytesIO(), dynamo=False, opset_version=17, input_names=["x", "i"],
                              dynamic_axes={"x": {0: "batch"}, "i": {0: "batch"}})
    finally:
        _clear_bridge_caches()  # the refusal is cached
    # chain_matmul's batch is fixed the same way, but its translation does not use it: exported
    sample = SAMPLES["chain_matmul"]
    _check_round_trip(sample, sample.inputs(torch.float32), 17, torch.float32)


@pytest.mark.parametrize("opset", [11, 17, 20])
@pytest.mark.parametrize("dim", [1, -1, 0, None])
def test_take_along_dim_broadcasts_dynamic_batches_at_run_time(dim, opset):
    # x and indices with separate dynamic batches: each broadcasts against the other (a batch
    # of 1 to the other's) at run time, as in torch
    fn = lambda x, i: torch.take_along_dim(x, i, dim)
    x = torch.arange(12.).reshape(3, 4)
    i = {0: torch.tensor([[0, 2, 1, 2]]), None: torch.tensor([[0, 11], [3, 5], [1, 1]])}.get(dim, torch.tensor([[0], [3], [1]]))
    f = io.BytesIO()
    torch.onnx.export(Lambda(fn), (x, i), f, dynamic_axes={"x": {0: "xb"}, "i": {0: "ib"}}, dynamo=False,
                      opset_version=opset, input_names=["x", "i"])
    session = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
    gen = torch.Generator().manual_seed(opset)
    checked = 0
    for xb, ib in [(3, 3), (1, 3), (5, 1), (1, 1), (6, 6)]:
        if dim == 0 and xb != ib and 1 not in (xb, ib):
            continue
        xx = torch.randn(xb, 4, dtype=torch.float64, generator=gen).float()
        high = xb if dim == 0 else (xb * 4 if dim is None else 4)
        ii = torch.randint(0, high, (ib, i.shape[1]), generator=gen)
        expected = torch.take_along_dim(xx, ii, dim)
        out = session.run(None, {"x": xx.numpy(), "i": ii.numpy()})[0]
        assert out.shape == tuple(expected.shape), (xb, ib)
        torch.testing.assert_close(torch.from_numpy(out), expected, rtol=0, atol=0)
        checked += 1
    assert checked >= 4


def test_the_forms_of_one_call_share_its_torch_export(monkeypatch):
    # tril at opset 11: torchlib's Trilu needs opset 14, so the decomposed form is translated too;
    # both start from one torch.export of the op.
    monkeypatch.delenv("OPFORGE_ATEN_CACHE_DIR", raising=False)
    translation._translate_cached.cache_clear()
    translation._traced.cache_clear()
    bridge.lowered.cache_clear()
    traced, forms = [], []
    real_export, real_translate = torch.export.export, translation._translate
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: traced.append(1) or real_export(*a, **k))
    monkeypatch.setattr(translation, "_translate", lambda call, form: forms.append(form) or real_translate(call, form))
    sample = SAMPLES["tril"]
    _check_round_trip(sample, sample.inputs(torch.float32), 11, torch.float32)
    assert forms[:2] == [translation.Form.DIRECT, translation.Form.DECOMPOSED] and len(traced) == 1


@pytest.mark.parametrize("no_onnx_function", [True, False])
def test_a_translation_torchlib_has_no_function_for_is_refused_at_the_first_size_hint(monkeypatch, no_onnx_function):
    # Another size hint traces the same ops: a missing ONNX function fails at every hint, so the
    # bridge stops at the first. Any other failure (torch.export refusing a size, say) may be
    # the size's: every hint is tried, and the last one's error reported.
    from torch.onnx._internal.exporter._errors import DispatchError

    call = binding.Call("aten::fft_ihfftn", (binding.TensorInfo(torch.float32, (None, 4, 6)), (4, 6), (1, 2), None))
    tried = []

    def failing(call, fn, form, hint, dynamic, must_stay_dynamic):
        tried.append(hint)
        cause = DispatchError(f"No ONNX function found for aten._fft_r2c at {hint}") if no_onnx_function else \
            RuntimeError(f"the size {hint} does not fit")
        raise RuntimeError("exporting failed") from cause

    monkeypatch.setattr(translation, "_exported", failing)
    with pytest.raises(errors.BridgeError) as refused:
        translation._translate(call, translation.Form.DIRECT)
    if no_onnx_function:
        assert tried == [binding.DYNAMIC_DIM_HINT]
        assert str(refused.value) == ("aten::fft_ihfftn: the dynamo exporter cannot translate it either "
                                      f"(DispatchError: No ONNX function found for aten._fft_r2c at {tried[0]})")
    else:
        assert len(tried) > 2 and tried[0] == binding.DYNAMIC_DIM_HINT and len(set(tried)) == len(tried)
        assert str(refused.value).endswith(f"(RuntimeError: the size {tried[-1]} does not fit)")


@pytest.mark.parametrize("name", ["expm1", "logaddexp", "heaviside", "__lshift__", "einsum", "tril", "native_dropout",
                                  "fft_fftshift"])
def test_a_program_in_the_registrys_terms_skips_the_retrace_and_exports_the_same_bytes(name, monkeypatch):
    # translation._program_to_ir: the exporter's decomposition only retraces such a program; the
    # models are the same bytes with it skipped (and with it run: _in_registry_terms answering False)
    monkeypatch.delenv("OPFORGE_ATEN_CACHE_DIR", raising=False)
    sample = SAMPLES[name]
    dtype = torch.float32 if sample.float_only else torch.int64
    retraces, real = [], torch.export.ExportedProgram.run_decompositions
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions",
                        lambda *a, **k: retraces.append(1) or real(*a, **k))
    models, counts = {}, {}
    for retrace in (False, True):
        if retrace:
            monkeypatch.setattr(translation, "_in_registry_terms", lambda p, r: False)
        _clear_bridge_caches()
        retraces.clear()
        models[retrace] = {opset: _export(sample, sample.inputs(dtype), opset)[0] for opset in (11, 17)}
        counts[retrace] = len(retraces)
    _clear_bridge_caches()
    assert models[False] == models[True]
    # ops torchlib translates as they are: fewer retraces (native_dropout: with the getitem of its two
    # outputs; fft_fftshift: with a dynamic dim's size and the arithmetic on it)
    if name in ("expm1", "logaddexp", "native_dropout", "fft_fftshift"):
        assert counts[False] < counts[True], counts
