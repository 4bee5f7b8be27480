"""Tutorial 8: a tiny rotated-box detection head: RoI Align over rotated rois, a few training steps,
rotated NMS, and an export with both exporters run in ONNX Runtime at another roi count.

Run it:  .venv/bin/python tutorials/08_rotated_detection.py      (after scripts/bootstrap.sh)

Rotated detectors (mmrotate, detectron2's rotated heads, text detection) pool every rotated roi to
a fixed grid with opforge.roi_align_rotated (mmcv's op: rois are (batch index, cx, cy, w, h, angle)),
score and refine the rois with a small head, then drop duplicates with opforge.nms_rotated (exact
rotated IoU). Here, on synthetic images of filled rotated rectangles of two classes:

  1. the model: two convs (stride 2) -> RoIAlignRotated 7x7 -> two linear layers predicting
     a score per class and the roi's refinement (dx, dy, dw, dh, da) in the roi's own frame
  2. train it a few Adam steps (the op's backward carries the gradient into the convs)
  3. post-process a new image: nms_rotated over all classes, batched_nms_rotated per class
  4. export head + NMS (features and rois in; scores, boxes and kept indices out) with the dynamo
     and the TorchScript exporter, the roi count dynamic
  5. run both in ONNX Runtime (opforge's library) at another roi count and compare with torch

One convention to keep straight: opforge.nms_rotated (like mmcv's) puts a box's width axis along
(cos a, sin a) in image coordinates (y down). roi_align_rotated with clockwise=True samples along
that same axis, so rois and predicted boxes are the same kind of box and go to NMS as they are.
"""

import math
import tempfile
from pathlib import Path

import numpy as np
import torch

import opforge

CLASSES = 2  # class 0 is painted in channel 0, class 1 in channel 1
SIZE = 64  # images are SIZE x SIZE; the features are half that (spatial_scale 0.5)


def render(objects, generator):
    """A (3, SIZE, SIZE) image: each object (cx, cy, w, h, angle, class) a filled rotated rectangle in
    its class's channel, plus noise. Pixel (row i, col j) has its centre at (j + 0.5, i + 0.5)."""
    image = 0.2 * torch.randn(3, SIZE, SIZE, generator=generator)
    centre = torch.arange(SIZE) + 0.5
    py, px = torch.meshgrid(centre, centre, indexing="ij")
    for cx, cy, w, h, a, c in objects.tolist():
        u = (px - cx) * math.cos(a) + (py - cy) * math.sin(a)  # along the width axis (cos a, sin a)
        v = -(px - cx) * math.sin(a) + (py - cy) * math.cos(a)  # along the height axis
        image[int(c)] += ((u.abs() <= w / 2) & (v.abs() <= h / 2)).float()
    return image


def random_objects(count, generator):
    """(count, 6): centre away from the border, 10..24 x 5..10 pixels, angle in [-pi/2, pi/2), class."""
    r = torch.rand(count, 6, generator=generator)
    return torch.stack([12 + 40 * r[:, 0], 12 + 40 * r[:, 1], 10 + 14 * r[:, 2], 5 + 5 * r[:, 3],
                        math.pi * (r[:, 4] - 0.5), (r[:, 5] * CLASSES).floor()], 1)


def proposals(objects, image_index, generator, per_object=6, background=8):
    """Rois as a region proposal network would give them: jittered copies of each object (label: its
    class, target: the object's box) and random boxes elsewhere (label: background, -1)."""
    boxes = objects[:, :5].repeat_interleave(per_object, 0)
    jitter = torch.randn(len(boxes), 5, generator=generator)
    near = torch.stack([boxes[:, 0] + 2 * jitter[:, 0], boxes[:, 1] + 2 * jitter[:, 1],
                        boxes[:, 2] * (1 + 0.15 * jitter[:, 2]).clamp(0.6, 1.5),
                        boxes[:, 3] * (1 + 0.15 * jitter[:, 3]).clamp(0.6, 1.5), boxes[:, 4] + 0.15 * jitter[:, 4]], 1)
    far = random_objects(background, generator)[:, :5]
    rois = torch.cat([near, far])
    labels = torch.cat([objects[:, 5].repeat_interleave(per_object, 0), torch.full((background,), -1.0)]).long()
    targets = torch.cat([boxes, far])  # a background roi's target is unused
    return torch.cat([torch.full((len(rois), 1), float(image_index)), rois], 1), labels, targets


