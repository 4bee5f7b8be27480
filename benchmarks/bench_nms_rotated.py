"""nms_rotated speed, measured side by side in one run against a vectorised pure-PyTorch anchor.

    python benchmarks/bench_nms_rotated.py [--boxes 2000] [--iou 0.5] [--threads 2] [--repeats 10]
                                           [--no-all-pairs] [--quick] [--json]

Boxes (float32, detector-like): 150 objects in a 1024x1024 image (20..200 x 10..60 pixels, any
angle), 12 proposals jittered around each (they overlap heavily), the rest random background
boxes; random scores. N = 2000 by default.
Anchor: the same exact IoU in float64 torch ops, vectorised over box pairs (the intersection
polygon's vertices: corners of each box inside the other and the crossings of their edges,
ordered by angle around their centroid, shoelace area), then greedy suppression driven by the
suppression matrix (IoU > threshold), visiting boxes by decreasing score. Two forms:
  pruned:    only the pairs whose circumscribed circles meet (the rest have IoU 0), and only
             pairs (i, j) with i before j in score order -- what a careful torch user writes
  all pairs: every pair (i before j in score order: half of the N^2), in chunks of rows. Slow
             (tens of seconds at N = 2000), so timed once: its agreement run.
  opforge.nms_rotated vs the pruned anchor                                        target >= 10x faster
The kept indices must be identical (checked before anything is timed).
Candidates of a group run round-robin (one call each per round); medians are reported.
--quick: few boxes and two rounds, a smoke test. Never used to gate CI.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

import opforge
from timing import bench_parser, print_ms, report, round_robin

TARGETS = {"ratio": 10.0}  # opforge vs the pruned torch anchor, x faster
ROW_CHUNK = 128  # rows of the all-pairs IoU per step: (128 x N x 24 x 2) float64 intermediates


def detector_like_boxes(n, generator, objects=150, per_object=12, size=1024.0):
    """(n, 5) float32 boxes and (n,) scores: proposals clustered around ``objects`` elongated
    rotated objects plus random background boxes, shuffled."""
    objects = min(objects, n * 9 // 10 // per_object)  # at least a tenth background
    r = torch.rand(objects, 5, generator=generator, dtype=torch.float64)
    gt = torch.stack([50 + (size - 100) * r[:, 0], 50 + (size - 100) * r[:, 1], 20 + 180 * r[:, 2],
                      10 + 50 * r[:, 3], math.pi * (r[:, 4] - 0.5)], 1)
    base = gt.repeat_interleave(per_object, 0)
    j = torch.randn(len(base), 5, generator=generator, dtype=torch.float64)
    near = torch.stack([base[:, 0] + 0.1 * base[:, 2] * j[:, 0], base[:, 1] + 0.1 * base[:, 3] * j[:, 1],
                        base[:, 2] * (1 + 0.1 * j[:, 2]).clamp(min=0.5),
                        base[:, 3] * (1 + 0.1 * j[:, 3]).clamp(min=0.5), base[:, 4] + 0.1 * j[:, 4]], 1)
    r = torch.rand(n - len(near), 5, generator=generator, dtype=torch.float64)
    background = torch.stack([size * r[:, 0], size * r[:, 1], 10 + 190 * r[:, 2], 10 + 50 * r[:, 3],
                              math.pi * (r[:, 4] - 0.5)], 1)
    boxes = torch.cat([near, background])[torch.randperm(n, generator=generator)]
    return boxes.float(), torch.rand(n, generator=generator)


# ---- the anchor: exact rotated IoU in vectorised float64 torch ops ----------------------------------


def corners(boxes):
    """(N, 4, 2) corners, counter-clockwise in the (width axis, height axis) frame; the width axis
    is (cos a, sin a), as opforge.nms_rotated (mmcv) has it."""
    cx, cy, w, h, a = boxes.unbind(1)
    u = torch.stack([a.cos(), a.sin()], 1) * (w / 2)[:, None]
    v = torch.stack([-a.sin(), a.cos()], 1) * (h / 2)[:, None]
    c = torch.stack([cx, cy], 1)
    return torch.stack([c + u + v, c - u + v, c - u - v, c + u - v], 1)


def cross(a, b):
    return a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]


def inside(points, boxes):
    """(..., 4) whether each of points (..., 4, 2) lies in (or on) the box (..., 5) it is paired with."""
    d = points - boxes[..., None, :2]
    cos, sin = boxes[..., None, 4].cos(), boxes[..., None, 4].sin()
    along, across = d[..., 0] * cos + d[..., 1] * sin, d[..., 1] * cos - d[..., 0] * sin
    eps = 1e-9  # a corner on the other's edge counts (the edge crossing gives the same point anyway)
    return (along.abs() <= boxes[..., None, 2] / 2 + eps) & (across.abs() <= boxes[..., None, 3] / 2 + eps)


def paired_iou(a, b, ca, cb):
    """IoU of a[p] and b[p] for p over the leading dims: boxes (..., 5), corners (..., 4, 2), float64."""
    shape = a.shape[:-1]
    # the up to 24 candidate vertices: 4 + 4 corners, 16 edge crossings
    pa, ra = ca[..., :, None, :], (ca.roll(-1, -2) - ca)[..., :, None, :]  # edges of a: p + t r
    pb, rb = cb[..., None, :, :], (cb.roll(-1, -2) - cb)[..., None, :, :]  # edges of b: q + s r'
    den = cross(ra, rb)
    qp = pb - pa
    t, s = cross(qp, rb) / den, cross(qp, ra) / den
    crossing = (den != 0) & (t >= 0) & (t <= 1) & (s >= 0) & (s <= 1)
    points = torch.cat([ca, cb, (pa + t[..., None] * ra).flatten(-3, -2)], -2)  # (..., 24, 2)
    valid = torch.cat([inside(ca, b), inside(cb, a), crossing.flatten(-2)], -1)  # (..., 24)
    points = torch.where(valid[..., None], points, 0.0)  # parallel edges gave inf/nan crossings
    count = valid.sum(-1)
    centre = points.sum(-2) / count.clamp(min=1)[..., None]
    rel = torch.where(valid[..., None], points - centre[..., None, :], 0.0)
    angle = torch.atan2(rel[..., 1], rel[..., 0]).masked_fill(~valid, math.inf)  # invalid ones sort last
    order = angle.argsort(-1)
    rel = rel.gather(-2, order[..., None].expand(*shape, 24, 2))
    # invalid vertices (now at the end) repeat the first one: they add no area, and close the polygon
    rel = torch.where(valid.gather(-1, order)[..., None], rel, rel[..., :1, :])
    inter = torch.where(count >= 3, cross(rel, rel.roll(-1, -2)).sum(-1).abs() / 2, 0.0)
    area_a, area_b = a[..., 2] * a[..., 3], b[..., 2] * b[..., 3]
    iou = inter / (area_a + area_b - inter)
    positive = (a[..., 2] > 0) & (a[..., 3] > 0) & (b[..., 2] > 0) & (b[..., 3] > 0)
    return torch.where(positive, iou, 0.0)


def greedy(suppresses, order):
    """Greedy NMS in score order from the (N, N) suppression matrix (row i: the later boxes that box i
    suppresses, positions in score order). A Python loop over the boxes: numpy's per-element
    overhead is far below torch's."""
    suppresses = suppresses.numpy()
    removed = np.zeros(len(order), dtype=bool)
    keep = []
    for i in range(len(order)):
        if not removed[i]:
            keep.append(i)
            removed |= suppresses[i]
    return order[torch.tensor(keep, dtype=torch.int64)]


