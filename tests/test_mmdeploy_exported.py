"""libopforge_mmdeploy.so on files that mmdeploy 1.3.1 itself exported (issue #40, item 4).

tests/data/mmdeploy/ holds genuine mmdeploy exports of grid_sampler, MMCVModulatedDeformConv2d
(domains mmdeploy and mmcv), NMSRotated, MMCVRoIAlignRotated and NMSMatch, with input cases and
the outputs of mmdeploy's own ``libmmdeploy_onnxruntime_ops.so`` (manifest.json says how each was
made; tests/mmdeploy_export/export_cases.py made them, in a torch 2.0.1 + mmdeploy venv). Each
case runs here in plain ONNX Runtime with ``opforge.mmdeploy_library_path()`` registered and is
compared with a reference computed independently in this process: torch's grid_sample,
torchvision's deform_conv2d, opforge.roi_align_rotated, opforge.nms_rotated per (batch, class),
and a numpy NMSMatch that follows mmdeploy's kernel. Attributes and thresholds are read from the
file's node, not from the manifest.

The quick tier needs only the committed files. The slow test re-creates the mmdeploy venv
(build/mmdeploy-venv, reused by its stamp) and re-exports everything, checking the node forms.
"""

import functools
import importlib.util
import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper

import opforge

from helpers import cached_venv

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "mmdeploy"
GENERATOR = REPO / "tests" / "mmdeploy_export" / "export_cases.py"
MANIFEST = json.loads((DATA / "manifest.json").read_text())
FILES = MANIFEST["files"]
CASES = [pytest.param(f, c, id=f"{f[:-5]}-{c}") for f, e in FILES.items() for c in e["cases"]]

# Cases where mmdeploy's own library is wrong (max |error| vs torchvision > 1e-2) or crashes: its
# MMCVModulatedDeformConv2d with groups > 1 and deform_groups > 1, with (C_in/groups)*kh*kw not a
# multiple of 8, and with the INT attributes mmcv.ops.modulated_deform_conv2d writes for plain ints
# (a segfault). Ours must get all of them right. (test_mmdeploy_own_results_are_as_recorded keeps
# this list honest.)
MMDEPLOY_WRONG = {
    "dcn_groups2_deform_groups2.onnx": ["random", "partly_outside"],  # with zero offsets: right
    "mmcv_domain_dcn_groups2_deform_groups2.onnx": ["random", "partly_outside"],
    "dcn_groups2_deform_groups1.onnx": ["random", "zero_offset_unit_mask", "partly_outside"],
    "dcn_k_not_multiple_of_8.onnx": ["random", "zero_offset_unit_mask", "partly_outside"],
    "dcn_int_attrs.onnx": ["random", "zero_offset_unit_mask", "partly_outside"],
}
DEFECT_CASES = [pytest.param(f, c, id=f"{f[:-5]}-{c}") for f, cases in MMDEPLOY_WRONG.items() for c in cases]


# ---- the files -------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _model(fname: str) -> onnx.ModelProto:
    return onnx.load(str(DATA / fname))


@functools.lru_cache(maxsize=None)
def _npz(fname: str) -> dict:
    with np.load(DATA / fname.replace(".onnx", ".npz")) as z:
        return dict(z.items())


def _node(fname: str) -> onnx.NodeProto:
    (node,) = [n for n in _model(fname).graph.node if n.op_type == FILES[fname]["op"]]
    return node


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _value(fname: str, name: str) -> np.ndarray:
    """An initializer or a Constant node's value."""
    graph = _model(fname).graph
    for init in graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init).copy()
    for n in graph.node:
        if n.op_type == "Constant" and n.output[0] == name:
            return numpy_helper.to_array(n.attribute[0].t).copy()
    raise KeyError(name)


def _feeds(fname: str, case: str) -> dict:
    z = _npz(fname)
    return {i.name: z[f"{case}__{i.name}"] for i in _model(fname).graph.input}


def _pair(v):
    return (int(v[0]), int(v[1])) if isinstance(v, (list, tuple)) else (int(v), int(v))


def _scores_ncb(fname: str, feeds: dict) -> np.ndarray:
    """The NMS node's scores input: graph input 'scores' (N, B, C) through mmdeploy's Transpose."""
    node = _node(fname)
    (transpose,) = [n for n in _model(fname).graph.node if node.input[1] in n.output]
    assert transpose.op_type == "Transpose" and list(transpose.input) == ["scores"]
    assert list(_attrs(transpose)["perm"]) == [0, 2, 1]
    return np.ascontiguousarray(feeds["scores"].transpose(0, 2, 1))


