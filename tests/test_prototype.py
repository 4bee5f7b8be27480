"""The prototype tier and onnxruntime-extensions: an op from a spec and a numpy kernel only
(opforge.register_prototype) in torch, both exporters and ONNX Runtime; ortx's own ops served by
opforge.ort_session; a model mixing an ortx C++ op, an opforge C++ op, an ATen-fallback node and
a prototype op in one session; errors inside ONNX Runtime reported, never a crash."""

import gc
import warnings
import weakref

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import opforge
from opforge.spec import ATEN_DOMAIN
from opforge.aten import fallback
from opforge.testing import BadSample, Sample, op_tests, single_node_model

from helpers import scratch_venv
from preloaded_python import run_command, run_python

NS, DOMAIN = "opf_proto_t", "com.example.proto"


# ---- a prototype op with two tensor inputs, int/float/bool attributes and two outputs -----------
# poly(a, b, alpha, power, negate) = (s * (alpha * a**power + b), that > 0), s = -1 if negate else 1


def _poly_fake(a, b, alpha, power, negate):
    if not (a.dtype.is_floating_point and b.dtype == a.dtype):
        raise TypeError(f"{NS}::poly: a and b must be floating tensors of one dtype, got {a.dtype} and {b.dtype}")
    if not 1 <= power <= 4:
        raise ValueError(f"{NS}::poly: power must be in 1..4, got {power}")
    try:
        shape = torch.broadcast_shapes(a.shape, b.shape)
    except RuntimeError:
        raise ValueError(f"{NS}::poly: a {list(a.shape)} and b {list(b.shape)} do not broadcast") from None
    return a.new_empty(shape), a.new_empty(shape)


def _poly_kernel(a, b, *, alpha, power, negate):
    y = alpha * a ** power + b
    if negate:
        y = -y
    return y, (y > 0).astype(y.dtype)


def _poly_setup(ctx, inputs, output):
    a, b, alpha, power, negate = inputs
    ctx.save_for_backward(a)
    ctx.alpha, ctx.power, ctx.sign = float(np.float32(alpha)), power, (-1.0 if negate else 1.0)
    ctx.b_shape = b.shape


def _poly_backward(ctx, grad_y, grad_mask):
    (a,) = ctx.saved_tensors
    grad_a = grad_y * ctx.sign * ctx.alpha * ctx.power * a ** (ctx.power - 1)
    grad_b = (grad_y * ctx.sign).sum_to_size(ctx.b_shape)
    return grad_a.sum_to_size(a.shape), grad_b, None, None, None


def _poly_reference(a, b, *, alpha, power, negate):
    """The formula in plain torch, float64 (independent of the numpy kernel)."""
    ta, tb = torch.from_numpy(a).double(), torch.from_numpy(b).double()
    y = (-1 if negate else 1) * (alpha * ta ** power + tb)
    return y.numpy().astype(a.dtype), (y > 0).numpy().astype(a.dtype)


POLY = opforge.OpSpec(
    name="poly", namespace=NS, domain=DOMAIN,
    schema="poly(Tensor a, Tensor b, float alpha, int power, bool negate) -> (Tensor, Tensor)",
    args=(opforge.TensorArg("a", "A"), opforge.TensorArg("b", "B"), opforge.AttrArg("alpha", kind="float"),
          opforge.AttrArg("power", kind="int"), opforge.AttrArg("negate", kind="bool")),
    outputs=("Y", "Positive"), doc="", fake=_poly_fake, setup_context=_poly_setup, backward=_poly_backward,
    reference=_poly_reference, onnx_output_shapes=lambda shapes, attrs: [None, None],
    onnx_types=("tensor(float)", "tensor(double)"),
)
poly = opforge.register_prototype(POLY, impl=_poly_kernel)

_g = torch.Generator().manual_seed(0)
SAMPLES = [
    Sample(torch.randn(4, 5, generator=_g), torch.randn(4, 5, generator=_g), 0.7, 3, False, name="same-shape"),
    Sample(torch.randn(3, 2, 5, generator=_g), torch.randn(5, generator=_g), -1.3, 2, True, batch=("a",),
           name="broadcast-b"),
]
BAD = [
    BadSample(torch.randn(3), torch.randn(3), 1.0, 7, False, match=r"poly: power must be in 1\.\.4", name="power"),
    BadSample(torch.randn(3, 2), torch.randn(4), 1.0, 2, False, match=r"poly: a \[3, 2\] and b \[4\] do not broadcast",
              name="no-broadcast"),
    BadSample(torch.arange(3), torch.arange(3), 1.0, 2, False, match="poly", name="integer-inputs"),
]

