"""opforge::nms_rotated and opforge::batched_nms_rotated against independent references: mmcv's
hard-coded case (and its mirror image), torchvision's nms / batched_nms on axis-aligned boxes, the
spec's greedy numpy reference (its own polygon construction) on random rotated boxes with tied
scores and duplicates, in every dtype; IoU invariances (half turns, quarter turns with w and h
swapped, mirror images) seen through the kept indices; check_op's round trips (opcheck,
references, both exporters, ORT, bad samples); exported models at other box counts; idxs at the
ends of int64 (exact) and float idxs no int64 holds (refused); boxes at extreme scales (1e-300 ..
1e300, float64's products out of range) keeping what the same boxes at 1 keep; and hostile boxes,
scores, labels and thresholds, which torch and ONNX Runtime refuse alike."""

import functools
import importlib
import math
import warnings

import numpy as np
import onnxruntime
import pytest
import torch
import torchvision

import opforge
from opforge.ops.nms_rotated import BATCHED_NMS_ROTATED, NMS_ROTATED, _greedy, _iou
from opforge.symbolics.onnx_schema import NodeTypeError
from opforge.testing import BadSample, Sample, op_tests, single_node_model

from helpers import run_in_ort

OP = "opforge::nms_rotated"
BOP = "opforge::batched_nms_rotated"
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def reference(boxes, scores, iou_threshold, labels=None):
    """The spec's greedy reference on the values as the kernel sees them (16-bit ones widened)."""
    keep = _greedy(boxes.double().numpy(), scores.double().numpy(), None if labels is None else labels.numpy(),
                   iou_threshold)
    return torch.from_numpy(keep)


def assert_keep(got, want):
    assert got.dtype == torch.int64 and got.dim() == 1, (got.dtype, got.shape)
    assert got.tolist() == torch.as_tensor(want).tolist()


def random_boxes(n, seed=0, extent=40.0, size=(1.0, 11.0), dtype=torch.float64, angles=True, near_copies=0):
    """(boxes, scores): centres in [0, extent)^2, sides in [size), angles in (-pi, pi); the last
    ``near_copies`` of the n boxes are slightly moved, resized and turned copies of earlier ones
    (IoUs of about 0.75 to 1, for high thresholds)."""
    g = torch.Generator().manual_seed(seed)
    u = lambda *s: torch.rand(*s, generator=g, dtype=torch.float64)  # noqa: E731
    centres = u(n, 2) * extent
    sides = u(n, 2) * (size[1] - size[0]) + size[0]
    angle = (u(n, 1) - 0.5) * 2 * math.pi if angles else torch.zeros(n, 1, dtype=torch.float64)
    boxes = torch.cat([centres, sides, angle], 1)
    if near_copies:
        first = n - near_copies
        src = boxes[torch.randint(0, first, (near_copies,), generator=g)]
        jitter = (u(near_copies, 5) - 0.5) * torch.tensor([0.3, 0.3, 0.1, 0.1, 0.06 if angles else 0.0],
                                                           dtype=torch.float64)
        jitter[:, 2:4] = src[:, 2:4] * jitter[:, 2:4]  # sides by up to 5%
        boxes[first:] = src + jitter
    return boxes.to(dtype), u(n).to(dtype)


def iou_matrix(boxes):
    """Every pair's IoU by the reference's polygon construction (upper triangle)."""
    b = boxes.double().numpy()
    return np.array([_iou(b[i], b[j]) for i in range(len(b)) for j in range(i + 1, len(b))])


def away_from(ious, threshold, margin=1e-6):
    """A threshold near ``threshold`` no IoU is within ``margin`` of: the greedy result then does
    not depend on how an implementation rounds the IoU."""
    ious = np.asarray(ious, dtype=np.float64).ravel()
    for step in range(1000):
        t = float(np.float32(threshold + step * 1e-4))
        if ious.size == 0 or np.abs(ious - t).min() > margin:
            return t
    raise AssertionError("no threshold away from the IoUs")


# ---- mmcv's hard-coded case ---------------------------------------------------------------------

# the boxes and scores of mmcv's tests/test_ops/test_nms_rotated.py (angles: mmcv's clockwise=True,
# opforge's only convention)
MMCV_BOXES = [[6.0, 3.0, 8.0, 7.0, 0.5], [3.0, 6.0, 9.0, 11.0, 0.6], [3.0, 7.0, 10.0, 12.0, 0.3],
              [1.0, 4.0, 13.0, 7.0, 0.6]]