def encode(rois, boxes):
    """The refinement from roi (batch, cx, cy, w, h, a) to box (cx, cy, w, h, a): the centre offset in
    the roi's frame over its size, log size ratios, the angle difference."""
    _, x, y, w, h, a = rois.unbind(1)
    dx, dy = boxes[:, 0] - x, boxes[:, 1] - y
    return torch.stack([(dx * a.cos() + dy * a.sin()) / w, (-dx * a.sin() + dy * a.cos()) / h,
                        (boxes[:, 2] / w).log(), (boxes[:, 3] / h).log(), boxes[:, 4] - a], 1)


def decode(rois, deltas):
    """encode's inverse: the refined boxes (K, 5)."""
    _, x, y, w, h, a = rois.unbind(1)
    ddx, ddy = deltas[:, 0] * w, deltas[:, 1] * h
    return torch.stack([x + ddx * a.cos() - ddy * a.sin(), y + ddx * a.sin() + ddy * a.cos(),
                        w * deltas[:, 2].exp(), h * deltas[:, 3].exp(), a + deltas[:, 4]], 1)


class Backbone(torch.nn.Sequential):
    def __init__(self, channels=16):
        super().__init__(torch.nn.Conv2d(3, channels, 3, padding=1), torch.nn.ReLU(),
                         torch.nn.Conv2d(channels, channels, 3, stride=2, padding=1), torch.nn.ReLU())


class RotatedHead(torch.nn.Module):
    """Features (N, C, H, W) and rois (K, 6) -> class logits (K, CLASSES) and deltas (K, 5)."""

    def __init__(self, channels=16, pool=7, hidden=64):
        super().__init__()
        # clockwise=True: sample along the width axis (cos a, sin a), nms_rotated's convention
        self.pool = opforge.RoIAlignRotated(pool, spatial_scale=0.5, sampling_ratio=2, aligned=True, clockwise=True)
        self.fc = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(channels * pool * pool, hidden),
                                      torch.nn.ReLU())
        self.cls = torch.nn.Linear(hidden, CLASSES)
        self.reg = torch.nn.Linear(hidden, 5)

    def forward(self, features, rois):
        x = self.fc(self.pool(features, rois))
        return self.cls(x), self.reg(x)


class Detector(torch.nn.Module):
    """What is exported: head + post-processing. Scores (sigmoid per class), refined boxes, and two
    sets of kept indices: ``keep`` over all classes (each roi scored by its best class) and
    ``keep_per_class`` over the K * CLASSES (roi, class) candidates, each class on its own."""

    def __init__(self, head, iou_threshold=0.3):
        super().__init__()
        self.head = head
        self.iou_threshold = iou_threshold

    def forward(self, features, rois):
        logits, deltas = self.head(features, rois)
        scores = logits.sigmoid()
        boxes = decode(rois, deltas)
        keep = opforge.nms_rotated(boxes, scores.max(1).values, self.iou_threshold)
        # candidate i * CLASSES + c has class c. expand_as, not expand(len(rois), ...): a Python int taken
        # from a shape can make the dynamo exporter fix the roi count at the example's, silently.
        labels = torch.arange(CLASSES).expand_as(scores).reshape(-1)
        keep_per_class = opforge.batched_nms_rotated(boxes.repeat_interleave(CLASSES, 0), scores.reshape(-1), labels,
                                                     self.iou_threshold)
        return scores, boxes, keep, keep_per_class


torch.manual_seed(0)
g = torch.Generator().manual_seed(0)
workdir = Path(tempfile.mkdtemp(prefix="opforge-tutorial-"))

# --- 1. The model on 8 training images, 3 objects each --------------------------------------------
scenes = [random_objects(3, g) for _ in range(8)]
images = torch.stack([render(objects, g) for objects in scenes])
rois, labels, targets = (torch.cat(t) for t in zip(*(proposals(o, i, g) for i, o in enumerate(scenes))))
backbone, head = Backbone(), RotatedHead()
with torch.no_grad():
    features = backbone(images)
    pooled = head.pool(features, rois)
print(f"1. images {tuple(images.shape)} -> features {tuple(features.shape)}; {len(rois)} rotated rois "
      f"({int((labels >= 0).sum())} on objects) -> roi_align_rotated {tuple(pooled.shape)}")

