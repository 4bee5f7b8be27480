"""The public op API on ops that are not opforge's: OpSpec (namespace vs domain), register_op,
check_library, ORT libraries by domain, and ort_session's registration rules."""

import dataclasses
import types

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import opforge
from opforge import AttrArg, OpSpec, TensorArg

NS = "opforge_api_test"


def _lib(name: str, schema: str, impl):
    """A torch op defined from Python (stands in for a package's C++ TORCH_LIBRARY)."""
    lib = torch.library.Library(NS, "FRAGMENT")
    lib.define(schema)
    lib.impl(name, impl, "CPU")
    return lib


_LIBS = [
    _lib("scale", "scale(Tensor x, float factor) -> Tensor", lambda x, factor: x * factor),
    _lib("unspecced", "unspecced(Tensor x) -> Tensor", lambda x: x.clone()),
    _lib("twin", "twin(Tensor x) -> Tensor", lambda x: x + 1),
    _lib("wrong_schema", "wrong_schema(Tensor x) -> Tensor", lambda x: x),
    _lib("top1", "top1(Tensor x, Tensor bias) -> (Tensor, Tensor)", lambda x, bias: tuple((x + bias).max(dim=-1))),
]


def _scale_spec(**overrides):
    kw = dict(
        name="scale", namespace=NS, domain="com.example.api", schema="scale(Tensor x, float factor) -> Tensor",
        args=(TensorArg("x", "X"), AttrArg("factor", kind="float")), outputs=("Y",), doc="Y = X * factor",
        fake=lambda x, factor: torch.empty_like(x),
        setup_context=lambda ctx, inputs, output: setattr(ctx, "factor", inputs[1]),
        backward=lambda ctx, grad: (grad * ctx.factor, None),
        reference=lambda x, *, factor: ((x * np.asarray(factor, x.dtype)).astype(x.dtype),),
        onnx_output_shapes=lambda shapes, attrs: [shapes[0]],
    )
    kw.update(overrides)
    return OpSpec(**kw)


SCALE = _scale_spec()
SCALE_OP = opforge.register_op(SCALE)

# An op with an output of another element type than the op's own: the position of the maximum.
TOP1 = OpSpec(
    name="top1", namespace=NS, domain="com.example.api", schema="top1(Tensor x, Tensor bias) -> (Tensor, Tensor)",
    args=(TensorArg("x"), TensorArg("bias")), outputs=("values", TensorArg("indices", dtypes=("int64",))),
    doc="the largest of x + bias along the last dim, and its index",
    fake=lambda x, bias: (x.new_empty(x.shape[:-1]), x.new_empty(x.shape[:-1], dtype=torch.int64)),
    reference=lambda x, bias: ((x + bias).max(-1).astype(x.dtype), (x + bias).argmax(-1).astype(np.int64)),
    onnx_output_shapes=lambda shapes, attrs: None if shapes[0] is None else [shapes[0][:-1]] * 2,
)
TOP1_OP = opforge.register_op(TOP1)


def test_namespace_and_domain_are_separate_and_the_registry_is_keyed_by_domain():
    assert SCALE.torch_qualname == f"{NS}::scale" and SCALE.onnx_qualname == "com.example.api::scale"
    assert opforge.spec.REGISTRY["com.example.api::scale"] is SCALE
    assert opforge.register_op(SCALE) is SCALE_OP  # idempotent
    x = torch.randn(3, requires_grad=True)
    y = torch.ops.opforge_api_test.scale(x, 2.5)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.5))
    torch.library.opcheck(SCALE_OP, (torch.randn(2, 3), 1.5))


def test_op_spec_validation_says_what_to_fix():
    with pytest.raises(ValueError, match=r"namespace 'com.example' is not a Python identifier.*namespace='com_example'"):
        _scale_spec(namespace=None, domain="com.example")
    with pytest.raises(TypeError, match="give a torch namespace"):
        _scale_spec(namespace=None, domain=None)
    with pytest.raises(ValueError, match="kind must be one of"):
        AttrArg("factor", kind="double")
    with pytest.raises(TypeError, match="both setup_context and backward"):
        _scale_spec(backward=None)