MMCV_SCORES = [0.7, 0.8, 0.5, 0.9]
MMCV_LABELS = [1, 0, 1, 0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mmcv_case(dtype):
    boxes, scores = torch.tensor(MMCV_BOXES, dtype=dtype), torch.tensor(MMCV_SCORES, dtype=dtype)
    keep = opforge.nms_rotated(boxes, scores, 0.5)
    assert_keep(keep, [3, 1, 0])
    # mmcv's dets: the kept boxes with their scores
    dets = torch.cat([boxes[keep], scores[keep, None]], 1).float()
    torch.testing.assert_close(dets, torch.tensor([[1.0, 4.0, 13.0, 7.0, 0.6, 0.9], [3.0, 6.0, 9.0, 11.0, 0.6, 0.8],
                                                   [6.0, 3.0, 8.0, 7.0, 0.5, 0.7]]).to(dtype).float())
    assert_keep(run_in_ort(NMS_ROTATED, (boxes, scores, 0.5)), [3, 1, 0])
    # mmcv negates the angles and passes clockwise=False; opforge has one convention, and the
    # geometric statement is that a mirror image (y -> -y, so angle -> -angle) keeps the same boxes
    mirrored = boxes.clone()
    mirrored[:, 1] = -mirrored[:, 1]
    mirrored[:, 4] = -mirrored[:, 4]
    assert_keep(opforge.nms_rotated(mirrored, scores, 0.5), [3, 1, 0])
    # per label: box 2 (label 1) only meets box 0 (IoU 0.26) and stays
    labels = torch.tensor(MMCV_LABELS)
    assert_keep(opforge.batched_nms_rotated(boxes, scores, labels, 0.5), [3, 1, 0, 2])
    assert_keep(opforge.batched_nms_rotated(mirrored, scores, labels, 0.5), [3, 1, 0, 2])
    assert_keep(run_in_ort(BATCHED_NMS_ROTATED, (boxes, scores, labels, 0.5)), [3, 1, 0, 2])
    # mmcv's labels are floats: integer-valued ones are accepted
    assert_keep(opforge.batched_nms_rotated(boxes, scores, labels.float(), 0.5), [3, 1, 0, 2])
    assert_keep(opforge.batched_nms_rotated(boxes, scores, labels.to(dtype), 0.5), [3, 1, 0, 2])
    # one label for all: class-agnostic
    assert_keep(opforge.batched_nms_rotated(boxes, scores, torch.zeros(4, dtype=torch.int64), 0.5), [3, 1, 0])


def test_mmcv_case_iou_and_thresholds():
    """The pairwise IoUs of mmcv's boxes, and the keep sets they imply at thresholds between them."""
    boxes, scores = torch.tensor(MMCV_BOXES, dtype=torch.float64), torch.tensor(MMCV_SCORES, dtype=torch.float64)
    ious = iou_matrix(boxes)  # pairs (0,1) (0,2) (0,3) (1,2) (1,3) (2,3)
    np.testing.assert_allclose(ious, [0.313, 0.2566, 0.186, 0.7172, 0.4344, 0.4068], atol=1e-4)
    for threshold, want in ((0.8, [3, 1, 0, 2]), (0.5, [3, 1, 0]), (0.42, [3, 0, 2]), (0.3, [3, 0]),
                            (0.2, [3, 0]), (0.1, [3]), (0.0, [3])):
        assert_keep(opforge.nms_rotated(boxes, scores, threshold), want)
        assert_keep(reference(boxes, scores, threshold), want)


# ---- torchvision at angle 0 ----------------------------------------------------------------------


def _xyxy(boxes):
    cx, cy, w, h = boxes[:, :4].unbind(1)
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("threshold", [0.05, 0.3, 0.5, 0.7, 0.9])
def test_angle_zero_is_torchvision_nms(threshold, dtype):
    boxes, scores = random_boxes(200, seed=int(threshold * 100), extent=60.0, dtype=dtype, angles=False,
                                 near_copies=50)
    xyxy = _xyxy(boxes.double())
    threshold = away_from(torchvision.ops.box_iou(xyxy, xyxy).numpy(), threshold)
    want = torchvision.ops.nms(xyxy, scores.double(), threshold)
    assert 10 < len(want) < 200
    assert_keep(opforge.nms_rotated(boxes, scores, threshold), want)
    assert_keep(run_in_ort(NMS_ROTATED, (boxes, scores, threshold)), want)
    labels = torch.randint(-2, 3, (200,), generator=torch.Generator().manual_seed(1))
    want = torchvision.ops.batched_nms(xyxy, scores.double(), labels, threshold)
    assert_keep(opforge.batched_nms_rotated(boxes, scores, labels, threshold), want)
    assert_keep(run_in_ort(BATCHED_NMS_ROTATED, (boxes, scores, labels, threshold)), want)


def test_3000_axis_aligned_boxes_are_torchvision_nms():
    boxes, scores = random_boxes(3000, seed=5, extent=300.0, size=(2.0, 20.0), angles=False)
    xyxy = _xyxy(boxes)
    threshold = away_from(torchvision.ops.box_iou(xyxy, xyxy).numpy(), 0.4)
    want = torchvision.ops.nms(xyxy, scores, threshold)
    assert 1000 < len(want) < 2900
    assert_keep(opforge.nms_rotated(boxes, scores, threshold), want)
    assert_keep(run_in_ort(NMS_ROTATED, (boxes, scores, threshold)), want)


# ---- rotated boxes: the greedy reference, invariances --------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("threshold", [0.1, 0.5, 0.9])
def test_rotated_boxes_match_the_reference(threshold, dtype):
    boxes, scores = random_boxes(60, seed=int(threshold * 10), extent=25.0, dtype=dtype, near_copies=20)
    threshold = away_from(iou_matrix(boxes), threshold)
    want = reference(boxes, scores, threshold)
    assert 3 < len(want) < 60
    assert_keep(opforge.nms_rotated(boxes, scores, threshold), want)
    assert_keep(run_in_ort(NMS_ROTATED, (boxes, scores, threshold)), want)
    labels = torch.arange(60) % 3
    want = reference(boxes, scores, threshold, labels)
    assert_keep(opforge.batched_nms_rotated(boxes, scores, labels, threshold), want)
    assert_keep(run_in_ort(BATCHED_NMS_ROTATED, (boxes, scores, labels, threshold)), want)


def _ties_and_duplicates(n, seed):
    """Boxes where a third are exact copies of others, scores on a coarse grid (many ties), and
    copies placed both before and after their originals."""
    boxes, _ = random_boxes(n, seed=seed, extent=30.0)
    g = torch.Generator().manual_seed(seed)
    copies = torch.randint(0, n, (n // 3,), generator=g)
    boxes = torch.cat([boxes, boxes[copies]])
    perm = torch.randperm(len(boxes), generator=g)
    boxes = boxes[perm]
    scores = torch.randint(0, 6, (len(boxes),), generator=g).double() / 5
    return boxes, scores


@pytest.mark.parametrize("n,seed", [(45, 0), pytest.param(300, 1, marks=pytest.mark.slow)])
def test_ties_and_duplicates_match_the_reference(n, seed, monkeypatch):
    # the four reference runs below ask for mostly the same pairs (in the same order: score, then
    # index): each pair's IoU is computed once (n=300: 9.9 s of reference runs without this)
    nms_rotated = importlib.import_module("opforge.ops.nms_rotated")  # (the package's name is the op's function)
    exact = nms_rotated._iou
    iou = functools.lru_cache(maxsize=None)(lambda a, b: exact(np.array(a), np.array(b)))
    monkeypatch.setattr(nms_rotated, "_iou", lambda a, b: iou(tuple(a.tolist()), tuple(b.tolist())))
    boxes, scores = _ties_and_duplicates(n, seed)
    labels = torch.randint(0, 2, (len(boxes),), generator=torch.Generator().manual_seed(seed))
    for threshold in (0.25, 0.6):
        got = opforge.nms_rotated(boxes, scores, threshold)
        assert_keep(got, reference(boxes, scores, threshold))
        # sorted by decreasing score, equal scores by increasing index
        kept_scores = scores[got]
        assert bool((kept_scores[:-1] >= kept_scores[1:]).all())
        ties = kept_scores[:-1] == kept_scores[1:]
        assert bool((got[:-1][ties] < got[1:][ties]).all())
        assert_keep(opforge.batched_nms_rotated(boxes, scores, labels, threshold),
                    reference(boxes, scores, threshold, labels))


def test_stable_order_and_exact_duplicates():
    box = [5.0, 5.0, 4.0, 2.0, 0.7]
    boxes = torch.tensor([box] * 5, dtype=torch.float64)
    # equal scores: the lowest index is kept and suppresses its copies (IoU 1 > threshold)
    assert_keep(opforge.nms_rotated(boxes, torch.full((5,), 0.5, dtype=torch.float64), 0.5), [0])
    assert_keep(opforge.nms_rotated(boxes, torch.tensor([0.1, 0.9, 0.9, 0.3, 0.9], dtype=torch.float64), 0.99), [1])
    # IoU 1 is not > 1: at threshold 1 nothing is ever suppressed, copies included
    assert_keep(opforge.nms_rotated(boxes, torch.tensor([0.1, 0.9, 0.9, 0.3, 0.9], dtype=torch.float64), 1.0),
                [1, 2, 4, 3, 0])
    # disjoint boxes with equal scores: all kept, in index order
    far = torch.tensor([[10.0 * i, 0, 3, 3, 0.1 * i] for i in range(7)], dtype=torch.float64)
    assert_keep(opforge.nms_rotated(far, torch.zeros(7, dtype=torch.float64), 0.0), list(range(7)))
    # threshold 0: any overlap suppresses; touching boxes (IoU 0) do not
    touching = torch.tensor([[0.0, 0, 2, 2, 0], [2.0, 0, 2, 2, 0], [1.0, 0, 2, 2, 0]], dtype=torch.float64)
    assert_keep(opforge.nms_rotated(touching, torch.tensor([0.9, 0.8, 0.1], dtype=torch.float64), 0.0), [0, 1])
    # infinite scores are ordered like any others
    s = torch.tensor([-math.inf, math.inf, 0.0], dtype=torch.float64)
    assert_keep(opforge.nms_rotated(far[:3], s, 0.5), [1, 2, 0])
    assert_keep(run_in_ort(NMS_ROTATED, (far[:3], s, 0.5)), [1, 2, 0])


def test_equal_scores_in_16_bit_are_ties():
    """Scores distinct in float32 but equal once rounded to bfloat16 are ties: lower index first."""
    boxes = torch.tensor([[5.0, 5.0, 4.0, 2.0, 0.7]] * 3)
    scores = torch.tensor([0.5, 0.5 + 2 ** -12, 0.5 + 2 ** -11])  # all 0.5 in bfloat16
    assert_keep(opforge.nms_rotated(boxes, scores, 0.5), [2])
    assert_keep(opforge.nms_rotated(boxes.bfloat16(), scores.bfloat16(), 0.5), [0])
    assert_keep(run_in_ort(NMS_ROTATED, (boxes.bfloat16(), scores.bfloat16(), 0.5)), [0])


def test_iou_invariances():
    """Each box described another way (a half turn; a quarter turn with w and h swapped; a full turn;
    a mirror image; all moved together) is the same set of boxes: the same ones are kept."""
    boxes, scores = random_boxes(40, seed=3, extent=20.0)
    threshold = away_from(iou_matrix(boxes), 0.3, margin=1e-5)
    want = opforge.nms_rotated(boxes, scores, threshold)
    assert 3 < len(want) < 40
    assert_keep(want, reference(boxes, scores, threshold))
    half = boxes.clone()
    half[:, 4] += math.pi
    quarter = boxes[:, [0, 1, 3, 2, 4]].clone()
    quarter[:, 4] += math.pi / 2
    quarter_back = boxes[:, [0, 1, 3, 2, 4]].clone()
    quarter_back[:, 4] -= math.pi / 2
    full = boxes.clone()
    full[:, 4] -= 2 * math.pi
    mirror = boxes.clone()
    mirror[:, 0] = -mirror[:, 0]
    mirror[:, 4] = math.pi - mirror[:, 4]  # x -> -x: the width axis (cos a, sin a) -> (-cos a, sin a)
    moved = boxes.clone()
    moved[:, :2] += torch.tensor([100.25, -50.5], dtype=torch.float64)
    for name, other in (("half", half), ("quarter", quarter), ("quarter-back", quarter_back), ("full", full),
                        ("mirror", mirror), ("moved", moved)):
        assert opforge.nms_rotated(other, scores, threshold).tolist() == want.tolist(), name
    # each box and its other descriptions are one box: IoU 1 (by the reference's construction)
    for other in (half, quarter, quarter_back, full):
        for b, o in zip(boxes[:10], other[:10]):
            assert abs(_iou(b.numpy(), o.numpy()) - 1) < 1e-9


def test_degenerate_boxes_neither_suppress_nor_are_suppressed():
    big = [5.0, 5.0, 6.0, 4.0, 0.3]
    boxes = torch.tensor([big, [5.0, 5.0, 0.0, 4.0, 0.3], [5.0, 5.0, 6.0, -4.0, 0.3], [5.0, 5.0, 0.0, 0.0, 0.0], big,
                          [5.0, 5.0, -1.0, -1.0, 0.0]], dtype=torch.float64)
    scores = torch.tensor([0.5, 0.9, 0.8, 0.7, 0.4, 0.6], dtype=torch.float64)
    want = [1, 2, 3, 5, 0]  # only box 4 (a copy of box 0, lower score) goes
    assert_keep(opforge.nms_rotated(boxes, scores, 0.0), want)
    assert_keep(reference(boxes, scores, 0.0), want)
    assert_keep(run_in_ort(NMS_ROTATED, (boxes, scores, 0.0)), want)
    assert_keep(opforge.batched_nms_rotated(boxes, scores, torch.zeros(6, dtype=torch.int64), 0.0), want)


def test_labels_are_compared_only_for_equality():
    boxes = torch.tensor([[5.0, 5.0, 6.0, 4.0, 0.3]] * 4, dtype=torch.float64)
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6], dtype=torch.float64)
    for labels, want in (([2 ** 62, -(2 ** 62), 2 ** 62, -1], [0, 1, 3]), ([-5, -5, -5, -5], [0]),
                         ([0, 1, 2, 3], [0, 1, 2, 3])):
        labels = torch.tensor(labels)
        assert_keep(opforge.batched_nms_rotated(boxes, scores, labels, 0.5), want)
        assert_keep(run_in_ort(BATCHED_NMS_ROTATED, (boxes, scores, labels, 0.5)), want)
    # int32 labels are converted by the wrapper; the op itself takes int64 only
    assert_keep(opforge.batched_nms_rotated(boxes, scores, torch.tensor([0, 1, 0, 1], dtype=torch.int32), 0.5),
                [0, 1])
    with pytest.raises(RuntimeError, match=rf"^{BOP}: idxs has dtype (Int|torch\.int32) but must be int64"):
        torch.ops.opforge.batched_nms_rotated(boxes, scores, torch.zeros(4, dtype=torch.int32), 0.5)
    with pytest.raises(opforge.OpInputError, match=rf"^{BOP}: idxs must hold integer categories"):
        opforge.batched_nms_rotated(boxes, scores, torch.tensor([0, 0.5, 1, 1]), 0.5)


# ---- idxs at the edges: exact int64 categories, or an error --------------------------------------


def per_class_torchvision(boxes, scores, labels, threshold):
    """torchvision's nms run on each category's boxes alone (angle-0 boxes as corners), labels
    compared as Python numbers: the kept indices by decreasing score."""
    keep = []
    for label in set(labels):
        where = torch.tensor([i for i, other in enumerate(labels) if other == label])
        keep += where[torchvision.ops.nms(_xyxy(boxes[where]).double(), scores[where].double(), threshold)].tolist()
    return sorted(keep, key=lambda i: (-float(scores[i]), i))


SAME_BOXES = torch.tensor([[5.0, 5.0, 6.0, 4.0, 0.0]] * 4, dtype=torch.float64)  # IoU 1 in every pair
SAME_SCORES = torch.tensor([0.9, 0.8, 0.7, 0.6], dtype=torch.float64)


def test_int64_idxs_at_the_ends_of_int64_stay_exact():
    """INT64_MAX and INT64_MAX - 1 are one number in float64 (2^63): the labels are never rounded."""
    top, bottom = torch.iinfo(torch.int64).max, torch.iinfo(torch.int64).min
    for labels in ([top, top - 1, bottom, bottom + 1], [top, bottom, top, bottom + 1], [top - 1, top, top - 1, top]):
        want = per_class_torchvision(SAME_BOXES, SAME_SCORES, labels, 0.5)
        idxs = torch.tensor(labels)
        assert_keep(opforge.batched_nms_rotated(SAME_BOXES, SAME_SCORES, idxs, 0.5), want)
        assert_keep(run_in_ort(BATCHED_NMS_ROTATED, (SAME_BOXES, SAME_SCORES, idxs, 0.5)), want)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_float_idxs_holding_int64_values_are_those_categories(dtype):
    """Float idxs go to the op as they are; integers in [-2^63, 2^63) are exactly those categories."""
    bits, top = {torch.float64: (53, 63), torch.float32: (24, 63), torch.float16: (11, 15),
                 torch.bfloat16: (8, 63)}[dtype]  # mantissa bits; 2^top is in the dtype's range
    huge = [-2.0 ** top, 2.0 ** (top - 1), -2.0 ** top, 2.0 ** bits + 2]  # each exact in the dtype
    for labels in (huge, [3.0, -0.0, 0.0, 3.0], [7.0, 7.0, 7.0, 7.0]):
        want = per_class_torchvision(SAME_BOXES, SAME_SCORES, labels, 0.5)
        idxs = torch.tensor(labels, dtype=dtype)
        assert idxs.tolist() == labels
        assert_keep(opforge.batched_nms_rotated(SAME_BOXES, SAME_SCORES, idxs, 0.5), want)
        assert_keep(torch.ops.opforge.batched_nms_rotated(SAME_BOXES, SAME_SCORES, idxs, 0.5), want)
        assert_keep(run_in_ort(BATCHED_NMS_ROTATED, (SAME_BOXES, SAME_SCORES, idxs, 0.5)), want)
    assert want == [0]


# (value, dtype, how the message shows it): no int64 holds these, and a cast (C's, torch's .to(int64),
# ONNX's Cast) turned every one of the first six into INT64_MIN, merging their categories
NOT_INT64 = [(1e19, torch.float64, r"1e\+19"), (1e19, torch.float32, r"1e\+19"),
             (1e30, torch.float64, r"1e\+30"), (2.0 ** 63, torch.float64, r"9\.223372036854776e\+18"),
             (math.inf, torch.float32, "inf"), (-math.inf, torch.float64, "-inf"), (math.nan, torch.float64, "nan"),
             (math.inf, torch.float16, "inf"),
             (-2.0 ** 63 * (1 + 2.0 ** -52), torch.float64, r"-9\.223372036854778e\+18"),  # next below -2^63
             (0.5, torch.float32, r"0\.5"), (-2.5, torch.bfloat16, r"-2\.5")]


@pytest.mark.parametrize("value,dtype,shown", NOT_INT64, ids=[f"{v}-{str(d)[6:]}" for v, d, _ in NOT_INT64])
def test_float_idxs_outside_int64_are_refused_in_torch_and_ort(value, dtype, shown):
    idxs = torch.tensor([0.0, value, -2.0], dtype=dtype)
    boxes, scores = SAME_BOXES[:3], SAME_SCORES[:3]
    # torchvision's batched_nms keeps all three (three categories); a silent cast kept [0, 1]
    match = rf"{BOP}: idxs must hold integer categories in int64's range \[-2\^63, 2\^63\), got idxs\[1\] = {shown}$"
    with pytest.raises(opforge.OpInputError, match="^" + match):
        opforge.batched_nms_rotated(boxes, scores, idxs, 0.5)
    with pytest.raises(RuntimeError, match="^" + match):
        torch.ops.opforge.batched_nms_rotated(boxes, scores, idxs, 0.5)
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument, match="INVALID_ARGUMENT.*" + match):
        run_in_ort(BATCHED_NMS_ROTATED, (boxes, scores, idxs, 0.5))


