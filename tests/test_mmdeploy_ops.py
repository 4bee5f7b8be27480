"""libopforge_mmdeploy.so on nodes in exactly the forms mmdeploy 1.3.1's exporters write (built here
with onnx.helper; the files mmdeploy exported itself are tests/test_mmdeploy_exported.py), against
independent references: torchvision's deform_conv2d, the plain-PyTorch roi_align_rotated of
test_roi_align_rotated, nms_rotated's numpy greedy (its own polygon construction) per image and
class, and a plain-Python nms_match (its IoU rounded to float32 as mmdeploy's kernel's; exact ties by
hand). Also: INT and INTS attributes, absent and omitted bias, the mmcv domain, every float type,
empty outputs, ties, hostile values and bad nodes (clear errors, no crash), MMCVRoIAlignRotated's
budgets (opforge's session config entries), and how the library meets opforge.ort_session and other
libraries."""

import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch
import torchvision
from onnx import AttributeProto, TensorProto, helper

import opforge
from opforge.ops.nms_rotated import _greedy
from opforge.testing import node_model
from opforge.testing.support import _ort_run
from test_roi_align_rotated import BUDGET_CASES, MAX_SAMPLES, check_linear, linear_case, torch_roi_align_rotated

F32, F64, F16, BF16, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.INT64
ONNX_TYPE = {torch.float32: F32, torch.float64: F64, torch.float16: F16, torch.bfloat16: BF16}
DTYPES = list(ONNX_TYPE)
TOL = {torch.float32: 1e-4, torch.float64: 1e-10, torch.float16: 2e-2, torch.bfloat16: 1e-1}


def mmdeploy_model(op, inputs, outputs, domain="mmdeploy", **attrs):
    """One node ``domain::op`` with inputs/outputs given as (name, element type) pairs; an input name
    "" is an omitted input."""
    # opset 11: what mmdeploy's onnx_config writes by default
    return node_model(op, inputs, outputs, domain=domain, opsets={"": 11, domain: 1}, ir_version=8, **attrs)


def session(model, threads=None):
    so = onnxruntime.SessionOptions()
    so.log_severity_level = 4
    if threads:
        so.intra_op_num_threads = threads
    so.register_custom_ops_library(opforge.mmdeploy_library_path())
    return onnxruntime.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run(model, *tensors, threads=None):
    """The model's first output for torch inputs (in the graph's input order), as a torch tensor."""
    sess = session(model, threads)
    return _ort_run(sess, {i.name: t for i, t in zip(sess.get_inputs(), tensors)})[0]


# ---- MMCVModulatedDeformConv2d ------------------------------------------------------------------