def test_register_op_errors_name_the_missing_piece():
    with pytest.raises(opforge.OpRegistrationError, match=r"opforge_api_test::nowhere has a spec but no C\+\+ declaration"):
        opforge.register_op(_scale_spec(name="nowhere", schema="nowhere(Tensor x, float factor) -> Tensor"))
    with pytest.raises(opforge.OpRegistrationError, match="C\\+\\+ schema of opforge_api_test::wrong_schema is"):
        opforge.register_op(_scale_spec(name="wrong_schema", schema="wrong_schema(Tensor x, float factor) -> Tensor"))
    with pytest.raises(ValueError, match="torch op opforge_api_test::scale already has a spec"):
        opforge.register_op(_scale_spec(domain="com.other"))
    assert "com.other::scale" not in opforge.spec.REGISTRY


def test_same_op_name_in_two_domains():
    twin = _scale_spec(name="twin", domain="com.example.other", schema="twin(Tensor x) -> Tensor", args=(TensorArg("x"),),
                       setup_context=None, backward=None, reference=lambda x: (x + 1,), fake=lambda x: torch.empty_like(x))
    opforge.register_op(twin)
    assert {"com.example.other::twin", "com.example.api::scale"} <= set(opforge.spec.REGISTRY)
    assert opforge.spec.find("twin") is twin and opforge.spec.find("com.example.other::twin") is twin


def test_cuda_build_without_cuda_kernel_is_an_error_and_cpu_build_gets_a_stub():
    lib = _lib("gpu_less", "gpu_less(Tensor x) -> Tensor", lambda x: x)
    spec = _scale_spec(name="gpu_less", domain="com.example.gpu", schema="gpu_less(Tensor x) -> Tensor",
                       args=(TensorArg("x"),), setup_context=None, backward=None, fake=lambda x: torch.empty_like(x))
    with pytest.raises(opforge.OpRegistrationError, match="no CUDA kernel for opforge_api_test::gpu_less"):
        opforge.register_op(spec, extension=types.SimpleNamespace(WITH_CUDA=1))
    assert "com.example.gpu::gpu_less" not in opforge.spec.REGISTRY
    opforge.register_op(spec, extension=types.SimpleNamespace(WITH_CUDA=0))
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{NS}::gpu_less", "CUDA")  # the explaining stub
    del lib


def test_check_library_names_ops_without_spec():
    with pytest.raises(opforge.OpRegistrationError, match=r"opforge_api_test::unspecced, opforge_api_test::wrong_schema declared in C\+\+"):
        opforge.check_library(NS)
    opforge.check_library("opforge")  # opforge's own library is complete


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_both_exporters_emit_the_domain_and_ort_session_names_what_is_missing(dynamo):
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.relu(torch.ops.opforge_api_test.scale(x, 0.5))

    x = torch.randn(2, 4)
    proto = opforge.export(M().eval(), (x,), dynamo=dynamo, opset_version=18 if dynamo else 17, input_names=["x"])
    nodes = [(n.domain, n.op_type) for n in proto.graph.node]
    assert ("com.example.api", "scale") in nodes
    assert any(o.domain == "com.example.api" for o in proto.opset_import)
    (ref,) = opforge.symbolics.reference.evaluator(proto).run(None, {"x": x.numpy()})
    np.testing.assert_allclose(ref, M()(x).numpy(), rtol=1e-6)
    with pytest.raises(opforge.MissingOrtKernels, match=r"com.example.api::scale: no ONNX Runtime library is known for "
                                                         r"domain 'com.example.api'.*register_ort_library"):
        opforge.ort_session(proto)


def _my_add_model():
    node = helper.make_node("my_add", ["A", "B"], ["C"], domain="opforge")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "AB"],
                              [helper.make_tensor_value_info("C", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("opforge", 1)])


