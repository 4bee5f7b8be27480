"""nms_rotated / batched_nms_rotated: non-maximum suppression of rotated boxes, by their exact
IoU (polygon intersection in float64), returning kept indices like ``torchvision.ops.nms``.

* ``opforge.nms_rotated(boxes, scores, iou_threshold)`` -> int64 indices of the kept boxes,
  sorted by decreasing score;
* ``opforge.batched_nms_rotated(boxes, scores, idxs, iou_threshold)``: the same per category
  (``torchvision.ops.batched_nms``'s form): boxes of different ``idxs`` never suppress each
  other;
* ``torch.ops.opforge.nms_rotated`` / ``torch.ops.opforge.batched_nms_rotated``: the ops.

``boxes`` is (N, 5) = (cx, cy, w, h, angle in radians) as mmcv's (the width axis along
(cos a, sin a), so a positive angle turns clockwise on screen, mmcv's default); ``scores`` is
(N,) of the boxes' dtype; ``idxs`` is (N,) int64, or float (mmcv's labels) holding integers in
int64's range. Boxes are visited by decreasing score, equal scores lower index first; a box is
suppressed when its IoU with a kept box is greater than ``iou_threshold``. Defined results: a box
with w <= 0 or h <= 0 has IoU 0 with every box, so it never suppresses another and is never
suppressed; N = 0 gives an empty result. Any finite box values work: a pair with a side beyond
2^500 (about 3e150) or below 2^-500, where float64's products would overflow or underflow, is
scaled by a power of two (exactly: the IoU does not change) before its IoU is computed.
Errors (:class:`opforge.OpInputError` in torch, an error status in ONNX Runtime, naming the
argument): non-finite box values, NaN scores, float idxs that are not integers in [-2^63, 2^63)
(0.5, 1e19, inf, NaN: no exact int64 category), and ``iou_threshold`` outside [0, 1].

Export: the ``opforge::nms_rotated`` / ``opforge::batched_nms_rotated`` custom nodes
(libopforge_ort); N and the number kept are dynamic.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import spec as _spec
from ..registration import OpInputError, as_input_error, check_same_device, register_op
from ._registry import _C

_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _op_name(batched: bool) -> str:
    return "opforge::batched_nms_rotated" if batched else "opforge::nms_rotated"


def _check(boxes, scores, idxs, iou_threshold) -> None:
    """The kernels' checks that need no tensor values (shapes, threshold, dtypes, devices), for fake
    tensors; the values (finite boxes, no NaN score, integer float idxs) are checked by the kernels."""
    op = _op_name(idxs is not None)
    if boxes.dim() != 2 or (type(boxes.shape[1]) is int and boxes.shape[1] != 5):
        raise OpInputError(f"{op}: boxes must be 2-D (N, 5), one (cx, cy, w, h, angle) row per box, got shape "
                           f"{list(boxes.shape)}")
    n = boxes.shape[0]
    if scores.dim() != 1 or (type(n) is int and type(scores.shape[0]) is int and scores.shape[0] != n):
        raise OpInputError(f"{op}: scores must be 1-D (N,) with N = {n} (boxes' rows), got shape "
                           f"{list(scores.shape)}")
    if idxs is not None and (idxs.dim() != 1 or (type(n) is int and type(idxs.shape[0]) is int
                                                 and idxs.shape[0] != n)):
        raise OpInputError(f"{op}: idxs must be 1-D (N,) with N = {n} (boxes' rows), got shape {list(idxs.shape)}")
    threshold = float(np.float32(iou_threshold))  # as the kernels see it
    if not (0.0 <= threshold <= 1.0):
        raise OpInputError(f"{op}: iou_threshold must be in [0, 1], got {iou_threshold}")
    if boxes.dtype not in _FLOATS:
        raise OpInputError(f"{op}: boxes has dtype {boxes.dtype}; supported dtypes are float32, float64, float16 and "
                           "bfloat16")
    if scores.dtype != boxes.dtype:
        raise OpInputError(f"{op}: scores has dtype {scores.dtype} but boxes has dtype {boxes.dtype}; they must match")
    if idxs is not None and idxs.dtype != torch.int64 and idxs.dtype not in _FLOATS:
        raise OpInputError(f"{op}: idxs has dtype {idxs.dtype} but must be int64 (torch.long) or a float dtype "
                           "holding integers")
    check_same_device(op, boxes=boxes, scores=scores, idxs=idxs)


def _kept(boxes):
    """A 1-D int64 tensor whose length is the number of boxes kept: data-dependent, so a fresh
    unbacked size under fake tensors (torch.export, torch.compile)."""
    n = torch.library.get_ctx().new_dynamic_size()
    return boxes.new_empty((n,), dtype=torch.int64)


def _fake(boxes, scores, iou_threshold):
    _check(boxes, scores, None, iou_threshold)
    return _kept(boxes)


def _batched_fake(boxes, scores, idxs, iou_threshold):
    _check(boxes, scores, idxs, iou_threshold)
    return _kept(boxes)


# ---- independent numpy reference ---------------------------------------------------------------


def _corners(box) -> np.ndarray:
    cx, cy, w, h, a = (float(v) for v in box)
    u = np.array([math.cos(a), math.sin(a)]) * w / 2
    v = np.array([-math.sin(a), math.cos(a)]) * h / 2
    c = np.array([cx, cy])
    return np.stack([c - u - v, c + u - v, c + u + v, c - u + v])


def _inside(p, poly) -> bool:
    # inside (or on) a counter-clockwise convex polygon
    for i in range(4):
        a, b = poly[i], poly[(i + 1) % 4]
        if (b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0]) < -1e-12:
            return False
    return True


def _in_range(a, b):
    """The pair as is when its products stay inside float64's range (sides in [2^-500, 2^500], centres
    at most 2^500 apart per axis); else moved to their centres' midpoint and scaled by the power of
    two that brings their extent to about 1 (the IoU does not change)."""
    a, b = [float(v) for v in a], [float(v) for v in b]
    hx, hy = abs(a[0] / 2 - b[0] / 2), abs(a[1] / 2 - b[1] / 2)  # halves first: the offset may overflow
    sides = (a[2], a[3], b[2], b[3])
    if all(2.0 ** -500 <= v <= 2.0 ** 500 for v in sides) and max(hx, hy) <= 2.0 ** 499:
        return a, b
    k = -math.frexp(max(hx, hy, *sides))[1]
    dx, dy = math.ldexp(a[0] / 2 - b[0] / 2, k), math.ldexp(a[1] / 2 - b[1] / 2, k)
    return ([dx, dy, math.ldexp(a[2], k), math.ldexp(a[3], k), a[4]],
            [-dx, -dy, math.ldexp(b[2], k), math.ldexp(b[3], k), b[4]])


def _iou(a, b) -> float:
    """IoU from the intersection polygon's vertices: the corners of each box inside the other plus
    every crossing of their edges, ordered by angle around their centroid (a different construction
    from the kernels' half-plane clipping)."""
    if not (a[2] > 0 and a[3] > 0 and b[2] > 0 and b[3] > 0):
        return 0.0
    a, b = _in_range(a, b)
    shift = (np.asarray(a[:2], dtype=np.float64) + np.asarray(b[:2], dtype=np.float64)) / 2
    pa = _corners(a) - shift
    pb = _corners(b) - shift
    points = [p for p in pa if _inside(p, pb)] + [p for p in pb if _inside(p, pa)]
    for i in range(4):
        p, r = pa[i], pa[(i + 1) % 4] - pa[i]
        for j in range(4):
            q, s = pb[j], pb[(j + 1) % 4] - pb[j]
            denom = r[0] * s[1] - r[1] * s[0]
            if abs(denom) < 1e-300:
                continue
            t = ((q[0] - p[0]) * s[1] - (q[1] - p[1]) * s[0]) / denom
            u = ((q[0] - p[0]) * r[1] - (q[1] - p[1]) * r[0]) / denom
            if 0 <= t <= 1 and 0 <= u <= 1:
                points.append(p + t * r)
    if len(points) < 3:
        return 0.0
    pts = np.array(points)
    centre = pts.mean(axis=0)
    pts = pts[np.argsort(np.arctan2(pts[:, 1] - centre[1], pts[:, 0] - centre[0]))]
    x, y = pts[:, 0], pts[:, 1]
    inter = 0.5 * abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))
    area_a, area_b = float(a[2]) * float(a[3]), float(b[2]) * float(b[3])
    inter = min(inter, area_a, area_b)
    return inter / (area_a + area_b - inter)