# ---- independent references --------------------------------------------------------------------------

def ref_grid_sampler(fname, feeds):
    a = _attrs(_node(fname))
    x, grid = (torch.from_numpy(feeds[k]).double() for k in ("input", "grid"))
    return F.grid_sample(x, grid, mode=("bilinear", "nearest", "bicubic")[a["interpolation_mode"]],
                         padding_mode=("zeros", "border", "reflection")[a["padding_mode"]],
                         align_corners=bool(a["align_corners"])).numpy()


def ref_modulated_deform_conv(fname, feeds):
    import torchvision
    node = _node(fname)
    a = _attrs(node)
    x, offset, mask = (torch.from_numpy(feeds[node.input[i]]).double() for i in range(3))
    weight = torch.from_numpy(_value(fname, node.input[3])).double()
    bias = torch.from_numpy(_value(fname, node.input[4])).double() if len(node.input) > 4 and node.input[4] else None
    # torchvision takes groups and deform_groups from the shapes: check they are the node's
    assert x.shape[1] // weight.shape[1] == a["groups"]
    assert offset.shape[1] // (2 * weight.shape[2] * weight.shape[3]) == a["deform_groups"]
    return torchvision.ops.deform_conv2d(x, offset, weight, bias, stride=_pair(a["stride"]),
                                         padding=_pair(a["padding"]), dilation=_pair(a["dilation"]),
                                         mask=mask).numpy()


def ref_roi_align_rotated(fname, feeds):
    a = _attrs(_node(fname))
    x, rois = (torch.from_numpy(feeds[k]).double() for k in ("input", "rois"))
    return opforge.roi_align_rotated(x, rois, (a["output_height"], a["output_width"]), a["spatial_scale"],
                                     a["sampling_ratio"], bool(a["aligned"]), bool(a["clockwise"])).numpy()


def ref_nms_rotated(fname, feeds):
    """Per (batch, class): scores > score_threshold, then opforge.nms_rotated on those; rows
    (batch, class, box index) in score order."""
    a = _attrs(_node(fname))
    boxes, scores = feeds["boxes"], _scores_ncb(fname, feeds)
    score_thr = np.float32(a["score_threshold"])
    rows = []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            (idx,) = np.nonzero(scores[b, c] > score_thr)
            if len(idx) == 0:
                continue
            keep = opforge.nms_rotated(torch.from_numpy(boxes[b, idx]), torch.from_numpy(scores[b, c, idx]),
                                       float(a["iou_threshold"])).numpy()
            rows += [(b, c, int(idx[k])) for k in keep]
    return np.array(rows, np.int64).reshape(-1, 3)


def ref_nms_match(fname, feeds):
    """mmdeploy's NMSMatch kernel: per (batch, class), boxes by decreasing score (stable); each
    unsuppressed box i suppresses every later unsuppressed j with IoU(i, j) >= iou_threshold
    (axis-aligned, no +1) and groups it under i; rows (b, c, i, j) for the groups of boxes with
    score > score_threshold."""
    node = _node(fname)
    iou_thr = float(_value(fname, node.input[2]).reshape(-1)[0])
    score_thr = _value(fname, node.input[3]).reshape(-1)[0]
    boxes, scores = feeds["boxes"].astype(np.float64), _scores_ncb(fname, feeds)
    rows = []
    for b in range(scores.shape[0]):
        x1, y1, x2, y2 = boxes[b].T
        area = (x2 - x1) * (y2 - y1)
        for c in range(scores.shape[1]):
            order = np.argsort(-scores[b, c], kind="stable")
            alive = np.ones(len(order), bool)
            for p, i in enumerate(order):
                if not alive[i]:
                    continue
                for j in order[p + 1:]:
                    if not alive[j]:
                        continue
                    iw = max(0.0, min(x2[i], x2[j]) - max(x1[i], x1[j]))
                    ih = max(0.0, min(y2[i], y2[j]) - max(y1[i], y1[j]))
                    inter = iw * ih
                    if inter / (area[i] + area[j] - inter) >= iou_thr:
                        alive[j] = False
                        if scores[b, c, i] > score_thr:
                            rows.append((b, c, int(i), int(j)))
    return np.array(rows, np.int64).reshape(-1, 4)


REFERENCES = {"grid_sampler": ref_grid_sampler, "MMCVModulatedDeformConv2d": ref_modulated_deform_conv,
              "MMCVRoIAlignRotated": ref_roi_align_rotated, "NMSRotated": ref_nms_rotated,
              "NMSMatch": ref_nms_match}


