"""libopforge_mmdeploy.so's CUDA EP kernels (its _cuda companion) against its CPU kernels, on a GPU
with onnxruntime-gpu: every file mmdeploy 1.3.1 exported itself (tests/data/mmdeploy), and the five
node forms in every float type. Each test checks from ORT's profile that the node really ran on
the CUDA EP. Without a CUDA build, a GPU and onnxruntime-gpu these tests skip (the CUDA code is
compiled by every CUDA build, and grid_sampler's work items run on the host in
tests/test_gpu_cores_emulated.py)."""

import json
import os

import numpy as np
import onnx
import pytest
import torch
import opforge
import test_mmdeploy_ops as mm
from helpers import profiling_session_options
from opforge.testing.support import _ort_run


def _ort_cuda_available():
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return "CUDAExecutionProvider" in ort.get_available_providers()


pytestmark = [
    pytest.mark.skipif(not opforge.BUILT_WITH_CUDA, reason="a CPU-only build has no CUDA EP kernels"),
    pytest.mark.skipif(not _ort_cuda_available(), reason="needs onnxruntime-gpu (CUDAExecutionProvider)"),
]

DATA = os.path.join(os.path.dirname(__file__), "data", "mmdeploy")


def _providers(session, op_types):
    """{op type: provider} from ORT's profile: which EP ran each node of these types."""
    path = session.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.unlink(path)
    return {e["args"]["op_name"]: e["args"].get("provider") for e in events
            if e.get("args", {}).get("op_name") in op_types}


def _run_both(model, feeds):
    """(CUDA EP outputs, {op: provider}, CPU EP outputs) of ``model`` for torch ``feeds``."""
    so = profiling_session_options()
    so.log_severity_level = 4
    cuda = opforge.ort_session(model, so, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    got = _ort_run(cuda, feeds)
    custom = {n.op_type for n in model.graph.node if n.domain in ("mmdeploy", "mmcv")}
    return got, _providers(cuda, custom), _ort_run(opforge.ort_session(model), feeds)


def _close(got, want, dtype):
    if got.dtype == torch.int64:
        assert got.tolist() == want.tolist()
        return
    tol = {torch.float32: 1e-4, torch.float64: 1e-10, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    scale = max(1.0, want.double().abs().max().item()) if want.numel() else 1.0
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol * scale, equal_nan=True)


def _exported_cases():
    manifest = json.load(open(os.path.join(DATA, "manifest.json")))
    return [pytest.param(f, c, id=f"{f[:-5]}-{c}") for f, e in manifest["files"].items() for c in e["cases"]]


@pytest.mark.parametrize("fname,case", _exported_cases())
def test_exported_file_on_the_cuda_ep_matches_the_cpu_ep(fname, case):
    model = onnx.load(os.path.join(DATA, fname))
    data = np.load(os.path.join(DATA, fname[:-5] + ".npz"))
    feeds = {i.name: torch.from_numpy(data[f"{case}__{i.name}"]) for i in model.graph.input}
    got, providers, want = _run_both(model, feeds)
    assert set(providers.values()) == {"CUDAExecutionProvider"}, providers
    for g, w in zip(got, want):
        _close(g, w, g.dtype if g.is_floating_point() else torch.float32)


@pytest.mark.parametrize("dtype", mm.DTYPES, ids=str)
def test_node_forms_on_the_cuda_ep_in_every_float_type(dtype):
    t = mm.ONNX_TYPE[dtype]
    x, offset, mask, weight, bias = mm.dcn_inputs(dtype=dtype)
    feat = torch.randn(2, 3, 10, 12).to(dtype)
    grid = (torch.rand(2, 6, 7, 2) * 2.4 - 1.2).to(dtype)
    rois = mm.rotated_rois(5, 2, 20.0, seed=2).to(dtype)
    boxes, scores = mm.detections(2, 40, 3, seed=4, dtype=dtype)
    aa_boxes, aa_scores = mm.axis_aligned(2, 30, 2, seed=5, dtype=dtype)
    cases = [
        (mm.dcn_model(dtype, stride=1, padding=1, dilation=1, groups=2, deform_groups=2), (x, offset, mask, weight, bias)),
        (mm.dcn_model(dtype, with_bias=False, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=2,
                      deform_groups=2), (x, offset, mask, weight)),
        (mm.roi_model(dtype, output_height=2, output_width=3, spatial_scale=0.5, sampling_ratio=0, aligned=1,
                      clockwise=1), (feat, rois)),
        (mm.nms_rotated_model(dtype, iou_threshold=0.2, score_threshold=0.1), (boxes, scores)),
        (mm.nms_match_model(dtype), (aa_boxes, aa_scores, torch.tensor([0.3]), torch.tensor([0.1]))),
    ]
    for mode in range(3):
        for padding in range(3):
            cases.append((mm.mmdeploy_model("grid_sampler", [("input", t), ("grid", t)], [("output", t)],
                                            interpolation_mode=mode, padding_mode=padding, align_corners=mode % 2),
                          (feat, grid)))
    for model, tensors in cases:
        feeds = {i.name: v for i, v in zip(model.graph.input, tensors)}
        (got,), providers, (want,) = _run_both(model, feeds)
        assert set(providers.values()) == {"CUDAExecutionProvider"}, (model.graph.node[0].op_type, providers)
        _close(got, want, dtype)


def test_cuda_ep_refuses_hostile_values_with_an_error_status():
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    model = mm.nms_match_model(torch.float32)
    sess = opforge.ort_session(model, so, providers=["CUDAExecutionProvider"])
    boxes, scores = mm.axis_aligned(1, 5, 1, seed=0)
    scores[0, 0, 2] = float("nan")
    with pytest.raises(Exception, match=r"mmdeploy::NMSMatch: scores\[0, 0, 2\] is NaN"):
        sess.run(None, {"boxes": boxes.numpy(), "scores": scores.numpy(), "iou_threshold": np.array([0.5], np.float32),
                        "score_threshold": np.array([0.1], np.float32)})
    roi = opforge.ort_session(mm.roi_model(torch.float32, output_height=2, output_width=2, spatial_scale=1.0,
                                           sampling_ratio=2, aligned=1, clockwise=0), so,
                              providers=["CUDAExecutionProvider"])
    with pytest.raises(Exception, match="mmdeploy::MMCVRoIAlignRotated: rois row 0 has batch index"):
        roi.run(None, {"input": np.ones((1, 2, 4, 4), np.float32),
                       "rois": np.array([[3, 2, 2, 2, 2, 0]], np.float32)})
