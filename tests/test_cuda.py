"""CUDA: torch CUDA kernels and the ORT CUDAExecutionProvider kernels, on a real GPU.

Every test here needs a GPU (``-m cuda`` selects them) and is skipped, with the
reason, where torch sees none; the ORT ones also need onnxruntime-gpu. What can
be checked without a GPU is checked elsewhere: the kernels' work-item code in
test_gpu_cores_emulated.py, the CUDA build in test_build.py.
"""

import json
import os

import numpy as np
import pytest
import torch
import torchvision
from torch.testing import assert_close
from torchvision.ops import deform_conv2d as tv_deform_conv2d

import opforge
from helpers import DEFORM_CONFIGS, deform_inputs, profiling_session_options

HAVE_GPU = torch.cuda.is_available()

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]

needs_cuda_build = pytest.mark.skipif(not opforge.BUILT_WITH_CUDA, reason="opforge built without CUDA kernels")

DEV = "cuda"
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
TOL16 = {torch.float16: dict(rtol=2e-2, atol=2e-2), torch.bfloat16: dict(rtol=5e-2, atol=8e-2)}


# ---- my_add ------------------------------------------------------------------------------

def _my_add_case(name, dtype):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(s, generator=g).to(dtype)  # noqa: E731
    if name == "contiguous-odd-size":  # vector body + scalar tail
        return r(1_000_003), r(1_000_003)
    if name == "misaligned":  # 16-byte vector path must not be taken
        a, b = r(4097), r(4097)
        return a[1:], b[:-1]
    if name == "broadcast":
        return r(8, 1, 33, 7), r(5, 1, 7)
    if name == "non-contiguous":
        return r(64, 48).t(), r(48, 64)[:, ::1]
    if name == "scalar":
        return r(), r(3, 4)
    if name == "empty":
        return r(0, 5), r(1, 5)
    raise KeyError(name)


