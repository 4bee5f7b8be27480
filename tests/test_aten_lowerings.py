"""The ATen bridge below the opset of the ONNX op dynamo's translation needs: torch's
decompositions, opforge's compositions (aten_lowerings), and the node adapters they rely on.
Each is run in ONNX Runtime against torch (the per-op samples are in test_aten_bridge)."""

import io
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F

import opforge  # noqa: F401  (registers the bridge)
from opforge.aten import bridge, downgrade, lowerings

from helpers import Lambda


def _run(fn, inputs, opset, dynamic_batch=False):
    names = [f"in{k}" for k in range(len(inputs))]
    f = io.BytesIO()
    axes = {names[0]: {0: "batch"}} if dynamic_batch else None
    torch.onnx.export(Lambda(fn), tuple(inputs), f, dynamo=False, opset_version=opset, input_names=names,
                      dynamic_axes=axes)
    session = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
    return [torch.from_numpy(o) for o in session.run(None, {n: t.numpy() for n, t in zip(names, inputs)})]


# ---- scatter_reduce: opforge's one-hot composition (dynamo's translation is wrong for mean) ----

SCATTER_CASES = [(reduce, include_self) for reduce in ("sum", "prod", "mean", "amax", "amin")
                 for include_self in (True, False)]


@pytest.mark.parametrize("reduce,include_self", SCATTER_CASES, ids=[f"{r}-self{s}" for r, s in SCATTER_CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=["float32", "int64"])
def test_scatter_reduce_composition_matches_torch_eagerly(reduce, include_self, dtype):
    # Duplicate indices, untouched positions, and an index smaller than src in every dim.
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 5, 3, generator=g) * 10).to(dtype)
    src = (torch.randn(3, 4, 3, generator=g) * 10).to(dtype)
    index = torch.tensor([[[0, 1, 1], [4, 4, 0], [1, 1, 1]], [[2, 2, 2], [0, 3, 0], [4, 1, 1]]])
    for dim in (1, -2):
        expected = x.scatter_reduce(dim, index, src, reduce, include_self=include_self)
        got = lowerings.scatter_reduce_one_hot(x, dim, index, src, reduce, include_self)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("reduce,include_self", [("mean", True), ("mean", False), ("amax", False), ("prod", True)])
def test_scatter_reduce_below_opset_16_in_ort(opset, reduce, include_self):
    x = torch.randn(3, 5)
    index = torch.tensor([[0, 4, 4], [1, 1, 2]])
    src = torch.randn(2, 4)  # larger than index: only its leading block is scattered
    fn = lambda a, i, s: a.scatter_reduce(1, i, s, reduce, include_self=include_self)
    (got,) = _run(fn, (x, index, src), opset)
    torch.testing.assert_close(got, fn(x, index, src), rtol=1e-5, atol=1e-6)


# ---- antialiased resize below opset 18: two MatMuls with torch's own weights ----------------

@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("opset", [11, 17])
def test_antialiased_resize_by_size_below_opset_18(mode, opset):
    x = torch.randn(2, 3, 9, 7, dtype=torch.float64)
    fn = lambda a: F.interpolate(a, size=(4, 5), mode=mode, antialias=True, align_corners=True)
    (got,) = _run(fn, (x,), opset, dynamic_batch=True)
    torch.testing.assert_close(got, fn(x), rtol=1e-9, atol=1e-9)
    bigger = torch.randn(5, 3, 9, 7, dtype=torch.float64)  # another batch: only H and W are fixed
    torch.testing.assert_close(_run(fn, (bigger,), opset, dynamic_batch=True)[0], fn(bigger), rtol=1e-9, atol=1e-9)


def test_antialiased_resize_with_a_dynamic_image_size_is_refused_below_18():
    f = io.BytesIO()
    fn = Lambda(lambda a: F.interpolate(a, scale_factor=0.5, mode="bilinear", antialias=True))
    with pytest.raises(torch.onnx.errors.SymbolicValueError, match="static height and width"):
        torch.onnx.export(fn, (torch.randn(1, 2, 8, 8),), f, dynamo=False, opset_version=17, input_names=["x"],
                          dynamic_axes={"x": {2: "h", 3: "w"}})


# ---- torch's decompositions, at opset 11 ------------------------------------------------------

