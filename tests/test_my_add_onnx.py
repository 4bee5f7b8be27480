"""my_add round trips: torch -> {TorchScript, dynamo} exporter -> ONNX Runtime (libopforge_ort)
and onnx.reference; plus the ORT kernel on its own (broadcasting, dtypes, threads, errors)."""

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto

import opforge
from opforge.symbolics import reference

from helpers import single_node_model, to_numpy

ONNX_TYPES = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.float16: TensorProto.FLOAT16}
TOL = {torch.float32: 1e-6, torch.float64: 1e-12, torch.float16: 1e-3}


class FunctionModel(torch.nn.Module):
    """The classic flow: MyAddFunction.apply inside a model, between standard ops."""

    def forward(self, a, b):
        return torch.tanh(opforge.MyAddFunction.apply(a, b)) * 3


class OpModel(torch.nn.Module):
    """The op called directly (torch.ops.opforge.my_add), twice, with a parameter."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.linspace(-1, 1, 4))

    def forward(self, a, b):
        return opforge.my_add(opforge.my_add(a, b), self.bias)


def export(model, args, *, dynamo, opset, standard=False):
    names = ["a", "b"]
    if dynamo:
        dyn = {"dynamic_shapes": ({0: torch.export.Dim("batch")}, None)}
    else:
        dyn = {"dynamic_axes": {"a": {0: "batch"}, "out": {0: "batch"}}}
    return opforge.export(
        model, args, dynamo=dynamo, opset_version=opset, standard_onnx=standard,
        input_names=names, output_names=["out"], **dyn,
    )


CASES = [("torchscript", opset) for opset in (9, 13, 17, 20)] + [("dynamo", opset) for opset in (18, 20)]


@pytest.mark.parametrize("exporter,opset", CASES, ids=[f"{e}-opset{o}" for e, o in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("standard", [False, True], ids=["custom-op", "standard-onnx"])
@pytest.mark.parametrize("model_cls", [FunctionModel, OpModel])
def test_round_trip(exporter, opset, dtype, standard, model_cls):
    model = model_cls().to(dtype).eval()
    a, b = torch.randn(2, 3, 4, dtype=dtype), torch.randn(3, 4, dtype=dtype)  # exported at batch 2
    proto = export(model, (a, b), dynamo=exporter == "dynamo", opset=opset, standard=standard)

    onnx.checker.check_model(proto, full_check=True)
    ops = [(n.domain, n.op_type) for n in proto.graph.node]
    n_custom = ops.count(("opforge", "my_add"))
    assert n_custom == (0 if standard else (1 if model_cls is FunctionModel else 2)), ops
    if standard:
        assert ("", "Mul") in ops and ("", "Add") in ops
    else:
        assert any(o.domain == "opforge" and o.version == 1 for o in proto.opset_import)
    assert any(o.domain in ("", "ai.onnx") and o.version == opset for o in proto.opset_import)

    a5 = torch.randn(5, 3, 4, dtype=dtype)  # run at batch 5: the batch dim is dynamic
    with torch.no_grad():
        expected = to_numpy(model(a5, b))
    feeds = {"a": to_numpy(a5), "b": to_numpy(b)}
    (got_ort,) = opforge.ort_session(proto).run(None, feeds)
    (got_ref,) = reference.evaluator(proto).run(None, feeds)
    tol = TOL[dtype]
    assert got_ort.shape == expected.shape == (5, 3, 4)
    np.testing.assert_allclose(got_ort, expected, rtol=tol, atol=tol)
    np.testing.assert_allclose(got_ref, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("opset", [9, 11, 16, 20])
def test_plain_torch_onnx_export_after_import(opset):
    """`import opforge` is enough for torch.onnx.export(dynamo=False) at every opset 9..20."""
    a, b = torch.randn(2, 3), torch.randn(3)
    buf = io.BytesIO()
    torch.onnx.export(_DirectOp(), (a, b), buf, dynamo=False, opset_version=opset, input_names=["a", "b"])
    proto = onnx.load_from_string(buf.getvalue())
    assert [(n.domain, n.op_type) for n in proto.graph.node] == [("opforge", "my_add")]
    (got,) = opforge.ort_session(proto).run(None, {"a": a.numpy(), "b": b.numpy()})
    np.testing.assert_allclose(got, (2 * a + b).numpy(), rtol=1e-6)


class _DirectOp(torch.nn.Module):
    def forward(self, a, b):
        return torch.ops.opforge.my_add(a, b)


def test_plain_dynamo_export_with_translation_table():
    a, b = torch.randn(2, 3), torch.randn(3)
    program = torch.onnx.export(
        _DirectOp().eval(), (a, b), dynamo=True, custom_translation_table=opforge.translation_table(),
    )
    proto = program.model_proto
    assert [(n.domain, n.op_type) for n in proto.graph.node] == [("opforge", "my_add")]
    (got,) = opforge.ort_session(proto).run(None, {n.name: v.numpy() for n, v in zip(proto.graph.input, (a, b))})
    np.testing.assert_allclose(got, (2 * a + b).numpy(), rtol=1e-6)


def test_torchscript_exporter_rejects_opsets_it_cannot_do():
    with pytest.raises(ValueError, match="TorchScript exporter .* supports opsets 9..20"):
        opforge.export(_DirectOp(), (torch.randn(2), torch.randn(2)), dynamo=False, opset_version=21)


def test_standard_onnx_rejects_unknown_ops():
    with pytest.raises(ValueError, match="unknown op 'no_such_op'"):
        opforge.export(_DirectOp(), (torch.randn(2), torch.randn(2)), standard_onnx={"no_such_op"})


def test_onnx_shape_inference_knows_the_op():
    model = single_node_model("my_add", [TensorProto.FLOAT, TensorProto.FLOAT])
    model.graph.input[0].type.CopyFrom(onnx.helper.make_tensor_type_proto(TensorProto.FLOAT, ["N", 1, 4]))
    model.graph.input[1].type.CopyFrom(onnx.helper.make_tensor_type_proto(TensorProto.FLOAT, [3, 1]))
    del model.graph.output[:]
    model.graph.output.append(onnx.helper.make_value_info("O0", onnx.TypeProto()))
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    out = inferred.graph.output[0].type.tensor_type
    assert out.elem_type == TensorProto.FLOAT
    assert [d.dim_param or d.dim_value for d in out.shape.dim] == ["N", 3, 4]
    bad = single_node_model("my_add", [TensorProto.FLOAT, TensorProto.INT64])
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(bad, full_check=True)


# ---- the ORT kernel on its own ---------------------------------------------------------

BROADCAST_SHAPES = [
    ((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((4,), (2, 3, 4)), ((2, 1, 4), (1, 3, 1)),
    ((), ()), ((), (3, 2)), ((0, 3), (3,)), ((1,), (1,)), ((2, 3, 1, 5, 1, 4), (3, 5, 6, 1)),
]


@pytest.mark.parametrize("np_dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape_a,shape_b", BROADCAST_SHAPES)
def test_ort_kernel_broadcasting(np_dtype, shape_a, shape_b):
    t = ONNX_TYPES[np_dtype]
    sess = opforge.ort_session(single_node_model("my_add", [t, t]))
    a = np.asarray(np.random.randn(*shape_a)).astype(np_dtype)
    b = np.asarray(np.random.randn(*shape_b)).astype(np_dtype)
    (got,) = sess.run(None, {"I0": a, "I1": b})
    expected = opforge.my_add(torch.from_numpy(a), torch.from_numpy(b)).numpy()  # the torch kernel
    assert got.dtype == np_dtype and got.shape == np.broadcast_shapes(a.shape, b.shape)
    np.testing.assert_array_equal(got, expected)  # same core: bit-identical
    np.testing.assert_allclose(got, (2 * a.astype(np.float64) + b).astype(np_dtype), rtol=1e-3 if np_dtype == np.float16 else 1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_ort_kernel_large_multithreaded(threads):
    a = np.random.randn(3_000_001).astype(np.float32)
    b = np.random.randn(3_000_001).astype(np.float32)
    row = np.random.randn(1531).astype(np.float32)
    big = np.random.randn(1000, 1531).astype(np.float32)
    sess = opforge.ort_session(
        single_node_model("my_add", [TensorProto.FLOAT] * 2), intra_op_num_threads=threads
    )
    np.testing.assert_array_equal(sess.run(None, {"I0": a, "I1": b})[0], 2 * a + b)
    np.testing.assert_array_equal(sess.run(None, {"I0": big, "I1": row})[0], 2 * big + row)
    np.testing.assert_array_equal(sess.run(None, {"I0": row, "I1": big})[0], 2 * row + big)


def test_ort_bad_shapes_give_error_status_and_session_survives():
    sess = opforge.ort_session(single_node_model("my_add", [TensorProto.FLOAT] * 2))
    a = np.ones((2, 3), np.float32)
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT.*opforge::my_add: shapes of A \[2, 3\] and B \[4\] are not broadcastable") as info:
        sess.run(None, {"I0": a, "I1": np.ones(4, np.float32)})
    assert type(info.value).__name__ == "InvalidArgument"
    (got,) = sess.run(None, {"I0": a, "I1": np.full(3, 0.5, np.float32)})  # next good call works
    np.testing.assert_array_equal(got, np.full((2, 3), 2.5, np.float32))


@pytest.mark.parametrize("types", [(TensorProto.FLOAT, TensorProto.DOUBLE), (TensorProto.INT64, TensorProto.INT64),
                                   (TensorProto.INT32, TensorProto.INT32)], ids=["mixed", "int64", "int32"])
def test_ort_rejects_unsupported_types_at_load(types):
    with pytest.raises(Exception, match="my_add") as info:
        opforge.ort_session(single_node_model("my_add", list(types)))
    assert "opforge kernels" not in str(info.value)  # the library is registered; it is a type error


def test_missing_library_message():
    proto = opforge.export(_DirectOp(), (torch.randn(2, 3), torch.randn(3)), dynamo=False)
    with pytest.raises(opforge.MissingOpforgeKernels, match=r"opforge::my_add.*register_custom_ops_library\(opforge.ort_library_path\(\)\)"):
        opforge.ort_session(proto, register_opforge=False)
    # and the plain ORT user flow from the message works
    so = ort.SessionOptions()
    so.register_custom_ops_library(opforge.ort_library_path())
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert sess.get_outputs()[0].type == "tensor(float)"


def test_ort_kernel_bfloat16():
    """bfloat16 has no numpy dtype in ORT's Python API: bind raw uint16 buffers as tensor(bfloat16)."""
    import ml_dtypes  # a dependency of onnx
    sess = opforge.ort_session(single_node_model("my_add", [TensorProto.BFLOAT16] * 2))
    a = np.random.randn(300, 7).astype(ml_dtypes.bfloat16)
    b = np.random.randn(7).astype(ml_dtypes.bfloat16)
    out = np.zeros((300, 7), np.uint16)
    binding = sess.io_binding()
    for name, arr in (("I0", a), ("I1", b)):
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(arr.view(np.uint16), TensorProto.BFLOAT16))
    binding.bind_ortvalue_output("O0", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(out, TensorProto.BFLOAT16))
    sess.run_with_iobinding(binding)
    expected = (2 * a.astype(np.float64) + b.astype(np.float64)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(out, expected.view(np.uint16))
    torch_out = opforge.my_add(torch.from_numpy(a.view(np.uint16).astype(np.int32) << 16).view(torch.float32).to(torch.bfloat16),
                               torch.from_numpy(b.view(np.uint16).astype(np.int32) << 16).view(torch.float32).to(torch.bfloat16))
    np.testing.assert_array_equal(out, (torch_out.view(torch.int16).numpy().view(np.uint16)))