# Every generic check, the ORT ones through the onnxruntime-extensions Python op.
test_poly_checks = op_tests(POLY, SAMPLES, bad_samples=BAD)


def test_values_and_gradients_against_plain_torch():
    a = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y, positive = poly(a, b, 0.25, 3, True)
    want = -(0.25 * a ** 3 + b)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(positive, (want > 0).double())
    ga, gb = torch.autograd.grad(y.sum(), (a, b))
    wa, wb = torch.autograd.grad(want.sum(), (a, b))
    torch.testing.assert_close(ga, wa)
    torch.testing.assert_close(gb, wb)


def test_half_precision_torch_op_computes_in_float32():
    a, b = torch.randn(8, generator=_g), torch.randn(8, generator=_g)
    for dtype in (torch.float16, torch.bfloat16):
        y, _ = poly(a.to(dtype), b.to(dtype), 1.5, 2, False)
        assert y.dtype == dtype
        ar, br = a.to(dtype).float(), b.to(dtype).float()
        torch.testing.assert_close(y, (1.5 * ar ** 2 + br).to(dtype))


def test_torch_compile_uses_the_fake_impl():
    a, b = torch.randn(2, 3), torch.randn(3)
    compiled = torch.compile(lambda a, b: poly(a, b, 0.5, 2, False)[0] * 2, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(a, b), (0.5 * a ** 2 + b) * 2)


# ---- errors: clear in torch, reported (never a crash) in ONNX Runtime ------------------------------


def test_bad_input_in_onnx_runtime_raises_through_ort_session():
    model = single_node_model(POLY, [torch.randn(3), torch.randn(3), 1.0, 9, False])  # power 9: refused
    session = opforge.ort_session(model)
    assert isinstance(session, ort.InferenceSession) and type(session).__name__ == "PrototypeSession"
    with pytest.raises(opforge.OpInputError, match=r"opf_proto_t::poly: power must be in 1\.\.4, got 9"):
        session.run(None, {"A": np.ones(3, np.float32), "B": np.ones(3, np.float32)})
    # the session stays usable, and a run with good input after a failed one is right
    ok = single_node_model(POLY, [torch.randn(3), torch.randn(3), 1.0, 2, False])
    ok_session = opforge.ort_session(ok)
    with pytest.raises(opforge.OpInputError, match=r"a \[2\] and b \[3\] do not broadcast"):
        ok_session.run(None, {"A": np.ones(2, np.float32), "B": np.ones(3, np.float32)})
    y, pos = ok_session.run(None, {"A": np.full(3, 2, np.float32), "B": np.ones(3, np.float32)})
    np.testing.assert_array_equal(y, np.full(3, 5, np.float32))
    # The fake impl's error is cached per input signature, without the frames that raised it: they
    # would keep this session (and, up the stack, everything its caller held) alive.
    gone = weakref.ref(ok_session)
    del ok_session
    gc.collect()  # (the errors raised through pytest.raises above form cycles with the run's frames)
    assert gone() is None


def test_bad_input_in_a_plain_onnxruntime_session_warns_and_gives_no_values():
    model = single_node_model(POLY, [torch.randn(3), torch.randn(3), 1.0, 9, False])
    so = ort.SessionOptions()
    so.register_custom_ops_library(opforge.ort_library_path(DOMAIN))  # onnxruntime-extensions' library
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    with pytest.warns(opforge.PrototypeKernelWarning, match=r"poly: power must be in 1\.\.4.*opforge\.ort_session"):
        y, pos = session.run(None, {"A": np.ones(3, np.float32), "B": np.ones(3, np.float32)})
    assert y.size == 0 and pos.size == 0  # no plausible-looking numbers


def _failing_spec(name, impl):
    spec = opforge.OpSpec(name=name, namespace=NS, domain=DOMAIN, schema=f"{name}(Tensor x) -> Tensor",
                          args=(opforge.TensorArg("x", "X"),), outputs=("Y",), doc="",
                          fake=lambda x: torch.empty_like(x), onnx_types=("tensor(float)",))
    opforge.register_prototype(spec, impl=impl)
    return spec