GRID_CASES = [("bilinear", "zeros", False), ("nearest", "border", True), ("bilinear", "reflection", True),
              ("bicubic", "zeros", False)]


@pytest.mark.parametrize("mode,padding,align", GRID_CASES, ids=["-".join(map(str, c)) for c in GRID_CASES])
def test_grid_sample_modes_at_opset_11(mode, padding, align):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 5, 6, generator=g)
    grid = torch.rand(2, 4, 3, 2, generator=g) * 2.4 - 1.2  # some points outside the image
    fn = lambda a, b: F.grid_sample(a, b, mode=mode, padding_mode=padding, align_corners=align)
    (got,) = _run(fn, (x, grid), 11)
    torch.testing.assert_close(got, fn(x, grid), rtol=1e-4, atol=1e-5)


def test_cross_entropy_with_label_smoothing_and_weights_at_opset_11():
    # torch's own rule (12+) refuses label_smoothing; below 12 the bridge takes it.
    x, t, w = torch.randn(4, 5), torch.tensor([0, 2, 4, 1]), torch.rand(5) + 0.5
    fn = lambda a, b, c: F.cross_entropy(a, b, weight=c, label_smoothing=0.2)
    (got,) = _run(fn, (x, t, w), 11)
    torch.testing.assert_close(got, fn(x, t, w), rtol=1e-5, atol=1e-6)


def test_native_dropout_in_training_at_opset_11():
    # Random, so its properties: kept values are x / (1 - p), the mask says which, about 1 - p kept.
    x = torch.rand(200, 100) + 1.0
    out, mask = _run(lambda a: torch.native_dropout(a, 0.25, True), (x,), 11)
    assert mask.dtype == torch.bool
    torch.testing.assert_close(out[mask], x[mask] / 0.75)
    assert (out[~mask] == 0).all()
    assert 0.72 < mask.float().mean().item() < 0.78


def test_einsum_equations_at_opset_11():
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    for equation, args in [("bij,bjk->bik", (a, b)), ("bij->bji", (a,)), ("bij,bij->b", (a, a)), ("ii->i", (a[0, :3, :3],))]:
        fn = lambda *t, e=equation: torch.einsum(e, *t)
        (got,) = _run(fn, args, 11)
        torch.testing.assert_close(got, fn(*args), rtol=1e-5, atol=1e-5)


def test_stft_below_opset_17_with_a_dynamic_signal_length():
    # Frames come from Range over the runtime length: one export serves every length.
    fn = lambda a: torch.stft(a, 32, hop_length=8, win_length=24, normalized=True, onesided=False,
                              return_complex=False)
    f = io.BytesIO()
    torch.onnx.export(Lambda(fn), (torch.randn(3, 100),), f, dynamo=False, opset_version=11, input_names=["x"],
                      dynamic_axes={"x": {0: "batch", 1: "length"}})
    session = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
    for shape in [(3, 100), (1, 257)]:
        x = torch.randn(*shape)
        (got,) = session.run(None, {"x": x.numpy()})
        torch.testing.assert_close(torch.from_numpy(got), fn(x), rtol=1e-4, atol=1e-4)


def test_per_channel_fake_quantize_below_13_is_not_written_as_per_tensor_quantize_linear():
    # QuantizeLinear before 13 is per-tensor: with axis dropped as a "default" ORT happens to run
    # it, but the model is not valid ONNX. Below 13 opforge's Round-based composition is used.
    x = torch.randn(3, 4) * 10
    scale, zero_point = torch.tensor([0.1, 0.25, 0.05, 0.2]), torch.tensor([0, 10, 128, 255], dtype=torch.int32)
    fn = lambda a, s, z: torch.fake_quantize_per_channel_affine(a, s, z, 1, 0, 255)
    f = io.BytesIO()
    torch.onnx.export(Lambda(fn), (x, scale, zero_point), f, dynamo=False, opset_version=12)
    model = onnx.load_from_string(f.getvalue())
    assert "QuantizeLinear" not in {n.op_type for n in model.graph.node}
    onnx.checker.check_model(model, full_check=True)
    (got,) = _run(fn, (x, scale, zero_point), 12)
    torch.testing.assert_close(got, fn(x, scale, zero_point))
    with pytest.raises(torch.onnx.errors.SymbolicValueError, match="per channel.*opset 13"):
        torch.onnx.export(Lambda(fn), (x, scale, zero_point), io.BytesIO(), dynamo=False, opset_version=10)