def test_float_idxs_reach_the_exported_node_uncast():
    """The wrapper passes float idxs to the op, so both exporters write them into the node as they
    are and ONNX Runtime refuses what torch refuses (a Cast to int64 in the graph would not)."""

    class PerClass(torch.nn.Module):
        def forward(self, boxes, scores, labels):
            return opforge.batched_nms_rotated(boxes, scores, labels, 0.5)

    boxes, scores = SAME_BOXES.float()[:3], SAME_SCORES.float()[:3]
    labels = torch.tensor([0.0, 1.0, 0.0])
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    for dynamo in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            proto = opforge.export(PerClass(), (boxes, scores, labels), dynamo=dynamo,
                                   input_names=["boxes", "scores", "labels"])
        assert [n.op_type for n in proto.graph.node] == ["batched_nms_rotated"], dynamo
        sess = opforge.ort_session(proto, options)
        feeds = {"boxes": boxes.numpy(), "scores": scores.numpy()}
        assert sess.run(None, {**feeds, "labels": labels.numpy()})[0].tolist() == [0, 1]
        with pytest.raises(Exception, match=r"idxs must hold integer categories .* got idxs\[1\] = 1e\+30"):
            sess.run(None, {**feeds, "labels": np.array([0.0, 1e30, -1e30], np.float32)})