def test_a_failing_kernel_is_an_error_naming_the_op_in_both_runtimes():
    def kernel(x):
        if np.isnan(x).any():
            raise FloatingPointError("NaN input")
        return x + 1

    spec = _failing_spec("fails_on_nan", kernel)
    x = torch.tensor([1.0, float("nan")])
    with pytest.raises(RuntimeError, match=r"opf_proto_t::fails_on_nan: the prototype implementation .*kernel\) raised "
                                           r"FloatingPointError: NaN input"):
        torch.ops.opf_proto_t.fails_on_nan(x)
    session = opforge.ort_session(single_node_model(spec, [x]))
    with pytest.raises(RuntimeError, match="fails_on_nan.*FloatingPointError: NaN input"):
        session.run(None, {"X": x.numpy()})
    np.testing.assert_array_equal(session.run(None, {"X": np.ones(2, np.float32)})[0], np.full(2, 2, np.float32))


def test_a_kernel_disagreeing_with_the_fake_impl_is_an_error_in_both_runtimes():
    spec = _failing_spec("wrong_shape", lambda x: x[:1])
    x = torch.ones(3)
    with pytest.raises(RuntimeError, match=r"wrong_shape: the prototype implementation returned output 'Y' of shape "
                                           r"\[1\], but the spec's fake impl says \[3\]"):
        torch.ops.opf_proto_t.wrong_shape(x)
    with pytest.raises(RuntimeError, match=r"of shape \[1\], but the spec's fake impl says \[3\]"):
        opforge.ort_session(single_node_model(spec, [x])).run(None, {"X": x.numpy()})


@pytest.mark.parametrize("change, match", [
    ({"args": (opforge.TensorArg("x"), opforge.AttrArg("ks", kind="ints"))}, r"\['ks'\] are lists \(int\[\] or float\[\]\)"),
    ({"args": (opforge.TensorArg("x"), opforge.TensorArg("w", optional=True))}, r"optional tensor input\(s\) \['w'\]"),
    ({"onnx_types": ("tensor(float)", "tensor(float16)")}, r"\['tensor\(float16\)'\] cannot be served"),
])
def test_registration_refuses_what_ortx_python_ops_cannot_do(change, match):
    fields = dict(name="refused", namespace="opf_proto_refused", domain="com.example.refused",
                  schema="refused(Tensor x) -> Tensor", args=(opforge.TensorArg("x"),), outputs=("Y",), doc="",
                  fake=lambda *a: torch.empty(0), onnx_types=("tensor(float)",))
    fields.update(change)
    with pytest.raises(opforge.OpRegistrationError, match=match):
        opforge.register_prototype(opforge.OpSpec(**fields), impl=lambda x, **kw: x)
    assert "com.example.refused::refused" not in opforge.spec.REGISTRY


def test_registration_refuses_a_compiled_op_and_a_missing_impl():
    my_add = opforge.spec.find("opforge::my_add")
    with pytest.raises(opforge.OpRegistrationError, match="registered already"):
        opforge.register_prototype(my_add, impl=lambda a, b: 2 * a + b)
    spec = opforge.OpSpec(name="no_impl", namespace="opf_proto_refused", schema="no_impl(Tensor x) -> Tensor",
                          args=(opforge.TensorArg("x"),), outputs=("Y",), doc="", fake=lambda x: x)
    with pytest.raises(TypeError, match="give impl="):
        opforge.register_prototype(spec)
    assert opforge.register_prototype(POLY, impl=_poly_kernel) is poly  # the same spec again: a no-op


def _scale_spec(name: str, domain: str) -> opforge.OpSpec:
    return opforge.OpSpec(name=name, namespace="opf_proto_order", domain=domain, schema=f"{name}(Tensor x) -> Tensor",
                          args=(opforge.TensorArg("x", "X"),), outputs=("Y",), doc="", fake=lambda x: torch.empty_like(x),
                          onnx_types=("tensor(float)",))