def dcn_inputs(n=2, c=6, o=4, h=9, w=8, k=(3, 3), groups=2, dg=2, stride=(1, 1), pad=(1, 1), dil=(1, 1),
               dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    oh = (h + 2 * pad[0] - dil[0] * (k[0] - 1) - 1) // stride[0] + 1
    ow = (w + 2 * pad[1] - dil[1] * (k[1] - 1) - 1) // stride[1] + 1
    x = torch.randn(n, c, h, w, generator=g)
    offset = torch.randn(n, 2 * dg * k[0] * k[1], oh, ow, generator=g) * 2
    mask = torch.rand(n, dg * k[0] * k[1], oh, ow, generator=g)
    weight = torch.randn(o, c // groups, *k, generator=g)
    bias = torch.randn(o, generator=g)
    return [t.to(dtype) for t in (x, offset, mask, weight, bias)]


def dcn_model(dtype, with_bias=True, domain="mmdeploy", **attrs):
    t = ONNX_TYPE[dtype]
    inputs = [("input", t), ("offset", t), ("mask", t), ("weight", t)] + ([("bias", t)] if with_bias else [])
    return mmdeploy_model("MMCVModulatedDeformConv2d", inputs, [("output", t)], domain=domain, **attrs)


def torchvision_dcn(x, offset, mask, weight, bias, stride, pad, dil):
    return torchvision.ops.deform_conv2d(x.double(), offset.double(), weight.double(),
                                         None if bias is None else bias.double(), stride=stride, padding=pad,
                                         dilation=dil, mask=mask.double())


# (groups, deform_groups, C, kernel): mmdeploy 1.3.1's kernel is wrong for groups > 1 with deform_groups > 1 and
# when (C / groups) * kh * kw is not a multiple of 8; both are here
DCN_SHAPES = [(1, 1, 4, (3, 3)), (2, 2, 6, (3, 3)), (3, 1, 6, (3, 3)), (1, 3, 6, (2, 3)), (2, 3, 6, (1, 1)),
              (4, 2, 8, (3, 2))]


@pytest.mark.parametrize("domain", ["mmdeploy", "mmcv"])
@pytest.mark.parametrize("groups,dg,c,k", DCN_SHAPES)
def test_dcn_matches_torchvision(domain, groups, dg, c, k):
    stride, pad, dil = (1, 2), (1, 0), (2, 1)
    x, offset, mask, weight, bias = dcn_inputs(c=c, o=2 * groups, k=k, groups=groups, dg=dg, stride=stride, pad=pad,
                                               dil=dil, h=11, w=10)
    model = dcn_model(torch.float32, domain=domain, stride=list(stride), padding=list(pad), dilation=list(dil),
                      groups=groups, deform_groups=dg)
    got = run(model, x, offset, mask, weight, bias)
    want = torchvision_dcn(x, offset, mask, weight, bias, stride, pad, dil)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


# INT attributes are what mmdeploy writes for mmcv.ops.modulated_deform_conv2d(..., 1, 1, 1, ...) with plain ints
# (mmdeploy's own kernel crashes on them at session creation); INTS of one value and absent attributes too
@pytest.mark.parametrize("form", ["ints", "int", "ints1", "absent"])
def test_dcn_attribute_forms(form):
    x, offset, mask, weight, bias = dcn_inputs(groups=1, dg=1, c=4, stride=(2, 2), pad=(1, 1), dil=(1, 1), h=9, w=9)
    attrs = {"ints": dict(stride=[2, 2], padding=[1, 1], dilation=[1, 1], groups=1, deform_groups=1),
             "int": dict(stride=2, padding=1, dilation=1, groups=1, deform_groups=1),
             "ints1": dict(stride=[2], padding=[1], dilation=[1], groups=1, deform_groups=1),
             "absent": {}}[form]
    if form == "absent":  # mmcv's defaults: stride 1, padding 0, dilation 1, groups 1, deform_groups 1
        x, offset, mask, weight, bias = dcn_inputs(groups=1, dg=1, c=4, stride=(1, 1), pad=(0, 0), h=9, w=9)
        stride, pad = (1, 1), (0, 0)
    else:
        stride, pad = (2, 2), (1, 1)
    got = run(dcn_model(torch.float32, **attrs), x, offset, mask, weight, bias)
    torch.testing.assert_close(got.double(), torchvision_dcn(x, offset, mask, weight, bias, stride, pad, (1, 1)),
                               rtol=1e-4, atol=1e-4)


def test_dcn_without_bias():
    x, offset, mask, weight, _ = dcn_inputs()
    inputs = [("input", F32), ("offset", F32), ("mask", F32), ("weight", F32)]
    model = mmdeploy_model("MMCVModulatedDeformConv2d", inputs, [("output", F32)], stride=[1, 1], padding=[1, 1],
                           dilation=[1, 1], groups=2, deform_groups=2)
    got = run(model, x, offset, mask, weight)
    torch.testing.assert_close(got.double(), torchvision_dcn(x, offset, mask, weight, None, (1, 1), (1, 1), (1, 1)),
                               rtol=1e-4, atol=1e-4)
    # an omitted ("") fifth input is refused when the session is made (ORT's lite-op glue would dereference it)
    omitted = mmdeploy_model("MMCVModulatedDeformConv2d", inputs + [("", F32)], [("output", F32)], groups=2,
                             deform_groups=2)
    with pytest.raises(Exception, match=r"input 4 \(bias\) is omitted"):
        session(omitted)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dcn_every_float_type(dtype):
    x, offset, mask, weight, bias = dcn_inputs(dtype=dtype)
    got = run(dcn_model(dtype, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=2, deform_groups=2),
              x, offset, mask, weight, bias)
    assert got.dtype == dtype
    want = torchvision_dcn(x, offset, mask, weight, bias, (1, 1), (1, 1), (1, 1))
    scale = want.abs().max().item()
    torch.testing.assert_close(got.double(), want, rtol=TOL[dtype], atol=TOL[dtype] * scale)


def test_dcn_is_opforge_deform_conv2d_bit_for_bit():
    """The same computation as opforge::deform_conv2d's ORT kernel (one code path), not a copy."""
    x, offset, mask, weight, bias = dcn_inputs(c=8, o=6, groups=2, dg=4, k=(3, 3))
    ours = run(dcn_model(torch.float32, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=2, deform_groups=4),
               x, offset, mask, weight, bias)
    node = helper.make_node("deform_conv2d", ["input", "weight", "offset", "mask", "bias"], ["out"], domain="opforge",
                            stride_h=1, stride_w=1, pad_h=1, pad_w=1, dilation_h=1, dilation_w=1, groups=2,
                            offset_groups=4, use_mask=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, F32, None)
                                            for n in ("input", "weight", "offset", "mask", "bias")],
                              [helper.make_tensor_value_info("out", F32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("opforge", 1)])
    theirs = opforge.ort_session(model).run(None, dict(input=x.numpy(), weight=weight.numpy(), offset=offset.numpy(),
                                                       mask=mask.numpy(), bias=bias.numpy()))[0]
    assert np.array_equal(ours.numpy(), theirs)


def test_dcn_threads_give_the_same_bits():
    x, offset, mask, weight, bias = dcn_inputs(n=3, c=8, o=8, h=20, w=20, groups=2, dg=2)
    model = dcn_model(torch.float32, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=2, deform_groups=2)
    one, two = (run(model, x, offset, mask, weight, bias, threads=t) for t in (1, 2))
    assert torch.equal(one, two)


@pytest.mark.parametrize("attrs,match", [
    (dict(stride=[0, 1]), "stride must be positive"),
    (dict(stride=[1, 1, 1]), "'stride' must be an int or a list of 1 or 2 ints, got 3"),
    (dict(padding=1.5), "'padding' must be an int or a list of 1 or 2 ints, got a float"),
    (dict(dilation=[1, -1]), "dilation must be positive"),
    (dict(groups=0), "groups must be positive"),
    (dict(groups=[1, 2]), "'groups' must be an int, got a list"),
    # ORT's list getter reads any present non-INTS attribute as an empty list: these must not pass as absent
    (dict(stride=[2.0, 2.0]), "'stride' must be an int or a list of 1 or 2 ints, got another type"),
    (dict(dilation="2"), "'dilation' must be an int or a list of 1 or 2 ints, got another type"),
    (dict(groups=1.0), "'groups' must be an int, got a float"),
    (dict(deform_groups=[1.0]), "'deform_groups' must be an int, got another type"),
    (dict(deform_groups=-2), "deform_groups must be positive"),
])
def test_dcn_bad_attributes_fail_the_session(attrs, match):
    base = dict(stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1, deform_groups=1)
    with pytest.raises(Exception, match=match) as info:
        session(dcn_model(torch.float32, **{**base, **attrs}))
    assert "MMCVModulatedDeformConv2d" in str(info.value)


def test_dcn_empty_ints_attribute_is_not_absent():
    model = dcn_model(torch.float32, stride=[1, 1], dilation=[1, 1], groups=1, deform_groups=1)
    model.graph.node[0].attribute.append(helper.make_attribute("padding", [], attr_type=AttributeProto.INTS))
    with pytest.raises(Exception, match="'padding' must be an int or a list of 1 or 2 ints, got another type"):
        session(model)


def test_dcn_bad_nodes_fail_the_session():
    with pytest.raises(Exception, match=r"MMCVModulatedDeformConv2d: the node has 3 input\(s\); expected 4 or 5"):
        session(mmdeploy_model("MMCVModulatedDeformConv2d", [("a", F32), ("b", F32), ("c", F32)], [("o", F32)]))
    with pytest.raises(Exception, match=r"input 2 \(mask\) is omitted"):
        session(mmdeploy_model("MMCVModulatedDeformConv2d", [("a", F32), ("b", F32), ("", F32), ("d", F32)],
                               [("o", F32)]))


@pytest.mark.parametrize("which,shape,match", [
    ("offset", (2, 35, 9, 8), r"offset.shape\[1\] is not valid"),
    ("mask", (2, 18, 9, 7), "mask output dims do not match"),
    ("weight", (4, 4, 3, 3), r"weight.size\(1\) \* groups must equal input channels"),
    ("bias", (5,), r"bias must have shape \[4\]"),
    ("input", (2, 6, 9), "input must be 4-D"),
])
def test_dcn_bad_shapes_are_run_errors(which, shape, match):
    tensors = dict(zip(["input", "offset", "mask", "weight", "bias"], dcn_inputs()))
    tensors[which] = torch.zeros(shape)
    sess = session(dcn_model(torch.float32, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=2,
                             deform_groups=2))
    with pytest.raises(Exception, match=match) as info:
        sess.run(None, {k: v.numpy() for k, v in tensors.items()})
    assert "mmdeploy::MMCVModulatedDeformConv2d" in str(info.value) and "deform_groups" not in match
    # the session survives and still computes
    sess.run(None, {k: v.numpy() for k, v in zip(["input", "offset", "mask", "weight", "bias"], dcn_inputs())})


def test_dcn_empty_batch():
    x, offset, mask, weight, bias = dcn_inputs(n=0)
    got = run(dcn_model(torch.float32, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=2, deform_groups=2),
              x, offset, mask, weight, bias)
    assert got.shape == (0, 4, 9, 8)


# ---- MMCVRoIAlignRotated ------------------------------------------------------------------------


def rotated_rois(k, n, size, seed):
    g = torch.Generator().manual_seed(seed)
    r = torch.rand(k, 6, generator=g, dtype=torch.float64)
    return torch.stack([(r[:, 0] * n).floor(), r[:, 1] * size, r[:, 2] * size, 1 + r[:, 3] * size / 2,
                        1 + r[:, 4] * size / 2, (r[:, 5] - 0.5) * 7], 1)


def roi_model(dtype, **attrs):
    t = ONNX_TYPE[dtype]
    return mmdeploy_model("MMCVRoIAlignRotated", [("input", t), ("rois", t)], [("output", t)], **attrs)


@pytest.mark.parametrize("aligned,clockwise,sampling_ratio", [(1, 0, 0), (1, 1, 2), (0, 0, 2), (0, 1, 0)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roi_align_rotated_matches_the_torch_reference(aligned, clockwise, sampling_ratio, dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 12, 14, generator=g, dtype=torch.float64)
    rois = rotated_rois(9, 2, 24.0, seed=4)
    model = roi_model(dtype, output_height=3, output_width=4, spatial_scale=0.5, sampling_ratio=sampling_ratio,
                      aligned=aligned, clockwise=clockwise)
    got = run(model, x.to(dtype), rois.to(dtype))
    assert got.dtype == dtype and got.shape == (9, 5, 3, 4)
    want = torch_roi_align_rotated(x.to(dtype), rois.to(dtype), (3, 4), 0.5, sampling_ratio, bool(aligned),
                                   bool(clockwise))
    torch.testing.assert_close(got.double(), want, rtol=TOL[dtype], atol=TOL[dtype] * 4)


def test_roi_align_rotated_no_rois_and_hostile_rois():
    x = torch.randn(1, 3, 8, 8)
    model = roi_model(torch.float32, output_height=2, output_width=2, spatial_scale=1.0, sampling_ratio=2, aligned=1,
                      clockwise=0)
    assert run(model, x, torch.zeros(0, 6)).shape == (0, 3, 2, 2)
    sess = session(model)
    for rois, match in [([[1, 4, 4, 2, 2, 0]], "batch index"), ([[0, float("nan"), 4, 2, 2, 0]], "non-finite"),
                        ([[0.5, 4, 4, 2, 2, 0]], "batch index")]:
        with pytest.raises(Exception, match=match) as info:
            sess.run(None, {"input": x.numpy(), "rois": np.array(rois, np.float32)})
        assert "mmdeploy::MMCVRoIAlignRotated" in str(info.value)


def test_roi_align_rotated_bad_attributes_fail_the_session():
    with pytest.raises(Exception, match=r"MMCVRoIAlignRotated: output_size must be in \[1, 1024\]"):
        session(roi_model(torch.float32, output_height=0, output_width=2, spatial_scale=1.0, sampling_ratio=2,
                          aligned=1, clockwise=0))
    with pytest.raises(Exception, match="MMCVRoIAlignRotated.*needs the float attribute 'spatial_scale'"):
        session(roi_model(torch.float32, output_height=2, output_width=2, sampling_ratio=2, aligned=1, clockwise=0))
    with pytest.raises(Exception, match="MMCVRoIAlignRotated: attribute aligned must be 0 or 1"):
        session(roi_model(torch.float32, output_height=2, output_width=2, spatial_scale=1.0, sampling_ratio=2,
                          aligned=2, clockwise=0))


def _budget_session(size, sr, entries=()):
    so = onnxruntime.SessionOptions()
    so.log_severity_level = 4
    for key, value in entries:
        so.add_session_config_entry(key, str(value))  # read when the library is registered, next
    so.register_custom_ops_library(opforge.mmdeploy_library_path())
    model = roi_model(torch.float32, output_height=size, output_width=size, spatial_scale=1.0, sampling_ratio=sr,
                      aligned=1, clockwise=0)
    return onnxruntime.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name,x,rois,size,sr,match", BUDGET_CASES, ids=[c[0] for c in BUDGET_CASES])
def test_roi_align_rotated_budgets_refuse_the_hostile_calls_quickly(name, x, rois, size, sr, match):
    sess = _budget_session(size, sr)
    start = time.perf_counter()
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument,
                       match=f"INVALID_ARGUMENT.*mmdeploy::MMCVRoIAlignRotated: {match}"):
        sess.run(None, {"input": x.numpy(), "rois": rois.numpy()})
    assert time.perf_counter() - start < 1.0, "the refusal took the time of the work"


def test_roi_align_rotated_budgets_are_opforge_session_entries():
    # the same entries as opforge's node: 8 x 256 x 64 x 64 x 17^2 = 2.42e9 samples, 1.13x the default
    x, rois, reference = linear_case(8, 256, 64)
    feeds = {"input": x.numpy(), "rois": rois.numpy()}
    with pytest.raises(Exception, match=r"MMCVRoIAlignRotated: the call would take 2424307712 bilinear samples"):
        _budget_session(64, 17).run(None, feeds)
    check_linear(_budget_session(64, 17, [(MAX_SAMPLES, 3 << 30)]).run(None, feeds)[0], reference)
    with pytest.raises(Exception, match=rf"session config entry '{MAX_SAMPLES}' must be a positive integer"):
        _budget_session(64, 17, [(MAX_SAMPLES, "lots")])


# ---- NMSRotated ---------------------------------------------------------------------------------


def nms_rotated_reference(boxes, scores, iou_threshold, score_threshold):
    """mmdeploy's rows: per image and class, the boxes with score > score_threshold through the greedy
    numpy reference (decreasing score, ties by index); (image, class, box)."""
    rows = []
    b64, s64 = boxes.double().numpy(), scores.double().numpy()
    for n in range(b64.shape[0]):
        for c in range(s64.shape[1]):
            picked = np.nonzero(s64[n, c] > np.float32(score_threshold))[0]
            if picked.size:
                keep = _greedy(b64[n, picked], s64[n, c, picked], None, float(np.float32(iou_threshold)))
                rows += [[n, c, int(picked[k])] for k in keep]
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def detections(n, b, c, seed, dtype=torch.float32, extent=30.0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.rand(n, b, 2, generator=g, dtype=torch.float64) * extent
    sides = 2 + torch.rand(n, b, 2, generator=g, dtype=torch.float64) * 8
    angles = (torch.rand(n, b, 1, generator=g, dtype=torch.float64) - 0.5) * 3
    scores = torch.rand(n, c, b, generator=g, dtype=torch.float64)
    return torch.cat([centres, sides, angles], -1).to(dtype), scores.to(dtype)


def nms_rotated_model(dtype, **attrs):
    t = ONNX_TYPE[dtype]
    return mmdeploy_model("NMSRotated", [("boxes", t), ("scores", t)], [("indices", I64)], **attrs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,b,c,iou,score", [(2, 40, 3, 0.1, 0.05), (1, 60, 1, 0.5, 0.3), (3, 25, 4, 0.3, 0.0)])
def test_nms_rotated_matches_the_reference(dtype, n, b, c, iou, score):
    boxes, scores = detections(n, b, c, seed=b + c, dtype=dtype)
    got = run(nms_rotated_model(dtype, iou_threshold=iou, score_threshold=score), boxes, scores)
    assert got.dtype == torch.int64 and got.dim() == 2 and got.shape[1] == 3
    np.testing.assert_array_equal(got.numpy(), nms_rotated_reference(boxes, scores, iou, score))


def test_nms_rotated_edges():
    model = nms_rotated_model(torch.float32, iou_threshold=0.5, score_threshold=0.5)
    boxes, scores = detections(2, 10, 2, seed=1)
    # every score at or below the threshold: no rows, (0, 3)
    assert run(model, boxes, torch.full_like(scores, 0.5)).shape == (0, 3)
    # no boxes, no images
    assert run(model, torch.zeros(2, 0, 5), torch.zeros(2, 3, 0)).shape == (0, 3)
    assert run(model, torch.zeros(0, 4, 5), torch.zeros(0, 3, 4)).shape == (0, 3)
    # no boxes but a huge N x C: nothing is visited or allocated per (image, class) pair
    huge = np.zeros((1 << 40, 0, 5), np.float32), np.zeros((1 << 40, 1 << 10, 0), np.float32)
    out = session(model).run(None, {"boxes": huge[0], "scores": huge[1]})[0]
    assert out.shape == (0, 3) and out.dtype == np.int64
    # ties: equal scores keep the lower index first, repeatably
    same = torch.tensor([[[0.0, 0, 4, 4, 0], [20, 20, 4, 4, 0], [0.1, 0, 4, 4, 0], [40, 0, 4, 4, 0]]])
    got = run(model, same, torch.full((1, 1, 4), 0.9))
    assert got.tolist() == [[0, 0, 0], [0, 0, 1], [0, 0, 3]]
    # NaN scores are never above the threshold; a box whose score is not above it is never read
    scores = torch.tensor([[[0.9, float("nan"), 0.8, 0.1]]])
    hostile = same.clone()
    hostile[0, 3] = float("inf")
    assert run(model, hostile, scores).tolist() == [[0, 0, 0]]


def test_nms_rotated_extreme_scales():
    """float64 boxes whose products leave float64's range (sides 1e200 or 1e-200): opforge's core
    scales such pairs, so the rows are those of the boxes unscaled (and of the reference)."""
    boxes, scores = detections(2, 40, 3, seed=5, dtype=torch.float64)
    model = nms_rotated_model(torch.float64, iou_threshold=0.3, score_threshold=0.1)
    want = nms_rotated_reference(boxes, scores, 0.3, 0.1)
    assert len(want) > 20
    for scale in (1e200, 1e-200, 2.0 ** 700):
        scaled = boxes.clone()
        scaled[..., :4] *= scale
        np.testing.assert_array_equal(run(model, scaled, scores).numpy(), want, err_msg=str(scale))


def test_nms_rotated_hostile_values_and_nodes():
    model = nms_rotated_model(torch.float32, iou_threshold=0.5, score_threshold=0.1)
    boxes, scores = detections(1, 6, 2, seed=2)
    boxes[0, 4, 2] = float("nan")
    scores[0, 1, 4] = 0.9
    with pytest.raises(Exception, match=r"mmdeploy::NMSRotated: boxes\[0, 4\] has a non-finite w"):
        session(model).run(None, {"boxes": boxes.numpy(), "scores": scores.numpy()})
    sess = session(model)
    for b, s, match in [(torch.zeros(1, 6, 4), torch.zeros(1, 2, 6), r"boxes must be 3-D \(N, B, 5\)"),
                        (torch.zeros(1, 6, 5), torch.zeros(1, 2, 5), r"scores must be 3-D \(N, C, B\)"),
                        (torch.zeros(6, 5), torch.zeros(1, 2, 6), "boxes must be 3-D")]:
        with pytest.raises(Exception, match=match):
            sess.run(None, {"boxes": b.numpy(), "scores": s.numpy()})
    for attrs, match in [(dict(iou_threshold=1.5, score_threshold=0.1), r"iou_threshold must be in \[0, 1\]"),
                         (dict(iou_threshold=float("nan"), score_threshold=0.1), "iou_threshold must be in"),
                         (dict(iou_threshold=0.5, score_threshold=float("nan")), "score_threshold is NaN"),
                         (dict(iou_threshold=0.5), "needs the float attribute 'score_threshold'")]:
        with pytest.raises(Exception, match=match):
            session(nms_rotated_model(torch.float32, **attrs))


# ---- NMSMatch -----------------------------------------------------------------------------------


def nms_match_reference(boxes, scores, iou_threshold, score_threshold):
    """mmdeploy's NMSMatch from its definition, in plain Python: per image and class, boxes by
    decreasing score (ties by index); each unmatched box leads the later unmatched boxes with IoU >=
    iou_threshold, the IoU rounded to float32 as mmdeploy's kernel returns it; rows (image, class,
    leader, member) of groups whose leader scores above score_threshold."""
    b, s = boxes.double().tolist(), scores.double().tolist()
    rows = []
    for n in range(len(b)):
        for c in range(len(s[n])):
            order = sorted(range(len(b[n])), key=lambda i: (-s[n][c][i], i))
            matched = set()
            for pos, i in enumerate(order):
                if i in matched:
                    continue
                group = []
                for j in order[pos + 1:]:
                    if j in matched:
                        continue
                    x1, y1, x2, y2 = b[n][i]
                    u1, v1, u2, v2 = b[n][j]
                    inter = max(0.0, min(x2, u2) - max(x1, u1)) * max(0.0, min(y2, v2) - max(y1, v1))
                    union = (x2 - x1) * (y2 - y1) + (u2 - u1) * (v2 - v1) - inter
                    if float(np.float32(inter / (union + 1e-10))) >= iou_threshold:
                        matched.add(j)
                        group.append(j)
                if group and s[n][c][i] > score_threshold:
                    rows += [[n, c, i, j] for j in group]
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


def axis_aligned(n, b, c, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    corner = torch.rand(n, b, 2, generator=g, dtype=torch.float64) * 20
    boxes = torch.cat([corner, corner + 2 + torch.rand(n, b, 2, generator=g, dtype=torch.float64) * 6], -1)
    return boxes.to(dtype), torch.rand(n, c, b, generator=g, dtype=torch.float64).to(dtype)


def nms_match_model(dtype, threshold_dtype=torch.float32):
    t, u = ONNX_TYPE[dtype], ONNX_TYPE[threshold_dtype]
    return mmdeploy_model("NMSMatch", [("boxes", t), ("scores", t), ("iou_threshold", u), ("score_threshold", u)],
                          [("indices", I64)])


@pytest.mark.parametrize("dtype,threshold_dtype", [(torch.float32, torch.float32), (torch.float64, torch.float32),
                                                   (torch.float16, torch.float32), (torch.float16, torch.float16),
                                                   (torch.bfloat16, torch.bfloat16), (torch.float64, torch.float64)],
                         ids=str)
@pytest.mark.parametrize("n,b,c,iou,score", [(2, 30, 2, 0.3, 0.1), (1, 50, 3, 0.5, 0.5), (2, 12, 1, 0.0, -1.0)])
def test_nms_match_matches_the_reference(dtype, threshold_dtype, n, b, c, iou, score):
    boxes, scores = axis_aligned(n, b, c, seed=b, dtype=dtype)
    thresholds = [torch.tensor([v], dtype=threshold_dtype) for v in (iou, score)]
    got = run(nms_match_model(dtype, threshold_dtype), boxes, scores, *thresholds)
    assert got.dtype == torch.int64 and got.dim() == 2 and got.shape[1] == 4
    want = nms_match_reference(boxes, scores, thresholds[0].double().item(), thresholds[1].double().item())
    np.testing.assert_array_equal(got.numpy(), want)
    assert len(want) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_nms_match_rounds_the_iou_to_float_as_mmdeploy(dtype):
    """mmdeploy's kernel returns the IoU as float and compares it `>=` the threshold. By hand: box 1
    is the left half of box 0, IoU = 1 / (2 + 1 - 1 + 1e-10) = 0.5 - 2.5e-11, which is 0.5 in
    float32: it matches at threshold 0.5 (in float64 alone it did not), not at the next float32
    above. Box 3 covers 0.99999 of box 2's left half, IoU 0.499995: below 0.5 after rounding too."""
    model = nms_match_model(dtype)
    boxes = torch.tensor([[[0.0, 0.0, 2.0, 1.0], [0.0, 0.0, 1.0, 1.0], [10.0, 10.0, 12.0, 11.0],
                           [10.0, 10.0, 10.99999, 11.0]]], dtype=dtype)
    scores = torch.tensor([[[0.9, 0.8, 0.7, 0.6]]], dtype=dtype)
    above = float(np.nextafter(np.float32(0.5), np.float32(1)))
    for threshold, want in ((0.5, [[0, 0, 0, 1]]), (above, []), (0.4999, [[0, 0, 0, 1], [0, 0, 2, 3]])):
        thresholds = [torch.tensor([threshold], dtype=torch.float32), torch.tensor([0.1], dtype=torch.float32)]
        assert run(model, boxes, scores, *thresholds).tolist() == want, threshold
        assert nms_match_reference(boxes, scores, float(np.float32(threshold)), 0.1).tolist() == want, threshold


def test_nms_match_edges_and_hostile_values():
    model = nms_match_model(torch.float32)
    sess = session(model)
    thr = lambda *v: [np.array(v, np.float32) for v in v]  # noqa: E731
    boxes, scores = axis_aligned(1, 5, 1, seed=0)
    far = torch.tensor([[[0.0, 0, 1, 1], [10, 10, 11, 11], [20, 20, 21, 21]]])
    # no overlaps: no groups with members, (0, 4)
    assert sess.run(None, {"boxes": far.numpy(), "scores": np.full((1, 2, 3), 0.5, np.float32),
                           "iou_threshold": thr(0.5)[0], "score_threshold": thr(0.1)[0]})[0].shape == (0, 4)
    # ties: the lower index leads
    same = torch.tensor([[[0.0, 0, 4, 4], [0, 0, 4, 4], [0, 0, 4, 4]]])
    out = sess.run(None, {"boxes": same.numpy(), "scores": np.full((1, 1, 3), 0.5, np.float32),
                          "iou_threshold": thr(0.5)[0], "score_threshold": thr(0.1)[0]})[0]
    assert out.tolist() == [[0, 0, 0, 1], [0, 0, 0, 2]]
    bad = [({"scores": np.array([[[0.5, np.nan, 0.1, 0.2, 0.3]]], np.float32)}, r"scores\[0, 0, 1\] is NaN"),
           ({"boxes": np.array([[[0, 0, 1, np.inf]] * 5], np.float32)}, r"boxes\[0, 0\] has a non-finite y2"),
           ({"iou_threshold": np.array([0.5, 0.6], np.float32)}, r"iou_threshold must hold one value"),
           ({"iou_threshold": np.array([2.0], np.float32)}, r"iou_threshold must be in \[0, 1\]"),
           ({"score_threshold": np.array([np.nan], np.float32)}, "score_threshold is NaN"),
           ({"scores": np.zeros((1, 1, 4), np.float32)}, r"scores must be 3-D \(N, C, B\)")]
    for change, match in bad:
        feeds = {"boxes": boxes.numpy(), "scores": scores.numpy(), "iou_threshold": thr(0.5)[0],
                 "score_threshold": thr(0.1)[0], **change}
        with pytest.raises(Exception, match=match) as info:
            sess.run(None, feeds)
        assert "mmdeploy::NMSMatch" in str(info.value)
    huge = {"boxes": np.zeros((1, 0, 4), np.float32), "scores": np.zeros((1, 1 << 40, 0), np.float32),
            "iou_threshold": thr(0.5)[0], "score_threshold": thr(0.1)[0]}
    assert sess.run(None, huge)[0].shape == (0, 4)  # no boxes: no per-pair work however many classes
    with pytest.raises(Exception, match=r"NMSMatch: the node has 2 input\(s\); expected 4"):
        session(mmdeploy_model("NMSMatch", [("b", F32), ("s", F32)], [("o", I64)]))


# ---- the library among others -------------------------------------------------------------------


def test_ort_session_registers_the_library_for_both_domains():
    x, offset, mask, weight, bias = dcn_inputs()
    nodes = [helper.make_node("MMCVModulatedDeformConv2d", ["x", "off", "mask", "w", "b"], ["y"], domain=d,
                              stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=2, deform_groups=2)
             for d in ("mmdeploy",)]
    nodes.append(helper.make_node("MMCVModulatedDeformConv2d", ["y", "off", "mask", "w2"], ["z"], domain="mmcv",
                                  stride=1, padding=1, dilation=1, groups=1, deform_groups=2))
    nodes.append(helper.make_node("my_add", ["z", "z"], ["out"], domain="opforge"))
    inputs = [helper.make_tensor_value_info(n, F32, None) for n in ("x", "off", "mask", "w", "b", "w2")]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("out", F32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11), helper.make_opsetid("mmdeploy", 1),
                                                    helper.make_opsetid("mmcv", 1), helper.make_opsetid("opforge", 1)],
                              ir_version=8)
    w2 = torch.randn(3, 4, 3, 3)
    got = opforge.ort_session(model).run(None, dict(x=x.numpy(), off=offset.numpy(), mask=mask.numpy(),
                                                    w=weight.numpy(), b=bias.numpy(), w2=w2.numpy()))[0]
    y = torchvision_dcn(x, offset, mask, weight, bias, 1, 1, 1)
    z = torchvision.ops.deform_conv2d(y, offset.double(), w2.double(), padding=1, mask=mask.double())
    torch.testing.assert_close(torch.from_numpy(got).double(), 3 * z, rtol=1e-4, atol=1e-3)


def test_registering_twice_is_a_no_op_and_other_mmcv_ops_are_named():
    so = onnxruntime.SessionOptions()
    so.register_custom_ops_library(opforge.mmdeploy_library_path())
    so.register_custom_ops_library(opforge.mmdeploy_library_path())  # once per options; ORT would refuse twice
    model = dcn_model(torch.float32, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=2, deform_groups=2)
    onnxruntime.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    # mmcv's own exporter's other ops are not mmdeploy's: the error says what the library serves
    other = mmdeploy_model("MMCVRoiAlign", [("x", F32), ("r", F32)], [("y", F32)], domain="mmcv")
    with pytest.raises(opforge.MissingOrtKernels, match="MMCVRoiAlign: libopforge_mmdeploy.so serves mmdeploy 1.3.1's"):
        opforge.ort_session(other)


def test_the_library_needs_no_torch(tmp_path):
    """libopforge_mmdeploy.so links neither libtorch nor libonnxruntime."""
    from helpers import needed_libraries

    needed = needed_libraries(opforge.mmdeploy_library_path())
    assert not [n for n in needed if "torch" in n or "onnxruntime" in n or "c10" in n], needed


# ---- beside mmdeploy's own library (from the mmdeploy 1.3.1 wheel; it brings its own ORT 1.15) ------------------

MMDEPLOY_WHEEL_DIR = Path(__file__).resolve().parents[1] / "build" / "mmdeploy-wheel"
MMDEPLOY_LIBRARY = "libmmdeploy_onnxruntime_ops.so"


@pytest.fixture(scope="module")
def mmdeploy_own_library() -> Path:
    """mmdeploy 1.3.1's ORT library and its bundled libonnxruntime.so.1.15.1, unpacked from the wheel
    (downloaded once into build/mmdeploy-wheel)."""
    lib_dir = MMDEPLOY_WHEEL_DIR / "mmdeploy" / "lib"
    if not (lib_dir / MMDEPLOY_LIBRARY).is_file():
        MMDEPLOY_WHEEL_DIR.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                               "-d", str(MMDEPLOY_WHEEL_DIR), "mmdeploy==1.3.1"], capture_output=True, text=True,
                              timeout=600)
        if proc.returncode != 0:
            pytest.skip(f"the mmdeploy 1.3.1 wheel could not be downloaded (package index unreachable?): {proc.stderr}")
        (wheel,) = MMDEPLOY_WHEEL_DIR.glob("mmdeploy-1.3.1-*.whl")
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.startswith("mmdeploy/lib/") and "tensorrt" not in name:
                    z.extract(name, MMDEPLOY_WHEEL_DIR)
    return lib_dir / MMDEPLOY_LIBRARY


# Runs in a child: mmdeploy's library maps a second ONNX Runtime (its bundled 1.15.1) into the process.
_BESIDE = r"""
import json, sys
import numpy as np, onnx, onnxruntime as ort
import opforge
ours, theirs, model_path, feeds_path, order = sys.argv[1:6]
model = onnx.load(model_path)
feeds = dict(np.load(feeds_path))
report = {}
def session(libraries):
    so = ort.SessionOptions()
    for lib in libraries:
        so.register_custom_ops_library(lib)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
if order == "outputs":  # each library in its own session
    for name, lib in (("ours", ours), ("theirs", theirs)):
        report[name] = session([lib]).run(None, feeds)[0].tolist()
else:
    try:
        if order == "ort_session":  # theirs registered by the user, ours by opforge.ort_session
            so = ort.SessionOptions()
            so.register_custom_ops_library(theirs)
            opforge.ort_session(model, so)
        else:
            session([ours, theirs] if order == "ours_first" else [theirs, ours])
        report["error"] = None
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(report))
"""


def _beside(tmp_path, theirs, model, feeds, order):
    (tmp_path / "model.onnx").write_bytes(model.SerializeToString())
    np.savez(tmp_path / "feeds.npz", **{k: v.numpy() for k, v in feeds.items()})
    proc = subprocess.run([sys.executable, "-c", _BESIDE, opforge.mmdeploy_library_path(), str(theirs),
                           str(tmp_path / "model.onnx"), str(tmp_path / "feeds.npz"), order],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, f"the child crashed or failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _dcn_case(groups, dg, c):
    x, offset, mask, weight, bias = dcn_inputs(c=c, o=2 * groups, groups=groups, dg=dg, seed=7)
    model = dcn_model(torch.float32, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=groups, deform_groups=dg)
    feeds = dict(input=x, offset=offset, mask=mask, weight=weight, bias=bias)
    return model, feeds, torchvision_dcn(x, offset, mask, weight, bias, 1, 1, 1)


@pytest.mark.parametrize("order", ["ours_first", "theirs_first", "ort_session"])
def test_mmdeploy_own_library_in_the_same_options_is_a_clear_error(tmp_path, mmdeploy_own_library, order):
    model, feeds, _ = _dcn_case(1, 1, 8)
    report = _beside(tmp_path, mmdeploy_own_library, model, feeds, order)
    assert "Domain already set in registry" in report["error"]
    if order == "ort_session":
        assert report["error"].startswith("ConflictingOrtLibraries") and "register only one of the two" in report["error"]


@pytest.mark.parametrize("groups,dg,c,mmdeploy_right", [
    (1, 1, 8, True),    # (C/groups)*9 = 72, a multiple of 8: mmdeploy's kernel is right
    (2, 2, 16, False),  # groups > 1 with deform_groups > 1: mmdeploy splits each group's channels among the deform groups
    (1, 1, 6, False),   # (C/groups)*9 = 54, not a multiple of 8: mmdeploy's unrolled GEMM reads past its buffers
])
def test_mmdeploy_dcn_defects_against_torchvision(tmp_path, mmdeploy_own_library, groups, dg, c, mmdeploy_right):
    model, feeds, want = _dcn_case(groups, dg, c)
    report = _beside(tmp_path, mmdeploy_own_library, model, feeds, "outputs")
    ours, theirs = (torch.tensor(report[k], dtype=torch.float64) for k in ("ours", "theirs"))
    torch.testing.assert_close(ours, want, rtol=1e-4, atol=1e-4)
    theirs_error = (theirs - want).abs().max().item()
    assert (theirs_error < 1e-3) == mmdeploy_right, theirs_error


def test_int_attributes_crash_mmdeploy_own_library_but_not_ours(tmp_path, mmdeploy_own_library):
    """mmdeploy writes INT stride/padding/dilation for mmcv.ops.modulated_deform_conv2d called with plain ints; its
    library reads them as INTS and crashes creating the session. Ours computes torchvision's result."""
    x, offset, mask, weight, bias = dcn_inputs(groups=1, dg=1, c=4)
    model = dcn_model(torch.float32, stride=1, padding=1, dilation=1, groups=1, deform_groups=1)
    (tmp_path / "model.onnx").write_bytes(model.SerializeToString())
    child = ("import sys, onnxruntime as ort\nso = ort.SessionOptions()\nso.register_custom_ops_library(sys.argv[1])\n"
             "ort.InferenceSession(sys.argv[2], so, providers=['CPUExecutionProvider'])\nprint('created')")
    proc = subprocess.run([sys.executable, "-c", child, str(mmdeploy_own_library), str(tmp_path / "model.onnx")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode < 0 and "created" not in proc.stdout, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    got = run(model, x, offset, mask, weight, bias)
    torch.testing.assert_close(got.double(), torchvision_dcn(x, offset, mask, weight, bias, 1, 1, 1), rtol=1e-4,
                               atol=1e-4)