@pytest.mark.parametrize("opset", [11, 16, 20])
def test_bincount_with_weights_and_empty_inputs(opset):
    # dynamo cannot take weights at all, and needs opset 16 without them: the one-hot composition.
    fn = lambda x, w: torch.bincount(x, w, minlength=5)
    f = io.BytesIO()
    torch.onnx.export(Lambda(fn), (torch.tensor([0, 1, 1, 3]), torch.rand(4)), f, dynamo=False, opset_version=opset,
                      input_names=["x", "w"], dynamic_axes={"x": {0: "n"}, "w": {0: "n"}})
    session = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
    for x in [torch.tensor([0, 1, 1, 3, 9, 1]), torch.tensor([2, 2])]:
        w = torch.rand(len(x))
        (got,) = session.run(None, {"x": x.numpy(), "w": w.numpy()})
        torch.testing.assert_close(torch.from_numpy(got), fn(x, w))
    # An empty input gives minlength zeros (torch gives them as int64 even with float weights,
    # a dtype a static graph cannot switch to: the values are checked).
    (got,) = session.run(None, {"x": np.zeros(0, np.int64), "w": np.zeros(0, np.float32)})
    assert got.tolist() == [0.0] * 5
    plain = lambda x: torch.bincount(x, minlength=3)
    f = io.BytesIO()
    torch.onnx.export(Lambda(plain), (torch.tensor([0, 1]),), f, dynamo=False, opset_version=opset,
                      input_names=["x"], dynamic_axes={"x": {0: "n"}})
    session = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
    for x in [torch.tensor([], dtype=torch.int64), torch.tensor([4, 0, 4])]:
        (got,) = session.run(None, {"x": x.numpy()})
        torch.testing.assert_close(torch.from_numpy(got), plain(x))


# ---- node adapters: same values as the newer ONNX op -------------------------------------------

def _lowered_model(op_type, attrs, x_type, shape, opset):
    x = onnx.helper.make_tensor_value_info("x", x_type, shape)
    y = onnx.helper.make_tensor_value_info("y", x_type, None)
    inputs = ["x", "x2"] if op_type in ("Max", "Min") else ["x"]
    extra = [onnx.helper.make_tensor_value_info("x2", x_type, shape)] if len(inputs) == 2 else []
    node = onnx.helper.make_node(op_type, inputs, ["y"], **attrs)
    source = onnx.helper.make_model(onnx.helper.make_graph([node], "g", [x, *extra], [y]),
                                    opset_imports=[onnx.helper.make_opsetid("", downgrade.SOURCE_OPSET)])
    source = onnx.shape_inference.infer_shapes(source)
    nodes = downgrade.Downgrade(downgrade.Graph(source), opset, "test").run()
    protos = [onnx.helper.make_node(n.op_type, n.inputs, n.outputs, **n.attrs) for n in nodes]
    target = onnx.helper.make_model(onnx.helper.make_graph(protos, "g", [x, *extra], [y]),
                                    opset_imports=[onnx.helper.make_opsetid("", opset)])
    return target


@pytest.mark.parametrize("op_type,ref", [("Softmax", torch.softmax), ("LogSoftmax", torch.log_softmax)])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_below_13_normalises_over_one_axis_only(op_type, ref, axis):
    # Softmax-11 flattens at `axis`; the adapter keeps opset 13's one-axis meaning.
    model = _lowered_model(op_type, {"axis": axis}, onnx.TensorProto.FLOAT, [2, 3, 4], 11)
    x = torch.randn(2, 3, 4)
    (got,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), ref(x, axis))


