"""libopforge_aten's argument guards (opforge/aten/csrc/aten_guards.h), issue #43: what each
check refuses, that the calls it lets through still give torch's answer, and the per-node memory
budget. The hostile models of the issue, through both paths, are in test_aten_hostile.py; the
schema-driven fuzzing of every allowed op in test_aten_fuzz.py."""

import gc
import subprocess
import sys
import textwrap

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto

import opforge
from opforge.aten import policy

from helpers import aten_model

F, L, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32


def _plain(model, **config):
    so = ort.SessionOptions()
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    so.register_custom_ops_library(opforge.aten_library_path())
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _run(model, feeds, **config):
    return _plain(model, **config).run(None, feeds)


# ---- enums and loop counts ----------------------------------------------------------------

GRID_X = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
GRID_G = np.random.default_rng(0).uniform(-1.2, 1.2, (1, 3, 5, 2)).astype(np.float32)


@pytest.mark.parametrize("interp,pad", [(0, 0), (1, 1), (2, 2), (0, 2)])
def test_grid_sampler_with_valid_modes_matches_torch(interp, pad):
    model = aten_model("grid_sampler_2d", "", [("x", F), ("g", F)],
                       consts=[np.array(interp), np.array(pad), np.array(False)], out_types=(F,))
    (got,) = _run(model, {"x": GRID_X, "g": GRID_G})
    want = torch.ops.aten.grid_sampler_2d(torch.from_numpy(GRID_X), torch.from_numpy(GRID_G), interp, pad, False)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("operator,arg,value,valid", [
    ("grid_sampler_2d", 2, 3, "0 to 2"), ("grid_sampler_2d", 3, 7, "0 to 2"), ("grid_sampler_2d", 2, -1, "0 to 2"),
    ("grid_sampler_3d", 2, 2, "0 to 1"),  # no bicubic in 3-D: the kernel left the output unwritten
])
def test_grid_sampler_modes_out_of_range_are_refused(operator, arg, value, valid):
    consts = [np.array(0), np.array(0), np.array(False)]
    consts[arg - 2] = np.array(value)
    x, g = (GRID_X, GRID_G) if operator == "grid_sampler_2d" else (GRID_X[None], np.zeros((1, 2, 2, 2, 3), np.float32))
    model = aten_model(operator, "", [("x", F), ("g", F)], consts=consts, out_types=(F,))
    with pytest.raises(Exception, match=rf"ATen op aten::{operator}, argument {arg} .*is {value}; valid values are "
                                        rf"{valid}"):
        _run(model, {"x": x, "g": g})


def test_a_reduction_out_of_range_is_refused_for_every_loss():
    x, y = np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)
    for reduction, ok in ((2, True), (3, False), (-1, False)):
        model = aten_model("mse_loss", "", [("x", F), ("y", F)], consts=[np.array(reduction)], out_types=(F,))
        if ok:
            assert _run(model, {"x": x, "y": y})[0] == pytest.approx(6.0)
        else:
            with pytest.raises(Exception, match=rf"aten::mse_loss, argument 2 'reduction'.*is {reduction}; valid "
                                                r"values are 0 to 2"):
                _run(model, {"x": x, "y": y})


def test_matrix_power_keeps_its_answer_and_refuses_powers_that_never_end():
    a = np.array([[1.0, 1.0], [0.0, 1.0]], np.float32)
    for n in (5, -3, 0):
        model = aten_model("matrix_power", "", [("a", F)], consts=[np.array(n)], out_types=(F,))
        np.testing.assert_allclose(_run(model, {"a": a})[0],
                                   torch.linalg.matrix_power(torch.from_numpy(a), n).numpy(), rtol=1e-6)
    model = aten_model("matrix_power", "", [("a", F)], consts=[np.array(-2**63)], out_types=(F,))
    with pytest.raises(Exception, match=r"'n' is -9223372036854775808; valid values are -2147483648 to 2147483648"):
        _run(model, {"a": a})


