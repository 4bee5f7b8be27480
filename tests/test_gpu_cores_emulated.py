"""The CUDA kernels' work-item bodies, run on the CPU and checked against independent references.

opforge's CUDA kernels are grid-stride loops over host+device bodies
(opforge/csrc/core/deform_conv2d_gpu.h, my_add_gpu.h, ms_deform_attn_gpu.h,
roi_align_rotated_gpu.h, nms_rotated_gpu.h). tests/csrc/gpu_cores_host.cpp compiles
those same headers with the host compiler and runs every work item in a loop, in the
kernels' launch order: deform_conv2d with the kernels' chunking and the exact GEMM
geometry the ORT CUDA kernel hands cuBLAS (checked against torchvision), my_add
(against torch), ms_deform_attn's forward and backward (grad_value scattered into a
zeroed buffer, then the sampling-point items), checked against opforge's CPU kernels
and a grid_sample reference with autograd; roi_align_rotated's forward and backward
(the front end's shape and rois checks first, the gradient scattered into a zeroed
buffer), checked against the CPU kernels and the numpy reference (its transpose for
the backward) over rotated, clockwise, legacy-clamped, outside, edge-touching and
one-pixel-wide geometries; nms_rotated / batched_nms_rotated as the CUDA front end
runs them (host plan, suppression-mask items in row chunks forced as small as one
row, the host's greedy reduction per chunk), checked against the CPU kernels and
the numpy greedy reference; the exact rotated-box IoU the mask items use,
against the reference and rectangle overlaps computed by hand; and grid_sample's
forward items (mmdeploy::grid_sampler's CUDA EP kernel), against F.grid_sample and
the ORT CPU kernel in all 18 modes and on NaN / inf / huge grids. So the GPU indexing
and arithmetic are verified on any machine; what only a GPU can check (launches,
atomics, cuBLAS, streams) is in test_cuda.py.
"""

import ctypes
import inspect
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
    emu = ctypes.CDLL(str(lib))
    emu.emu_last_error.restype = ctypes.c_char_p
    emu.emu_nms_rotated_chunk_rows.restype = ctypes.c_int64
    emu.emu_nms_rotated_chunk_rows.argtypes = [ctypes.c_int64]
    emu.emu_rotated_box_iou.restype = None
    return emu


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


def _params(x, w, geometry, use_mask):
    n, c, h, wd = x.shape
    return np.array([n, c, h, wd, w.shape[0], w.shape[2], w.shape[3], *geometry, int(use_mask)], dtype=np.int64)


CASES = [
    # (kwargs for deform_inputs, use_mask, chunk)
    (dict(), True, 1),
    (dict(), True, 2),
    (dict(), False, 2),
    (dict(n=3, c=4, o=6, h=7, w=7, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1, offset_groups=1), True, 2),
    (dict(n=2, c=8, o=4, h=6, w=10, kh=1, kw=3, stride=(2, 1), pad=(0, 2), dil=(1, 1), groups=4, offset_groups=2,
          offset_scale=4.0), True, 1),
]


_DEFORM_DEFAULTS = {name: p.default for name, p in inspect.signature(deform_inputs).parameters.items()}


def _deform_case(kwargs, dtype, use_mask):
    """A CASES entry: deform_inputs(dtype=dtype, **kwargs), the same tensors as leaves that require
    grad, torchvision's output on the leaves, and the geometry the tensors were drawn with
    (deform_inputs' defaults where kwargs names none) as the kernels' flat list: stride, padding and
    dilation (h, w each), groups, offset_groups."""
    tensors = deform_inputs(dtype=dtype, **kwargs)
    drawn = {**_DEFORM_DEFAULTS, **kwargs}
    geometry = [*drawn["stride"], *drawn["pad"], *drawn["dil"], drawn["groups"], drawn["offset_groups"]]
    leaves = [t.clone().requires_grad_() for t in tensors]
    x, w, off, mask, b = leaves
    out = torchvision.ops.deform_conv2d(x, off, w, b, geometry[0:2], geometry[2:4], geometry[4:6],
                                        mask if use_mask else None)
    return tensors, leaves, out, geometry


