"""ATen ops: the curated symbolics (ONNX has the op, torch lacks the rule) and the ATen
fallback (ONNX lacks the op) for both exporters, run in ONNX Runtime with libopforge_aten."""

import io
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto

import opforge
from opforge.spec import ATEN_DOMAIN
from opforge.aten import fallback, nodes, rules

from helpers import Lambda, aten_model


# ---- 1. curated symbolics -------------------------------------------------------------

def test_every_registry_candidate_is_ruled_or_explained():
    """The candidates come from torch's own registry (ONNX op names that are ATen ops with no
    TorchScript rule). Each must have a rule here or a documented reason; none may be stale."""
    candidates = set(rules.missing_in_torch())
    ruled = {r.aten for r in rules.RULES}
    assert candidates <= ruled | set(rules.NOT_RULED), candidates - ruled - set(rules.NOT_RULED)
    assert set(rules.NOT_RULED) <= candidates  # no stale explanations
    for rule in rules.RULES:  # and no rule overrides one torch has
        assert not any(rules.has_torch_rule(rule.aten, o) for o in rule.opsets), rule.aten


RULE_INPUTS = {
    "asinh": lambda: torch.randn(3, 4) * 3,
    "acosh": lambda: torch.rand(3, 4) * 5 + 1,
    "atanh": lambda: torch.rand(3, 4) * 1.8 - 0.9,
    "sinh": lambda: torch.randn(3, 4) * 2,
    "cosh": lambda: torch.randn(3, 4) * 2,
    "trunc": lambda: torch.cat([torch.randn(3, 4) * 5, torch.tensor([[-0.5, 0.5, -2.0, 2.7]])]),
    "fix": lambda: torch.randn(3, 4) * 5,
    "bitwise_xor": lambda: torch.randint(-100, 100, (3, 4), dtype=torch.int32),
    "bitwise_and": lambda: torch.randint(-100, 100, (3, 4), dtype=torch.int32),
}
RULE_CASES = [(r.aten, o) for r in rules.RULES
              for o in sorted({r.opsets[0], min(max(17, r.opsets[0]), r.opsets[-1]), r.opsets[-1]})]


@pytest.mark.parametrize("aten,opset", RULE_CASES, ids=[f"{a}-opset{o}" for a, o in RULE_CASES])
def test_curated_symbolic_round_trip(aten, opset):
    x = RULE_INPUTS[aten]()
    if aten.startswith("bitwise_"):
        op = getattr(torch, aten)
        if opset >= 18:  # integers (BitwiseXor/BitwiseAnd) and bools
            fn = lambda a: op(a, a * 3 + 1) + op(a > 0, a < 5).int()
        else:  # bools only: integers are refused below 18 (test_aten_lowerings)
            fn = lambda a: op(a > 0, a < 5).int()
    else:
        fn = getattr(torch, aten)
    model = Lambda(fn)
    buf = io.BytesIO()
    torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=opset, input_names=["x"])
    proto = onnx.load_from_string(buf.getvalue())
    onnx.checker.check_model(proto, full_check=True)
    assert not any(n.domain for n in proto.graph.node)  # standard ONNX only
    (got,) = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})
    np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_unary_rules_promote_integers_like_torch():
    x = torch.arange(-3, 4, dtype=torch.int64)
    buf = io.BytesIO()
    torch.onnx.export(Lambda(torch.asinh), (x,), buf, dynamo=False, opset_version=17, input_names=["x"])
    (got,) = ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, torch.asinh(x).numpy(), rtol=1e-6)


# ---- 2. ATen fallback -------------------------------------------------------------------

def _sorted_seq():
    return torch.tensor([-1.0, -0.2, 0.3, 0.9, 1.5])