def _tolerance(fname: str) -> float:
    e = FILES[fname]
    if _model(fname).graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16:
        return 2e-2
    if e["op"] == "grid_sampler" and _attrs(_node(fname))["interpolation_mode"] == 2:
        return 5e-4  # bicubic: 16 taps of cubic weights
    return 1e-4


def _reference(fname: str, case: str) -> np.ndarray:
    return REFERENCES[FILES[fname]["op"]](fname, _feeds(fname, case))


def _assert_matches(fname, case, got, expected, what="opforge"):
    if expected.dtype == np.int64:
        assert got.dtype == np.int64, f"{fname} [{case}]: {what} gives {got.dtype}, mmdeploy's node gives int64"
        np.testing.assert_array_equal(got, expected, err_msg=f"{fname} [{case}] ({what})")
        return
    tol = _tolerance(fname)
    assert got.dtype == _feeds(fname, case)[_model(fname).graph.input[0].name].dtype
    assert got.shape == expected.shape, f"{fname} [{case}] ({what}): shape {got.shape}, expected {expected.shape}"
    err = float(np.max(np.abs(got.astype(np.float64) - expected), initial=0.0)) if got.size else 0.0
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=tol, atol=tol,
                               err_msg=f"{fname} [{case}] ({what}): max abs error {err:.3g}")


# ---- sessions with our library -------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _session(fname: str) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.register_custom_ops_library(opforge.mmdeploy_library_path())
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(DATA / fname), so, providers=["CPUExecutionProvider"])


def _run(sess, fname, case) -> dict:
    outs = sess.run(None, _feeds(fname, case))
    return {o.name: v for o, v in zip(sess.get_outputs(), outs)}


def _check_nms_postprocessing(fname, case, outs, index):
    """The rest of mmdeploy's graph (its select_rnms_index / _select_nms_index in standard ops) on
    our node's output: per batch image, the rows with a score are the kept boxes, by score."""
    feeds = _feeds(fname, case)
    boxes, scores = feeds["boxes"], _scores_ncb(fname, feeds)
    dets, labels = outs["dets"], outs["labels"]
    assert dets.shape[:2] == labels.shape and dets.shape[1] == len(index) + 1
    for n in range(boxes.shape[0]):
        mine = index[index[:, 0] == n]
        expected = np.concatenate([mine[:, 1:2].astype(np.float64), boxes[n, mine[:, 2]],
                                   scores[n, mine[:, 1], mine[:, 2]][:, None]], 1)
        has = dets[n, :, -1] > 0
        got = np.concatenate([labels[n, has][:, None].astype(np.float64), dets[n, has]], 1)
        assert np.all(np.diff(dets[n, :, -1]) <= 0), f"{fname} [{case}]: dets of image {n} not sorted by score"
        key = lambda rows: rows[np.lexsort(rows.T[::-1])]  # noqa: E731
        np.testing.assert_allclose(key(got), key(expected), rtol=0, atol=0, err_msg=f"{fname} [{case}] image {n}")


# ---- the tests -------------------------------------------------------------------------------------------

def test_manifest_describes_the_committed_files():
    total = 0
    for fname, entry in FILES.items():
        node = _node(fname)
        assert (node.domain, node.op_type) == (entry["domain"], entry["op_type"]), fname
        attrs = {a.name: onnx.AttributeProto.AttributeType.Name(a.type) for a in node.attribute}
        assert attrs == {k: v["type"] for k, v in entry["node"]["attrs"].items()}, fname
        assert len(node.input) == len(entry["node"]["inputs"]) and len(node.output) == 1, fname
        z = _npz(fname)
        for case in entry["cases"]:
            assert all(f"{case}__{i.name}" in z for i in _model(fname).graph.input), (fname, case)
        total += (DATA / fname).stat().st_size + (DATA / fname.replace(".onnx", ".npz")).stat().st_size
    assert total < 2 * 2 ** 20, f"tests/data/mmdeploy holds {total} bytes"
    ops = {e["op"] for e in FILES.values()}
    assert ops == set(REFERENCES)
    assert {e["domain"] for e in FILES.values() if e["op"] == "MMCVModulatedDeformConv2d"} == {"mmdeploy", "mmcv"}


@pytest.mark.parametrize("fname, case", CASES)
def test_opforge_library_matches_the_reference(fname, case):
    outs = _run(_session(fname), fname, case)
    entry = FILES[fname]
    got = outs[entry["node_output"]]
    _assert_matches(fname, case, got, _reference(fname, case))
    if entry["op"] in ("NMSRotated", "NMSMatch"):
        _check_nms_postprocessing(fname, case, outs, got)