# ---- extreme coordinates: the same boxes at any scale ---------------------------------------------
# The IoU does not change when both boxes are scaled alike. Products of sides or offsets beyond ~1e154
# (or below ~1e-154) leave float64's range, so the kernels scale such pairs by a power of two first.

EXTREME_SCALES = [2.0 ** 520, 2.0 ** 1000, 1e154, 1e300, 2.0 ** -520, 2.0 ** -1000, 1e-170, 1e-300]


@pytest.mark.parametrize("scale", EXTREME_SCALES, ids=str)
def test_extreme_scales_keep_what_moderate_boxes_keep(scale):
    """mmcv's boxes scaled: the keep sets at thresholds between their IoUs (0.19 .. 0.72, the
    reference's polygon construction) stay those of test_mmcv_case_iou_and_thresholds."""
    boxes, scores = torch.tensor(MMCV_BOXES, dtype=torch.float64), torch.tensor(MMCV_SCORES, dtype=torch.float64)
    scaled = boxes.clone()
    scaled[:, :4] *= scale
    assert torch.isfinite(scaled).all() and (scaled[:, 2:4] > 0).all()
    for threshold, want in ((0.8, [3, 1, 0, 2]), (0.5, [3, 1, 0]), (0.42, [3, 0, 2]), (0.3, [3, 0]), (0.1, [3])):
        assert_keep(opforge.nms_rotated(scaled, scores, threshold), want)
        assert_keep(reference(scaled, scores, threshold), want)  # the spec's reference scales such pairs too
    assert_keep(run_in_ort(NMS_ROTATED, (scaled, scores, 0.5)), [3, 1, 0])
    # two copies of one box: IoU 1, the lower score goes
    assert_keep(opforge.nms_rotated(scaled[[1, 1]], scores[:2], 0.99), [1])
    assert_keep(run_in_ort(NMS_ROTATED, (scaled[[1, 1]], scores[:2], 0.99)), [1])