FALLBACK_MODELS = {
    # name: (fn(x), ops expected to fall back with the TorchScript exporter; none where
    # opforge's ATen bridge now exports the op with standard ONNX)
    "logcumsumexp": (lambda x: torch.logcumsumexp(x, 1), set()),
    "cummax-two-outputs": (lambda x: torch.cummax(x, 1), {"aten::cummax"}),
    "frexp-float-and-int-outputs": (lambda x: torch.frexp(x), {"aten::frexp.Tensor"}),
    "searchsorted-kwargs-and-None": (lambda x: torch.searchsorted(_sorted_seq(), x, right=True), {"aten::searchsorted.Tensor"}),
    "searchsorted-string-arg": (lambda x: torch.searchsorted(_sorted_seq(), x, side="right"), {"aten::searchsorted.Tensor"}),
    "polygamma-int-first": (lambda x: torch.polygamma(2, x.abs() + 0.5), {"aten::polygamma"}),
    "kthvalue-ints-two-outputs": (lambda x: torch.kthvalue(x, 2, 1), {"aten::kthvalue"}),
    "cumprod-optional-dtype": (lambda x: torch.cumprod(x, 1), {"aten::cumprod"}),
    "cumprod-dtype-arg": (lambda x: torch.cumprod(x, 1, dtype=torch.float64), {"aten::cumprod"}),
    "histc-int-and-floats": (lambda x: torch.histc(x, bins=4, min=-2, max=2), set()),
    "renorm-float-int-float": (lambda x: torch.renorm(x, 2, 0, 1.0), set()),
    "rot90-int-list": (lambda x: torch.rot90(x, 1, [0, 1]), set()),
    "count_nonzero-int-list": (lambda x: torch.count_nonzero(x > 0, dim=[0, 1]), set()),
}


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", list(FALLBACK_MODELS))
def test_fallback_round_trip(name, exporter):
    fn, ts_ops = FALLBACK_MODELS[name]
    model = Lambda(fn).eval()
    x = torch.randn(3, 4)
    dynamo = exporter == "dynamo"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        proto = opforge.export(model, (x,), dynamo=dynamo, aten_fallback=True, input_names=["x"], opset_version=18)
    fell_back = [str(w.message) for w in caught if issubclass(w.category, fallback.AtenFallbackWarning)]
    aten_nodes = [n for n in proto.graph.node if n.domain == ATEN_DOMAIN]
    meta = {p.key: p.value for p in proto.metadata_props}
    if aten_nodes:  # never silent: warned and recorded, naming exactly the ops in the graph
        assert fell_back and "fell back to ATen nodes" in fell_back[-1]
        in_graph = set()
        for n in aten_nodes:
            attrs = {a.name: a.s.decode() for a in n.attribute}
            in_graph.add(f"aten::{attrs['operator']}" + (f".{attrs['overload_name']}" if attrs.get("overload_name") else ""))
        assert set(meta["opforge.aten_fallback"].split(",")) == in_graph
        assert all(op in fell_back[-1] for op in in_graph)
    if not dynamo:
        assert set(meta.get("opforge.aten_fallback", "").split(",")) - {""} == ts_ops
    else:  # the dynamo exporter translates some of these natively; whatever is left falls back
        assert set(meta.get("opforge.aten_fallback", "").split(",")) - {""} <= ts_ops
    with torch.no_grad():
        expected = model(x)
    expected = expected if isinstance(expected, tuple) else (expected,)
    outs = opforge.ort_session(proto).run(None, {proto.graph.input[0].name: x.numpy()})
    assert len(outs) == len(expected)
    for got, exp in zip(outs, expected):
        assert got.dtype == exp.numpy().dtype
        np.testing.assert_allclose(got, exp.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_fallback_with_dynamic_shapes_and_a_mixed_model(exporter):
    """Standard ops + an opforge custom op + ATen nodes, both libraries registered, dynamic batch."""

    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = opforge.my_add(self.lin(x), x)  # opforge::my_add
            values, idx = torch.cummax(y, 1)    # ATen
            return torch.relu(values) + torch.logcumsumexp(y, 1), idx

    model = Mixed().eval()
    dynamo = exporter == "dynamo"
    kw = dict(dynamic_shapes=({0: torch.export.Dim("n")},)) if dynamo else dict(dynamic_axes={"x": {0: "n"}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fallback.AtenFallbackWarning)
        proto = opforge.export(model, (torch.randn(2, 4),), dynamo=dynamo, aten_fallback=True, input_names=["x"], **kw)
    domains = {n.domain for n in proto.graph.node}
    assert {"opforge", ATEN_DOMAIN} <= domains
    x = torch.randn(7, 4)
    with torch.no_grad():
        expected = model(x)
    outs = opforge.ort_session(proto).run(None, {proto.graph.input[0].name: x.numpy()})
    for got, exp in zip(outs, expected):
        np.testing.assert_allclose(got, exp.numpy(), rtol=1e-5, atol=1e-5)


def test_without_fallback_export_still_fails_loudly():
    with pytest.raises(Exception, match="cummax"):
        opforge.export(Lambda(lambda x: torch.cummax(x, 1)), (torch.randn(2, 3),), dynamo=False)


# ---- the ORT kernel on its own: errors ------------------------------------------------

def test_unknown_operator_is_an_error_naming_it():
    with pytest.raises(Exception, match=r"ATen op aten::no_such_op: no such operator"):
        opforge.ort_session(aten_model("no_such_op", "", [("x", TensorProto.FLOAT)]))
    with pytest.raises(Exception, match=r"ATen op aten::cummax.bogus: no such operator \(or overload\)"):
        opforge.ort_session(aten_model("cummax", "bogus", [("x", TensorProto.FLOAT)]))


def test_undecodable_argument_is_an_error_status_and_the_session_survives():
    x = np.random.randn(3, 4).astype(np.float32)
    bad = opforge.ort_session(aten_model("cummax", "", [("x", TensorProto.FLOAT), ("dim", TensorProto.FLOAT)], n_out=2))
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT.*ATen op aten::cummax, argument 1 'dim' \(int\): expected one integer"):
        bad.run(None, {"x": x, "dim": np.array([1.5], np.float32)})
    good = opforge.ort_session(aten_model("cummax", "", [("x", TensorProto.FLOAT), ("dim", TensorProto.INT64)], n_out=2))
    with pytest.raises(Exception, match=r"ATen op aten::cummax failed: .*[Dd]imension out of range"):
        good.run(None, {"x": x, "dim": np.array(5, np.int64)})
    values, _ = good.run(None, {"x": x, "dim": np.array(1, np.int64)})  # the same session still works
    np.testing.assert_array_equal(values, torch.cummax(torch.from_numpy(x), 1).values.numpy())


def test_too_many_inputs_is_an_error():
    sess = opforge.ort_session(aten_model("i0", "", [("x", TensorProto.FLOAT), ("y", TensorProto.FLOAT)]))
    with pytest.raises(Exception, match=r"ATen op aten::i0: node has 2 inputs but its schema takes 1 arguments"):
        sess.run(None, {"x": np.ones(2, np.float32), "y": np.ones(2, np.float32)})


def test_aten_library_links_torch_and_exports_only_register_custom_ops():
    out = subprocess.run(["nm", "-D", "--defined-only", opforge.aten_library_path()], capture_output=True, text=True, check=True)
    assert {l.split()[-1].split("@")[0] for l in out.stdout.splitlines() if l.strip()} == {"RegisterCustomOps"}
    needed = subprocess.run(["readelf", "-d", opforge.aten_library_path()], capture_output=True, text=True, check=True).stdout
    assert "libtorch_cpu.so" in needed and "onnxruntime" not in needed


def test_aten_library_works_in_a_process_without_torch_imported(tmp_path):
    with pytest.warns(fallback.AtenFallbackWarning, match="aten::cummax"):
        proto = opforge.export(Lambda(lambda x: torch.cummax(x, 1)), (torch.randn(2, 3),), dynamo=False,
                               aten_fallback=True, input_names=["x"])
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    script = textwrap.dedent(f"""
        import sys, numpy as np, onnxruntime as ort
        so = ort.SessionOptions()
        so.register_custom_ops_library({opforge.aten_library_path()!r})
        v, i = ort.InferenceSession({str(path)!r}, so, providers=["CPUExecutionProvider"]).run(
            None, {{"x": np.array([[1, 3, 2], [0, -1, 5]], np.float32)}})
        assert v.tolist() == [[1, 3, 3], [0, 0, 5]] and i.tolist() == [[0, 1, 1], [0, 0, 2]], (v, i)
        assert "torch" not in sys.modules
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# ---- the reference documents' ATen flow: g.at(...) with typed scalar attributes ---------------


class _SquareTwice(torch.autograd.Function):
    """x*x + x**2 in torch; its symbolic writes two ATen nodes by hand, as the reference documents do:
    no overload_name, the scalar as a typed attribute (exponent_f=2.0)."""

    @staticmethod
    def forward(ctx, x):
        return x * x + x.pow(2.0)

    @staticmethod
    def symbolic(g, x):
        return g.op("Add", g.at("mul", x, x), g.at("pow", x, exponent_f=2.0))


class _GatModel(torch.nn.Module):
    def forward(self, x):
        return _SquareTwice.apply(x) - 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("how", ["plain-torch.onnx.export", "opforge.export"])
def test_hand_written_g_at_nodes_run_through_libopforge_aten(how, dtype):
    model = _GatModel()
    x = torch.randn(2, 3, dtype=dtype)
    kw = dict(dynamo=False, opset_version=17, input_names=["x"], dynamic_axes={"x": {0: "n"}})
    if how == "opforge.export":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fallback.AtenFallbackWarning)
            proto = opforge.export(model, (x,), aten_fallback=True, **kw)
        overloads = {onnx.helper.get_attribute_value(a).decode() for n in proto.graph.node if n.op_type == "ATen"
                     for a in n.attribute if a.name == "overload_name"}
        assert overloads == {"Tensor", "Tensor_Scalar"}  # mul.Tensor, pow.Tensor_Scalar: resolved as dispatched
    else:
        f = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (x,), f, operator_export_type=torch.onnx.OperatorExportTypes.ONNX_ATEN_FALLBACK, **kw)
        proto = onnx.load_from_string(f.getvalue())
        pow_node = next(n for n in proto.graph.node if n.op_type == "ATen" and any(a.s == b"pow" for a in n.attribute))
        assert {a.name for a in pow_node.attribute} == {"operator", "overload_name", "exponent"}  # as torch wrote it
    x5 = torch.linspace(-3, 3, 15, dtype=dtype).reshape(5, 3)
    (got,) = opforge.ort_session(proto).run(None, {"x": x5.numpy()})
    assert got.dtype == x5.numpy().dtype
    np.testing.assert_allclose(got, (2 * x5 * x5 - 1).numpy(), rtol=1e-6)


def _aten_node(operator, inputs, **attrs):
    return onnx.helper.make_node("ATen", inputs, ["y"], domain=ATEN_DOMAIN, operator=operator,
                                 overload_name="", **attrs)


@pytest.mark.parametrize("operator, inputs, attrs, consts, expected", [
    ("mul", ["x", "x"], {}, set(), "mul.Tensor"),                     # aten::mul.default takes two Scalars
    ("pow", ["x"], {"exponent": 2.0}, set(), "pow.Tensor_Scalar"),
    ("pow", ["x", "e"], {}, set(), "pow.Tensor_Tensor"),               # a computed exponent is a tensor
    ("add", ["x", "y"], {"alpha": 2.0}, set(), "add.Tensor"),          # a keyword-only scalar by name
    ("cumsum", ["x"], {"dim": 1}, set(), "cumsum.default"),            # int attribute, dtype left to its default
    ("searchsorted", ["s", "v"], {}, set(), "searchsorted.Tensor"),
    ("searchsorted", ["s", "c"], {}, {"c"}, "searchsorted.Tensor"),    # Tensor comes first for a constant
])
def test_overloads_are_resolved_from_the_arguments(operator, inputs, attrs, consts, expected):
    op, plan = nodes.bind_overload(_aten_node(operator, inputs, **attrs), consts)
    assert f"{op._schema.name.split('::')[1]}.{op._overloadname}" == expected
    assert [p[1] for p in plan if p[0] == "value"] == list(attrs.values())


def test_an_unbindable_g_at_node_names_the_overloads():
    with pytest.raises(ValueError, match=r"no overload of aten::pow takes inputs \['x'\], bogus=1.0 \(non-out overloads"):
        nodes.bind_overload(_aten_node("pow", ["x"], bogus=1.0), set())


def test_g_at_with_int_and_keyword_scalar_attributes_runs():
    nodes = [_aten_node("cumsum", ["x"], dim=1)]
    nodes[0].output[0] = "c"
    nodes.append(_aten_node("add", ["c", "x"], alpha=0.5))
    graph = onnx.helper.make_graph(nodes, "g", [onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                                   [onnx.helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17),
                                                         onnx.helper.make_opsetid(ATEN_DOMAIN, 1)])
    x = torch.randn(2, 3)
    (got,) = opforge.ort_session(model).run(None, {"x": x.numpy()})
    np.testing.assert_allclose(got, (torch.cumsum(x, 1) + 0.5 * x).numpy(), rtol=1e-6)


def test_g_at_with_a_bool_argument_given_as_an_int_attribute():
    node = _aten_node("cumsum", ["x"], dim=0)  # then a bool one: any(x, dim, keepdim)
    node.output[0] = "c"
    anynode = _aten_node("any", ["c"], dim=1, keepdim=1)
    graph = onnx.helper.make_graph([node, anynode], "g", [onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                                   [onnx.helper.make_tensor_value_info("y", TensorProto.BOOL, None)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17),
                                                         onnx.helper.make_opsetid(ATEN_DOMAIN, 1)])
    x = torch.tensor([[0.0, 1.0, 0.0], [0.0, -1.0, 0.0]])
    (got,) = opforge.ort_session(model).run(None, {"x": x.numpy()})
    np.testing.assert_array_equal(got, torch.any(torch.cumsum(x, 0), 1, keepdim=True).numpy())


# ---- chains of hand-written ATen nodes (the reference documents' Caffe2-era flow) ----------

class _MulAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        return x * x + y

    @staticmethod
    def symbolic(g, x, y):
        return g.at("add", g.at("mul", x, x), y)  # ATen -> ATen


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.pow(2.0)

    @staticmethod
    def symbolic(g, x):
        return g.at("pow", x, exponent_f=2.0)


class _AtenChain(torch.nn.Module):
    """ATen -> ATen -> ATen, and (``standard_between``) ATen -> Relu -> ATen."""

    def __init__(self, standard_between: bool):
        super().__init__()
        self.standard_between = standard_between

    def forward(self, x, y):
        z = _MulAdd.apply(x, y)
        if self.standard_between:
            z = torch.relu(z)
        return _Square.apply(z)


@pytest.mark.parametrize("opset", [9, 13, 17])
@pytest.mark.parametrize("standard_between", [False, True], ids=["aten-aten-aten", "aten-relu-aten"])
@pytest.mark.parametrize("how", ["plain-torch.onnx.export", "opforge.export"])
def test_chained_g_at_nodes_are_typed_and_run(how, standard_between, opset):
    model = _AtenChain(standard_between)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    kw = dict(dynamo=False, opset_version=opset, input_names=["x", "y"], dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    if how == "opforge.export":
        with pytest.warns(fallback.AtenFallbackWarning):
            proto = opforge.export(model, (x, y), aten_fallback=True, **kw)
    else:
        f = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (x, y), f, operator_export_type=torch.onnx.OperatorExportTypes.ONNX_ATEN_FALLBACK,
                              **kw)
        proto = onnx.load_from_string(f.getvalue())
    kinds = [n.op_type for n in proto.graph.node if n.op_type != "Constant"]
    assert kinds == ["ATen", "ATen"] + (["Relu"] if standard_between else []) + ["ATen"]
    x5, y5 = torch.randn(5, 4), torch.randn(5, 4)
    (got,) = opforge.ort_session(proto).run(None, {"x": x5.numpy(), "y": y5.numpy()})
    np.testing.assert_allclose(got, model(x5, y5).numpy(), rtol=1e-6)