def test_defining_an_op_under_a_live_session_of_its_domain_is_refused_not_a_crash():
    # onnxruntime-extensions keeps a domain's Python ops in one growing array that ORT points into:
    # a new op of the domain moves it under the sessions made before (a segfault at their next run
    # or destruction, seen in this suite when a garbage collection destroyed such a session).
    domain = "com.example.proto_order"
    double_spec = _scale_spec("double", domain)
    opforge.register_prototype(double_spec, impl=lambda x: 2 * x)
    x = torch.arange(4, dtype=torch.float32)
    session = opforge.ort_session(single_node_model(double_spec, [x]))
    (y,) = session.run(None, {"X": x.numpy()})
    np.testing.assert_array_equal(y, [0, 2, 4, 6])
    triple_spec = _scale_spec("triple", domain)
    with pytest.raises(opforge.OpRegistrationError, match=r"register_prototype\(com.example.proto_order::triple\): 2 "
                                                          r"ONNX Runtime session\(s\) or SessionOptions .* would crash"):
        opforge.register_prototype(triple_spec, impl=lambda x: 3 * x)
    assert f"{domain}::triple" not in opforge.spec.REGISTRY and not hasattr(torch.ops.opf_proto_order, "triple")
    (y,) = session.run(None, {"X": x.numpy()})  # the session was left as it was
    np.testing.assert_array_equal(y, [0, 2, 4, 6])
    # Another domain's table is another array: defining an op there leaves this session alone.
    opforge.register_prototype(_scale_spec("half", "com.example.proto_order2"), impl=lambda x: x / 2)
    (y,) = session.run(None, {"X": x.numpy()})
    np.testing.assert_array_equal(y, [0, 2, 4, 6])
    del session  # (a session in a reference cycle counts as gone: the check collects first)
    triple = opforge.register_prototype(triple_spec, impl=lambda x: 3 * x)
    torch.testing.assert_close(triple(x), 3 * x)
    for spec, factor in ((double_spec, 2), (triple_spec, 3)):
        (y,) = opforge.ort_session(single_node_model(spec, [x])).run(None, {"X": x.numpy()})
        np.testing.assert_array_equal(y, factor * x.numpy())


# ---- onnxruntime-extensions' own ops, and users' own onnx_op, next to ours -------------------------


def _string_length_model(opset=18):
    node = helper.make_node("StringLength", ["text"], ["n"], domain="ai.onnx.contrib")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("text", TensorProto.STRING, [None])],
                              [helper.make_tensor_value_info("n", TensorProto.INT64, [None])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid("ai.onnx.contrib", 1)])


def test_ort_session_registers_onnxruntime_extensions_for_ai_onnx_contrib():
    (n,) = opforge.ort_session(_string_length_model()).run(None, {"text": np.array(["", "ab", "héllo"], object)})
    np.testing.assert_array_equal(n, [0, 2, 5])
    assert opforge.ort_library_path("ai.onnx.contrib") == opforge.ort_kernels.ortx_library_path()


def test_a_contrib_op_nobody_defined_gets_a_clear_error():
    node = helper.make_node("NoSuchContribOp", ["x"], ["y"], domain="ai.onnx.contrib")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("ai.onnx.contrib", 1)])
    with pytest.raises(opforge.MissingOrtKernels, match="ai.onnx.contrib::NoSuchContribOp: the session has the "
                                                        "onnxruntime-extensions library.*no Python op of that name"):
        opforge.ort_session(model)


def test_users_own_onnx_op_still_runs_through_ortx_next_to_prototypes():
    from onnxruntime_extensions import PyCustomOpDef, onnx_op

    # A user's own onnx_op goes past opforge's check (register_prototype's): this test keeps the
    # order itself. (It collects first: an earlier test's session in a reference cycle counts.)
    assert opforge.ort_kernels.ortx_tables_in_use("ai.onnx.contrib") == 0

    @onnx_op(op_type="OpforgeTestTriple", inputs=[PyCustomOpDef.dt_float], outputs=[PyCustomOpDef.dt_float])
    def triple(x):
        return x * 3

    nodes = [helper.make_node("OpforgeTestTriple", ["x"], ["t"], domain="ai.onnx.contrib"),
             helper.make_node("poly", ["t", "x"], ["y", "p"], domain=DOMAIN, alpha=1.0, power=1, negate=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("ai.onnx.contrib", 1),
                                                    helper.make_opsetid(DOMAIN, 1)])
    (y,) = opforge.ort_session(model).run(None, {"x": np.array([1, -2], np.float32)})
    np.testing.assert_array_equal(y, [4, -8])  # 3x + x