# --- 2. Train: classify the rois and regress the refinement of those on objects -------------------
parameters = list(backbone.parameters()) + list(head.parameters())
optimiser = torch.optim.Adam(parameters, lr=3e-3)
onehot = torch.nn.functional.one_hot(labels.clamp(min=0), CLASSES).float() * (labels >= 0)[:, None]
positive = labels >= 0
losses = []
for step in range(40):
    optimiser.zero_grad()
    logits, deltas = head(backbone(images), rois)
    loss = (torch.nn.functional.binary_cross_entropy_with_logits(logits, onehot)
            + torch.nn.functional.smooth_l1_loss(deltas[positive], encode(rois[positive], targets[positive]), beta=0.1))
    loss.backward()
    optimiser.step()
    losses.append(loss.item())
    if step % 10 == 0 or step == 39:
        print(f"2. step {step:2d}: loss {loss.item():.4f}")
assert losses[-1] < 0.5 * losses[0], losses
assert backbone[0].weight.grad.abs().sum() > 0  # the gradient went through roi_align_rotated into the convs
backbone.eval()
head.eval()
detector = Detector(head).eval()

# --- 3. Post-process a new image: NMS over all classes and per class ------------------------------
objects = random_objects(3, g)
test_rois, _, _ = proposals(objects, 0, g)
with torch.no_grad():
    features = backbone(render(objects, g)[None])
    scores, boxes, keep, keep_per_class = detector(features, test_rois)
print(f"3. new image, objects (cx, cy, w, h, angle, class): {[[round(v, 1) for v in o] for o in objects.tolist()]}")
print(f"3. {len(test_rois)} rois -> nms_rotated keeps {len(keep)}, batched_nms_rotated over {CLASSES} classes "
      f"keeps {len(keep_per_class)} (roi, class) candidates; with score > 0.5:")
for k in keep_per_class.tolist():
    roi, c = divmod(k, CLASSES)
    if scores[roi, c] > 0.5:
        print(f"   class {c} score {scores[roi, c]:.2f} box {[round(v, 1) for v in boxes[roi].tolist()]}")

# --- 4. Export head + NMS with both exporters; the number of rois dynamic --------------------------
names = dict(input_names=["features", "rois"], output_names=["scores", "boxes", "keep", "keep_per_class"])
args = (features, test_rois)
exported = {
    # verbose=False: no exporter progress lines
    "dynamo": opforge.export(detector, args, workdir / "detector_dynamo.onnx", dynamo=True, verbose=False, **names,
                             dynamic_shapes=(None, {0: torch.export.Dim("rois")})),
    "torchscript": opforge.export(detector, args, workdir / "detector_torchscript.onnx", dynamo=False,
                                  opset_version=17, **names,
                                  dynamic_axes={"rois": {0: "rois"}, "scores": {0: "rois"}, "boxes": {0: "rois"},
                                                "keep": {0: "kept"}, "keep_per_class": {0: "kept_per_class"}}),
}
for name, proto in exported.items():
    custom = sorted({f"{n.domain}::{n.op_type}" for n in proto.graph.node if n.domain == "opforge"})
    shape = [d.dim_param or d.dim_value for d in proto.graph.input[1].type.tensor_type.shape.dim]
    assert shape == ["rois", 6], shape  # the roi count stayed a dimension, not the example's 26
    print(f"4. {name}: exported, custom nodes {custom}, rois input {shape}")

# --- 5. ONNX Runtime at another roi count: a scene with 5 objects -> 5 * 6 + 8 = 38 rois ----------
objects = random_objects(5, g)
other_rois, _, _ = proposals(objects, 0, g)
with torch.no_grad():
    other_features = backbone(render(objects, g)[None])
    expected = [t.numpy() for t in detector(other_features, other_rois)]
feeds = {"features": other_features.numpy(), "rois": other_rois.numpy()}
for name, proto in exported.items():
    got = opforge.ort_session(proto).run(None, feeds)  # registers libopforge_ort for the opforge nodes
    diff = max(float(np.abs(ours - want).max()) for ours, want in zip(got[:2], expected[:2]))
    for ours, want in zip(got[:2], expected[:2]):
        np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-4)  # boxes are in pixels, up to ~64
    for kept, want in zip(got[2:], expected[2:]):
        assert np.array_equal(kept, want), (kept, want)
    print(f"5. {name}: ORT at {len(other_rois)} rois (exported at {len(test_rois)}) matches torch: scores and boxes "
          f"max |diff| = {diff:.1e}; keep {got[2].tolist()} and keep_per_class {got[3].tolist()} identical")
print("   saved:", sorted(p.name for p in workdir.glob("*.onnx")), "in", workdir)
