"""The CUDA kernels' work-item bodies, run on the CPU and checked against torchvision.

opforge's CUDA kernels are grid-stride loops over host+device bodies
(opforge/csrc/core/deform_conv2d_gpu.h, my_add_gpu.h). tests/csrc/gpu_cores_host.cpp
compiles those same headers with the host compiler and runs every work item in a
loop, with the kernels' chunking and the exact GEMM geometry the ORT CUDA kernel
hands cuBLAS. So the GPU indexing and arithmetic are verified on any machine; what
only a GPU can check (launches, atomics, cuBLAS, streams) is in test_cuda.py.
"""

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision

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