def _greedy(boxes, scores, labels, iou_threshold) -> np.ndarray:
    boxes = np.asarray(boxes, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    threshold = float(np.float32(iou_threshold))
    removed, keep = set(), []
    for pos, i in enumerate(order):
        if i in removed:
            continue
        keep.append(i)
        for j in order[pos + 1:]:
            if j not in removed and (labels is None or labels[i] == labels[j]) and \
                    _iou(boxes[i], boxes[j]) > threshold:
                removed.add(j)
    return np.array(keep, dtype=np.int64)


def _reference(boxes, scores, *, iou_threshold):
    return (_greedy(boxes, scores, None, iou_threshold),)


def _batched_reference(boxes, scores, idxs, *, iou_threshold):
    return (_greedy(boxes, scores, np.asarray(idxs), iou_threshold),)


def _output_shapes(shapes, attrs):
    return [[None]]  # how many boxes are kept is known only at run time


_IDXS_DTYPES = ("int64", "float32", "float64", "float16", "bfloat16")
_KEEP = _spec.TensorArg("keep", dtypes=("int64",), doc="indices of the kept boxes, by decreasing score")
_BOXES = _spec.TensorArg("boxes", doc="(N, 5): cx, cy, w, h, angle (radians)")
_SCORES = _spec.TensorArg("scores", doc="(N,)")
_THRESHOLD = _spec.AttrArg("iou_threshold", kind="float", doc="suppress IoU > iou_threshold; in [0, 1]")

NMS_ROTATED = _spec.OpSpec(
    name="nms_rotated",
    namespace=_spec.DOMAIN,
    schema="nms_rotated(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor",
    args=(_BOXES, _SCORES, _THRESHOLD),
    outputs=(_KEEP,),
    doc="Rotated NMS by exact IoU: int64 indices of the kept boxes, by decreasing score.",
    fake=_fake,
    reference=_reference,
    onnx_output_shapes=_output_shapes,
)

BATCHED_NMS_ROTATED = _spec.OpSpec(
    name="batched_nms_rotated",
    namespace=_spec.DOMAIN,
    schema="batched_nms_rotated(Tensor boxes, Tensor scores, Tensor idxs, float iou_threshold) -> Tensor",
    # float idxs go to the kernels as they are: they refuse values that are no exact int64 (a cast before
    # the op, in torch or in an exported graph, would turn 1e19 and inf into INT64_MIN alike)
    args=(_BOXES, _SCORES, _spec.TensorArg("idxs", dtypes=_IDXS_DTYPES,
                                           doc="(N,) category of each box: int64, or float holding integers"),
          _THRESHOLD),
    outputs=(_KEEP,),
    doc="Rotated NMS per category (boxes of different idxs never suppress each other): kept indices, by decreasing "
        "score.",
    fake=_batched_fake,
    reference=_batched_reference,
    onnx_output_shapes=_output_shapes,
)

nms_rotated_op = register_op(NMS_ROTATED, extension=_C)
batched_nms_rotated_op = register_op(BATCHED_NMS_ROTATED, extension=_C)


def nms_rotated(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Rotated NMS: int64 indices of the kept boxes, by decreasing score (see the module
    docstring). Bad input raises :class:`opforge.OpInputError` naming the argument."""
    try:
        return nms_rotated_op(boxes, scores, float(iou_threshold))
    except (RuntimeError, ValueError, TypeError) as e:
        raise as_input_error(_op_name(False), e) from None


def batched_nms_rotated(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor,
                        iou_threshold: float) -> torch.Tensor:
    """Rotated NMS per category ``idxs`` (torchvision's batched_nms form): int64 indices of the
    kept boxes, by decreasing score. Float ``idxs`` (mmcv's labels) go to the op as they are: it
    takes integer values in int64's range and refuses others (0.5, 1e19, inf, NaN) with
    :class:`opforge.OpInputError`. Other integer dtypes are converted to int64 (exactly)."""
    if isinstance(idxs, torch.Tensor) and idxs.dtype != torch.int64 and not idxs.is_floating_point() \
            and not idxs.is_complex():
        idxs = idxs.to(torch.int64)
    try:
        return batched_nms_rotated_op(boxes, scores, idxs, float(iou_threshold))
    except (RuntimeError, ValueError, TypeError) as e:
        raise as_input_error(_op_name(True), e) from None
