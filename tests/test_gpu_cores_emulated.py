"""The CUDA kernels' work-item bodies, run on the CPU and checked against independent references.

opforge's CUDA kernels are grid-stride loops over host+device bodies
(opforge/csrc/core/deform_conv2d_gpu.h, my_add_gpu.h, ms_deform_attn_gpu.h).
tests/csrc/gpu_cores_host.cpp compiles those same headers with the host compiler and
runs every work item in a loop, in the kernels' launch order: deform_conv2d with the
kernels' chunking and the exact GEMM geometry the ORT CUDA kernel hands cuBLAS
(checked against torchvision), my_add (against torch), and ms_deform_attn's forward
and backward (grad_value scattered into a zeroed buffer, then the sampling-point
items), checked against opforge's CPU kernels and a grid_sample reference with
autograd. So the GPU indexing and arithmetic are verified on any machine; what only
a GPU can check (launches, atomics, cuBLAS, streams) is in test_cuda.py.
"""

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision

import opforge
from helpers import deform_inputs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx, "a C++ compiler is needed to build the GPU-core emulation"
    lib = tmp_path_factory.mktemp("emu") / "libgpu_cores_host.so"
    subprocess.run(
        [cxx, "-O1", "-g0", "-std=c++17", "-shared", "-fPIC", "-I", str(ROOT / "opforge" / "csrc"),
         str(ROOT / "tests" / "csrc" / "gpu_cores_host.cpp"), "-o", str(lib)],
        check=True,
    )
    return ctypes.CDLL(str(lib))


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


def _params(x, w, offset_groups, stride, pad, dil, groups, use_mask):
    n, c, h, wd = x.shape
    return np.array([n, c, h, wd, w.shape[0], w.shape[2], w.shape[3], *stride, *pad, *dil, groups, offset_groups,
                     int(use_mask)], dtype=np.int64)


CASES = [
    # (kwargs for deform_inputs, use_mask, chunk)
    (dict(), True, 1),
    (dict(), True, 2),
    (dict(), False, 2),
    (dict(n=3, c=4, o=6, h=7, w=7, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1, offset_groups=1), True, 2),
    (dict(n=2, c=8, o=4, h=6, w=10, kh=1, kw=3, stride=(2, 1), pad=(0, 2), dil=(1, 1), groups=4, offset_groups=2,
          offset_scale=4.0), True, 1),
]