def test_ort_session_with_options_that_already_hold_the_library():
    so = ort.SessionOptions()
    so.register_custom_ops_library(opforge.ort_library_path())
    so.register_custom_ops_library(opforge.ort_library_path())  # the library itself makes this a no-op
    sess = opforge.ort_session(_my_add_model(), so)
    a, b = np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(sess.run(None, {"A": a, "B": b})[0], 2 * a + b)
    assert so.get_session_config_entry("opforge.custom_domain.opforge") == "libopforge_ort"
    sess2 = opforge.ort_session(_my_add_model(), so)  # the same options again
    np.testing.assert_array_equal(sess2.run(None, {"A": a, "B": b})[0], 2 * a + b)


def test_ort_library_registry_rules(tmp_path):
    with pytest.raises(opforge.MissingOrtLibrary, match="no ONNX Runtime library is known for the ONNX domain 'com.nobody'"):
        opforge.ort_library_path("com.nobody")
    with pytest.raises(ValueError, match="already served by opforge"):
        opforge.register_ort_library("opforge", tmp_path / "libother.so")
    with pytest.raises(ValueError, match="not a custom ONNX domain"):
        opforge.register_ort_library("ai.onnx", tmp_path / "libother.so")
    opforge.register_ort_library("com.example.missing", tmp_path / "libmissing.so", provider="test")
    with pytest.raises(FileNotFoundError, match="com.example.missing.*not at"):
        opforge.ort_library_path("com.example.missing")
    libs = opforge.ort_libraries()
    assert libs["opforge"][1] == opforge.ort_library_path()
    assert libs["com.example.missing"][1].startswith("not available")


def test_check_library_kernels_probes_the_ort_library():
    from opforge.ort_kernels import check_library_kernels

    assert check_library_kernels("opforge") == []
    ghost = _scale_spec(name="ghost", namespace="opforge_ghost_ns", domain="opforge", schema="ghost(Tensor x) -> Tensor",
                        args=(TensorArg("x"),), setup_context=None, backward=None)
    assert check_library_kernels("opforge", [ghost]) == ["opforge::ghost"]


def test_second_library_for_a_registered_domain_is_a_clear_ort_error(tmp_path):
    """Two libraries cannot share a domain in ORT; the second one's RegisterCustomOps says so
    (the options are marked as if another library had registered the domain first)."""
    so = ort.SessionOptions()
    so.add_session_config_entry("opforge.custom_domain.opforge", "libsomebody_else")
    with pytest.raises(Exception, match="libopforge_ort serves the ONNX domain 'opforge', which these SessionOptions "
                                        "already have from libsomebody_else; ONNX Runtime allows one"):
        so.register_custom_ops_library(opforge.ort_library_path())


def test_ort_session_names_a_spec_whose_library_has_no_kernel():
    """A spec registered for a domain whose library lacks its kernel: ort_session says which
    piece is missing, instead of ORT's bare 'not a registered function/op'."""
    from opforge.ort_kernels.session import _KERNEL_AUDIT

    path = opforge.ort_library_path()
    _KERNEL_AUDIT[("opforge", path)] = ["opforge::phantom"]  # what the probe reports for such a spec
    try:
        node = helper.make_node("phantom", ["X"], ["Y"], domain="opforge")
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
                                  [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("opforge", 1)])
        with pytest.raises(opforge.MissingOrtKernels, match=r"opforge::phantom has a spec .* libopforge_ort.so has no kernel"):
            opforge.ort_session(model)
        with pytest.warns(UserWarning, match="opforge::phantom has a spec but libopforge_ort.so has no kernel"):
            opforge.ort_session(_my_add_model())
    finally:
        del _KERNEL_AUDIT[("opforge", path)]


class _Top1(torch.nn.Module):
    def forward(self, x, bias):
        values, indices = TOP1_OP(x, bias)
        return values * 2, indices