@pytest.mark.parametrize("dtype,scales", [(torch.float64, [2.0 ** 600, 2.0 ** 1015, 2.0 ** -600, 2.0 ** -1040]),
                                          (torch.float32, [2.0 ** 64, 2.0 ** 100, 2.0 ** -100, 2.0 ** -120])],
                         ids=str)
def test_extreme_scales_at_angle_zero_are_torchvision_nms(dtype, scales):
    """Axis-aligned boxes scaled by powers of two (exactly, but for the last bits of subnormal values at
    2^-1040) keep what torchvision's nms keeps for the boxes unscaled (it overflows on the scaled ones)."""
    boxes, scores = random_boxes(60, seed=11, extent=30.0, angles=False, near_copies=20)
    threshold = away_from(iou_matrix(boxes), 0.5)
    want = torchvision.ops.nms(_xyxy(boxes), scores, threshold)
    assert 10 < len(want) < 60
    for scale in scales:
        scaled = boxes.to(dtype) * torch.tensor([scale] * 4 + [1.0], dtype=dtype)
        assert torch.isfinite(scaled).all() and (scaled[:, 2:4] > 0).all()
        assert_keep(opforge.nms_rotated(scaled, scores.to(dtype), threshold), want)
    assert_keep(run_in_ort(NMS_ROTATED, (scaled, scores.to(dtype), threshold)), want)


