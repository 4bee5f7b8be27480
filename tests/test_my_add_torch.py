"""torch side of my_add: values, dtypes, broadcasting, autograd, opcheck, errors."""

import os
import textwrap

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import opforge
from opforge.ops.my_add import MY_ADD
from preloaded_python import run_python

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]

# (shape of a, shape of b): equal, broadcasting both ways, rank mismatch, 0-d, empty, 1-element.
SHAPES = [
    ((3, 4), (3, 4)),
    ((2, 3, 4), (4,)),
    ((4,), (2, 3, 4)),
    ((2, 1, 4), (1, 3, 1)),
    ((5, 1), (1, 7)),
    ((), ()),
    ((), (3, 2)),
    ((2, 3), ()),
    ((0, 3), (3,)),
    ((2, 0, 3), (2, 1, 3)),
    ((1,), (1,)),
    ((2, 3, 1, 5, 1, 4), (3, 5, 6, 1)),
]


def reference(a, b):
    """Independent reference: 2*a + b in float64, rounded once to the input dtype."""
    return (2 * a.double() + b.double()).to(a.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape_a,shape_b", SHAPES)
def test_matches_reference(dtype, shape_a, shape_b):
    a = torch.randn(shape_a, dtype=torch.float64).to(dtype)
    b = torch.randn(shape_b, dtype=torch.float64).to(dtype)
    out = opforge.my_add(a, b)
    assert out.dtype == dtype
    assert out.shape == torch.broadcast_shapes(a.shape, b.shape)
    torch.testing.assert_close(out, reference(a, b), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_rounding_is_exact(dtype):
    # Covers the conversion corner cases: subnormals, overflow to inf, nan, signed zeros.
    specials = torch.tensor([0.0, -0.0, 1e-7, -3e-8, 6e-5, 65504.0, 4e4, float("inf"), float("-inf"), 1.0, -2.5])
    a = torch.cat([torch.randn(100_000) * 50, specials]).to(dtype)
    b = torch.cat([torch.randn(100_000), specials.flip(0)]).to(dtype)
    expected = (2 * a.float() + b.float()).to(dtype)
    torch.testing.assert_close(opforge.my_add(a, b), expected, rtol=0, atol=0, equal_nan=True)
    nan = torch.tensor([float("nan")], dtype=dtype)
    assert torch.isnan(opforge.my_add(nan, nan)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_parallel_and_streaming_paths(dtype):
    # > 4 MB output takes the non-temporal-store path, many grains the parallel one;
    # odd sizes and an offset view exercise unaligned heads and tails.
    base_a = torch.randn(3 * 1024 * 1024 + 7, dtype=dtype)
    a = base_a[1:]
    b = torch.randn(a.shape, dtype=dtype)
    torch.testing.assert_close(opforge.my_add(a, b), 2 * a + b, rtol=0, atol=0)
    row = torch.randn(1531, dtype=dtype)
    big = torch.randn(2000, 1531, dtype=dtype)
    torch.testing.assert_close(opforge.my_add(big, row), 2 * big + row, rtol=0, atol=0)
    torch.testing.assert_close(opforge.my_add(row, big), 2 * row + big, rtol=0, atol=0)


def test_non_contiguous_inputs():
    a = torch.randn(6, 8).t()  # transposed
    b = torch.randn(8, 12)[:, ::2]  # strided
    c = torch.randn(3, 8, 6).permute(1, 2, 0)[:, :, 1]  # permuted slice
    for x, y in [(a, b), (b, a), (a, c), (c.t(), a.t())]:
        assert not x.is_contiguous() or not y.is_contiguous()
        torch.testing.assert_close(opforge.my_add(x, y), reference(x, y), rtol=0, atol=0)
    expanded = torch.randn(1, 6).expand(8, 6)  # zero stride
    torch.testing.assert_close(opforge.my_add(expanded, a), reference(expanded, a), rtol=0, atol=0)


def test_three_entry_points_agree():
    a, b = torch.randn(4, 5), torch.randn(5)
    expected = reference(a, b)
    torch.testing.assert_close(opforge.my_add(a, b), expected)
    torch.testing.assert_close(torch.ops.opforge.my_add(a, b), expected)
    torch.testing.assert_close(opforge.MyAddFunction.apply(a, b), expected)
    torch.testing.assert_close(opforge.MyAdd()(a, b), expected)


@pytest.mark.parametrize("entry", ["op", "function"])
@pytest.mark.parametrize("shape_a,shape_b", [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((1, 4), (3, 1)), ((), (2, 2))])
def test_gradients_match_reference(entry, shape_a, shape_b):
    fn = opforge.my_add if entry == "op" else opforge.MyAddFunction.apply
    a = torch.randn(shape_a, dtype=torch.float64, requires_grad=True)
    b = torch.randn(shape_b, dtype=torch.float64, requires_grad=True)
    grad_out = torch.randn(torch.broadcast_shapes(shape_a, shape_b), dtype=torch.float64)
    ga, gb = torch.autograd.grad(fn(a, b), (a, b), grad_out)
    ra, rb = torch.autograd.grad(2 * a + b, (a, b), grad_out)
    torch.testing.assert_close(ga, ra)
    torch.testing.assert_close(gb, rb)
    assert torch.autograd.gradcheck(fn, (a, b))
    assert torch.autograd.gradgradcheck(fn, (a, b))


def test_gradient_only_for_inputs_that_need_it():
    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(4)
    opforge.my_add(a, b).sum().backward()
    torch.testing.assert_close(a.grad, torch.full((3, 4), 2.0))
    assert b.grad is None


@pytest.mark.parametrize("shape_a,shape_b", [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((5, 1), (1, 7)), ((), (3,))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck(shape_a, shape_b, dtype):
    a = torch.randn(shape_a, dtype=dtype, requires_grad=True)
    b = torch.randn(shape_b, dtype=dtype, requires_grad=True)
    torch.library.opcheck(torch.ops.opforge.my_add.default, (a, b))


def test_schema_matches_spec():
    assert str(torch.ops.opforge.my_add.default._schema) == f"opforge::{MY_ADD.schema}"


def test_torch_compile_and_export_see_the_op():
    def f(a, b):
        return opforge.my_add(a, b).relu()

    a, b = torch.randn(4, 3), torch.randn(3)
    torch.testing.assert_close(torch.compile(f, backend="aot_eager", fullgraph=True)(a, b), f(a, b))

    class M(torch.nn.Module):
        def forward(self, a, b):
            return opforge.MyAddFunction.apply(a, b)

    batch = torch.export.Dim("batch")
    ep = torch.export.export(M(), (a, b), dynamic_shapes=({0: batch}, None))
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert torch.ops.opforge.my_add.default in targets
    a7 = torch.randn(7, 3)
    torch.testing.assert_close(ep.module()(a7, b), reference(a7, b))


# ---- bad input: clear Python exceptions naming op and argument -------------------------


@pytest.mark.parametrize("fake", [False, True], ids=["kernel", "fake"])
def test_shape_mismatch_error(fake):
    a, b = torch.randn(2, 3), torch.randn(4)
    with FakeTensorMode() if fake else torch.no_grad():
        if fake:
            a, b = torch.empty(2, 3), torch.empty(4)
        with pytest.raises(ValueError, match=r"opforge::my_add: shapes of a \[2, 3\] and b \[4\] are not broadcastable"):
            opforge.my_add(a, b)


@pytest.mark.parametrize("fake", [False, True], ids=["kernel", "fake"])
def test_mixed_dtype_error(fake):
    with FakeTensorMode() if fake else torch.no_grad():
        a, b = torch.ones(3, dtype=torch.float32), torch.ones(3, dtype=torch.float64)
        with pytest.raises(TypeError, match=r"opforge::my_add: a and b must have the same dtype, got a: (Float|torch.float32) and b: (Double|torch.float64)"):
            opforge.my_add(a, b)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64])
def test_unsupported_dtype_error(dtype):
    a = torch.ones(3, dtype=dtype)
    with pytest.raises(TypeError, match="opforge::my_add: a has dtype .*supported dtypes are float16, bfloat16, float32 and float64"):
        opforge.my_add(a, a)


def test_too_many_dims_error():
    a = torch.ones([1] * 17)
    with pytest.raises(ValueError, match="opforge::my_add: at most 16 dimensions"):
        opforge.my_add(a, a)


@pytest.mark.parametrize("isa", ["baseline", "avx2", "avx512"])
def test_every_cpu_isa_path_is_exact(isa):
    """The core's loops are compiled for baseline/AVX2/AVX-512 and picked at run time;
    OPFORGE_CPU_ISA forces a lower one so each is checked (torch kernel and ORT kernel)."""
    script = textwrap.dedent(
        """
        import numpy as np, torch, opforge
        from onnx import TensorProto
        from helpers import single_node_model
        torch.manual_seed(0)
        shapes = [((1000, 37), (37,)), ((37,), (1000, 37)), ((3, 1, 513), (1, 7, 1)), ((100_003,), (100_003,))]
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            for sa, sb in shapes:
                a, b = (torch.randn(sa) * 30).to(dtype), torch.randn(sb).to(dtype)
                assert torch.equal(opforge.my_add(a, b), (2 * a.double() + b.double()).to(dtype)), (dtype, sa, sb)
        sess = opforge.ort_session(single_node_model("my_add", [TensorProto.FLOAT16] * 2))
        a, b = np.random.randn(1000, 37).astype(np.float16), np.random.randn(37).astype(np.float16)
        assert np.array_equal(sess.run(None, {"I0": a, "I1": b})[0], (2 * a.astype(np.float64) + b).astype(np.float16))
        print("ok")
        """
    )
    env = dict(os.environ, OPFORGE_CPU_ISA=isa, PYTHONPATH=os.path.dirname(__file__))
    out = run_python(["-c", script], env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