def threshold_as_kernel(iou_threshold):
    return float(np.float32(iou_threshold))  # the op's attribute is a float32


def nms_torch_pruned(boxes, scores, iou_threshold):
    """Exact IoU on the pairs (i before j in score order) whose circumscribed circles meet."""
    order = torch.sort(scores, descending=True, stable=True).indices  # equal scores: lower index first
    b = boxes.double()[order]
    n = len(b)
    radius = b[:, 2:4].norm(dim=1) / 2
    near = torch.cdist(b[:, :2], b[:, :2]) <= radius[:, None] + radius[None, :]
    i, j = torch.triu(near, diagonal=1).nonzero().unbind(1)
    c = corners(b)
    iou = paired_iou(b[i], b[j], c[i], c[j])
    suppresses = torch.zeros(n, n, dtype=torch.bool)
    hit = iou > threshold_as_kernel(iou_threshold)
    suppresses[i[hit], j[hit]] = True
    return greedy(suppresses, order), len(i)


def nms_torch_all_pairs(boxes, scores, iou_threshold):
    """Exact IoU on every pair (i before j in score order), ROW_CHUNK rows at a time."""
    order = torch.sort(scores, descending=True, stable=True).indices
    b = boxes.double()[order]
    c = corners(b)
    n = len(b)
    threshold = threshold_as_kernel(iou_threshold)
    suppresses = torch.zeros(n, n, dtype=torch.bool)
    for r0 in range(0, n, ROW_CHUNK):
        rows = slice(r0, min(r0 + ROW_CHUNK, n))
        m = n - r0  # columns r0.. (the lower triangle is never read)
        k = rows.stop - r0
        iou = paired_iou(b[rows, None].expand(k, m, 5), b[None, r0:].expand(k, m, 5),
                         c[rows, None].expand(k, m, 4, 2), c[None, r0:].expand(k, m, 4, 2))
        suppresses[rows, r0:] = torch.triu(iou > threshold, diagonal=1)
    return greedy(suppresses, order)