def test_huge_boxes_near_the_float64_limit():
    """Centres and sides near 1e308: the centres' offset itself overflows (2e308), and still the IoU
    is right: box 2 copies box 0 (IoU 1), box 1 is apart from both (IoU 0), box 3 covers half of box 0
    (IoU 0.5; by hand: overlap 0.5e308 x 1e300 of areas 1e308 x 1e300 and 0.5e308 x 1e300)."""
    boxes = torch.tensor([[1e308, 0.0, 1e308, 1e300, 0.0], [-1e308, 0.0, 1e308, 1e300, 0.0],
                          [1e308, 0.0, 1e308, 1e300, 0.0], [1.25e308, 0.0, 0.5e308, 1e300, 0.0]], dtype=torch.float64)
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6], dtype=torch.float64)
    for threshold, want in ((0.99, [0, 1, 3]), (0.51, [0, 1, 3]), (0.49, [0, 1])):
        assert_keep(opforge.nms_rotated(boxes, scores, threshold), want)
        assert_keep(reference(boxes, scores, threshold), want)
        assert_keep(run_in_ort(NMS_ROTATED, (boxes, scores, threshold)), want)
    turned = boxes.clone()
    turned[:, 4] = 0.3  # every box turned alike about its own centre: the copy still goes
    assert opforge.nms_rotated(turned, scores, 0.99).tolist()[:2] == [0, 1]


# ---- empty input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_no_boxes(dtype):
    boxes, scores = torch.zeros(0, 5, dtype=dtype), torch.zeros(0, dtype=dtype)
    labels = torch.zeros(0, dtype=torch.int64)
    for keep in (opforge.nms_rotated(boxes, scores, 0.5), opforge.batched_nms_rotated(boxes, scores, labels, 0.5),
                 run_in_ort(NMS_ROTATED, (boxes, scores, 0.5)),
                 run_in_ort(BATCHED_NMS_ROTATED, (boxes, scores, labels, 0.5))):
        assert keep.shape == (0,) and keep.dtype == torch.int64


# ---- hostile input: torch and ORT refuse it alike -------------------------------------------------

_COLUMNS = ["cx", "cy", "w", "h", "angle"]


def _hostile():
    boxes, scores = random_boxes(6, seed=2)
    for col, name in enumerate(_COLUMNS):
        for value in (math.nan, math.inf, -math.inf):
            b = boxes.clone()
            b[4, col] = value
            shown = "nan" if math.isnan(value) else ("-inf" if value < 0 else "inf")
            yield f"{name}={shown}", b, scores, rf"boxes row 4 has a non-finite {name} \({shown}\)"
    s = scores.clone()
    s[3] = math.nan
    yield "score=nan", boxes, s, r"scores\[3\] is NaN: boxes cannot be ordered by it"