@needs_cuda_build
@pytest.mark.parametrize("case", ["contiguous-odd-size", "misaligned", "broadcast", "non-contiguous", "scalar", "empty"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_my_add_cuda_matches_cpu_exactly(case, dtype):
    a, b = _my_add_case(case, dtype)
    got = opforge.my_add(a.to(DEV), b.to(DEV))
    want = opforge.my_add(a, b)  # same formula, accumulation type and single rounding
    assert got.device.type == DEV and got.dtype == dtype and got.shape == want.shape
    assert_close(got.cpu(), want, rtol=0, atol=0)
    assert_close(got.cpu().double(), torch.add(b.double(), a.double(), alpha=2), **TOL16.get(dtype, dict(rtol=1e-6, atol=1e-6)))


@needs_cuda_build
def test_my_add_cuda_autograd_and_function():
    a = torch.randn(6, 5, device=DEV, requires_grad=True)
    b = torch.randn(5, device=DEV, requires_grad=True)
    out = opforge.MyAddFunction.apply(a, b)
    out.backward(torch.ones_like(out))
    assert_close(a.grad, torch.full_like(a, 2.0))
    assert_close(b.grad, torch.full_like(b, 6.0))


@needs_cuda_build
def test_kernels_run_on_the_callers_stream_under_graph_capture():
    """CUDA graph capture fails on any launch to the legacy default stream, and a
    replay only reproduces work enqueued on the capturing stream: both ops pass."""
    x, w, off, mask, bias = (t.to(DEV, torch.float32) for t in deform_inputs(n=2, c=8, o=8, h=12, w=12, kh=3, kw=3,
                                                                            stride=(1, 1), pad=(1, 1), dil=(1, 1),
                                                                            groups=1, offset_groups=2))
    a, b = torch.randn(1 << 20, device=DEV), torch.randn(1 << 20, device=DEV)
    opforge.my_add(a, b), opforge.deform_conv2d(x, off, w, bias, padding=1, mask=mask)  # warm up (cuBLAS handles)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_add = opforge.my_add(a, b)
        out_dcn = opforge.deform_conv2d(x, off, w, bias, padding=1, mask=mask)
    a.copy_(torch.randn_like(a))
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out_add, 2 * a + b)
    assert_close(out_dcn, tv_deform_conv2d(x, off, w, bias, padding=1, mask=mask), rtol=1e-4, atol=1e-4)


@needs_cuda_build
def test_mixed_devices_are_a_clear_error():
    a = torch.randn(3, device=DEV)
    with pytest.raises(ValueError, match=r"opforge::my_add: b is on cpu but a is on cuda"):
        opforge.my_add(a, torch.randn(3))
    x, w, off, mask, bias = deform_inputs()
    with pytest.raises(ValueError, match=r"opforge::deform_conv2d: weight is on cpu but input is on cuda"):
        torch.ops.opforge.deform_conv2d(x.to(DEV), w, off.to(DEV), mask.to(DEV), bias.to(DEV), 1, 2, 1, 0, 1, 2, 2, 3, True)


@pytest.mark.skipif(opforge.BUILT_WITH_CUDA, reason="only a CPU-only build has the explanatory CUDA stub")
def test_cpu_only_build_explains_itself_for_cuda_tensors():
    with pytest.raises(NotImplementedError, match="no CUDA kernels"):
        opforge.my_add(torch.ones(2, device=DEV), torch.ones(2, device=DEV))


# ---- deform_conv2d ---------------------------------------------------------------------

CONFIGS = {name: DEFORM_CONFIGS[name] for name in ("basic-3x3", "non-square-mixed", "groups-4",
                                                  "offset-groups-span-weight-groups", "multi-tile-batch-5")}


def _leaves(cfg, dtype, device, scale=2.0):
    """The same values for every dtype: drawn in float64, then rounded to dtype."""
    return [t.to(device, dtype).requires_grad_() for t in deform_inputs(**cfg, dtype=torch.float64, offset_scale=scale)]


def _forward(fn, leaves, cfg, use_mask):
    x, w, off, mask, b = leaves
    return fn(x, off, w, b, stride=cfg["stride"], padding=cfg["pad"], dilation=cfg["dil"], mask=mask if use_mask else None)


def _grads(out, leaves, grad, use_mask):
    wanted = [t for i, t in enumerate(leaves) if i != 3 or use_mask]
    return torch.autograd.grad(out, wanted, grad)


@needs_cuda_build
@pytest.mark.parametrize("use_mask", [True, False], ids=["dcnv2", "dcnv1"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_and_gradients_match_torchvision_cuda_and_cpu(name, use_mask):
    cfg = CONFIGS[name]
    ours_leaves = _leaves(cfg, torch.float64, DEV)
    tv_leaves = _leaves(cfg, torch.float64, DEV)
    cpu_leaves = _leaves(cfg, torch.float64, "cpu")
    ours = _forward(opforge.deform_conv2d, ours_leaves, cfg, use_mask)
    ref = _forward(tv_deform_conv2d, tv_leaves, cfg, use_mask)
    cpu = _forward(opforge.deform_conv2d, cpu_leaves, cfg, use_mask)
    assert_close(ours, ref, rtol=1e-10, atol=1e-10)
    assert_close(ours.cpu(), cpu, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(ref)
    for got, exp, on_cpu in zip(_grads(ours, ours_leaves, grad, use_mask), _grads(ref, tv_leaves, grad, use_mask),
                                _grads(cpu, cpu_leaves, grad.cpu(), use_mask)):
        assert_close(got, exp, rtol=1e-9, atol=1e-9)
        assert_close(got.cpu(), on_cpu, rtol=1e-9, atol=1e-9)


@needs_cuda_build
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_lower_precision_dtypes_against_float64(dtype):
    cfg = CONFIGS["multi-tile-batch-5"]
    leaves = _leaves(cfg, dtype, DEV)
    # reference: float64 on exactly the rounded inputs, so only the arithmetic precision differs
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    out = _forward(opforge.deform_conv2d, leaves, cfg, True)
    ref = _forward(tv_deform_conv2d, ref_leaves, cfg, True)
    assert out.dtype == dtype
    scale = ref.abs().max().item()
    tol = dict(rtol=1e-4, atol=1e-4 * scale) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2 * scale)
    assert_close(out.double(), ref, **tol)
    grad = torch.randn_like(ref)
    for got, exp in zip(_grads(out, leaves, grad.to(dtype), True), _grads(ref, ref_leaves, grad, True)):
        assert got.dtype == dtype
        s = exp.abs().max().item()
        assert_close(got.double(), exp, rtol=tol["rtol"], atol=tol["rtol"] * s)


@needs_cuda_build
def test_gradcheck_float64():
    cfg = dict(n=2, c=4, o=2, h=5, w=5, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=2, offset_groups=2)
    x, w, off, mask, b = (t.to(DEV).requires_grad_() for t in deform_inputs(**cfg, offset_scale=0.7))
    fn = lambda x, w, off, mask, b: opforge.deform_conv2d(x, off, w, b, padding=1, mask=mask)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w, off, mask, b), eps=1e-6, atol=1e-5)


@needs_cuda_build
def test_images_larger_than_one_column_chunk():
    """150 MB of columns per image: forward and backward loop over several chunks."""
    cfg = dict(n=3, c=64, o=16, h=256, w=256, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1, offset_groups=1)
    leaves, ref_leaves = _leaves(cfg, torch.float32, DEV), _leaves(cfg, torch.float32, DEV)
    out, ref = _forward(opforge.deform_conv2d, leaves, cfg, True), _forward(tv_deform_conv2d, ref_leaves, cfg, True)
    assert_close(out, ref, rtol=1e-4, atol=1e-3)
    grad = torch.randn_like(ref)
    for got, exp in zip(_grads(out, leaves, grad, True), _grads(ref, ref_leaves, grad, True)):
        assert_close(got, exp, rtol=1e-3, atol=1e-2 * max(1.0, exp.abs().max().item()) * 1e-2)


@needs_cuda_build
def test_opcheck_on_cuda():
    a, b = torch.randn(4, 5, device=DEV), torch.randn(5, device=DEV)
    torch.library.opcheck(torch.ops.opforge.my_add.default, (a, b))
    x, w, off, mask, bias = (t.to(DEV, torch.float32) for t in deform_inputs())
    args = (x.requires_grad_(), w, off, mask, bias, 1, 2, 1, 0, 1, 2, 2, 3, True)
    torch.library.opcheck(torch.ops.opforge.deform_conv2d.default, args)


@needs_cuda_build
def test_drop_in_module_on_cuda_matches_torchvision_module():
    tv = torchvision.ops.DeformConv2d(8, 16, 3, padding=1).to(DEV)
    ours = opforge.DeformConv2d(8, 16, 3, padding=1).to(DEV)
    ours.load_state_dict(tv.state_dict())
    x = torch.randn(2, 8, 10, 10, device=DEV)
    off = torch.randn(2, 18, 10, 10, device=DEV)
    assert_close(ours(x, off), tv(x, off), rtol=1e-4, atol=1e-4)


# ---- ONNX Runtime CUDA EP --------------------------------------------------------------

def _ort_cuda_available():
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return "CUDAExecutionProvider" in ort.get_available_providers()


needs_ort_cuda = pytest.mark.skipif(not _ort_cuda_available(), reason="needs onnxruntime-gpu (CUDAExecutionProvider)")


class DcnModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = opforge.DeformConv2d(8, 16, 3, padding=1)

    def forward(self, x, offset, mask):
        return opforge.my_add(self.conv(x, offset, mask=mask), x.mean(1, keepdim=True))


def _providers_of(session, op_names):
    """{op: provider} from ORT's profile: which EP really ran each custom node."""
    path = session.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.unlink(path)
    found = {}
    for e in events:
        args = e.get("args", {})
        if args.get("op_name") in op_names:
            found[args["op_name"]] = args.get("provider")
    return found


@needs_cuda_build
@needs_ort_cuda
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_ort_cuda_ep_round_trip(exporter, dtype):
    model = DcnModel().to(dtype).eval()
    x = torch.randn(2, 8, 12, 12, dtype=dtype)
    off = torch.randn(2, 18, 12, 12, dtype=dtype)
    mask = torch.rand(2, 9, 12, 12, dtype=dtype)
    onnx_model = opforge.export(model, (x, off, mask), dynamo=exporter == "dynamo", opset_version=18,
                                standard_onnx=False, input_names=["x", "offset", "mask"], output_names=["y"])
    so = profiling_session_options()
    sess = opforge.ort_session(onnx_model, so, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    got = sess.run(None, {"x": x.numpy(), "offset": off.numpy(), "mask": mask.numpy()})[0]
    assert _providers_of(sess, {"deform_conv2d", "my_add"}) == {"deform_conv2d": "CUDAExecutionProvider",
                                                                "my_add": "CUDAExecutionProvider"}
    with torch.no_grad():
        want = model.to(DEV)(x.to(DEV), off.to(DEV), mask.to(DEV)).cpu()
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=5e-2)
    assert_close(torch.from_numpy(got), want, **tol)


@needs_cuda_build
@needs_ort_cuda
def test_ort_cuda_ep_bad_input_is_an_error_status():
    import onnxruntime as ort
    from onnx import TensorProto

    from helpers import single_node_model

    model = single_node_model("my_add", [TensorProto.FLOAT, TensorProto.FLOAT])
    sess = opforge.ort_session(model, providers=["CUDAExecutionProvider"])
    with pytest.raises(Exception, match=r"opforge::my_add: shapes of A \[2, 3\] and B \[4\] are not broadcastable"):
        sess.run(None, {"I0": np.ones((2, 3), np.float32), "I1": np.ones(4, np.float32)})
    out = sess.run(None, {"I0": np.ones((2, 3), np.float32), "I1": np.ones(3, np.float32)})[0]
    np.testing.assert_array_equal(out, np.full((2, 3), 3.0, np.float32))
    assert ort.get_device() == "GPU"


# ---- benchmark -------------------------------------------------------------------------

@needs_cuda_build
def test_cuda_benchmark_reports_ratios(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_cuda.py"
    out = subprocess.run([sys.executable, str(script), "--batch", "2", "--channels", "16", "--size", "20",
                          "--repeats", "3", "--json"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout)
    for dtype in ("float32", "float16"):
        assert result[f"deform_{dtype}"]["fwd_bwd_speedup_vs_torchvision"] > 0
    assert result["my_add_ms"]["opforge"] > 0


# =============================================================================================
# ---- rotated detection: roi_align_rotated, nms_rotated, batched_nms_rotated -------------------
# torch CUDA against the CPU kernels (every dtype, forward and backward; the CPU kernels are
# checked against independent references in test_roi_align_rotated.py / test_nms_rotated.py),
# gradcheck on the device, empty and large inputs, hostile rois/boxes refused on the device with
# the CPU's exact messages, and the ORT CUDAExecutionProvider against the CPU EP.

import math  # noqa: E402
import warnings  # noqa: E402

from opforge.ops.nms_rotated import BATCHED_NMS_ROTATED, NMS_ROTATED  # noqa: E402
from opforge.ops.roi_align_rotated import ROI_ALIGN_ROTATED  # noqa: E402
from opforge.ops.roi_align_rotated import _reference as _rar_numpy_reference  # noqa: E402
from opforge.testing import single_node_model as _spec_model  # noqa: E402
from opforge.testing.support import _ort_run  # noqa: E402

RAR = "opforge::roi_align_rotated"
#: CUDA vs CPU on the same inputs. float64 / float32: summation order and FMA contraction; the
#: 16-bit types compute in float32 on both and round once, so a last-bit difference of the result.
ROTATED_TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
ROTATED_CONFIGS = {  # output_size, spatial_scale, sampling_ratio, aligned, clockwise
    "7x7-aligned-sr2": ((7, 7), 0.5, 2, True, False),
    "aligned-adaptive-cw": ((3, 2), 0.5, 0, True, True),
    "legacy-sr1-cw": ((2, 2), 1.0, 1, False, True),
    "legacy-adaptive": ((4, 3), 0.25, 0, False, False),
}


def _rar_case(n=2, c=5, h=11, w=13, k=40, scale=0.5, seed=0, dtype=torch.float64):
    """(input, rois) on the CPU: rois of every image, some centred outside the map, sizes 15..85%
    of the map's extent (before spatial_scale), angles in (-2 pi, 2 pi); drawn in float64."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g, dtype=torch.float64)
    ew, eh = w / scale, h / scale
    u = lambda: torch.rand(k, generator=g, dtype=torch.float64)  # noqa: E731
    b = torch.randint(0, n, (k,), generator=g).double()
    rois = torch.stack([b, (u() * 1.4 - 0.2) * ew, (u() * 1.4 - 0.2) * eh, (u() * 0.7 + 0.15) * ew,
                        (u() * 0.7 + 0.15) * eh, (u() - 0.5) * 4 * math.pi], 1)
    return x.to(dtype), rois.to(dtype)


@pytest.fixture(params=[(config, dtype) for config in ROTATED_CONFIGS for dtype in DTYPES],
                ids=lambda param: f"{param[0]}-{param[1]}")
def rotated_case(request):
    """(input, rois) of _rar_case for one ROTATED_CONFIGS entry in one dtype, its (output_size,
    spatial_scale, sampling_ratio, aligned, clockwise) and the dtype: the torch and the ORT CUDA
    tests run the same cases."""
    config, dtype = request.param
    x, rois = _rar_case(scale=ROTATED_CONFIGS[config][1], seed=len(config), dtype=dtype)
    return x, rois, ROTATED_CONFIGS[config], dtype


def _rotated_close(got, want, dtype, scale=1.0):
    tol = ROTATED_TOL[dtype] * scale
    size = max(1.0, want.double().abs().max().item()) if want.numel() else 1.0
    assert_close(got.detach().cpu().double(), want.detach().cpu().double(), rtol=tol, atol=tol * size)


def _nms_case(n, seed=0, extent=40.0, near_copies=0, dtype=torch.float64, angles=True):
    """(boxes, scores) on the CPU; the last near_copies boxes are slightly moved/resized/turned
    copies of earlier ones (IoUs 0.75..1), so high thresholds matter."""
    g = torch.Generator().manual_seed(seed)
    u = lambda *s: torch.rand(*s, generator=g, dtype=torch.float64)  # noqa: E731
    boxes = torch.cat([u(n, 2) * extent, u(n, 2) * 10 + 1,
                       (u(n, 1) - 0.5) * 2 * math.pi if angles else torch.zeros(n, 1, dtype=torch.float64)], 1)
    if near_copies:
        first = n - near_copies
        src = boxes[torch.randint(0, first, (near_copies,), generator=g)]
        jitter = (u(near_copies, 5) - 0.5) * torch.tensor([0.3, 0.3, 0.1, 0.1, 0.06 if angles else 0.0],
                                                           dtype=torch.float64)
        jitter[:, 2:4] *= src[:, 2:4]
        boxes[first:] = src + jitter
    return boxes.to(dtype), u(n).to(dtype)


def _raised(fn) -> BaseException:
    with pytest.raises(Exception) as info:
        fn()
    return info.value


@needs_cuda_build
def test_roi_align_rotated_cuda_matches_cpu(rotated_case):
    x, rois, (size, scale, sr, aligned, cw), dtype = rotated_case
    on_cpu, on_dev = x.clone().requires_grad_(), x.clone().to(DEV).requires_grad_()
    want = opforge.roi_align_rotated(on_cpu, rois, size, scale, sr, aligned, cw)
    got = opforge.roi_align_rotated(on_dev, rois.to(DEV), size, scale, sr, aligned, cw)
    assert got.device.type == DEV and got.dtype == dtype and got.shape == (40, 5, *size)
    assert want.abs().sum() > 1
    _rotated_close(got, want, dtype)
    if dtype == torch.float64:  # and the numpy reference, directly
        (ref,) = _rar_numpy_reference(x.numpy(), rois.numpy(), output_height=size[0], output_width=size[1],
                                      spatial_scale=scale, sampling_ratio=sr, aligned=int(aligned), clockwise=int(cw))
        assert_close(got.cpu(), torch.from_numpy(ref), rtol=1e-10, atol=1e-10)
    grad = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(dtype)
    want.backward(grad)
    got.backward(grad.to(DEV))
    assert on_dev.grad.device.type == DEV and on_dev.grad.dtype == dtype
    assert on_cpu.grad.abs().sum() > 1
    _rotated_close(on_dev.grad, on_cpu.grad, dtype, scale=2.0)  # atomics: another summation order


@needs_cuda_build
@pytest.mark.parametrize("sampling_ratio", [0, 2])
@pytest.mark.parametrize("aligned,clockwise", [(True, False), (False, True)])
def test_roi_align_rotated_cuda_gradcheck(aligned, clockwise, sampling_ratio):
    x = torch.randn(2, 2, 5, 6, dtype=torch.float64, device=DEV, requires_grad=True)
    rois = torch.tensor([[0, 2.2, 1.9, 3.1, 2.3, 0.4], [1, 4.6, 3.3, 2.7, 4.1, -1.1],
                         [1, -0.4, 5.2, 3.3, 2.6, 2.5], [0, 5.9, 0.3, 4.4, 1.7, -2.9]], dtype=torch.float64, device=DEV)

    def fn(t):
        return opforge.roi_align_rotated(t, rois, (2, 3), 1.0, sampling_ratio, aligned, clockwise)

    # the backward accumulates with float64 atomics: a rerun may differ in the last bits
    assert torch.autograd.gradcheck(fn, (x,), nondet_tol=1e-12)
    assert torch.autograd.gradgradcheck(fn, (x,), nondet_tol=1e-12)
    rois.requires_grad_()
    fn(x).sum().backward()
    assert rois.grad is None


@needs_cuda_build
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roi_align_rotated_cuda_empty_and_many_rois(dtype):
    x, rois = _rar_case(dtype=dtype)
    leaf = x.to(DEV).requires_grad_()
    out = opforge.roi_align_rotated(leaf, rois[:0].to(DEV), (2, 3), 0.5)
    assert out.shape == (0, 5, 2, 3) and out.device.type == DEV and out.dtype == dtype
    out.sum().backward()
    assert leaf.grad.shape == x.shape and not leaf.grad.any()
    assert opforge.roi_align_rotated(x[:0].to(DEV), rois[:0].to(DEV), 2, 0.5).shape == (0, 5, 2, 2)
    # 200,000 rois of a 1 x 1 x 2 x 2 map
    g = torch.Generator().manual_seed(0)
    tiny = torch.randn(1, 1, 2, 2, generator=g).to(dtype)
    many = (torch.rand(200_000, 6, generator=g) * torch.tensor([0, 3, 3, 2, 2, 7])
            - torch.tensor([0, 0.5, 0.5, 0, 0, 3.5])).to(dtype)
    got = opforge.roi_align_rotated(tiny.to(DEV), many.to(DEV), 2, 1.0, 0)
    assert got.shape == (200_000, 1, 2, 2) and torch.isfinite(got).all()
    _rotated_close(got, opforge.roi_align_rotated(tiny, many, 2, 1.0, 0), dtype)


def _hostile_rois_cases():
    base = [[0, 2.5, 2.5, 3.0, 2.0, 0.3], [1, 4.0, 3.0, 2.0, 3.0, -0.5], [0, 3.0, 4.0, 2.5, 2.5, 1.0]]
    for name, row, col, value in (("nan-cx", 2, 1, math.nan), ("inf-cy", 0, 2, math.inf), ("-inf-w", 1, 3, -math.inf),
                                  ("nan-h", 2, 4, math.nan), ("inf-angle", 1, 5, math.inf),
                                  ("batch-minus-1", 1, 0, -1.0), ("batch-N", 2, 0, 2.0), ("batch-half", 0, 0, 0.5),
                                  ("batch-1e30", 1, 0, 1e30), ("batch-nan", 1, 0, math.nan),
                                  ("negative-w", 1, 3, -2.0), ("adaptive-grid", 2, 3, 1e7)):
        rois = [r[:] for r in base]
        rois[row][col] = value
        yield name, rois


HOSTILE_ROTATED_ROIS = list(_hostile_rois_cases())


@needs_cuda_build
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rois", [r for _, r in HOSTILE_ROTATED_ROIS], ids=[n for n, _ in HOSTILE_ROTATED_ROIS])
def test_roi_align_rotated_cuda_refuses_hostile_rois_like_cpu(rois, dtype):
    x = torch.randn(2, 3, 5, 6).to(dtype)
    rois = torch.tensor(rois, dtype=torch.float64).to(dtype)
    cpu = _raised(lambda: opforge.roi_align_rotated(x, rois, 2, 1.0, 0, True))
    assert str(cpu).startswith(f"{RAR}: rois row ")
    dev = _raised(lambda: opforge.roi_align_rotated(x.to(DEV), rois.to(DEV), 2, 1.0, 0, True))
    assert isinstance(dev, opforge.OpInputError) and str(dev) == str(cpu)
    grad = torch.ones(3, 3, 2, 2, dtype=dtype, device=DEV)
    dev = _raised(lambda: torch.ops.opforge._roi_align_rotated_backward(grad, rois.to(DEV), [2, 3, 5, 6], 2, 2, 1.0, 0,
                                                                        True, False))
    assert str(dev) == str(cpu)
    torch.cuda.synchronize()  # nothing was launched with the bad rois: the device is still fine
    ok = rois.clone()
    ok[:, 0] = 0
    ok[:, 1:] = torch.tensor([2.5, 2.5, 3.0, 2.0, 0.3], dtype=dtype)
    _rotated_close(opforge.roi_align_rotated(x.to(DEV), ok.to(DEV), 2), opforge.roi_align_rotated(x, ok, 2), dtype)


@needs_cuda_build
@pytest.mark.parametrize("attrs", [(0, 2, 1.0, 0), (2, 5000, 1.0, 0), (2, 2, 0.0, 0), (2, 2, math.nan, 0),
                                   (2, 2, -1.0, 0), (2, 2, 1.0, 1000)],
                         ids=["oh0", "ow5000", "scale0", "scale-nan", "scale-1", "sr1000"])
def test_roi_align_rotated_cuda_refuses_bad_attributes_like_cpu(attrs):
    x, rois = _rar_case(dtype=torch.float32)
    oh, ow, scale, sr = attrs
    cpu = _raised(lambda: opforge.roi_align_rotated(x, rois, (oh, ow), scale, sr))
    dev = _raised(lambda: opforge.roi_align_rotated(x.to(DEV), rois.to(DEV), (oh, ow), scale, sr))
    assert isinstance(dev, opforge.OpInputError) and str(dev) == str(cpu) and str(cpu).startswith(RAR)
    empty = _raised(lambda: opforge.roi_align_rotated(x[:, :, :0].to(DEV), rois.to(DEV), 2))
    assert str(empty).startswith(f"{RAR}: input has an empty feature map")


@needs_cuda_build
def test_roi_align_rotated_cuda_mixed_devices_and_dtypes_are_refused():
    x, rois = _rar_case(dtype=torch.float32)
    with pytest.raises(ValueError, match=rf"{RAR}: rois is on cpu but input is on cuda"):
        opforge.roi_align_rotated(x.to(DEV), rois, 2)
    with pytest.raises(opforge.OpInputError, match=rf"{RAR}: rois has dtype (torch\.float64|Double) but input has "
                                                   rf"dtype (torch\.float32|Float)"):
        opforge.roi_align_rotated(x.to(DEV), rois.double().to(DEV), 2)


@needs_cuda_build
def test_rotated_ops_opcheck_on_cuda():
    x, rois = _rar_case(k=6, dtype=torch.float32)
    torch.library.opcheck(torch.ops.opforge.roi_align_rotated.default,
                          (x.to(DEV).requires_grad_(), rois.to(DEV), 2, 3, 0.5, 2, True, False))
    boxes, scores = _nms_case(30, extent=15.0, dtype=torch.float32)
    torch.library.opcheck(torch.ops.opforge.nms_rotated.default, (boxes.to(DEV), scores.to(DEV), 0.3))
    torch.library.opcheck(torch.ops.opforge.batched_nms_rotated.default,
                          (boxes.to(DEV), scores.to(DEV), (torch.arange(30) % 3).to(DEV), 0.3))


# ---- nms_rotated / batched_nms_rotated on CUDA -------------------------------------------------
# Both devices compute every IoU in float64 with the same code (core/rotated_box_iou.h); a
# different rounding could only matter for an IoU within ~1e-15 of the threshold, which random
# boxes do not produce.


def _nms_cases():
    mmcv = (torch.tensor([[6.0, 3.0, 8.0, 7.0, 0.5], [3.0, 6.0, 9.0, 11.0, 0.6], [3.0, 7.0, 10.0, 12.0, 0.3],
                          [1.0, 4.0, 13.0, 7.0, 0.6]], dtype=torch.float64),
            torch.tensor([0.7, 0.8, 0.5, 0.9], dtype=torch.float64), 0.5)
    yield "mmcv", mmcv
    yield "empty", (torch.zeros(0, 5, dtype=torch.float64), torch.zeros(0, dtype=torch.float64), 0.5)
    yield "one", (torch.tensor([[1.0, 2.0, 3.0, 4.0, 0.5]], dtype=torch.float64), torch.ones(1, dtype=torch.float64),
                  0.5)
    yield "random-300", (*_nms_case(300, seed=1, extent=60.0, near_copies=80), 0.5)
    yield "random-300-high", (*_nms_case(300, seed=2, extent=60.0, near_copies=80), 0.9)
    yield "random-300-zero", (*_nms_case(300, seed=3, extent=120.0), 0.0)
    boxes, _ = _nms_case(100, seed=4, extent=30.0)
    copies = torch.cat([boxes, boxes[::3], boxes[1::4]])  # exact duplicates
    ties = (torch.arange(len(copies)) % 5).double() / 4  # many equal scores
    yield "duplicates-ties", (copies, ties, 0.4)
    yield "duplicates-threshold-1", (copies, ties, 1.0)  # IoU 1 is not > 1: every box kept
    degenerate = torch.tensor([[5.0, 5.0, 6.0, 4.0, 0.3], [5.0, 5.0, 0.0, 4.0, 0.3], [5.0, 5.0, 6.0, -4.0, 0.3],
                               [5.0, 5.0, 6.0, 4.0, 0.3]], dtype=torch.float64)
    yield "degenerate", (degenerate, torch.tensor([0.5, 0.9, 0.8, 0.4], dtype=torch.float64), 0.0)
    yield "3000", (*_nms_case(3000, seed=5, extent=400.0, near_copies=600), 0.45)


NMS_CUDA_CASES = list(_nms_cases())


@needs_cuda_build
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", [c for _, c in NMS_CUDA_CASES], ids=[n for n, _ in NMS_CUDA_CASES])
def test_nms_rotated_cuda_matches_cpu(case, dtype):
    boxes, scores, threshold = case
    boxes, scores = boxes.to(dtype), scores.to(dtype)
    labels = torch.arange(len(boxes)) % 3
    for fn, args in ((opforge.nms_rotated, (boxes, scores)), (opforge.batched_nms_rotated, (boxes, scores, labels))):
        want = fn(*args, threshold)
        got = fn(*(a.to(DEV) for a in args), threshold)
        assert got.device.type == DEV and got.dtype == torch.int64 and got.dim() == 1
        assert got.cpu().tolist() == want.tolist()
    if len(boxes) == 4 and threshold == 0.5 and dtype != torch.bfloat16:  # mmcv's case
        assert opforge.nms_rotated(boxes.to(DEV), scores.to(DEV), 0.5).tolist() == [3, 1, 0]
    if threshold == 1.0:
        assert len(want) == len(boxes)


@needs_cuda_build
def test_nms_rotated_cuda_axis_aligned_matches_torchvision():
    boxes, scores = _nms_case(3000, seed=6, extent=300.0, near_copies=500, angles=False)
    cx, cy, w, h = boxes[:, :4].unbind(1)
    xyxy = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1).to(DEV)
    labels = torch.arange(3000) % 4
    for threshold in (0.2, 0.5, 0.8):
        want = torchvision.ops.nms(xyxy, scores.to(DEV), threshold)
        assert opforge.nms_rotated(boxes.to(DEV), scores.to(DEV), threshold).tolist() == want.tolist()
        want = torchvision.ops.batched_nms(xyxy, scores.to(DEV), labels.to(DEV), threshold)
        assert opforge.batched_nms_rotated(boxes.to(DEV), scores.to(DEV), labels.to(DEV), threshold).tolist() == \
            want.tolist()


@needs_cuda_build
@pytest.mark.parametrize("scale", [2.0 ** 600, 1e300, 2.0 ** -600, 1e-300], ids=str)
def test_nms_rotated_cuda_at_extreme_scales(scale):
    """float64 boxes whose products overflow or underflow float64 (the mask kernel's instance that
    scales such pairs) keep on the GPU what the CPU keeps: what the boxes unscaled keep. Float idxs
    holding integers too."""
    boxes, scores = _nms_case(300, seed=9, extent=60.0, near_copies=80)
    labels = torch.arange(300) % 3
    scaled = boxes.clone()
    scaled[:, :4] *= scale
    want = opforge.nms_rotated(boxes, scores, 0.5)
    assert opforge.nms_rotated(scaled, scores, 0.5).tolist() == want.tolist()
    assert opforge.nms_rotated(scaled.to(DEV), scores.to(DEV), 0.5).cpu().tolist() == want.tolist()
    want = opforge.batched_nms_rotated(boxes, scores, labels, 0.5)
    got = opforge.batched_nms_rotated(scaled.to(DEV), scores.to(DEV), labels.double().to(DEV), 0.5)
    assert got.cpu().tolist() == want.tolist()


@needs_cuda_build
@pytest.mark.slow
def test_nms_rotated_cuda_mask_in_several_chunks():
    """30,000 boxes: the suppression mask (N x N bits) is built in several chunks of rows."""
    boxes, scores = _nms_case(30_000, seed=7, extent=3000.0, near_copies=5000, angles=False)
    cx, cy, w, h = boxes[:, :4].unbind(1)
    xyxy = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1).to(DEV)
    want = torchvision.ops.nms(xyxy, scores.to(DEV), 0.5)
    assert opforge.nms_rotated(boxes.to(DEV), scores.to(DEV), 0.5).tolist() == want.tolist()


def _hostile_boxes_cases():
    boxes, scores = _nms_case(6, seed=8)
    for name, col in (("cx", 0), ("cy", 1), ("w", 2), ("h", 3), ("angle", 4)):
        for value in (math.nan, math.inf, -math.inf):
            b = boxes.clone()
            b[4, col] = value
            yield f"{name}={value}", b, scores, 0.5
    s = scores.clone()
    s[3] = math.nan
    yield "score-nan", boxes, s, 0.5
    for threshold in (-0.1, 1.5, math.nan, math.inf):
        yield f"threshold={threshold}", boxes, scores, threshold


HOSTILE_BOXES = list(_hostile_boxes_cases())


@needs_cuda_build
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("boxes,scores,threshold", [c[1:] for c in HOSTILE_BOXES], ids=[c[0] for c in HOSTILE_BOXES])
def test_nms_rotated_cuda_refuses_hostile_input_like_cpu(boxes, scores, threshold, dtype):
    boxes, scores = boxes.to(dtype), scores.to(dtype)
    labels = torch.arange(6)
    for fn, args, op in ((opforge.nms_rotated, (boxes, scores), "opforge::nms_rotated"),
                         (opforge.batched_nms_rotated, (boxes, scores, labels), "opforge::batched_nms_rotated")):
        cpu = _raised(lambda: fn(*args, threshold))
        assert str(cpu).startswith(f"{op}: ")
        dev = _raised(lambda: fn(*(a.to(DEV) for a in args), threshold))
        assert isinstance(dev, opforge.OpInputError) and str(dev) == str(cpu)
    torch.cuda.synchronize()


@needs_cuda_build
def test_nms_rotated_cuda_mixed_devices_are_refused():
    boxes, scores = _nms_case(5)
    with pytest.raises(ValueError, match=r"opforge::nms_rotated: scores is on cpu but boxes is on cuda"):
        opforge.nms_rotated(boxes.to(DEV), scores, 0.5)
    with pytest.raises(ValueError, match=r"opforge::batched_nms_rotated: idxs is on cpu but boxes is on cuda"):
        opforge.batched_nms_rotated(boxes.to(DEV), scores.to(DEV), torch.zeros(5, dtype=torch.int64), 0.5)


# ---- the ORT CUDAExecutionProvider ----------------------------------------------------------------


def _ort_cuda_and_cpu(spec, values):
    """(CUDA EP outputs, the provider that ran the node, CPU EP outputs) of a one-node model."""
    model = _spec_model(spec, values)
    tensors, _ = spec.split_args(list(values))
    feeds = {a.onnx_name: t for a, t in zip(spec.tensor_args, tensors)}
    so = profiling_session_options()
    cuda = opforge.ort_session(model, so, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    got = _ort_run(cuda, feeds)
    provider = _providers_of(cuda, {spec.name}).get(spec.name)
    want = _ort_run(opforge.ort_session(model), feeds)
    return got, provider, want


@needs_cuda_build
@needs_ort_cuda
def test_ort_cuda_ep_roi_align_rotated_matches_cpu_ep(rotated_case):
    x, rois, (size, scale, sr, aligned, cw), dtype = rotated_case
    (got,), provider, (want,) = _ort_cuda_and_cpu(ROI_ALIGN_ROTATED, (x, rois, *size, scale, sr, aligned, cw))
    assert provider == "CUDAExecutionProvider"
    assert got.dtype == dtype and got.shape == (40, 5, *size)
    _rotated_close(got, want, dtype)
    _rotated_close(got, opforge.roi_align_rotated(x.to(DEV), rois.to(DEV), size, scale, sr, aligned, cw), dtype)
    (empty,), _, _ = _ort_cuda_and_cpu(ROI_ALIGN_ROTATED, (x, rois[:0], *size, scale, sr, aligned, cw))
    assert empty.shape == (0, 5, *size)


@needs_cuda_build
@needs_ort_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
@pytest.mark.parametrize("case", [c for _, c in NMS_CUDA_CASES], ids=[n for n, _ in NMS_CUDA_CASES])
def test_ort_cuda_ep_nms_rotated_matches_cpu_ep(case, dtype):
    boxes, scores, threshold = case
    boxes, scores = boxes.to(dtype), scores.to(dtype)
    labels = torch.arange(len(boxes)) % 3
    for spec, values in ((NMS_ROTATED, (boxes, scores, threshold)),
                         (BATCHED_NMS_ROTATED, (boxes, scores, labels, threshold))):
        (got,), provider, (want,) = _ort_cuda_and_cpu(spec, values)
        assert provider == "CUDAExecutionProvider" or len(boxes) == 0
        assert got.dtype == torch.int64 and got.tolist() == want.tolist()


@needs_cuda_build
@needs_ort_cuda
def test_ort_cuda_ep_refuses_hostile_rois_and_boxes_with_an_error_status():
    import onnxruntime as ort

    x, rois = _rar_case(dtype=torch.float32)
    bad = rois.clone()
    bad[7, 0] = 5.0
    so = ort.SessionOptions()
    so.log_severity_level = 4
    sess = opforge.ort_session(_spec_model(ROI_ALIGN_ROTATED, (x, rois, 2, 2, 0.5, 0, True, False)), so,
                               providers=["CUDAExecutionProvider"])
    with pytest.raises(Exception, match=rf"INVALID_ARGUMENT.*{RAR}: rois row 7 has batch index 5\.0+, but input has "
                                        r"N = 2 images"):
        sess.run(None, {"input": x.numpy(), "rois": bad.numpy()})
    bad = rois.clone()
    bad[3, 5] = math.nan
    with pytest.raises(Exception, match=rf"INVALID_ARGUMENT.*{RAR}: rois row 3 has a non-finite angle \(nan\)"):
        sess.run(None, {"input": x.numpy(), "rois": bad.numpy()})
    (got,) = sess.run(None, {"input": x.numpy(), "rois": rois.numpy()})  # the session still works
    _rotated_close(torch.from_numpy(got), opforge.roi_align_rotated(x, rois, 2, 0.5), torch.float32)
    boxes, scores = _nms_case(8, dtype=torch.float32)
    sess = opforge.ort_session(_spec_model(NMS_ROTATED, (boxes, scores, 0.5)), so, providers=["CUDAExecutionProvider"])
    bad = boxes.clone()
    bad[2, 3] = math.inf
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT.*opforge::nms_rotated: boxes row 2 has a non-finite h"):
        sess.run(None, {"boxes": bad.numpy(), "scores": scores.numpy()})
    s = scores.clone()
    s[5] = math.nan
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT.*opforge::nms_rotated: scores\[5\] is NaN"):
        sess.run(None, {"boxes": boxes.numpy(), "scores": s.numpy()})
    (keep,) = sess.run(None, {"boxes": boxes.numpy(), "scores": scores.numpy()})
    assert keep.tolist() == opforge.nms_rotated(boxes, scores, 0.5).tolist()


class _RotatedDetector(torch.nn.Module):
    def forward(self, feat, rois, boxes, scores, labels):
        pooled = opforge.roi_align_rotated(feat, rois, (2, 3), 0.5, 2, True, False)
        return pooled, opforge.nms_rotated(boxes, scores, 0.3), opforge.batched_nms_rotated(boxes, scores, labels, 0.3)


@needs_cuda_build
@needs_ort_cuda
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_ort_cuda_ep_rotated_detector_round_trip(exporter):
    def inputs(k, n, seed):
        feat, rois = _rar_case(n=2, c=4, h=10, w=12, k=k, scale=0.5, seed=seed, dtype=torch.float32)
        boxes, scores = _nms_case(n, seed=seed, extent=20.0, dtype=torch.float32)
        return feat, rois, boxes, scores, torch.arange(n) % 3

    names = ["feat", "rois", "boxes", "scores", "labels"]
    if exporter == "dynamo":
        k, n = torch.export.Dim("k"), torch.export.Dim("n")
        kw = dict(dynamic_shapes=(None, {0: k}, {0: n}, {0: n}, {0: n}))
    else:
        kw = dict(dynamic_axes={"rois": {0: "k"}, "boxes": {0: "n"}, "scores": {0: "n"}, "labels": {0: "n"},
                                "pooled": {0: "k"}, "keep": {0: "m"}, "keep_per_class": {0: "mc"}})
    with warnings.catch_warnings():  # one Dim shared by boxes, scores and labels: that sharing is the point
        warnings.filterwarnings("ignore", message=".*shares the same shape constraints")
        proto = opforge.export(_RotatedDetector(), inputs(5, 9, 0), dynamo=exporter == "dynamo",
                               opset_version=18 if exporter == "dynamo" else 17, input_names=names,
                               output_names=["pooled", "keep", "keep_per_class"], **kw)
    so = profiling_session_options()
    sess = opforge.ort_session(proto, so, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    model = _RotatedDetector()
    for k, n, seed in ((5, 9, 0), (17, 60, 1), (0, 0, 2)):
        args = inputs(k, n, seed)
        got = sess.run(None, {name: t.numpy() for name, t in zip(names, args)})
        with torch.no_grad():
            want = model(*(a.to(DEV) for a in args))
        _rotated_close(torch.from_numpy(got[0]), want[0], torch.float32)
        assert got[1].tolist() == want[1].tolist() and got[2].tolist() == want[2].tolist()
    assert _providers_of(sess, {"roi_align_rotated", "nms_rotated", "batched_nms_rotated"}) == {
        "roi_align_rotated": "CUDAExecutionProvider", "nms_rotated": "CUDAExecutionProvider",
        "batched_nms_rotated": "CUDAExecutionProvider"}