@pytest.mark.parametrize("fname, case", DEFECT_CASES)
def test_where_mmdeploy_is_wrong_opforge_matches_torchvision(fname, case):
    """mmdeploy's own library is wrong or crashes on these DCN files; ours matches torchvision."""
    entry = FILES[fname]
    status = entry["mmdeploy_case_status"][case]
    expected = _reference(fname, case)
    if status == "ok":
        theirs = _npz(fname)[f"mmdeploy_out_{case}"]
        err = np.nanmax(np.abs(theirs - expected)) if not np.isnan(theirs).all() else np.inf
        assert np.isnan(theirs).any() or err > 1e-2, f"mmdeploy's output for {fname} [{case}] is right ({err:.3g})"
    else:
        assert status == "segfault", status
    _assert_matches(fname, case, _run(_session(fname), fname, case)["output"], expected)


def test_mmdeploy_own_results_are_as_recorded():
    """The stored outputs of mmdeploy's library: right (within 1e-3, exact indices) everywhere but
    in MMDEPLOY_WRONG, where they are off by more than 1e-2 or the process crashed."""
    wrong, report = {}, []
    for fname, entry in FILES.items():
        for case in entry["cases"]:
            status = entry["mmdeploy_case_status"][case]
            if status != "ok":
                wrong.setdefault(fname, []).append(case)
                report.append(f"{fname} [{case}]: {status}")
                continue
            theirs, expected = _npz(fname)[f"mmdeploy_out_{case}"], _reference(fname, case)
            if expected.dtype == np.int64:
                if theirs.shape != expected.shape or not np.array_equal(theirs, expected):
                    wrong.setdefault(fname, []).append(case)
                    report.append(f"{fname} [{case}]: indices differ")
                continue
            tol = max(1e-3, _tolerance(fname))
            err = np.inf if np.isnan(theirs).any() else float(np.max(np.abs(theirs - expected), initial=0.0))
            if theirs.shape != expected.shape or err > tol:
                wrong.setdefault(fname, []).append(case)
                report.append(f"{fname} [{case}]: max abs error {err:.3g}")
    assert wrong == MMDEPLOY_WRONG, "\n".join(report)


def test_ort_session_registers_the_mmdeploy_library_by_itself():
    for fname in ("dcn_bias.onnx", "mmcv_domain_dcn_bias.onnx", "grid_sampler_bilinear_zeros_ac0.onnx",
                  "nms_rotated_iou0.5_score0.3.onnx", "roi_align_rotated_2x2_scale1.0_ratio0_aligned0_clockwise1.onnx",
                  "nms_match_iou0.3_score0.4.onnx"):
        case = FILES[fname]["cases"][0]
        sess = opforge.ort_session(str(DATA / fname))
        _assert_matches(fname, case, _run(sess, fname, case)[FILES[fname]["node_output"]], _reference(fname, case),
                        what="opforge.ort_session")


# ---- regenerating the files with mmdeploy (slow: a venv with torch 2.0.1 and mmdeploy) -------------------

VENV = REPO / "build" / "mmdeploy-venv"


def _generator_requirements() -> list:
    spec = importlib.util.spec_from_file_location("mmdeploy_export_cases", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # stdlib imports only at module level
    return list(module.REQUIREMENTS)


def mmdeploy_venv() -> Path:
    """The python of build/mmdeploy-venv/venv: python3.11 with the generator's REQUIREMENTS."""
    return Path(cached_venv(VENV, _generator_requirements(), what="mmdeploy"))


def _node_forms(path: Path) -> list:
    model = onnx.load(str(path))
    return [(n.domain, n.op_type, len(n.input), len(n.output),
             sorted((a.name, a.type, repr(helper.get_attribute_value(a))) for a in n.attribute
                    if n.op_type != "Constant"))
            for n in model.graph.node]


@pytest.mark.slow
def test_regenerated_exports_have_the_committed_node_forms(tmp_path):
    python = mmdeploy_venv()
    proc = subprocess.run([str(python), str(GENERATOR), "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=1200, cwd=REPO)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    fresh = json.loads((tmp_path / "manifest.json").read_text())
    assert list(fresh["files"]) == list(FILES)
    for fname, entry in FILES.items():
        assert _node_forms(tmp_path / fname) == _node_forms(DATA / fname), fname
        new = fresh["files"][fname]
        assert (new["domain"], new["op_type"], new["node"]["attrs"]) == (entry["domain"], entry["op_type"],
                                                                         entry["node"]["attrs"]), fname
        assert new["cases"] == entry["cases"], fname
        assert new["mmdeploy_case_status"] == entry["mmdeploy_case_status"], fname