HOSTILE = list(_hostile())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("boxes,scores,match", [(b, s, m) for _, b, s, m in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_values_are_refused_in_torch_and_ort(boxes, scores, match, dtype):
    boxes, scores = boxes.to(dtype), scores.to(dtype)
    labels = torch.arange(6)
    for op, spec, fn, args in ((OP, NMS_ROTATED, opforge.nms_rotated, (boxes, scores, 0.5)),
                               (BOP, BATCHED_NMS_ROTATED, opforge.batched_nms_rotated, (boxes, scores, labels, 0.5))):
        with pytest.raises(opforge.OpInputError, match=f"^{op}: {match}"):
            fn(*args)
        with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument,
                           match=f"INVALID_ARGUMENT.*{op}: {match}"):
            run_in_ort(spec, args)


@pytest.mark.parametrize("threshold", [-0.1, 1.5, math.nan, math.inf, -math.inf, 1.0 + 1e-6])
def test_bad_thresholds_are_refused_in_torch_and_ort(threshold):
    boxes, scores = random_boxes(5)
    labels = torch.zeros(5, dtype=torch.int64)
    shown = {-0.1: r"-0\.10+", 1.5: r"1\.50+", math.inf: "inf", -math.inf: "-inf", 1.0 + 1e-6: r"1\.0000010*"}.get(
        threshold, "nan")
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    for op, spec, fn, args in ((OP, NMS_ROTATED, opforge.nms_rotated, (boxes, scores)),
                               (BOP, BATCHED_NMS_ROTATED, opforge.batched_nms_rotated, (boxes, scores, labels))):
        match = rf"{op}: iou_threshold must be in \[0, 1\], got {shown}"
        with pytest.raises(opforge.OpInputError, match="^" + match):
            fn(*args, threshold)
        with pytest.raises(opforge.OpInputError, match="^" + match):  # also with no boxes
            fn(*(a[:0] for a in args), threshold)
        with pytest.raises(Exception, match=match):  # checked when ORT creates the kernel
            opforge.ort_session(single_node_model(spec, (*args, threshold)), options)


def test_thresholds_at_the_ends_are_valid():
    boxes, scores = random_boxes(30, seed=4, extent=15.0)
    assert_keep(opforge.nms_rotated(boxes, scores, 1.0), scores.argsort(descending=True, stable=True))
    want = reference(boxes, scores, 0.0)
    assert_keep(opforge.nms_rotated(boxes, scores, 0.0), want)
    assert_keep(opforge.nms_rotated(boxes, scores, -0.0), want)
    # 1 + 1e-9 is 1 in float32, the threshold's type in ONNX and in the kernels
    assert_keep(opforge.nms_rotated(boxes, scores, 1.0 + 1e-9), scores.argsort(descending=True, stable=True))


@pytest.mark.parametrize("boxes_shape,scores_shape,labels_shape,match", [
    ((4, 4), (4,), (4,), r"boxes must be 2-D \(N, 5\), one \(cx, cy, w, h, angle\) row per box, got shape \[4, 4\]"),
    ((4, 5, 1), (4,), (4,), r"boxes must be 2-D \(N, 5\)"),
    ((5,), (1,), (1,), r"boxes must be 2-D \(N, 5\)"),
    ((4, 5), (3,), (4,), r"scores must be 1-D \(N,\) with N = 4 \(boxes' rows\), got shape \[3\]"),
    ((4, 5), (4, 1), (4,), r"scores must be 1-D \(N,\) with N = 4"),
], ids=["boxes-4-cols", "boxes-3d", "boxes-1d", "scores-short", "scores-2d"])
def test_bad_shapes_are_refused_in_torch_and_ort(boxes_shape, scores_shape, labels_shape, match):
    boxes, scores, labels = torch.rand(boxes_shape) + 1, torch.rand(scores_shape), torch.zeros(labels_shape).long()
    for op, spec, fn, args in ((OP, NMS_ROTATED, opforge.nms_rotated, (boxes, scores, 0.5)),
                               (BOP, BATCHED_NMS_ROTATED, opforge.batched_nms_rotated, (boxes, scores, labels, 0.5))):
        with pytest.raises(opforge.OpInputError, match=f"^{op}: {match}"):
            fn(*args)
        with pytest.raises(Exception, match=f"INVALID_ARGUMENT.*{op}: {match}"):
            run_in_ort(spec, args)


def test_bad_labels_shape_and_dtypes_are_refused():
    boxes, scores = random_boxes(4, dtype=torch.float32)
    with pytest.raises(opforge.OpInputError, match=rf"^{BOP}: idxs must be 1-D \(N,\) with N = 4 \(boxes' rows\), "
                                                   r"got shape \[3\]"):
        opforge.batched_nms_rotated(boxes, scores, torch.zeros(3, dtype=torch.int64), 0.5)
    with pytest.raises(Exception, match=rf"INVALID_ARGUMENT.*{BOP}: idxs must be 1-D"):
        run_in_ort(BATCHED_NMS_ROTATED, (boxes, scores, torch.zeros(4, 1, dtype=torch.int64), 0.5))
    with pytest.raises(opforge.OpInputError, match=rf"^{OP}: scores has dtype (torch\.float64|Double) but boxes has "
                                                   rf"dtype (torch\.float32|Float); they must match"):
        opforge.nms_rotated(boxes, scores.double(), 0.5)
    with pytest.raises(opforge.OpInputError, match=rf"^{OP}: boxes has dtype (torch\.int64|Long); supported dtypes"):
        opforge.nms_rotated(boxes.long(), scores.long(), 0.5)
    with pytest.raises(NodeTypeError, match=r"gets input 'scores' of type tensor\(double\) but 'boxes' of type "
                                            r"tensor\(float\); they share one element type"):
        opforge.ort_session(single_node_model(NMS_ROTATED, (boxes, scores.double(), 0.5)))
    with pytest.raises(NodeTypeError, match=r"input 'idxs' of type tensor\(int32\), which it does not take"):
        opforge.ort_session(single_node_model(BATCHED_NMS_ROTATED, (boxes, scores, torch.zeros(4).int(), 0.5)))


# ---- check_op -------------------------------------------------------------------------------------

_boxes, _scores = random_boxes(14, seed=31, extent=18.0)
_labels = torch.tensor([0, 1, 2] * 4 + [0, 1])
_tied = _scores.clone()
_tied[5] = _tied[9] = _tied[2]
NMS_SAMPLES = [
    Sample(_boxes, _scores, 0.3, batch=("boxes", "scores"), name="rotated"),
    Sample(_boxes, _tied, 0.6, batch=("boxes", "scores"), name="ties"),
    Sample(_boxes[:0], _scores[:0], 0.5, batch=(), name="no-boxes"),
]
BATCHED_SAMPLES = [
    Sample(_boxes, _scores, _labels, 0.3, batch=("boxes", "scores", "idxs"), name="rotated"),
    Sample(_boxes, _tied, _labels % 2, 0.1, batch=("boxes", "scores", "idxs"), name="ties"),
]
_nan_box = _boxes.clone()
_nan_box[6, 3] = math.nan
_nan_score = _scores.clone()
_nan_score[11] = math.nan
NMS_BAD = [
    BadSample(_nan_box, _scores, 0.5, match=rf"{OP}: boxes row 6 has a non-finite h \(nan\)", name="nan-h"),
    BadSample(_boxes, _nan_score, 0.5, match=rf"{OP}: scores\[11\] is NaN", name="nan-score"),
    BadSample(_boxes, _scores, 1.5, match=rf"{OP}: iou_threshold must be in \[0, 1\]", name="threshold"),
    BadSample(_boxes[:, :4], _scores, 0.5, match=rf"{OP}: boxes must be 2-D \(N, 5\)", name="boxes-shape"),
    BadSample(_boxes, _scores[:-1], 0.5, match=rf"{OP}: scores must be 1-D \(N,\) with N = 14", name="scores-shape"),
]
BATCHED_BAD = [
    BadSample(_nan_box, _scores, _labels, 0.5, match=rf"{BOP}: boxes row 6 has a non-finite h \(nan\)", name="nan-h"),
    BadSample(_boxes, _nan_score, _labels, 0.5, match=rf"{BOP}: scores\[11\] is NaN", name="nan-score"),
    BadSample(_boxes, _scores, _labels, -0.5, match=rf"{BOP}: iou_threshold must be in \[0, 1\]", name="threshold"),
    BadSample(_boxes, _scores, _labels[:-2], 0.5, match=rf"{BOP}: idxs must be 1-D \(N,\) with N = 14",
              name="idxs-shape"),
    BadSample(_boxes, _scores, torch.where(_labels == 2, math.inf, _labels.float()), 0.5,
              match=rf"{BOP}: idxs must hold integer categories in int64's range .* got idxs\[2\] = inf",
              name="idxs-inf"),
]
test_check_op_nms_rotated = op_tests(NMS_ROTATED, NMS_SAMPLES, bad_samples=NMS_BAD)
test_check_op_batched_nms_rotated = op_tests(BATCHED_NMS_ROTATED, BATCHED_SAMPLES, bad_samples=BATCHED_BAD)


# ---- export: the kept boxes as a model's output, other box counts ---------------------------------


class KeepBoxes(torch.nn.Module):
    """mmcv's (dets, keep) from nms_rotated, per class: the kept boxes with their scores."""

    def forward(self, boxes, scores, labels):
        keep = opforge.batched_nms_rotated(boxes, scores, labels, 0.45)
        return torch.cat([boxes[keep], scores[keep, None]], 1), keep


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_exported_model_serves_other_box_counts(dynamo):
    names = ["boxes", "scores", "labels"]
    boxes, scores = random_boxes(20, seed=8, extent=20.0, dtype=torch.float32)
    labels = torch.arange(20) % 2
    if dynamo:
        n = torch.export.Dim("n")
        kw = dict(dynamic_shapes=({0: n}, {0: n}, {0: n}))
    else:
        kw = dict(dynamic_axes={"boxes": {0: "n"}, "scores": {0: "n"}, "labels": {0: "n"}, "dets": {0: "m"},
                                "keep": {0: "m"}})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*shares the same shape constraints")
        proto = opforge.export(KeepBoxes(), (boxes, scores, labels), dynamo=dynamo, opset_version=18 if dynamo else 17,
                               input_names=names, output_names=["dets", "keep"], **kw)
    assert [n.op_type for n in proto.graph.node if n.domain == "opforge"] == ["batched_nms_rotated"]
    options = onnxruntime.SessionOptions()
    options.register_custom_ops_library(opforge.ort_library_path())
    for sess in (opforge.ort_session(proto),
                 onnxruntime.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])):
        for count, seed in ((20, 8), (57, 9), (1, 10), (0, 11)):
            b, s = random_boxes(count, seed=seed, extent=20.0, dtype=torch.float32)
            lab = torch.arange(count) % 2
            dets, keep = sess.run(None, {"boxes": b.numpy(), "scores": s.numpy(), "labels": lab.numpy()})
            want = reference(b, s, 0.45, lab)
            np.testing.assert_array_equal(keep, want.numpy())
            np.testing.assert_array_equal(dets, torch.cat([b[want], s[want, None]], 1).numpy())