# ---- the mixed model: ortx C++ op + opforge C++ op + ATen fallback + prototype op, one session ----


class _TextFeatures(torch.nn.Module):
    """The torch part: features x [B, 4] and text lengths [B, 1] (computed from strings by an ortx
    op in front of the exported graph)."""

    def forward(self, x, lengths):
        y = opforge.my_add(x, lengths)                    # opforge::my_add, libopforge_ort
        running_max, _ = torch.cummax(y, 1)               # no ONNX op: ATen fallback, libopforge_aten
        out, positive = poly(running_max, y, 0.5, 2, False)   # prototype op, ortx Python op
        return out * positive


def _prepend_string_lengths(main: onnx.ModelProto) -> onnx.ModelProto:
    """text [B] (strings) -> ai.onnx.contrib::StringLength -> float [B, 1] -> the main graph's `lengths`."""
    opset = next(o.version for o in main.opset_import if o.domain in ("", "ai.onnx"))
    nodes = [helper.make_node("StringLength", ["text"], ["n"], domain="ai.onnx.contrib"),
             helper.make_node("Cast", ["n"], ["n_f"], to=TensorProto.FLOAT),
             helper.make_node("Constant", [], ["axis1"], value=onnx.numpy_helper.from_array(np.array([1], np.int64))),
             helper.make_node("Unsqueeze", ["n_f", "axis1"], ["lengths_f"])]
    graph = helper.make_graph(nodes, "pre", [helper.make_tensor_value_info("text", TensorProto.STRING, ["B"])],
                              [helper.make_tensor_value_info("lengths_f", TensorProto.FLOAT, ["B", 1])])
    pre = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("ai.onnx.contrib", 1)],
                            ir_version=main.ir_version)
    return onnx.compose.merge_models(pre, main, io_map=[("lengths_f", "lengths")])


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_mixed_model_runs_in_one_ort_session_with_no_manual_registration(dynamo):
    model = _TextFeatures().eval()
    x, lengths = torch.randn(2, 4), torch.tensor([[3.0], [1.0]])
    kw = (dict(dynamic_shapes=({0: torch.export.Dim("B")}, {0: torch.export.Dim("B")})) if dynamo
          else dict(dynamic_axes={"x": {0: "B"}, "lengths": {0: "B"}}, opset_version=17))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fallback.AtenFallbackWarning)
        main = opforge.export(model, (x, lengths), dynamo=dynamo, aten_fallback=True, input_names=["x", "lengths"],
                              **kw)
    mixed = _prepend_string_lengths(main)
    onnx.checker.check_model(mixed)
    domains = {n.domain for n in mixed.graph.node}
    assert {"ai.onnx.contrib", "opforge", ATEN_DOMAIN, DOMAIN} <= domains, domains
    assert opforge.ort_kernels.custom_ops(mixed)["ai.onnx.contrib"] == ["ai.onnx.contrib::StringLength"]

    texts = ["a", "opforge", "", "onnx runtime", "xyz"]  # batch 5, exported at 2
    x5 = torch.randn(5, 4)
    session = opforge.ort_session(mixed)  # four libraries' worth of kernels, three .so files, no manual step
    (got,) = session.run(None, {"text": np.array(texts, object), "x": x5.numpy()})
    with torch.no_grad():
        want = model(x5, torch.tensor([[float(len(t))] for t in texts]))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


# ---- a generated prototype package: installs, passes its own tests, shows in `opforge info` -------