@pytest.mark.parametrize("dtype,layout,match", [
    (12, None, r"12 is not a valid ScalarType here \(a dtype of dense numbers"),  # qint8
    (None, 1, r"1 is not a valid Layout here \(0 \(strided"),  # sparse_coo
])
def test_quantized_dtypes_and_sparse_layouts_are_refused(dtype, layout, match):
    # zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None)
    model = aten_model("zeros", "", [], consts=[np.array([2, 2]), np.array(dtype if dtype is not None else 6),
                                                np.array(layout if layout is not None else 0)], out_types=(F,))
    with pytest.raises(Exception, match=match):
        _run(model, {})


# ---- data kernels trust -------------------------------------------------------------------

def _ctc_model():
    return aten_model("ctc_loss", "Tensor", [("lp", F), ("t", L), ("il", L), ("tl", L)], out_types=(F,))


def test_ctc_loss_matches_torch_and_refuses_targets_outside_the_classes():
    lp = torch.randn(6, 2, 5).log_softmax(2)
    targets, il, tl = torch.tensor([[1, 2, 3], [4, 4, 0]]), torch.tensor([6, 5]), torch.tensor([3, 2])
    feeds = {"lp": lp.numpy(), "t": targets.numpy(), "il": il.numpy(), "tl": tl.numpy()}
    (got,) = _run(_ctc_model(), feeds)
    np.testing.assert_allclose(got, torch.ops.aten.ctc_loss.Tensor(lp, targets, il, tl).numpy(), rtol=1e-5)
    for bad in (5, -1, 2**40):
        feeds["t"] = np.array([[1, bad, 3], [4, 4, 0]])
        with pytest.raises(Exception, match=rf"aten::ctc_loss.Tensor: 'targets' holds {bad}; every target must be a "
                                            r"class of log_probs, 0 to 4"):
            _run(_ctc_model(), feeds)


def test_polynomial_degrees_are_bounded_and_small_ones_match_torch():
    model = aten_model("special_legendre_polynomial_p", "", [("x", F), ("n", F)], out_types=(F,))
    x, n = np.array([0.5, -0.3, 0.9], np.float32), np.array([3, 10, 200], np.float32)
    np.testing.assert_allclose(_run(model, {"x": x, "n": n})[0],
                               torch.special.legendre_polynomial_p(torch.from_numpy(x), torch.from_numpy(n)).numpy(),
                               rtol=1e-5, atol=1e-6)
    for bad in (1e18, np.inf, np.nan, -1e9):
        with pytest.raises(Exception, match=r"'n' must hold finite degrees of at most 65536"):
            _run(model, {"x": x, "n": np.array([3, bad, 1], np.float32)})


@pytest.mark.parametrize("elem,mode", [(L, "trunc"), (L, "floor"), (I32, "trunc")])
def test_integer_division_of_the_minimum_by_minus_one_is_an_error_not_sigfpe(elem, mode):
    dtype = np.int64 if elem == L else np.int32
    low = np.iinfo(dtype).min
    model = aten_model("div", "Tensor_mode", [("x", elem), ("y", elem)], consts=[np.array(mode)], out_types=(elem,))
    x, y = np.array([7, -7, low], dtype), np.array([2, 2, 3], dtype)
    (got,) = _run(model, {"x": x, "y": y})
    np.testing.assert_array_equal(got, torch.div(torch.from_numpy(x), torch.from_numpy(y), rounding_mode=mode).numpy())
    with pytest.raises(Exception, match=rf"'self' holds {low} and 'other' holds -1: integer division"):
        _run(model, {"x": x, "y": np.array([2, -1, 3], dtype)})


# ---- the memory budget --------------------------------------------------------------------

def test_the_budget_refuses_an_allocation_before_it_is_made_and_names_the_way_out():
    model = aten_model("eye", "", [], consts=[np.array(25000)], out_types=(F,))
    with pytest.raises(Exception, match=r"ATen op aten::eye: asks for 2500000000 bytes more after 0, more than this "
                                        r"node may allocate \(268435456 bytes.*'opforge.aten.max_elements'"):
        _run(model, {})
    small = aten_model("eye", "", [], consts=[np.array(300)], out_types=(F,))
    np.testing.assert_array_equal(_run(small, {})[0], np.eye(300, dtype=np.float32))
    # the session setting raises the bound and the budget with it (8 bytes an element)
    with pytest.raises(Exception, match=r"more than this node may allocate \(80000 bytes"):
        _run(small, {}, **{policy.MAX_ELEMENTS_CONFIG_KEY: "10000"})