@pytest.mark.parametrize("kwargs,use_mask,chunk", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_forward_items_match_torchvision(emu, kwargs, use_mask, chunk, dtype):
    (x, w, off, mask, b), _, want, geometry = _deform_case(kwargs, dtype, use_mask)
    arrays = [t.contiguous().numpy() for t in (x, w, off, mask, b)]
    out = np.full(tuple(want.shape), np.nan, dtype=arrays[0].dtype)
    fn = emu.emu_deform_forward_f64 if dtype == torch.float64 else emu.emu_deform_forward_f32
    assert fn(_ptr(_params(x, w, geometry, use_mask)), ctypes.c_int64(chunk), *map(_ptr, arrays), _ptr(out)) == 0
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("kwargs,use_mask,chunk", CASES)
def test_backward_items_match_torchvision(emu, kwargs, use_mask, chunk):
    (x, w, off, mask, b), leaves, out, geometry = _deform_case(kwargs, torch.float64, use_mask)
    grad = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out.backward(grad)
    arrays = [t.contiguous().numpy() for t in (grad, x, w, off, mask)]
    gx, gw, goff, gm = (np.full(t.shape, np.nan) for t in (x, w, off, mask))
    if not use_mask:
        gm[:] = 0
    assert emu.emu_deform_backward_f64(_ptr(_params(x, w, geometry, use_mask)), ctypes.c_int64(chunk),
                                       *map(_ptr, arrays), _ptr(gx), _ptr(gw), _ptr(goff), _ptr(gm)) == 0
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
    """batched_host.cpp as a stable-ABI torch library (the flags of opforge's own), loaded once."""
    from torch.utils import cpp_extension

    from opforge.build import torch_target_version_flag

    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx, "a C++ compiler is needed to build the GPU-core emulation"
    lib = tmp_path_factory.mktemp("batched") / "libopforge_gpu_emulation.so"
    torch_lib = cpp_extension.library_paths()[0]
    subprocess.run(
        [cxx, "-O1", "-g0", "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden", torch_target_version_flag(),
         "-I", str(ROOT / "opforge" / "csrc"), "-I", str(ROOT / "opforge" / "ops" / "csrc"),
         "-I", cpp_extension.include_paths()[0], str(ROOT / "tests" / "csrc" / "batched_host.cpp"),
         "-o", str(lib), "-L", torch_lib, "-ltorch_cpu", f"-Wl,-rpath,{torch_lib}"],
        check=True,
    )
    torch.ops.load_library(str(lib))
    return torch.ops.opforge_gpu_emulation


def _budget(x, w, chunk_images, use_kk_p):
    """Column budget (bytes) that makes chunks of `chunk_images` images."""
    return chunk_images * x.shape[1] * use_kk_p * x.element_size()


@pytest.mark.parametrize("kwargs,use_mask,chunk", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_torch_cuda_algorithm_matches_torchvision(batched, kwargs, use_mask, chunk, dtype):
    (x, w, off, mask, b), leaves, ref, geometry = _deform_case(kwargs, dtype, use_mask)
    grad = torch.randn(ref.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    ref.backward(grad)
    budget = _budget(x, w, chunk, w.shape[2] * w.shape[3] * ref.shape[2] * ref.shape[3])
    args = (geometry, use_mask, budget)
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
    # opforge's sampling (ms_deform_attn_sample.h, CPU and GPU alike) takes grid_sample's
    # side, corners -1 and 0 with the derivative from the right; the border cases reach it.
    assert _pixel_at_minus_one(loc, shapes).any() == borders
    np.testing.assert_allclose(gloc, leaves[1].grad.numpy(), **tol, err_msg="grad sampling_locations vs grid_sample")


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


# ---- roi_align_rotated: forward and backward items vs the CPU kernels and the numpy reference ----

def _roi_edge(n, h, w, aligned):
    """Rois whose sampling points reach the last row and column (past H - 1, W - 1 the taps clamp to
    it and coincide; exactly H, W is still inside) and the first (exactly -1: inside, clamped to 0).
    Angle 0 and dyadic values: exact arithmetic in every dtype and in the reference."""
    off = 0.5 if aligned else 0.0  # aligned moves the centre by -0.5: the same pixel centres both ways
    return [
        [0, w - 0.5 + off, h / 2 + off, 2.0, 2.0, 0.0],          # columns W - 1.5 .. W + 0.5
        [n - 1, w / 2 + off, h - 0.5 + off, 3.0, 2.0, 0.0],      # rows H - 1.5 .. H + 0.5
        [n - 1, w - 0.5 + off, h - 0.5 + off, 2.0, 2.0, 0.0],    # the corner
        [0, -0.5 + off, -0.5 + off, 2.0, 2.0, 0.0],              # -1.5 .. 0.5 on both axes
        [n - 1, w - 1.0 + off, h - 1.0 + off, 3.0, 3.0, 1e-3],   # over the corner, turned a little
    ]


def _roi_geometry(name, aligned):
    """(N, C, H, W, output_size, spatial_scale, rois)."""
    pi = np.pi
    if name == "mixed":  # in input units at spatial_scale 0.5
        rois = [[0, 8.0, 6.0, 10.0, 6.0, 0.0], [1, 6.6, 8.2, 8.4, 5.0, pi / 2], [1, 10.0, 4.0, 12.0, 8.0, -0.7],
                [0, 5.0, 7.0, 6.0, 10.0, 100.0], [1, 9.0, 9.0, 7.0, 3.0, -pi], [0, 7.3, 5.1, 4.4, 9.8, 2.3]]
        return 2, 3, 7, 9, (3, 2), 0.5, rois
    if name == "outside":
        rois = [[0, -20.0, -20.0, 4.0, 4.0, 0.3],       # wholly outside: zeros
                [1, 9.5, 3.5, 6.0, 3.0, 0.2],           # half past the right edge
                [1, 4.5, -0.5, 5.0, 4.0, -1.2],         # half above the top
                [0, 4.5, 3.5, 27.0, 21.0, 1.0]]         # the map inside a larger roi
        return 2, 2, 7, 9, (2, 3), 1.0, rois
    if name == "edge":
        return 2, 2, 5, 6, (2, 2), 1.0, _roi_edge(2, 5, 6, aligned)
    if name == "tiny":  # the legacy clamp (not aligned: at least 1 x 1), a 0-point grid (aligned, adaptive)
        rois = [[0, 2.0, 2.0, 0.3, 0.0, 0.4], [0, 3.2, 1.7, 0.0, 0.0, 0.0], [0, 1.5, 2.5, 0.7, 0.2, -2.0]]
        if not aligned:
            rois.append([0, 2.5, 2.5, -3.0, 0.5, 0.1])  # a negative size, clamped to 1
        return 1, 3, 4, 5, (2, 2), 1.0, rois
    if name == "row":  # 1 x W
        # (turned rois keep their points off the map's border: there float32's cos(pi / 2) = -4e-8
        # and float64's 6e-17 put a point on either side of it, a jump in the value)
        rois = [[0, 4.0, 0.5, 6.0, 2.0, 0.0], [0, 3.0, 0.5, 5.0, 3.0, 0.6], [0, 6.5, 0.0, 2.6, 1.0, pi / 2]]
        return 1, 2, 1, 8, (2, 3), 1.0, rois
    if name == "column":  # H x 1
        rois = [[1, 0.5, 3.0, 2.0, 5.0, 0.0], [0, 0.5, 2.0, 3.0, 4.0, -0.6], [1, 0.0, 5.5, 1.0, 2.6, -pi / 2]]
        return 2, 2, 6, 1, (3, 2), 1.0, rois
    assert name == "none"  # K = 0
    return 2, 3, 4, 5, (2, 2), 1.0, []


ROI_GEOMETRIES = ["mixed", "outside", "edge", "tiny", "row", "column", "none"]
ROI_FLAGS = [(sr, aligned, cw) for sr in (0, 1, 3) for aligned in (True, False) for cw in (False, True)]
ROI_TOL = {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.float32: dict(rtol=1e-5, atol=1e-5)}
ROI_REF_TOL = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=2e-4, atol=2e-4)}


def _roi_args(n, c, h, w, k, output_size, sampling_ratio, aligned, clockwise):
    return np.array([n, c, h, w, k, *output_size, sampling_ratio, int(aligned), int(clockwise)], dtype=np.int64)


def _roi_emulate(emu, which, a, scale, data, rois, out_shape):
    dtype = data.dtype
    out = np.full(out_shape, np.nan, dtype=dtype)
    suffix = "f64" if dtype == np.float64 else "f32"
    fn = getattr(emu, f"emu_roi_align_rotated_{which}_{suffix}")
    rc = fn(_ptr(a), ctypes.c_float(scale), _ptr(np.ascontiguousarray(data)), _ptr(np.ascontiguousarray(rois)),
            _ptr(out))
    return rc, out


def _roi_reference_jacobian(n, h, w, rois, output_size, scale, sr, aligned, cw):
    """d out[k, ph, pw] / d input[b_k, q] per roi, from the numpy reference run on basis images: channel q
    of every image is the indicator of pixel q (the op is linear in the input, channel by channel)."""
    from opforge.ops.roi_align_rotated import _reference

    basis = np.broadcast_to(np.eye(h * w).reshape(1, h * w, h, w), (n, h * w, h, w))
    (jac,) = _reference(basis, rois.astype(np.float64), output_height=output_size[0], output_width=output_size[1],
                        spatial_scale=scale, sampling_ratio=sr, aligned=aligned, clockwise=cw)
    return jac  # (K, H*W, oh, ow)


@pytest.mark.parametrize("sr,aligned,cw", ROI_FLAGS)
@pytest.mark.parametrize("geometry", ROI_GEOMETRIES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_roi_align_rotated_items_match_cpu_and_reference(emu, geometry, sr, aligned, cw, dtype):
    from opforge.ops.roi_align_rotated import _reference

    n, c, h, w, output_size, scale, rois = _roi_geometry(geometry, aligned)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, c, h, w, generator=g, dtype=dtype)
    r = torch.tensor(rois, dtype=dtype).reshape(-1, 6)
    k = r.shape[0]
    a = _roi_args(n, c, h, w, k, output_size, sr, aligned, cw)
    attrs = (*output_size, scale, sr, aligned, cw)

    rc, out = _roi_emulate(emu, "forward", a, scale, x.numpy(), r.numpy(), (k, c, *output_size))
    assert rc == 0, emu.emu_last_error()
    assert not np.isnan(out).any(), "an output element no item wrote"
    cpu = torch.ops.opforge.roi_align_rotated(x, r, *attrs)
    np.testing.assert_allclose(out, cpu.numpy(), **ROI_TOL[dtype], err_msg="forward vs the CPU kernel")
    (ref,) = _reference(x.numpy(), r.numpy(), output_height=output_size[0], output_width=output_size[1],
                        spatial_scale=scale, sampling_ratio=sr, aligned=aligned, clockwise=cw)
    np.testing.assert_allclose(out, ref, **ROI_REF_TOL[dtype], err_msg="forward vs the numpy reference")
    if geometry == "outside":
        assert not out[0].any() and all(out[kk].any() for kk in range(1, k)), "roi 0 alone lies wholly outside"

    grad = torch.randn(k, c, *output_size, generator=g, dtype=dtype)
    grad_input = np.full((n, c, h, w), np.nan, dtype=out.dtype)
    fn = emu.emu_roi_align_rotated_backward_f64 if dtype == torch.float64 else emu.emu_roi_align_rotated_backward_f32
    assert fn(_ptr(a), ctypes.c_float(scale), _ptr(grad.numpy()), _ptr(r.numpy()), _ptr(grad_input)) == 0
    cpu = torch.ops.opforge._roi_align_rotated_backward(grad, r, [n, c, h, w], *attrs)
    np.testing.assert_allclose(grad_input, cpu.numpy(), **ROI_TOL[dtype], err_msg="backward vs the CPU kernel")
    # the reference's transpose: grad_input[b, c, q] = sum over rois of image b and bins of grad * d out / d x[q]
    jac = _roi_reference_jacobian(n, h, w, r.numpy(), output_size, scale, sr, aligned, cw)
    want = np.zeros((n, c, h * w))
    for kk, b in enumerate(r[:, 0].long().tolist()):
        want[b] += np.einsum("cij,qij->cq", grad[kk].double().numpy(), jac[kk])
    np.testing.assert_allclose(grad_input, want.reshape(n, c, h, w), **ROI_REF_TOL[dtype],
                               err_msg="backward vs the numpy reference's transpose")
    if k == 0:
        assert not grad_input.any()


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_roi_align_rotated_items_at_the_last_pixel(emu, aligned, dtype):
    """The corner roi of the edge geometry, 2 x 2 bins of 2 x 2 points: per axis the points lie at
    H - 1.25, H - 0.75 (bin 0) and H - 0.25, H + 0.25 (bin 1; the last outside). All but the first
    clamp to the last row, so a point's taps coincide (where the CPU backward once lost updates).
    Weights on the last pixel per axis: bin 0 0.75 + 1, bin 1 1; on the one before: bin 0 0.25."""
    n, c, h, w, output_size, scale, rois = _roi_geometry("edge", aligned)
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    r = np.array(rois[2:3], dtype=np_dtype)
    a = _roi_args(n, c, h, w, 1, output_size, 2, aligned, False)
    grad = np.ones((1, c, *output_size), dtype=np_dtype)
    fn = emu.emu_roi_align_rotated_backward_f64 if dtype == torch.float64 else emu.emu_roi_align_rotated_backward_f32
    gx = np.full((n, c, h, w), np.nan, dtype=np_dtype)
    assert fn(_ptr(a), ctypes.c_float(scale), _ptr(grad), _ptr(r), _ptr(gx)) == 0
    axis = {-1: {0: 1.75, 1: 1.0}, -2: {0: 0.25, 1: 0.0}}  # pixel -> bin -> summed weight
    want = np.zeros((n, c, h, w))
    for py in (-1, -2):
        for px in (-1, -2):
            want[n - 1, :, py, px] = sum(axis[py][i] * axis[px][j] for i in (0, 1) for j in (0, 1)) / 4
    assert want[n - 1, 0, -1, -1] == 7.5625 / 4 and want.sum() == c * 9 / 4  # 9 points inside, 4 per bin
    np.testing.assert_array_equal(gx, want.astype(np_dtype))
    x = np.random.default_rng(0).standard_normal((n, c, h, w)).astype(np_dtype)
    rc, out = _roi_emulate(emu, "forward", a, scale, x, r, (1, c, *output_size))
    assert rc == 0
    np.testing.assert_allclose(out[0, :, 1, 1], x[n - 1, :, -1, -1] / 4, rtol=1e-6)  # one point of four inside
    np.testing.assert_allclose(out.sum(axis=(2, 3))[0], (want[n - 1] * x[n - 1]).sum(axis=(1, 2)), rtol=1e-5)


@pytest.mark.parametrize("fault,rc", [
    ("batch index", 2), ("fractional index", 2), ("angle", 2), ("negative size", 2), ("grid", 2), ("empty map", 1),
    ("output size", 1),
])
def test_roi_align_rotated_items_refuse_what_the_front_end_refuses(emu, fault, rc):
    """The CUDA front end's checks run before any item (the items index the input with the rois'
    batch indices): refused calls write nothing, with the CPU kernel's message."""
    n, c, h, w, output_size, scale, sr = 2, 1, 4, 5, (2, 2), 1.0, 0
    rois = np.array([[0, 2.0, 2.0, 3.0, 2.0, 0.5], [1, 1.0, 3.0, 2.0, 2.0, 0.0]])
    if fault == "batch index":
        rois[1, 0] = 2
    elif fault == "fractional index":
        rois[0, 0] = 0.5
    elif fault == "angle":
        rois[1, 5] = np.inf
    elif fault == "negative size":
        rois[0, 3] = -1.0
    elif fault == "grid":
        rois[0, 3:5] = 1e6  # an adaptive grid of 500000 x 500000 points per bin
    elif fault == "empty map":
        h = 0
    else:
        output_size = (2, 1025)
    a = _roi_args(n, c, h, w, 2, output_size, sr, True, False)
    x = np.zeros((n, c, h, w))
    got, out = _roi_emulate(emu, "forward", a, scale, x, rois, (2, c, *output_size))
    assert got == rc and np.isnan(out).all()
    message = emu.emu_last_error().decode()
    assert message.startswith("opforge::roi_align_rotated: ")
    with pytest.raises(Exception) as info:
        torch.ops.opforge.roi_align_rotated(torch.from_numpy(x), torch.from_numpy(rois), *output_size, scale, sr,
                                            True, False)
    assert str(info.value).splitlines()[0] == message
    gx = np.full((n, c, h, w), np.nan)
    assert emu.emu_roi_align_rotated_backward_f64(_ptr(a), ctypes.c_float(scale), _ptr(np.zeros((2, c, *output_size))),
                                                  _ptr(rois), _ptr(gx)) == rc
    assert np.isnan(gx).all()


# ---- nms_rotated: the mask items in row chunks and the host reduction vs the CPU kernels and numpy ----

def _nms_boxes(n, seed):
    """Random rotated boxes, crowded enough that many overlap, with ties in the scores (one decimal),
    exact duplicates (some with equal scores: the lower index is kept), axis-aligned angles, and
    boxes of zero or negative size (IoU 0 with everything). Values are float32-exact, so one
    float64 reference serves both dtypes."""
    rng = np.random.default_rng(seed)
    boxes = np.column_stack([rng.uniform(0, 30, n), rng.uniform(0, 30, n), rng.uniform(2, 12, n),
                             rng.uniform(2, 12, n), rng.uniform(-np.pi, np.pi, n)])
    scores = np.round(rng.random(n), 1)
    if n >= 8:
        boxes[rng.choice(n, n // 8, replace=False), 4] = rng.integers(-2, 4, n // 8) * (np.pi / 2)
        src, dst = rng.choice(n, (2, n // 8), replace=False)
        boxes[dst] = boxes[src]
        scores[dst[::2]] = scores[src[::2]]
        empty = rng.choice(n, 3, replace=False)
        boxes[empty[0], 2], boxes[empty[1], 3], boxes[empty[2], 2] = 0.0, 0.0, -1.5
    labels = rng.integers(0, 3, n)
    return boxes.astype(np.float32).astype(np.float64), scores.astype(np.float32).astype(np.float64), labels


NMS_CASES = [
    # (n, iou_threshold, batched, seed); 63 / 64 / 65 boxes: one word of the mask, exactly one, two
    (0, 0.5, False, 0), (1, 0.5, False, 1), (1, 0.5, True, 2), (63, 0.3, False, 3), (64, 0.5, True, 4),
    (64, 0.1, False, 5), (65, 0.5, False, 6), (65, 0.7, True, 7), (65, 1.0, False, 8), (64, 0.0, True, 9),
    (200, 0.5, False, 10), (200, 0.3, True, 11),
]
_NMS_REFERENCE = {}


def _nms_reference(n, thr, batched, seed):
    """opforge.ops.nms_rotated._greedy (Python IoUs: slow) once per case."""
    from opforge.ops.nms_rotated import _greedy

    key = (n, thr, batched, seed)
    if key not in _NMS_REFERENCE:
        boxes, scores, labels = _nms_boxes(n, seed)
        _NMS_REFERENCE[key] = _greedy(boxes, scores, labels if batched else None, thr)
    return _NMS_REFERENCE[key]


def _nms_emulate(emu, boxes, scores, labels, thr, chunk_rows=0):
    n = boxes.shape[0]
    keep, kept = np.full(max(n, 1), -1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    fn = emu.emu_nms_rotated_f64 if boxes.dtype == np.float64 else emu.emu_nms_rotated_f32
    rc = fn(ctypes.c_int64(n), _ptr(np.ascontiguousarray(boxes)), _ptr(np.ascontiguousarray(scores)),
            None if labels is None else _ptr(np.ascontiguousarray(labels, dtype=np.int64)), ctypes.c_double(thr),
            ctypes.c_int64(chunk_rows), _ptr(keep), _ptr(kept))
    return rc, keep[:kept[0]]


@pytest.mark.parametrize("n,thr,batched,seed", NMS_CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_nms_rotated_mask_items_match_cpu_and_reference(emu, n, thr, batched, seed, dtype):
    boxes, scores, labels = _nms_boxes(n, seed)
    want = _nms_reference(n, thr, batched, seed)
    b, s = torch.from_numpy(boxes).to(dtype), torch.from_numpy(scores).to(dtype)
    if batched:
        cpu = torch.ops.opforge.batched_nms_rotated(b, s, torch.from_numpy(labels), thr)
    else:
        cpu = torch.ops.opforge.nms_rotated(b, s, thr)
    np.testing.assert_array_equal(cpu.numpy(), want, err_msg="the CPU kernel vs the reference")
    for chunk_rows in (0, 1, 7, 64):  # 0: the kernel's own chunk (all rows at these sizes)
        rc, keep = _nms_emulate(emu, b.numpy(), s.numpy(), labels if batched else None, thr, chunk_rows)
        assert rc == 0, emu.emu_last_error()
        np.testing.assert_array_equal(keep, want, err_msg=f"the mask items in chunks of {chunk_rows or 'all'} rows")
    if n >= 63:  # the case suppresses some boxes but not all; none at threshold 1 (IoU <= 1, duplicates too)
        assert len(want) == n if thr == 1.0 else 0 < len(want) < n


@pytest.mark.parametrize("scale", [2.0 ** 600, 1e300, 2.0 ** -600, 1e-300], ids=str)
def test_nms_rotated_mask_items_at_extreme_scales(emu, scale):
    """The mask items' instance for plans with extreme boxes (the CUDA launcher picks it): scaled
    boxes (exactly, powers of two, or nearly) keep what the boxes unscaled keep, as the CPU kernel does."""
    n, thr, seed = 65, 0.5, 6
    boxes, scores, labels = _nms_boxes(n, seed)
    want = _nms_reference(n, thr, False, seed)
    scaled = boxes.copy()
    scaled[:, :4] *= scale
    np.testing.assert_array_equal(torch.ops.opforge.nms_rotated(torch.from_numpy(scaled), torch.from_numpy(scores),
                                                                thr).numpy(), want)
    for chunk_rows in (0, 7):
        rc, keep = _nms_emulate(emu, scaled, scores, None, thr, chunk_rows)
        assert rc == 0, emu.emu_last_error()
        np.testing.assert_array_equal(keep, want)


def test_nms_rotated_chunk_rows_bound_the_mask(emu):
    """The kernel's chunk: every row while the whole mask fits 64 MiB, then as many rows as fit, at least one."""
    for n in (1, 63, 64, 65, 1000, 10**5, 10**6, 10**8, 10**10):
        chunk, words = emu.emu_nms_rotated_chunk_rows(n), -(-n // 64)
        assert 1 <= chunk <= n
        if n * words * 8 <= 64 << 20:
            assert chunk == n, n
        else:
            assert chunk == max(1, (64 << 20) // (8 * words)), n


def test_nms_rotated_mask_items_refuse_what_the_front_end_refuses(emu):
    boxes, scores, labels = _nms_boxes(8, 0)
    bad = boxes.copy()
    bad[3, 4] = np.nan
    rc, _ = _nms_emulate(emu, bad, scores, None, 0.5)
    assert rc == 2 and emu.emu_last_error().decode() == "opforge::nms_rotated: boxes row 3 has a non-finite angle (nan)"
    bad_scores = scores.copy()
    bad_scores[5] = np.nan
    rc, _ = _nms_emulate(emu, boxes, bad_scores, labels, 0.5)
    assert rc == 2 and emu.emu_last_error().decode().startswith("opforge::batched_nms_rotated: scores[5] is NaN")
    for thr in (-0.1, 1.5, float("nan")):
        rc, _ = _nms_emulate(emu, boxes, scores, None, thr)
        assert rc == 1 and "iou_threshold must be in [0, 1]" in emu.emu_last_error().decode()


# ---- the exact rotated-box IoU the mask items use, vs the numpy reference and by hand ----

def _emu_iou(emu, a, b):
    a, b = np.ascontiguousarray(a, dtype=np.float64), np.ascontiguousarray(b, dtype=np.float64)
    out = np.full(a.shape[0], np.nan)
    emu.emu_rotated_box_iou(ctypes.c_int64(a.shape[0]), _ptr(a), _ptr(b), _ptr(out))
    return out


def _ref_iou(a, b):
    from opforge.ops.nms_rotated import _iou

    return np.array([_iou(p, q) for p, q in zip(a, b)])


def _axis_aligned_iou(a, b):
    """By hand for angles that are multiples of pi/2: an odd multiple swaps the extents."""
    def extent(box):
        cx, cy, w, h, angle = box
        if int(round(angle / (np.pi / 2))) % 2:
            w, h = h, w
        return cx - w / 2, cx + w / 2, cy - h / 2, cy + h / 2

    (al, ar, at, ab), (bl, br, bt, bb) = extent(a), extent(b)
    inter = max(0.0, min(ar, br) - max(al, bl)) * max(0.0, min(ab, bb) - max(at, bt))
    return inter / (a[2] * a[3] + b[2] * b[3] - inter)


def test_rotated_box_iou_random_pairs_match_reference(emu):
    rng = np.random.default_rng(0)
    n = 300
    a = np.column_stack([rng.uniform(0, 8, n), rng.uniform(0, 8, n), rng.uniform(0.5, 6, n), rng.uniform(0.5, 6, n),
                         rng.uniform(-np.pi, np.pi, n)])
    b = np.column_stack([rng.uniform(0, 8, n), rng.uniform(0, 8, n), rng.uniform(0.5, 6, n), rng.uniform(0.5, 6, n),
                         rng.uniform(-4, 4, n)])
    far = np.array([1e4, -3e4, 0, 0, 0])  # far from the origin: the same pairs, moved
    got = _emu_iou(emu, np.vstack([a, a + far]), np.vstack([b, b + far]))
    want = _ref_iou(a, b)
    assert (want > 0.05).sum() > 50 and (want == 0).sum() > 20  # overlapping and disjoint pairs both
    np.testing.assert_allclose(got[:n], want, rtol=0, atol=1e-9)
    np.testing.assert_allclose(got[n:], want, rtol=0, atol=1e-9)


def test_rotated_box_iou_special_pairs(emu):
    pi = np.pi
    u = np.array([np.cos(0.4), np.sin(0.4)])  # the width axis of a box at angle 0.4 (mmcv's convention)
    pairs = [
        # (a, b, exact IoU)
        ((3, 4, 5, 2, 0.7), (3, 4, 5, 2, 0.7), 1.0),            # identical
        ((3, 4, 5, 2, 0.7), (3, 4, 5, 2, 0.7 + pi), 1.0),       # the same rectangle, turned half a turn
        ((3, 4, 5, 2, 0.7), (3, 4, 2, 5, 0.7 + pi / 2), 1.0),   # the same, width and height swapped
        ((0, 0, 2, 2, 0.3), (10, 0, 2, 2, -0.3), 0.0),          # disjoint
        ((0, 0, 4, 1, 0.0), (0, 2.6, 4, 1, 0.0), 0.0),          # disjoint, circumscribed circles overlap
        ((0, 0, 10, 8, 0.3), (0.5, -0.2, 2, 1, 1.1), 2 / 80),   # one inside the other
        ((0.5, -0.2, 2, 1, 1.1), (0, 0, 10, 8, 0.3), 2 / 80),
        ((0, 0, 2, 2, 0.0), (2, 0, 2, 2, 0.0), 0.0),            # touching edges
        ((0, 0, 2, 2, 0.0), (2, 2, 2, 2, 0.0), 0.0),            # touching corners
        ((1, 1, 3, 1, 0.4), (1 + 3 * u[0], 1 + 3 * u[1], 3, 1, 0.4), 0.0),  # touching, rotated
        ((1, 1, 3, 1, 0.4), (1 + 1.5 * u[0], 1 + 1.5 * u[1], 3, 1, 0.4), 1 / 3),  # half overlap along u
        ((0, 0, 4, 1, 0.0), (0, 0, 4, 1, pi / 2), 1 / 7),       # a cross: 1 / (4 + 4 - 1)
        ((0, 0, 0, 3, 0.2), (0, 0, 0, 3, 0.2), 0.0),            # zero size
        ((0, 0, 2, -3, 0.2), (0, 0, 2, 3, 0.2), 0.0),           # negative size
    ]
    a = np.array([p[0] for p in pairs], dtype=np.float64)
    b = np.array([p[1] for p in pairs], dtype=np.float64)
    exact = np.array([p[2] for p in pairs])
    got = _emu_iou(emu, a, b)
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-9)
    np.testing.assert_allclose(_ref_iou(a, b), exact, rtol=0, atol=1e-9)
    assert got[3] == 0.0 and got[4] == 0.0 and got[-2] == 0.0 and got[-1] == 0.0


def test_rotated_box_iou_at_extreme_scales(emu):
    """IoUs by hand (a cross: 1/7; half overlap: 1/3; one box inside another: 2/80; copies: 1;
    apart: 0) at scales where float64's products of coordinates overflow or underflow: the pair is
    scaled by a power of two first, so the IoU is the same."""
    pairs = [((0, 0, 4, 1, 0.0), (0, 0, 4, 1, np.pi / 2), 1 / 7), ((0, 0, 2, 2, 0.3), (0, 0, 2, 2, 0.3), 1.0),
             ((1, 1, 3, 1, 0.0), (2.5, 1, 3, 1, 0.0), 1 / 3), ((0, 0, 10, 8, 0.3), (0.5, -0.2, 2, 1, 1.1), 2 / 80),
             ((0, 0, 2, 2, 0.3), (10, 0, 2, 2, -0.3), 0.0)]
    a0 = np.array([p[0] for p in pairs], dtype=np.float64)
    b0 = np.array([p[1] for p in pairs], dtype=np.float64)
    exact = np.array([p[2] for p in pairs])
    for scale in (2.0 ** 520, 2.0 ** 1010, 1e154, 1e300, 2.0 ** -520, 2.0 ** -1060, 1e-170, 1e-300):
        a, b = a0.copy(), b0.copy()
        a[:, :4] *= scale
        b[:, :4] *= scale
        np.testing.assert_allclose(_emu_iou(emu, a, b), exact, rtol=0, atol=1e-12, err_msg=str(scale))
        np.testing.assert_allclose(_ref_iou(a, b), exact, rtol=0, atol=1e-9, err_msg=str(scale))
    # a huge box and a small one (area ratio 1e-300): IoU 1e-300, nothing at float64's precision of 1
    got = _emu_iou(emu, np.array([[0, 0, 1e200, 1e200, 0.0]]), np.array([[0, 0, 1e50, 1e50, 0.0]]))
    assert 0 <= got[0] <= 1e-290
    # centres 2e308 apart (their difference overflows): apart, IoU 0
    assert _emu_iou(emu, np.array([[1e308, 0, 1e308, 1, 0.0]]), np.array([[-1e308, 0, 1e308, 1, 0.0]]))[0] == 0


def test_rotated_box_iou_axis_aligned_matches_rectangle_overlap(emu):
    rng = np.random.default_rng(1)
    n = 200
    quarter = np.pi / 2
    a = np.column_stack([rng.uniform(0, 6, n), rng.uniform(0, 6, n), rng.uniform(0.5, 5, n), rng.uniform(0.5, 5, n),
                         rng.integers(-4, 5, n) * quarter])
    b = np.column_stack([rng.uniform(0, 6, n), rng.uniform(0, 6, n), rng.uniform(0.5, 5, n), rng.uniform(0.5, 5, n),
                         rng.integers(-4, 5, n) * quarter])
    exact = np.array([_axis_aligned_iou(p, q) for p, q in zip(a, b)])
    assert (exact > 0.05).sum() > 50 and (exact == 0).sum() > 10
    np.testing.assert_allclose(_emu_iou(emu, a, b), exact, rtol=0, atol=1e-9)
    np.testing.assert_allclose(_ref_iou(a, b), exact, rtol=0, atol=1e-9)


# ---- grid_sample (mmdeploy::grid_sampler): forward items vs F.grid_sample and the ORT CPU kernel ---------------

GRID_MODES = [(i, p, ac) for i in range(3) for p in range(3) for ac in (0, 1)]


def _grid_inputs(n, c, h, w, ho, wo, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g, dtype=torch.float64)
    grid = torch.rand(n, ho, wo, 2, generator=g, dtype=torch.float64) * 3.2 - 1.6  # inside, at and past the border
    grid[0, 0, :4] = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [-1.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    return x.to(dtype), grid.to(dtype)


def _grid_emulate(emu, x, grid, interpolation, padding, align_corners):
    n, c, h, w = x.shape
    _, ho, wo, _ = grid.shape
    a = np.array([n, c, h, w, ho, wo, interpolation, padding, align_corners], dtype=np.int64)
    out = np.full((n, c, ho, wo), np.nan, dtype=x.numpy().dtype)
    fn = emu.emu_grid_sample_forward_f32 if x.dtype == torch.float32 else emu.emu_grid_sample_forward_f64
    rc = fn(_ptr(a), _ptr(np.ascontiguousarray(x.numpy())), _ptr(np.ascontiguousarray(grid.numpy())), _ptr(out))
    return rc, torch.from_numpy(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("interpolation,padding,align_corners", GRID_MODES)
def test_grid_sample_items_match_grid_sample_and_the_cpu_kernel(emu, interpolation, padding, align_corners, dtype):
    from onnx import TensorProto

    from test_mmdeploy_ops import mmdeploy_model, run

    x, grid = _grid_inputs(2, 3, 5, 7, 4, 6, dtype)
    rc, got = _grid_emulate(emu, x, grid, interpolation, padding, align_corners)
    assert rc == 0, emu.emu_last_error()
    mode = ["bilinear", "nearest", "bicubic"][interpolation]
    want = F.grid_sample(x.double(), grid.double(), mode=mode, padding_mode=["zeros", "border", "reflection"][padding],
                         align_corners=bool(align_corners))
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    t = TensorProto.FLOAT if dtype == torch.float32 else TensorProto.DOUBLE
    cpu = run(mmdeploy_model("grid_sampler", [("input", t), ("grid", t)], [("output", t)],
                             interpolation_mode=interpolation, padding_mode=padding, align_corners=align_corners), x, grid)
    torch.testing.assert_close(got, cpu, rtol=tol, atol=tol)  # the CPU kernel's ISA clones may fuse multiply-adds


def test_grid_sample_items_on_hostile_grids_match_the_cpu_kernel(emu):
    """NaN, inf and huge coordinates: the items clamp before indexing, as the CPU kernel does, and give its values."""
    from onnx import TensorProto

    from test_mmdeploy_ops import mmdeploy_model, run

    x, grid = _grid_inputs(1, 2, 4, 5, 3, 4, torch.float32)
    grid.view(-1)[:8] = torch.tensor([float("nan"), 0.2, float("inf"), -float("inf"), 1e30, -1e30, 3e38, 0.0])
    for interpolation, padding, align_corners in GRID_MODES:
        rc, got = _grid_emulate(emu, x, grid, interpolation, padding, align_corners)
        assert rc == 0, emu.emu_last_error()
        cpu = run(mmdeploy_model("grid_sampler", [("input", TensorProto.FLOAT), ("grid", TensorProto.FLOAT)],
                                 [("output", TensorProto.FLOAT)], interpolation_mode=interpolation,
                                 padding_mode=padding, align_corners=align_corners), x, grid)
        assert torch.isfinite(got).all(), (interpolation, padding, align_corners)
        torch.testing.assert_close(got, cpu, rtol=1e-5, atol=1e-5)


def test_grid_sample_items_refuse_bad_nodes(emu):
    x, grid = _grid_inputs(1, 2, 4, 5, 3, 4, torch.float32)
    assert _grid_emulate(emu, x, grid, 3, 0, 0)[0] == 1 and b"interpolation_mode" in emu.emu_last_error()
    assert _grid_emulate(emu, x, grid, 0, 0, 2)[0] == 1 and b"align_corners" in emu.emu_last_error()