def table(r: dict) -> None:
    sh = r["shape"]
    print(f"nms_rotated: N={sh['boxes']} detector-like boxes, iou_threshold {sh['iou_threshold']}, float32, "
          f"{r['threads']} threads (medians); {sh['kept']} kept")
    print("  kept indices identical to the torch anchor: " + ", ".join(f"{k} {v}" for k, v in r["identical_keep"].items()))
    print(f"  pairs whose circles meet: {sh['pruned_pairs']} of {sh['all_pairs']}")
    print_ms(r["ms"], 26, "10.2f")
    verdict = "PASS" if r["ratio"] >= TARGETS["ratio"] else "BELOW"
    print(f"  speed-up vs the pruned torch anchor    = {r['ratio']:7.1f}x (target >= {TARGETS['ratio']:g}x) {verdict}")
    if "ratio_all_pairs" in r:
        print(f"  speed-up vs the all-pairs torch anchor = {r['ratio_all_pairs']:7.0f}x (for information)")


def main(argv=None) -> dict:
    p = bench_parser(__doc__, repeats=10, quick="300 boxes, two rounds: a smoke test")
    p.add_argument("--boxes", type=int, default=2000)
    p.add_argument("--iou", type=float, default=0.5, help="iou_threshold")
    p.add_argument("--no-all-pairs", action="store_true", help="skip the all-pairs anchor (tens of seconds)")
    args = p.parse_args(argv)
    if args.quick:
        args.boxes, args.repeats = 300, 2
    torch.set_num_threads(args.threads)

    boxes, scores = detector_like_boxes(args.boxes, torch.Generator().manual_seed(0))
    thr = args.iou

    # agreement first
    ours = opforge.nms_rotated(boxes, scores, thr)
    pruned, pairs = nms_torch_pruned(boxes, scores, thr)
    agreement = {"pruned": torch.equal(ours, pruned)}
    if not args.no_all_pairs:
        t0 = time.perf_counter()
        all_pairs = nms_torch_all_pairs(boxes, scores, thr)
        all_pairs_ms = (time.perf_counter() - t0) * 1e3
        agreement["all_pairs"] = torch.equal(ours, all_pairs)
    if not all(agreement.values()):
        raise SystemExit(f"bench_nms_rotated: the kept indices differ: {agreement}; opforge kept {ours.tolist()}, "
                         f"the pruned anchor {pruned.tolist()}")

    ms = round_robin({"opforge.nms_rotated": lambda: opforge.nms_rotated(boxes, scores, thr),
                      "torch pruned pairs": lambda: nms_torch_pruned(boxes, scores, thr)}, args.repeats)
    r = {
        "threads": args.threads, "quick": args.quick, "targets": TARGETS,
        "shape": {"boxes": args.boxes, "iou_threshold": thr, "dtype": "float32", "kept": len(ours),
                  "pruned_pairs": pairs, "all_pairs": args.boxes * (args.boxes - 1) // 2},
        "identical_keep": agreement,
        "ms": ms,
        "ratio": ms["torch pruned pairs"] / ms["opforge.nms_rotated"],
    }
    if not args.no_all_pairs:
        r["ms"]["torch all pairs (once)"] = all_pairs_ms  # its agreement run: one call of tens of seconds
        r["ratio_all_pairs"] = r["ms"]["torch all pairs (once)"] / ms["opforge.nms_rotated"]
    return report(r, args.json, table)


if __name__ == "__main__":
    main()