@pytest.fixture(scope="module")
def prototype_package(tmp_path_factory):
    base = tmp_path_factory.mktemp("proto_pkg")
    python = scratch_venv(base)
    pkg_dir = base / "opf_proto_pkg"
    # generated by this interpreter (the same opforge): the venv's own gets a server after the install
    gen = run_python(["-m", "opforge", "new-op", "swish", "--package", "opf_proto_pkg", "--domain",
                      "com.example.protopkg", "--prototype", "--dir", str(pkg_dir)], cwd=base)
    assert gen.returncode == 0, gen.stderr
    assert "prototype: numpy kernel, no C++" in gen.stdout
    install = run_command([python, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-e", str(pkg_dir)],
                          cwd=base)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    return python, pkg_dir


def test_generated_prototype_package_is_pure_python(prototype_package):
    _, pkg_dir = prototype_package
    files = sorted(p.relative_to(pkg_dir).as_posix() for p in pkg_dir.rglob("*") if p.is_file()
                   and "egg-info" not in p.as_posix() and "__pycache__" not in p.parts)
    assert files == [".gitignore", "README.md", "pyproject.toml", "src/opf_proto_pkg/__init__.py", "src/opf_proto_pkg/swish.py",
                     "tests/test_swish.py"]


def test_generated_prototype_package_installs_and_passes_its_tests(prototype_package):
    python, pkg_dir = prototype_package
    run = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", str(pkg_dir)], python=python, cwd=pkg_dir.parent)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "failed" not in run.stdout and "skipped" not in run.stdout


def test_import_makes_the_torch_op_and_info_shows_it(prototype_package):
    python, pkg_dir = prototype_package
    check = run_python(["-c", "import torch, opf_proto_pkg; x = torch.linspace(-3, 3, 7, dtype=torch.float64);"
                        "print(torch.ops.opf_proto_pkg.swish(x, 0.5).sub(x * torch.sigmoid(0.5 * x)).abs().max().item())"],
                       python=python, cwd=pkg_dir.parent)
    assert check.returncode == 0, check.stderr
    assert float(check.stdout) < 1e-15
    info = run_python(["-m", "opforge", "info"], python=python, cwd=pkg_dir.parent)
    assert info.returncode == 0, info.stderr
    import onnxruntime_extensions

    assert f"onnxruntime-extensions {onnxruntime_extensions.__version__}" in info.stdout
    line = next(l for l in info.stdout.splitlines() if "com.example.protopkg::swish" in l)
    assert "prototype: numpy kernel" in line and "torch.ops.opf_proto_pkg.swish" in line
    assert "com.example.protopkg: " in info.stdout and "_extensions_pydll" in info.stdout


def test_a_kernel_returning_its_input_does_not_make_the_op_alias_it():
    spec = _failing_spec("identity", lambda x: x)
    x = torch.randn(4)
    y = torch.ops.opf_proto_t.identity(x)
    assert torch.equal(y, x) and y.data_ptr() != x.data_ptr()
    torch.library.opcheck(torch.ops.opf_proto_t.identity.default, (x,))  # no aliasing between output and input
    del spec


def test_a_spec_not_matching_its_schema_is_refused_and_leaves_nothing_behind():
    import dataclasses

    good = opforge.OpSpec(name="retry", namespace="opf_proto_retry", domain="com.example.retry",
                          schema="retry(Tensor x) -> Tensor", args=(opforge.TensorArg("x"),), outputs=("Y",), doc="",
                          fake=lambda x: torch.empty_like(x), onnx_types=("tensor(float)",))
    wrong = dataclasses.replace(good, schema="retry(Tensor x, int k) -> Tensor")
    with pytest.raises(opforge.OpRegistrationError, match=r"spec.args \[x \(tensor\)\] do not match the schema's "
                                                          r"arguments \[x \(tensor\), k \(attribute\)\]"):
        opforge.register_prototype(wrong, impl=lambda x, **kw: x)
    op = opforge.register_prototype(good, impl=lambda x: x + 1)  # the corrected spec registers cleanly
    torch.testing.assert_close(op(torch.ones(2)), torch.full((2,), 2.0))


def test_import_opforge_does_not_import_onnxruntime_extensions():
    import subprocess
    import sys

    code = ("import sys, opforge; assert 'onnxruntime_extensions' not in sys.modules; "
            "print(opforge.ort_library_path('ai.onnx.contrib'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith(".so") and "_extensions_pydll" in out.stdout


def test_empty_inputs_give_empty_outputs_in_both_runtimes():
    a, b = torch.zeros(0, 3), torch.zeros(3)
    y, positive = poly(a, b, 1.0, 2, False)
    assert y.shape == positive.shape == (0, 3)
    session = opforge.ort_session(single_node_model(POLY, [a, b, 1.0, 2, False]))
    outs = session.run(None, {"A": a.numpy(), "B": b.numpy()})
    assert [o.shape for o in outs] == [(0, 3), (0, 3)]