@pytest.mark.parametrize("op_type,ref", [("Max", torch.maximum), ("Min", torch.minimum)])
def test_integer_max_min_below_12(op_type, ref):
    model = _lowered_model(op_type, {}, onnx.TensorProto.INT64, [2, 3], 11)
    a, b = torch.tensor([[5, -3, 7], [0, 2**40, -1]]), torch.tensor([[4, -2, 7], [1, 3, -2**40]])
    (got,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": a.numpy(), "x2": b.numpy()})
    assert got.tolist() == ref(a, b).tolist()


# ---- bitwise ops: bool tensors at every opset, integers from 18 ------------------------------

@pytest.mark.parametrize("opset", [9, 11, 17, 18, 20])
def test_bitwise_on_bool_tensors_at_every_opset(opset):
    a = torch.tensor([True, False, True, False])
    b = torch.tensor([True, True, False, False])
    fn = lambda x, y: (torch.bitwise_and(x, y), torch.bitwise_xor(x, y))
    got = _run(fn, (a, b), opset)
    assert [g.tolist() for g in got] == [e.tolist() for e in fn(a, b)]


def test_bitwise_on_integers_below_18_names_the_op_dtype_and_opset():
    f = io.BytesIO()
    with pytest.raises(torch.onnx.errors.SymbolicValueError) as info:
        torch.onnx.export(Lambda(torch.bitwise_and), (torch.tensor([5, 3]), torch.tensor([3, 6])), f,
                          dynamo=False, opset_version=17)
    assert "aten::bitwise_and on Long tensors at opset 17" in str(info.value) and "opset 18" in str(info.value)
    (got,) = _run(torch.bitwise_and, (torch.tensor([5, 3, -1]), torch.tensor([3, 6, 7])), 18)  # torch's rule
    assert got.tolist() == [1, 2, 7]


def test_col2im_keeps_inf_and_nan_where_torch_puts_them():
    # The composition adds zeros, never multiplies by them (a one-hot ConvTranspose would
    # spread 0 * inf = nan over the whole output).
    x = torch.randn(1, 12, 12)
    x[0, 0, 0], x[0, 5, 7] = math.inf, math.nan
    fn = lambda a: F.fold(a, (4, 5), (2, 2))
    (got,) = _run(fn, (x,), 11)
    expected = fn(x)
    assert torch.isnan(got).sum() == torch.isnan(expected).sum() < got.numel() // 2
    torch.testing.assert_close(got, expected, equal_nan=True)


# ---- where torch has a rule: torch's first, the bridge for the calls it refuses ---------------

def _op_types(fn, inputs, opset):
    f = io.BytesIO()
    torch.onnx.export(Lambda(fn), tuple(inputs), f, dynamo=False, opset_version=opset)
    return {n.op_type for n in onnx.load_from_string(f.getvalue()).graph.node}


@pytest.mark.parametrize("opset", [12, 17, 20])
def test_cross_entropy_label_smoothing_that_torchs_rule_refuses_goes_to_the_bridge(opset):
    x, t = torch.randn(4, 5), torch.tensor([0, 2, 4, 1])
    plain = lambda a, b: F.cross_entropy(a, b)
    assert _op_types(plain, (x, t), opset) == {"SoftmaxCrossEntropyLoss"}  # torch's own rule still runs first
    smoothed = lambda a, b: F.cross_entropy(a, b, label_smoothing=0.1)
    assert "LogSoftmax" in _op_types(smoothed, (x, t), opset)  # opforge's composition: the smoothing term
    (got,) = _run(smoothed, (x, t), opset)
    torch.testing.assert_close(got, smoothed(x, t), rtol=1e-5, atol=1e-6)
    # class probabilities, weights, no reduction
    p, w = torch.softmax(torch.randn(4, 5), 1), torch.rand(5) + 0.5
    soft = lambda a, b, c: F.cross_entropy(a, b, weight=c, reduction="none", label_smoothing=0.3)
    (got,) = _run(soft, (x, p, w), opset)
    torch.testing.assert_close(got, soft(x, p, w), rtol=1e-5, atol=1e-6)


def test_cross_entropy_composition_matches_torch_eagerly():
    # label smoothing, ignore_index, weights, class probabilities, each reduction, 1-D to 3-D
    g = torch.Generator().manual_seed(0)
    for shape, target in [((4, 5), torch.tensor([0, 2, 4, 1])), ((2, 5, 3), torch.tensor([[0, 2, 4], [1, 2, 2]])),
                          ((5,), torch.tensor(3))]:
        x = torch.randn(*shape, generator=g, dtype=torch.float64)
        probabilities = torch.softmax(torch.randn(*shape, generator=g, dtype=torch.float64), 0 if len(shape) == 1 else 1)
        weight = torch.rand(5, generator=g, dtype=torch.float64) + 0.5
        for reduction, name in enumerate(("none", "mean", "sum")):
            for w in (None, weight):
                for smoothing in (0.0, 0.2):
                    for t, ignore in ((target, 2), (probabilities, -100)):
                        expected = F.cross_entropy(x, t, weight=w, reduction=name, ignore_index=ignore,
                                                   label_smoothing=smoothing)
                        got = lowerings.cross_entropy_one_hot_smoothing(x, t, w, reduction, ignore, smoothing)
                        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("opset", [16, 18, 20])
@pytest.mark.parametrize("reduce,include_self", [("mean", True), ("amax", False), ("sum", False)])
def test_scatter_reduce_arguments_torchs_rule_refuses_go_to_the_bridge(opset, reduce, include_self):
    x, index, src = torch.randn(3, 5), torch.tensor([[0, 4, 4, 1], [1, 1, 2, 2], [3, 3, 3, 0]]), torch.randn(3, 4)
    fn = lambda a, i, s: a.scatter_reduce(1, i, s, reduce, include_self=include_self)
    (got,) = _run(fn, (x, index, src), opset)
    torch.testing.assert_close(got, fn(x, index, src), rtol=1e-5, atol=1e-6)


def test_wrapped_torch_rules_are_still_torchs():
    from opforge.aten import rules

    registry = rules._torch_registry()
    fn = registry.get_function_group("aten::cross_entropy_loss").get(17)
    assert getattr(fn, "opforge_bridge_fallback", False) and fn.__wrapped__.__module__.startswith("torch.onnx")
    assert rules.has_torch_rule("cross_entropy_loss", 17) and not rules.has_torch_rule("cross_entropy_loss", 11)
    assert rules.torch_rule("cross_entropy_loss", 17) is fn.__wrapped__


@pytest.mark.parametrize("opset", [13, 17, 20])
def test_float64_calls_torchs_rules_write_invalid_models_for_go_to_the_bridge(opset):
    # torch's diagonal (If branches of two types) and per-channel fake quantize (QuantizeLinear
    # takes no double) give models ORT rejects for float64.
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    fn = lambda a: torch.diagonal(a, -1, 1, 2)
    torch.testing.assert_close(_run(fn, (x,), opset)[0], fn(x))
    y, scale = torch.randn(3, 4, dtype=torch.float64) * 10, torch.tensor([0.1, 0.25, 0.05, 0.2])
    zero_point = torch.tensor([0, 10, 128, 255], dtype=torch.int32)
    fq = lambda a, s, z: torch.fake_quantize_per_channel_affine(a, s, z, 1, 0, 255)
    torch.testing.assert_close(_run(fq, (y, scale, zero_point), opset)[0], fq(y, scale, zero_point))


def test_a_call_torchs_rule_refuses_goes_to_the_bridge_and_if_both_refuse_the_error_says_both():
    from torch.onnx import errors
    from opforge.aten import rules

    def refusing_rule(g, *args):
        g.op("Identity", args[0])  # a node written before refusing must not stay in the graph
        raise errors.SymbolicValueError("torch's rule refuses this call", args[0])

    torch.onnx.register_custom_op_symbolic("aten::tril", bridge.torch_rule_then_bridge("tril", refusing_rule), 17)
    try:
        # The diagonal comes from the input's shape: a graph value, which the bridge cannot take.
        model = Lambda(lambda a: torch.tril(a, a.shape[1] - 3))
        with pytest.raises(errors.SymbolicValueError) as info:
            torch.onnx.export(model, (torch.randn(3, 4),), io.BytesIO(), dynamo=False, opset_version=17,
                              input_names=["x"], dynamic_axes={"x": {1: "n"}})
        text = str(info.value)
        assert "torch's rule refuses this call (and opforge's ATen bridge cannot export it either" in text
        assert "aten::tril" in text and "computed at run time" in text
        # A call the bridge can take: the refusing rule's node is gone, the values are torch's.
        x = torch.randn(3, 4)
        assert "Identity" not in _op_types(lambda a: torch.tril(a, 1), (x,), 17)
        torch.testing.assert_close(_run(lambda a: torch.tril(a, 1), (x,), 17)[0], torch.tril(x, 1))
    finally:
        torch.onnx.register_custom_op_symbolic(
            "aten::tril", bridge.torch_rule_then_bridge("tril", rules.torch_rule("tril", 17)), 17)


# ---- torch.fft: DFT-matrix compositions below opset 17 (and where dynamo's DFT is invalid) ----

FFT_CASES = [
    ("fft_fft", torch.fft.fft, True, {}), ("fft_fft", torch.fft.fft, False, dict(n=10, dim=1, norm="ortho")),
    ("fft_ifft", torch.fft.ifft, True, dict(n=4, norm="forward")), ("fft_rfft", torch.fft.rfft, False, {}),
    ("fft_rfft", torch.fft.rfft, False, dict(n=7, dim=0, norm="forward")), ("fft_irfft", torch.fft.irfft, True, {}),
    ("fft_irfft", torch.fft.irfft, True, dict(n=7, norm="ortho")), ("fft_hfft", torch.fft.hfft, True, {}),
    ("fft_hfft", torch.fft.hfft, True, dict(n=9, dim=1, norm="forward")), ("fft_fft2", torch.fft.fft2, True, {}),
    ("fft_ifft2", torch.fft.ifft2, True, dict(s=(4, 6), norm="ortho")), ("fft_rfft2", torch.fft.rfft2, False, {}),
    ("fft_irfft2", torch.fft.irfft2, True, {}), ("fft_hfft2", torch.fft.hfft2, True, {}),
    ("fft_fftn", torch.fft.fftn, True, {}), ("fft_ifftn", torch.fft.ifftn, True, dict(s=(3, 4), dim=(0, 2))),
    ("fft_rfftn", torch.fft.rfftn, False, dict(dim=(0, 1))), ("fft_irfftn", torch.fft.irfftn, True, dict(s=(4, 6))),
    ("fft_hfftn", torch.fft.hfftn, True, dict(norm="ortho")), ("fft_hfftn", torch.fft.hfftn, True, dict(dim=(0, 2))),
    ("fft_ihfft", torch.fft.ihfft, False, {}), ("fft_ihfft", torch.fft.ihfft, False, dict(n=5, dim=1, norm="forward")),
    ("fft_ihfft2", torch.fft.ihfft2, False, dict(norm="ortho")), ("fft_ihfftn", torch.fft.ihfftn, False, dict(s=(4, 9))),
]


@pytest.mark.parametrize("name,ref,complex_input,kwargs", FFT_CASES,
                         ids=[f"{c[0]}-{'-'.join(map(str, c[3].values())) or 'default'}" for c in FFT_CASES])
def test_fft_compositions_match_torch_eagerly(name, ref, complex_input, kwargs):
    # odd and even lengths, trimming and zero-padding (n/s), every norm, one-sided dims first
    # or last: the composition torch.export traces for the bridge, against torch.fft itself
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 6, 5 if complex_input else 8, dtype=torch.complex128 if complex_input else torch.float64,
                    generator=g)
    kw = dict(kwargs)
    size = kw.pop("n", kw.pop("s", None))
    got = lowerings.LOWERINGS[name](None)(x, size, kw.pop("dim", None), kw.pop("norm", None))
    torch.testing.assert_close(got, ref(x, **kwargs), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("opset", [11, 17, 20])
def test_log_mel_spectrogram_with_complex_stft_in_ort(opset):
    # Whisper's front end: a complex STFT, its power (abs ** 2) without the last frame, mel
    # filters, log. The complex values never leave the model; the batch is dynamic.
    window = torch.hann_window(32)
    mel = torch.rand(20, 17, generator=torch.Generator().manual_seed(1))

    def fn(audio):
        spec = torch.stft(audio, 32, 8, window=window, return_complex=True)
        power = spec[..., :-1].abs() ** 2
        return torch.clamp(mel @ power, min=1e-10).log10()

    f = io.BytesIO()
    torch.onnx.export(Lambda(fn), (torch.randn(2, 400),), f, dynamo=False, opset_version=opset, input_names=["audio"],
                      dynamic_axes={"audio": {0: "batch"}})
    session = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
    for batch in (2, 3):  # the traced batch size and another
        audio = torch.randn(batch, 400, generator=torch.Generator().manual_seed(batch))
        (got,) = session.run(None, {"audio": audio.numpy()})
        torch.testing.assert_close(torch.from_numpy(got), fn(audio), rtol=1e-4, atol=1e-4)