def test_an_output_declared_with_its_own_dtype_is_typed_so_in_the_schema_both_exporters_and_the_model():
    schema = onnx.defs.get_schema("top1", 1, "com.example.api")
    assert [o.type_str for o in schema.outputs] == ["T", "T_indices"]
    assert {c.type_param_str: list(c.allowed_type_strs) for c in schema.type_constraints}["T_indices"] == \
        ["tensor(int64)"]
    assert TOP1.output_names == ("values", "indices")
    x, bias = torch.randn(3, 5), torch.randn(5)
    for dynamo in (True, False):
        kw = ({"dynamic_shapes": ({0: torch.export.Dim("batch")}, None)} if dynamo
              else {"dynamic_axes": {"x": {0: "batch"}}, "opset_version": 17})
        proto = opforge.export(_Top1(), (x, bias), dynamo=dynamo, input_names=["x", "bias"], check=True, **kw)
        outputs = [(o.type.tensor_type.elem_type, [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim])
                   for o in proto.graph.output]
        assert outputs == [(TensorProto.FLOAT, ["batch"]), (TensorProto.INT64, ["batch"])], (dynamo, outputs)
        x7 = torch.randn(7, 5)
        values, indices = opforge.symbolics.reference.evaluator(proto).run(None, {"x": x7.numpy(), "bias": bias.numpy()})
        want_values, want_indices = (x7 + bias).max(dim=-1)
        np.testing.assert_allclose(values, 2 * want_values.numpy(), rtol=1e-6)
        assert indices.dtype == np.int64 and np.array_equal(indices, want_indices.numpy())


def test_output_declarations_are_checked():
    with pytest.raises(ValueError, match="output 'y' cannot be optional"):
        dataclasses.replace(TOP1, outputs=("values", TensorArg("y", optional=True)))
    with pytest.raises(ValueError, match="output 'x' declares dtypes and has the name of an input"):
        dataclasses.replace(TOP1, outputs=("values", TensorArg("x", dtypes=("int64",))))
    with pytest.raises(ValueError, match="duplicate output names"):
        dataclasses.replace(TOP1, outputs=("values", "values"))
    with pytest.raises(TypeError, match="outputs must be a tuple"):
        dataclasses.replace(TOP1, outputs="values")


def _rows_rule(x, index, keep, flag):
    """A shape rule written in Python for the test (packages write it in C++): rows of x picked by index."""
    if len(index) != 1:
        raise ValueError(f"{NS}::rows: index must be 1-D, got {len(index)} dims")
    if x[0] < 1:
        raise ValueError(f"{NS}::rows: x is empty")
    return [2, index[0], x[1]] + ([1, len(keep)] if flag else [])


_LIBS.append(torch.library.Library(NS, "FRAGMENT"))
_LIBS[-1].define("_rows_output_shapes(SymInt[] x, SymInt[] index, int[] keep, bool flag) -> SymInt[]")
_LIBS[-1].impl("_rows_output_shapes", _rows_rule, "CompositeExplicitAutograd")


def test_shape_rule_gives_the_fake_impl_and_onnx_shape_inference_the_same_shapes():
    rule = opforge.ShapeRule(f"{NS}::_rows_output_shapes")
    assert rule(torch.Size([3, 4]), [5], [0, 2], False) == [[5, 4]]
    assert rule([3, 4], [5], [0, 2], True) == [[5, 4], [2]]  # several outputs: [rank, dims...] each
    with pytest.raises(ValueError, match="index must be 1-D, got 2 dims"):
        rule([3, 4], [5, 1], [0], False)
    # ONNX: named dims stay named where the output dim is that dim; other values come through
    assert rule.onnx_output_shapes([["n", 4], ["m"]], {"keep": [1], "flag": 1}) == [["m", 4], [1]]
    assert rule.onnx_output_shapes([[None, "c"], [7]], {"keep": [1], "flag": 0}) == [[7, "c"]]
    assert rule.onnx_output_shapes([["n", 4], None], {"keep": [1], "flag": 0}) is None  # index's rank unknown
    assert rule.onnx_output_shapes([["n", 4], ["m", 2]], {"keep": [1], "flag": 0}) is None  # the rule refuses
    assert rule.onnx_output_shapes([["n", 4], ["m"]], {"keep": [1]}) is None  # an attribute is missing
    with pytest.raises(ValueError, match="not a qualified op name"):
        opforge.ShapeRule("rows_output_shapes")
    with pytest.raises(RuntimeError, match="is not registered"):
        opforge.ShapeRule(f"{NS}::_nowhere_output_shapes")([1])