def test_the_budget_counts_intermediates_not_just_the_output():
    # mvlgamma's output is its input's size; its internal range of p values is what grows
    model = aten_model("mvlgamma", "", [("x", F)], consts=[np.array(300_000_000)], out_types=(F,))
    with pytest.raises(Exception, match=r"aten::mvlgamma: asks for \d+ bytes more"):
        _run(model, {"x": np.array([5.0], np.float32)})
    model = aten_model("mvlgamma", "", [("x", F)], consts=[np.array(3)], out_types=(F,))
    x = np.array([5.0, 2.5], np.float32)
    np.testing.assert_allclose(_run(model, {"x": x})[0], torch.mvlgamma(torch.from_numpy(x), 3).numpy(), rtol=1e-5)


def test_outside_a_node_torch_allocates_as_before():
    _run(aten_model("eye", "", [], consts=[np.array(3)], out_types=(F,)), {})  # the allocator is installed now
    big = torch.ones(1 << 27)  # 512 MiB: over a node's default budget, and none of its business
    assert big[-1] == 1
    del big


def test_the_library_stays_loaded_after_its_last_session_options_are_gone():
    """ORT dlcloses a custom-op library with the last options that registered it; libtorch keeps a
    pointer to the allocator the library installed, so it must not go (the suite crashed in torch.randn
    before -z nodelete)."""
    code = textwrap.dedent("""
        import gc, sys
        import numpy as np, onnxruntime as ort, torch
        sys.path.insert(0, sys.argv[1])
        import opforge
        from helpers import aten_model
        so = ort.SessionOptions()
        so.register_custom_ops_library(opforge.aten_library_path())
        model = aten_model("eye", "", [], consts=[np.array(3)], out_types=(1,))
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {})
        del so
        gc.collect()
        print(float(sum(torch.randn(100, 100).sum() for _ in range(50)) * 0), "survived")
    """)
    tests_dir = str(__import__("pathlib").Path(__file__).parent)
    proc = subprocess.run([sys.executable, "-c", code, tests_dir], capture_output=True, text=True, timeout=300,
                          cwd="/")
    assert proc.returncode == 0 and "survived" in proc.stdout, (proc.returncode, proc.stderr[-2000:])


def test_malformed_nodes_give_the_same_error_through_ort_session_and_plain_onnxruntime():
    no_operator = aten_model("abs", "", [("x", F)], out_types=(F,))
    node = no_operator.graph.node[-1]
    kept = [a for a in node.attribute if a.name != "operator"]
    del node.attribute[:]
    node.attribute.extend(kept)
    errors = []
    for make in (lambda m: opforge.ort_session(m), _plain):
        with pytest.raises(Exception, match=r"org.pytorch.aten::ATen node '.*': it has no string attribute "
                                            r"'operator'") as caught:
            make(no_operator)
        errors.append(str(caught.value))
    assert "KeyError" not in errors[0]
    gc.collect()


def test_typing_a_factory_node_in_python_allocates_nothing():
    """opforge.ort_session types an ATen node's outputs with a meta run of its op. A factory op
    whose node leaves `device` out (a trailing default) ran on the CPU instead: eye(20000) took
    1.6 GB in the Python process before the library was even reached."""
    code = textwrap.dedent("""
        import resource, sys
        import numpy as np
        sys.path.insert(0, sys.argv[1])
        import opforge
        from helpers import aten_model
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for op, consts in (("eye", [np.array(20000)]), ("zeros", [np.array([20000, 20000])])):
            model = aten_model(op, "", [], consts=consts, out_types=(1,))
            model.graph.output[0].type.Clear()  # untyped, as the TorchScript exporter leaves it
            try:
                opforge.ort_session(model).run(None, {})
            except Exception as e:
                assert "more than this node may" in str(e), e
        print("grew", (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, "MB")
    """)
    tests_dir = str(__import__("pathlib").Path(__file__).parent)
    proc = subprocess.run([sys.executable, "-c", code, tests_dir], capture_output=True, text=True, timeout=300, cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    grew = int(proc.stdout.split("grew")[1].split()[0])
    assert grew < 400, proc.stdout  # 1.6 GB before the fix