@pytest.mark.parametrize("kwargs,use_mask,chunk", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_forward_items_match_torchvision(emu, kwargs, use_mask, chunk, dtype):
    x, w, off, mask, b = deform_inputs(dtype=dtype, **kwargs)
    stride, pad, dil = kwargs.get("stride", (1, 2)), kwargs.get("pad", (1, 0)), kwargs.get("dil", (1, 2))
    groups, og = kwargs.get("groups", 2), kwargs.get("offset_groups", 3)
    want = torchvision.ops.deform_conv2d(x, off, w, b, stride, pad, dil, mask if use_mask else None)
    arrays = [t.contiguous().numpy() for t in (x, w, off, mask, b)]
    out = np.full(tuple(want.shape), np.nan, dtype=arrays[0].dtype)
    fn = emu.emu_deform_forward_f64 if dtype == torch.float64 else emu.emu_deform_forward_f32
    assert fn(_ptr(_params(x, w, og, stride, pad, dil, groups, use_mask)), ctypes.c_int64(chunk),
              *map(_ptr, arrays), _ptr(out)) == 0
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    np.testing.assert_allclose(out, want.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("kwargs,use_mask,chunk", CASES)
def test_backward_items_match_torchvision(emu, kwargs, use_mask, chunk):
    x, w, off, mask, b = deform_inputs(dtype=torch.float64, **kwargs)
    stride, pad, dil = kwargs.get("stride", (1, 2)), kwargs.get("pad", (1, 0)), kwargs.get("dil", (1, 2))
    groups, og = kwargs.get("groups", 2), kwargs.get("offset_groups", 3)
    leaves = [t.clone().requires_grad_() for t in (x, w, off, mask, b)]
    out = torchvision.ops.deform_conv2d(leaves[0], leaves[2], leaves[1], leaves[4], stride, pad, dil,
                                        leaves[3] if use_mask else None)
    grad = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out.backward(grad)
    arrays = [t.contiguous().numpy() for t in (grad, x, w, off, mask)]
    gx, gw, goff, gm = (np.full(t.shape, np.nan) for t in (x, w, off, mask))
    if not use_mask:
        gm[:] = 0
    assert emu.emu_deform_backward_f64(_ptr(_params(x, w, og, stride, pad, dil, groups, use_mask)),
                                       ctypes.c_int64(chunk), *map(_ptr, arrays), _ptr(gx), _ptr(gw), _ptr(goff),
                                       _ptr(gm)) == 0
    for name, got, leaf in (("input", gx, leaves[0]), ("weight", gw, leaves[1]), ("offset", goff, leaves[2])):
        np.testing.assert_allclose(got, leaf.grad.numpy(), rtol=1e-9, atol=1e-9, err_msg=f"grad {name}")
    if use_mask:
        np.testing.assert_allclose(gm, leaves[3].grad.numpy(), rtol=1e-9, atol=1e-9, err_msg="grad mask")


def _broadcast_strides(t: torch.Tensor, out_shape):
    n = len(out_shape)
    strides = [0] * n
    for i in range(n - t.dim(), n):
        j = i - (n - t.dim())
        strides[i] = 0 if (t.shape[j] == 1 and out_shape[i] != 1) else t.stride(j)
    return strides


@pytest.mark.parametrize("shape_a,shape_b,transpose_a", [
    ((5, 7), (5, 7), False),
    ((5, 7), (5, 7), True),          # non-contiguous a
    ((2, 3, 4, 5), (3, 1, 5), False),
    ((4, 1), (1, 6), False),
    ((), (3, 3), False),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_my_add_items_match_torch(emu, shape_a, shape_b, transpose_a, dtype):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(shape_a[::-1] if transpose_a else shape_a, generator=g, dtype=dtype)
    a = a.t() if transpose_a else a
    b = torch.randn(shape_b, generator=g, dtype=dtype)
    want = torch.add(b, a, alpha=2)
    out_shape = list(want.shape)
    # the kernels read operands in place through their strides: hand over the storage
    sa, sb = _broadcast_strides(a, out_shape), _broadcast_strides(b, out_shape)
    storage_a = a.as_strided((a.untyped_storage().nbytes() // a.element_size(),), (1,)).numpy()
    storage_b = b.contiguous().numpy().reshape(-1)
    out = np.full(out_shape, np.nan, dtype=storage_b.dtype)
    fn = emu.emu_my_add_f64 if dtype == torch.float64 else emu.emu_my_add_f32
    arr = lambda v: np.array(v if v else [1], dtype=np.int64)  # noqa: E731
    assert fn(len(out_shape), _ptr(arr(out_shape)), _ptr(arr(sa)), _ptr(arr(sb)), _ptr(storage_a), _ptr(storage_b),
              _ptr(out)) == 0
    np.testing.assert_array_equal(out, want.numpy())


# ---- the torch CUDA path's algebra (deform_conv2d_batched.h) with host-run work items ----

@pytest.fixture(scope="module")
def batched(tmp_path_factory):
    from torch.utils import cpp_extension

    build = tmp_path_factory.mktemp("batched")
    cpp_extension.load(
        name="opforge_gpu_emulation", sources=[str(ROOT / "tests" / "csrc" / "batched_host.cpp")],
        extra_include_paths=[str(ROOT / "opforge" / "csrc"), str(ROOT / "opforge" / "ops" / "csrc")],
        extra_cflags=["-O1", "-g0"], build_directory=str(build), is_python_module=False, verbose=False,
    )
    return torch.ops.opforge_gpu_emulation


def _budget(x, w, chunk_images, use_kk_p):
    """Column budget (bytes) that makes chunks of `chunk_images` images."""
    return chunk_images * x.shape[1] * use_kk_p * x.element_size()


@pytest.mark.parametrize("kwargs,use_mask,chunk", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_torch_cuda_algorithm_matches_torchvision(batched, kwargs, use_mask, chunk, dtype):
    x, w, off, mask, b = deform_inputs(dtype=dtype, **kwargs)
    stride, pad, dil = kwargs.get("stride", (1, 2)), kwargs.get("pad", (1, 0)), kwargs.get("dil", (1, 2))
    groups, og = kwargs.get("groups", 2), kwargs.get("offset_groups", 3)
    leaves = [t.clone().requires_grad_() for t in (x, w, off, mask, b)]
    ref = torchvision.ops.deform_conv2d(leaves[0], leaves[2], leaves[1], leaves[4], stride, pad, dil,
                                        leaves[3] if use_mask else None)
    grad = torch.randn(ref.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    ref.backward(grad)
    budget = _budget(x, w, chunk, w.shape[2] * w.shape[3] * ref.shape[2] * ref.shape[3])
    args = (*stride, *pad, *dil, groups, og, use_mask, budget)
    tol = dict(rtol=1e-9, atol=1e-9) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(batched.forward(x, w, off, mask, b, *args), ref.detach(), **tol)
    gx, gw, goff, gm, gb = batched.backward(grad, x, w, off, mask, b, *args)
    for name, got, leaf in (("input", gx, leaves[0]), ("weight", gw, leaves[1]), ("offset", goff, leaves[2]),
                            ("bias", gb, leaves[4])):
        torch.testing.assert_close(got, leaf.grad, **tol, msg=lambda m, n=name: f"grad {n}: {m}")
    if use_mask:
        torch.testing.assert_close(gm, leaves[3].grad, **tol)
    else:
        assert not gm.any()


# ---- ms_deform_attn: forward and backward items vs the CPU kernels and grid_sample ----

def _ms_grid_sample(value, shapes, starts, loc, attn):
    """ms_deform_attn from torch primitives: per level, grid_sample(align_corners=False, zeros)."""
    n, _, m, d = value.shape
    lq, points = loc.shape[1], loc.shape[4]
    out = value.new_zeros(n, m, d, lq)
    for level, ((h, w), start) in enumerate(zip(shapes.tolist(), starts.tolist())):
        maps = value[:, start:start + h * w].permute(0, 2, 3, 1).reshape(n * m, d, h, w)
        grid = loc[:, :, :, level].permute(0, 2, 1, 3, 4).reshape(n * m, lq, points, 2) * 2 - 1
        sampled = F.grid_sample(maps, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        weights = attn[:, :, :, level].permute(0, 2, 1, 3).reshape(n * m, 1, lq, points)
        out = out + (sampled * weights).sum(-1).reshape(n, m, d, lq)
    return out.permute(0, 3, 1, 2).reshape(n, lq, m * d)


def _ms_layout(sizes):
    shapes = torch.tensor(sizes, dtype=torch.int64)
    areas = shapes[:, 0] * shapes[:, 1]
    return shapes, torch.cumsum(areas, 0) - areas, int(areas.sum())


def _ms_inputs(n, lq, m, d, sizes, p, dtype, borders, seed=0):
    """value, spatial_shapes, level_start_index, sampling_locations, attention_weights.

    Random locations spread over [-0.2, 1.2]: some points partly or wholly outside the
    map. With `borders`, each coordinate is, at random, such a location or one on a
    pixel border: pixel coordinate x = loc * W - 0.5 a multiple of 1/2 from -1.5 to
    W + 0.5 (pixel centres and the edges between them, the map's edges, just outside),
    exact in both this formula and grid_sample's for power-of-two sizes.
    """
    g = torch.Generator().manual_seed(seed)
    shapes, starts, s = _ms_layout(sizes)
    levels = len(sizes)
    value = torch.randn(n, s, m, d, generator=g, dtype=dtype)
    loc = torch.rand(n, lq, m, levels, p, 2, generator=g, dtype=dtype) * 1.4 - 0.2
    if borders:
        wh = shapes.flip(1).to(dtype).reshape(levels, 1, 2)  # (W, H) of each level
        half_steps = torch.floor(torch.rand(loc.shape, generator=g, dtype=dtype) * (2 * wh + 5)) - 3
        pixel = half_steps / 2  # -1.5, -1, ..., W + 0.5
        on_border = torch.rand(loc.shape, generator=g) < 0.7
        loc = torch.where(on_border, (pixel + 0.5) / wh, loc)
    attn = torch.rand(n, lq, m, levels, p, generator=g, dtype=dtype)
    return value, shapes, starts, loc, attn


def _ms_emulate_forward(emu, value, shapes, starts, loc, attn):
    n, s, m, d = value.shape
    _, lq, _, levels, p, _ = loc.shape
    a = np.array([n, s, m, d, lq, levels, p], dtype=np.int64)
    arrays = [t.contiguous().numpy() for t in (shapes, starts, value, loc, attn)]
    out = np.full((n, lq, m * d), np.nan, dtype=arrays[2].dtype)
    fn = emu.emu_ms_deform_attn_forward_f64 if value.dtype == torch.float64 else emu.emu_ms_deform_attn_forward_f32
    return fn(_ptr(a), *map(_ptr, arrays), _ptr(out)), out


def _ms_emulate_backward(emu, grad, value, shapes, starts, loc, attn):
    n, s, m, d = value.shape
    _, lq, _, levels, p, _ = loc.shape
    a = np.array([n, s, m, d, lq, levels, p], dtype=np.int64)
    arrays = [t.contiguous().numpy() for t in (shapes, starts, grad, value, loc, attn)]
    outs = [np.full(t.shape, np.nan, dtype=arrays[3].dtype) for t in (value, loc, attn)]
    fn = emu.emu_ms_deform_attn_backward_f64 if value.dtype == torch.float64 else emu.emu_ms_deform_attn_backward_f32
    return fn(_ptr(a), *map(_ptr, arrays), *map(_ptr, outs)), outs


MS_CASES = [
    # (n, lq, m, d, sizes, p, borders); border cases use power-of-two sizes (see _ms_inputs)
    (2, 4, 3, 5, ((5, 7),), 4, False),
    (2, 5, 2, 3, ((6, 9), (3, 4), (1, 2)), 2, False),
    (3, 3, 4, 2, ((4, 5), (2, 7), (7, 2), (1, 1)), 3, False),
    (1, 7, 1, 1, ((3, 5), (2, 2), (7, 1)), 5, False),
    (1, 9, 3, 2, ((8, 16),), 3, True),
    (2, 6, 2, 3, ((4, 8), (2, 2), (1, 4), (16, 1)), 4, True),
]
MS_TOL = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-4, atol=1e-4)}


@pytest.mark.parametrize("n,lq,m,d,sizes,p,borders", MS_CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ms_deform_attn_forward_items_match_cpu_and_grid_sample(emu, n, lq, m, d, sizes, p, borders, dtype):
    args = _ms_inputs(n, lq, m, d, sizes, p, dtype, borders)
    rc, out = _ms_emulate_forward(emu, *args)
    assert rc == 0
    cpu = opforge.ms_deform_attn(*args)  # the CPU kernel
    np.testing.assert_allclose(out, cpu.numpy(), **MS_TOL[dtype], err_msg="vs the CPU kernel")
    np.testing.assert_allclose(out, _ms_grid_sample(*args).numpy(), **MS_TOL[dtype], err_msg="vs grid_sample")


def _pixel_at_minus_one(loc, shapes):
    """Points with a pixel coordinate (x = loc_x * W - 0.5 or y = loc_y * H - 0.5) exactly -1."""
    wh = shapes.flip(1).to(loc.dtype).reshape(-1, 1, 2)
    return ((loc * wh - 0.5) == -1).any(-1)


@pytest.mark.parametrize("n,lq,m,d,sizes,p,borders", MS_CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ms_deform_attn_backward_items_match_cpu_and_grid_sample(emu, n, lq, m, d, sizes, p, borders, dtype):
    value, shapes, starts, loc, attn = _ms_inputs(n, lq, m, d, sizes, p, dtype, borders)
    grad = torch.randn(n, lq, m * d, dtype=dtype, generator=torch.Generator().manual_seed(1))
    rc, (gv, gloc, gattn) = _ms_emulate_backward(emu, grad, value, shapes, starts, loc, attn)
    assert rc == 0
    tol = MS_TOL[dtype]
    cpu = torch.ops.opforge._ms_deform_attn_backward(grad, value, shapes, starts, loc, attn, 64)
    for name, got, want in zip(("value", "sampling_locations", "attention_weights"), (gv, gloc, gattn), cpu):
        np.testing.assert_allclose(got, want.numpy(), **tol, err_msg=f"grad {name} vs the CPU kernel")

    leaves = [t.clone().requires_grad_() for t in (value, loc, attn)]
    _ms_grid_sample(leaves[0], shapes, starts, leaves[1], leaves[2]).backward(grad)
    np.testing.assert_allclose(gv, leaves[0].grad.numpy(), **tol, err_msg="grad value vs grid_sample")
    np.testing.assert_allclose(gattn, leaves[2].grad.numpy(), **tol, err_msg="grad attention_weights vs grid_sample")
    # At a pixel coordinate of exactly -1 the sample is 0 and its derivative has a kink:
    # opforge's sampling (ms_deform_attn_sample.h, CPU and GPU alike) treats the point as
    # outside and gives it zero gradient (the derivative from the left), grid_sample
    # floors to corners -1 and 0 and gives the derivative from the right. Those points
    # are checked against the CPU kernel (above) and the op's rule (here) only.
    kink = _pixel_at_minus_one(loc, shapes)
    assert kink.any() == borders  # the border cases do reach it
    want = leaves[1].grad.clone()
    want[kink] = 0
    np.testing.assert_allclose(gloc, want.numpy(), **tol, err_msg="grad sampling_locations vs grid_sample")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ms_deform_attn_items_on_non_finite_inputs_match_cpu(emu, dtype):
    """NaN / inf locations sample nothing; a non-finite weight of such a point makes
    the forward NaN (aw * 0) but not its gradients: the GPU items agree with the CPU."""
    value, shapes, starts, loc, attn = _ms_inputs(2, 4, 2, 3, ((4, 5), (2, 3)), 2, dtype, False)
    inf, nan = float("inf"), float("nan")
    loc[0, 1, 0, 0, 0] = torch.tensor([nan, 0.5])
    loc[1, 2, 1, 1, 1] = torch.tensor([0.5, inf])
    loc[0, 3, 1, 1, 0] = torch.tensor([-inf, nan])
    loc[1, 0, 0, 0, 1] = torch.tensor([1e30, -1e30])
    attn[1, 2, 1, 1, 1] = nan
    attn[1, 0, 0, 0, 1] = inf
    rc, out = _ms_emulate_forward(emu, value, shapes, starts, loc, attn)
    assert rc == 0
    cpu = opforge.ms_deform_attn(value, shapes, starts, loc, attn).numpy()
    assert np.isnan(cpu).any() and np.isfinite(cpu).any()
    np.testing.assert_allclose(out, cpu, **MS_TOL[dtype], equal_nan=True)
    grad = torch.randn(2, 4, 6, dtype=dtype, generator=torch.Generator().manual_seed(1))
    rc, got = _ms_emulate_backward(emu, grad, value, shapes, starts, loc, attn)
    assert rc == 0
    for name, g, want in zip(("value", "sampling_locations", "attention_weights"), got,
                             torch.ops.opforge._ms_deform_attn_backward(grad, value, shapes, starts, loc, attn, 64)):
        assert np.isfinite(g).all(), f"grad {name}"
        np.testing.assert_allclose(g, want.numpy(), **MS_TOL[dtype], err_msg=f"grad {name}")


@pytest.mark.parametrize("fault", ["start", "sum", "zero size"])
def test_ms_deform_attn_items_refuse_bad_level_geometry(emu, fault):
    value, shapes, starts, loc, attn = _ms_inputs(1, 2, 1, 2, ((3, 4), (2, 2)), 2, torch.float64, False)
    if fault == "start":
        starts = torch.tensor([0, 11])
    elif fault == "sum":
        value = value[:, :-1]
    else:
        shapes = torch.tensor([[3, 4], [0, 2]])
    rc, out = _ms_emulate_forward(emu, value.contiguous(), shapes, starts, loc, attn)
    assert rc != 0 and np.isnan(out).all()
    grad = torch.zeros(1, 2, 2, dtype=torch.float64)
    rc, outs = _ms_emulate_backward(emu, grad, value.contiguous(), shapes, starts, loc, attn)
    assert rc != 0 and all(np.isnan(o).all() for o in outs)
