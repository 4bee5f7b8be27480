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
from helpers import deform_inputs

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

CONFIGS = {
    "basic-3x3": dict(n=2, c=4, o=6, h=7, w=7, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1, offset_groups=1),
    "non-square-mixed": dict(n=2, c=6, o=4, h=9, w=8, kh=3, kw=2, stride=(1, 2), pad=(1, 0), dil=(1, 2), groups=2, offset_groups=3),
    "groups-4": dict(n=2, c=8, o=8, h=6, w=7, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=4, offset_groups=1),
    "offset-groups-span-weight-groups": dict(n=2, c=6, o=6, h=6, w=6, kh=2, kw=2, stride=(1, 1), pad=(0, 0), dil=(1, 1), groups=3, offset_groups=2),
    "batch-5-64ch": dict(n=5, c=64, o=8, h=24, w=26, kh=3, kw=3, stride=(1, 1), pad=(1, 1), dil=(1, 1), groups=1, offset_groups=1),
}


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
    cfg = CONFIGS["batch-5-64ch"]
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
    import onnxruntime as ort

    model = DcnModel().to(dtype).eval()
    x = torch.randn(2, 8, 12, 12, dtype=dtype)
    off = torch.randn(2, 18, 12, 12, dtype=dtype)
    mask = torch.rand(2, 9, 12, 12, dtype=dtype)
    onnx_model = opforge.export(model, (x, off, mask), dynamo=exporter == "dynamo", opset_version=18,
                                standard_onnx=False, input_names=["x", "offset", "mask"], output_names=["y"])
    so = ort.SessionOptions()
    so.enable_profiling = True
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
