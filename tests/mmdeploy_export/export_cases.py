"""Writes genuine mmdeploy 1.3.1 exports of five custom ops, their input cases and the outputs of
mmdeploy's own ONNX Runtime library, for tests/test_mmdeploy_exported.py.

Runs INSIDE the throwaway venv build/mmdeploy-venv/venv (python3.11; torch 2.0.1, mmdeploy 1.3.1,
mmcv-lite, onnxruntime 1.15.1; see REQUIREMENTS), never in the main venv:

    build/mmdeploy-venv/venv/bin/python tests/mmdeploy_export/export_cases.py [--out DIR] [--skip-mmdeploy-run]

The graphs come from mmdeploy's own rewriting: every model goes through
``mmdeploy.apis.onnx.export(..., backend='onnxruntime', context_info={'deploy_cfg': ...})``, i.e.
``patch_model`` + ``RewriterContext`` + ``torch.onnx.export`` at opset 11, so the custom nodes are
written by mmdeploy's symbolics (mmdeploy/pytorch/symbolics/grid_sampler.py and
mmdeploy/mmcv/ops/{modulated_deform_conv,nms_rotated,roi_align_rotated,nms_match}.py). The only
thing patched is mmcv-lite's missing compiled extension ``mmcv._ext``: the ops' Python forwards
still run while tracing, so the few kernels they call get small pure-torch stand-ins below; their
values only decide traced shapes (the custom node replaces the whole autograd Function).

Exceptions, named in the manifest's "made_by" of each file:
* ``mmcv::MMCVModulatedDeformConv2d``: mmdeploy never writes the mmcv domain (its rewriter writes
  ``mmdeploy::``; its ORT library registers the kernel in both domains). One file comes from
  mmcv's own symbolic (plain ``torch.onnx.export``, no mmdeploy context), one is a genuine
  mmdeploy export whose node domain was renamed to ``mmcv``.
* NMSRotated / NMSMatch: the models are mmdeploy's ``multiclass_nms_rotated`` /
  ``multiclass_nms_match`` (custom node + mmdeploy's index post-processing); after export the
  custom node's output is also made a graph output (``nms_index``) so that tests can check the
  node itself. Nodes are not touched.
* float16 files: the fp32 export converted the way mmdeploy's ``onnxruntime-fp16`` backend does
  it (``ONNXRuntimeManager.to_backend`` with that config's common_config, i.e. onnxconverter-common's
  ``convert_float_to_float16``).

Then each (file, case) runs in its own process with mmdeploy's
``mmdeploy/lib/libmmdeploy_onnxruntime_ops.so`` in onnxruntime 1.15.1; outputs go in the case's
npz as ``mmdeploy_out_<case>`` (the custom node's output) and ``mmdeploy_out_<case>__<graph
output>`` (other graph outputs); a crash is recorded in the manifest ("segfault", error text),
not raised.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import shutil
import sys
import tempfile
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_OUT = REPO / "tests" / "data" / "mmdeploy"
OPSET = 11
#: what build/mmdeploy-venv gets (tests/test_mmdeploy_exported.py installs exactly this list)
REQUIREMENTS = ["torch==2.0.1", "torchvision==0.15.2", "mmdeploy==1.3.1", "mmengine==0.10.7", "mmcv-lite==2.2.0",
                "onnx==1.17.0", "onnxruntime==1.15.1", "onnxconverter-common==1.16.0", "numpy<2",
                "protobuf<=3.20.2"]


# ---- mmcv-lite has no compiled _ext: pure-torch stand-ins, used only while tracing -----------------

def _install_fake_mmcv_ext() -> None:
    import torch
    import torchvision

    ext = types.ModuleType("mmcv._ext")

    def modulated_deform_conv_forward(input, weight, bias, ones, offset, mask, output, columns, *, kernel_h,
                                      kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group,
                                      deformable_group, with_bias):
        out = torchvision.ops.deform_conv2d(input, offset, weight, bias if with_bias else None,
                                            stride=(stride_h, stride_w), padding=(pad_h, pad_w),
                                            dilation=(dilation_h, dilation_w), mask=mask)
        output.resize_(out.shape).copy_(out)

    def _aa_iou(a, b):  # axis-aligned IoU of (x1, y1, x2, y2) rows
        iw = (torch.minimum(a[2], b[2]) - torch.maximum(a[0], b[0])).clamp(min=0)
        ih = (torch.minimum(a[3], b[3]) - torch.maximum(a[1], b[1])).clamp(min=0)
        inter = iw * ih
        union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
        return float(inter / union) if float(union) > 0 else 0.0

    def nms_rotated(dets, scores, order, dets_sorted, labels, iou_threshold, multi_label):
        # shapes only: the angle is ignored (cx, cy, w, h -> x1, y1, x2, y2)
        xyxy = torch.stack([dets[:, 0] - dets[:, 2] / 2, dets[:, 1] - dets[:, 3] / 2,
                            dets[:, 0] + dets[:, 2] / 2, dets[:, 1] + dets[:, 3] / 2], 1)
        keep = []
        for i in order.tolist():
            if all(_aa_iou(xyxy[i], xyxy[k]) <= iou_threshold for k in keep):
                keep.append(i)
        return torch.tensor(keep, dtype=torch.long)

    def nms_match(dets, iou_threshold):
        order = torch.argsort(dets[:, 4], descending=True, stable=True).tolist()
        alive, groups = set(order), []
        for pos, i in enumerate(order):
            if i not in alive:
                continue
            group = [i]
            for j in order[pos + 1:]:
                if j in alive and _aa_iou(dets[i], dets[j]) >= iou_threshold:
                    alive.discard(j)
                    group.append(j)
            groups.append(group)
        return groups

    def roi_align_rotated_forward(input, rois, output, **kwargs):
        output.zero_()  # values are irrelevant for the trace

    implemented = {f.__name__: f for f in (modulated_deform_conv_forward, nms_rotated, nms_match,
                                           roi_align_rotated_forward)}

    def __getattr__(name):
        if name in implemented:
            return implemented[name]
        if name.startswith("__"):
            raise AttributeError(name)

        def missing(*args, **kwargs):
            raise NotImplementedError(f"mmcv._ext.{name} is not available (mmcv-lite)")
        return missing

    ext.__getattr__ = __getattr__
    sys.modules["mmcv._ext"] = ext


# ---- models ------------------------------------------------------------------------------------

def _models():
    import torch
    import torch.nn.functional as F
    import mmcv.ops
    from mmdeploy.mmcv.ops.nms_match import multiclass_nms_match
    from mmdeploy.mmcv.ops.nms_rotated import multiclass_nms_rotated

    class GridSample(torch.nn.Module):
        def __init__(self, mode, padding_mode, align_corners):
            super().__init__()
            self.kw = dict(mode=mode, padding_mode=padding_mode, align_corners=align_corners)

        def forward(self, input, grid):
            return F.grid_sample(input, grid, **self.kw)

    class MDCN(torch.nn.Module):
        """mmcv.ops.ModulatedDeformConv2d (tuple attrs) or, int_attrs, mmcv.ops.modulated_deform_conv2d
        called with plain ints. Offset and mask are graph inputs: the node's inputs as given."""

        def __init__(self, cin, cout, k, stride=1, padding=0, dilation=1, groups=1, deform_groups=1, bias=True,
                     int_attrs=False):
            super().__init__()
            self.conv = mmcv.ops.ModulatedDeformConv2d(cin, cout, k, stride=stride, padding=padding,
                                                       dilation=dilation, groups=groups,
                                                       deform_groups=deform_groups, bias=bias)
            g = torch.Generator().manual_seed(cin * 100 + cout)
            with torch.no_grad():
                self.conv.weight.copy_(torch.randn(self.conv.weight.shape, generator=g) * 0.3)
                if self.conv.bias is not None:
                    self.conv.bias.copy_(torch.randn(self.conv.bias.shape, generator=g))
            self.int_attrs = int_attrs
            self.ints = (stride, padding, dilation, groups, deform_groups)

        def forward(self, input, offset, mask):
            if self.int_attrs:
                stride, padding, dilation, groups, deform_groups = self.ints
                return mmcv.ops.modulated_deform_conv2d(input, offset, mask, self.conv.weight, self.conv.bias,
                                                        stride, padding, dilation, groups, deform_groups)
            return self.conv(input, offset, mask)

    class RoIAlignRotated(torch.nn.Module):
        def __init__(self, output_size, spatial_scale, sampling_ratio, aligned, clockwise):
            super().__init__()
            self.op = mmcv.ops.RoIAlignRotated(output_size, spatial_scale, sampling_ratio, aligned=aligned,
                                               clockwise=clockwise)

        def forward(self, input, rois):
            return self.op(input, rois)

    class MulticlassNMS(torch.nn.Module):
        """mmdeploy's multiclass_nms_rotated (boxes (N, B, 5)) or multiclass_nms_match (boxes (N, B, 4)),
        scores (N, B, C)."""

        def __init__(self, nms, iou_threshold, score_threshold):
            super().__init__()
            self.nms = nms
            self.kw = dict(iou_threshold=iou_threshold, score_threshold=score_threshold)

        def forward(self, boxes, scores):
            return self.nms(boxes, scores, **self.kw)

    return types.SimpleNamespace(GridSample=GridSample, MDCN=MDCN, RoIAlignRotated=RoIAlignRotated,
                                 NMSRotated=functools.partial(MulticlassNMS, multiclass_nms_rotated),
                                 NMSMatch=functools.partial(MulticlassNMS, multiclass_nms_match))


# ---- input cases -------------------------------------------------------------------------------

def _rng(name: str):
    import numpy as np
    return np.random.default_rng(abs(hash_str(name)) % (2 ** 32))


def hash_str(s: str) -> int:  # stable across processes (str hash is salted)
    h = 0
    for ch in s.encode():
        h = (h * 131 + ch) % (2 ** 61 - 1)
    return h


def grid_cases(name, mode):
    import numpy as np
    r = _rng(name)
    f = np.float32
    cases = {
        "random": {"input": r.standard_normal((2, 3, 5, 6)).astype(f),
                   "grid": r.uniform(-1.3, 1.3, (2, 4, 5, 2)).astype(f)},
        "other_shape": {"input": r.standard_normal((1, 3, 7, 4)).astype(f),
                        "grid": r.uniform(-1.1, 1.1, (1, 3, 3, 2)).astype(f)},
    }
    if mode != "nearest":  # nearest at these points would round exact halves (ambiguous ties)
        special = np.array([-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.5], f)
        gx, gy = np.meshgrid(special, special[::-1])
        cases["boundary_and_far_outside"] = {"input": r.standard_normal((1, 3, 4, 5)).astype(f),
                                             "grid": np.stack([gx, gy], -1)[None].astype(f)}
    return cases


def dcn_cases(name, cin, k, stride, padding, dilation, deform_groups):
    import numpy as np
    r = _rng(name)
    f = np.float32
    kh, kw = k

    def out_size(h, w):
        return ((h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1,
                (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1)

    def case(n, h, w, offset_fn, mask_fn):
        ho, wo = out_size(h, w)
        return {"input": r.standard_normal((n, cin, h, w)).astype(f),
                "offset": offset_fn((n, 2 * deform_groups * kh * kw, ho, wo)).astype(f),
                "mask": mask_fn((n, deform_groups * kh * kw, ho, wo)).astype(f)}

    sigmoid = lambda shape: 1 / (1 + np.exp(-r.standard_normal(shape)))  # noqa: E731
    return {
        "random": case(2, 6, 7, lambda s: r.standard_normal(s) * 1.5, sigmoid),
        "zero_offset_unit_mask": case(1, 5, 5, np.zeros, np.ones),
        # a third of the taps far outside the image, the rest around and across its border
        "partly_outside": case(1, 4, 6, lambda s: r.choice([-9.0, 0.0, 9.0], s) + r.uniform(-2.5, 2.5, s),
                               sigmoid),
    }


def rotated_boxes(r, n, b):
    import numpy as np
    cxy = r.uniform(0, 24, (n, b, 2))
    wh = r.uniform(3, 12, (n, b, 2))
    a = r.uniform(-math.pi / 2, math.pi / 2, (n, b, 1))
    return np.concatenate([cxy, wh, a], -1).astype(np.float32)


def nms_rotated_cases(name, score_threshold):
    import numpy as np
    r = _rng(name)
    f = np.float32
    boxes = rotated_boxes(r, 2, 12)
    ties_boxes = rotated_boxes(r, 2, 8)
    ties_boxes[:, 1] = ties_boxes[:, 0]        # identical boxes (IoU 1)
    ties_boxes[:, 3] = ties_boxes[:, 2] + [0.5, 0.5, 0, 0, 0]  # heavily overlapping
    ties_scores = np.full((2, 8, 3), 0.7, f)   # equal scores
    ties_scores[:, 5:, 1] = 0.9
    ties_scores[:, :, 2] = 0.01
    return {
        "random": {"boxes": boxes, "scores": r.uniform(0, 1, (2, 12, 3)).astype(f)},
        "all_below_threshold": {"boxes": rotated_boxes(r, 2, 6),
                                "scores": r.uniform(0, score_threshold, (2, 6, 3)).astype(f)},
        "ties": {"boxes": ties_boxes, "scores": ties_scores},
        "batch1_one_box": {"boxes": rotated_boxes(r, 1, 1), "scores": np.array([[[0.8, 0.01, 0.5]]], f)},
    }


def xyxy_boxes(r, n, b):
    import numpy as np
    xy = r.uniform(0, 20, (n, b, 2))
    wh = r.uniform(2, 10, (n, b, 2))
    return np.concatenate([xy, xy + wh], -1).astype(np.float32)


def nms_match_cases(name, score_threshold):
    import numpy as np
    r = _rng(name)
    f = np.float32
    base = xyxy_boxes(r, 2, 5)
    clustered = np.concatenate([base, base + r.uniform(-0.6, 0.6, base.shape).astype(f)], 1)  # pairs overlap
    ties = np.repeat(xyxy_boxes(r, 1, 3), 2, axis=1)  # each box twice (IoU 1)
    ties_scores = np.full((1, 6, 3), 0.6, f)
    ties_scores[:, :, 2] = [0.2, 0.9, 0.9, 0.2, 0.5, 0.5]
    disjoint = np.array([[[0, 0, 2, 2], [3, 0, 5, 2], [0, 3, 2, 5], [6, 6, 9, 9]]], f)
    return {
        "random": {"boxes": clustered, "scores": r.uniform(0, 1, (2, 10, 3)).astype(f)},
        "all_below_threshold": {"boxes": clustered, "scores": r.uniform(0, score_threshold, (2, 10, 3)).astype(f)},
        "ties": {"boxes": ties, "scores": ties_scores},
        "disjoint": {"boxes": disjoint, "scores": r.uniform(0.5, 1, (1, 4, 3)).astype(f)},
    }


def roi_cases(name, spatial_scale):
    import numpy as np
    r = _rng(name)
    f = np.float32
    h, w = 8, 9

    def rois(k, n, far=False):
        s = 1.0 / spatial_scale
        cx = r.uniform(0, w, k) * s
        cy = r.uniform(0, h, k) * s
        rw = r.uniform(1, 6, k) * s * (3 if far else 1)
        rh = r.uniform(1, 6, k) * s * (3 if far else 1)
        a = r.uniform(-math.pi, math.pi, k)
        if far:
            cx += r.choice([-1, 1], k) * w * s
        return np.stack([r.integers(0, n, k).astype(np.float64), cx, cy, rw, rh, a], 1).astype(f)

    return {
        "random": {"input": r.standard_normal((2, 3, h, w)).astype(f), "rois": rois(5, 2)},
        "no_rois": {"input": r.standard_normal((1, 3, h, w)).astype(f), "rois": np.zeros((0, 6), f)},
        "large_and_outside": {"input": r.standard_normal((2, 3, h, w)).astype(f), "rois": rois(4, 2, far=True)},
    }


# ---- the exports -------------------------------------------------------------------------------

def deploy_cfg():
    return dict(backend_config=dict(type="onnxruntime"),
                onnx_config=dict(type="onnx", export_params=True, keep_initializers_as_inputs=False,
                                 opset_version=OPSET, save_file="end2end.onnx", input_shape=None,
                                 optimize=True))


def mmdeploy_export(model, args, path: Path, input_names, output_names, dynamic_axes):
    import torch
    from mmdeploy.apis.onnx import export
    cfg = deploy_cfg()
    cfg["onnx_config"].update(input_names=input_names, output_names=output_names, dynamic_axes=dynamic_axes)
    export(model.eval(), tuple(torch.from_numpy(a) for a in args), str(path.with_suffix("")),
           backend="onnxruntime", context_info=dict(deploy_cfg=cfg), input_names=input_names,
           output_names=output_names, opset_version=OPSET, dynamic_axes=dynamic_axes,
           keep_initializers_as_inputs=False)


def expose_node_output(path: Path, op_type: str, name: str = "nms_index") -> None:
    """Makes the custom node's output a graph output too (nodes untouched)."""
    import onnx
    from onnx import TensorProto, helper
    model = onnx.load(str(path))
    (node,) = [n for n in model.graph.node if n.op_type == op_type]
    cols = 3 if op_type == "NMSRotated" else 4
    model.graph.output.append(helper.make_tensor_value_info(node.output[0], TensorProto.INT64, ["num_selected", cols]))
    # a stable name for the tests: an Identity would add a node, so rename the value in place
    old = node.output[0]
    for n in model.graph.node:
        n.input[:] = [name if i == old else i for i in n.input]
        n.output[:] = [name if o == old else o for o in n.output]
    for vi in list(model.graph.output) + list(model.graph.value_info):
        if vi.name == old:
            vi.name = name
    onnx.save(model, str(path))


def rename_domain(src: Path, dst: Path, op_type: str, domain: str) -> None:
    import onnx
    model = onnx.load(str(src))
    for n in model.graph.node:
        if n.op_type == op_type:
            n.domain = domain
    used = {n.domain for n in model.graph.node}
    kept = [o for o in model.opset_import if o.domain in ("", "ai.onnx") or o.domain in used]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    if not any(o.domain == domain for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(domain, 1))
    onnx.save(model, str(dst))


def to_fp16(src: Path, dst: Path) -> None:
    """mmdeploy's onnxruntime-fp16 backend conversion (configs/_base_/backends/onnxruntime-fp16.py)."""
    from mmdeploy.backend.onnxruntime.backend_manager import ONNXRuntimeManager
    cfg = dict(backend_config=dict(type="onnxruntime", precision="fp16",
                                   common_config=dict(min_positive_val=1e-7, max_finite_val=1e4, keep_io_types=False,
                                                      disable_shape_infer=False, op_block_list=None,
                                                      node_block_list=None)),
               onnx_config=deploy_cfg()["onnx_config"])
    shutil.copy(src, dst)
    ONNXRuntimeManager.to_backend([str(dst)], str(dst.parent), cfg)


IMG_AXES = {0: "batch", 2: "height", 3: "width"}


def build(out: Path, M) -> dict:
    """Exports every file; returns {file: entry} (entry without the mmdeploy run results)."""
    import numpy as np
    import torch
    files = {}

    MMDEPLOY = ("mmdeploy.apis.onnx.export(model, args, prefix, backend='onnxruntime', opset_version=11, "
                "context_info={'deploy_cfg': ...}) (patch_model + RewriterContext + torch.onnx.export)")

    def export(fname, op, model, cases, input_names, output_names, dynamic_axes, model_desc, exposed=None):
        """mmdeploy-exports ``model`` (traced on the "random" case) into ``fname``, the custom node's
        output also made graph output ``exposed`` if given, and records the file and its cases."""
        first = cases["random"]
        mmdeploy_export(model, tuple(first[k] for k in input_names), out / fname, input_names, output_names,
                        dynamic_axes)
        made_by = MMDEPLOY
        if exposed:
            expose_node_output(out / fname, op, exposed)
            made_by += f"; then the node's output also made graph output {exposed!r}"
        np.savez_compressed((out / fname).with_suffix(".npz"),
                            **{f"{c}__{k}": v for c, arrays in cases.items() for k, v in arrays.items()})
        files[fname] = dict(op=op, model=model_desc, cases=list(cases), made_by=made_by,
                            node_output=exposed or "output")

    # 1. grid_sampler: every mode x padding x align_corners
    for mode in ("bilinear", "nearest", "bicubic"):
        for pad in ("zeros", "border", "reflection"):
            for ac in (False, True):
                fname = f"grid_sampler_{mode}_{pad}_ac{int(ac)}.onnx"
                export(fname, "grid_sampler", M.GridSample(mode, pad, ac), grid_cases(fname, mode), ["input", "grid"],
                       ["output"], {"input": IMG_AXES, "grid": {0: "batch", 1: "out_height", 2: "out_width"},
                                    "output": {0: "batch", 2: "out_height", 3: "out_width"}},
                       f"torch.nn.functional.grid_sample(input, grid, mode={mode!r}, padding_mode={pad!r}, "
                       f"align_corners={ac})")

    # 2. MMCVModulatedDeformConv2d
    dcn_specs = [
        # name, cin, cout, k, stride, padding, dilation, groups, deform_groups, bias, expectation
        ("dcn_bias", 8, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1, 1, True, "(C/groups)*kh*kw = 72"),
        ("dcn_nobias_stride_pad_dil", 8, 6, (2, 3), (2, 1), (2, 1), (2, 1), 1, 2, False,
         "(C/groups)*kh*kw = 48; stride/padding/dilation (2, 1), kernel 2x3, deform_groups 2"),
        ("dcn_groups2_deform_groups2", 16, 8, (3, 3), (1, 1), (1, 1), (1, 1), 2, 2, True,
         "(C/groups)*kh*kw = 72; groups 2 with deform_groups 2"),
        ("dcn_groups2_deform_groups1", 8, 4, (3, 3), (1, 1), (1, 1), (1, 1), 2, 1, True,
         "(C/groups)*kh*kw = 36 (not a multiple of 8); groups 2"),
        ("dcn_k_not_multiple_of_8", 3, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1, 1, True,
         "(C/groups)*kh*kw = 27 (not a multiple of 8)"),
    ]
    dcn_axes = {"input": IMG_AXES, "offset": IMG_AXES, "mask": IMG_AXES, "output": IMG_AXES}
    for name, cin, cout, k, stride, padding, dilation, groups, dg, bias, note in dcn_specs:
        fname = f"{name}.onnx"
        cases = dcn_cases(fname, cin, k, stride, padding, dilation, dg)
        model = M.MDCN(cin, cout, k, stride, padding, dilation, groups, dg, bias)
        export(fname, "MMCVModulatedDeformConv2d", model, cases, ["input", "offset", "mask"], ["output"], dcn_axes,
               f"mmcv.ops.ModulatedDeformConv2d({cin}, {cout}, {k}, stride={stride}, padding={padding}, "
               f"dilation={dilation}, groups={groups}, deform_groups={dg}, bias={bias}); {note}")
        if name == "dcn_groups2_deform_groups2":
            renamed = "mmcv_domain_dcn_groups2_deform_groups2.onnx"
            rename_domain(out / fname, out / renamed, "MMCVModulatedDeformConv2d", "mmcv")
            shutil.copy(out / f"{name}.npz", out / renamed.replace(".onnx", ".npz"))
            files[renamed] = dict(files[fname], made_by=f"{fname} (mmdeploy export) with the node's domain renamed "
                                  "mmdeploy -> mmcv (mmdeploy never writes this op in the mmcv domain)")
        if name == "dcn_bias":
            # mmcv's own symbolic writes mmcv::MMCVModulatedDeformConv2d: plain torch.onnx.export, no mmdeploy
            mfile = "mmcv_domain_dcn_bias.onnx"
            first = cases["random"]
            torch.onnx.export(model.eval(), tuple(torch.from_numpy(first[k]) for k in ("input", "offset", "mask")),
                              str(out / mfile), opset_version=OPSET, input_names=["input", "offset", "mask"],
                              output_names=["output"], dynamic_axes=dcn_axes)
            shutil.copy(out / f"{name}.npz", out / mfile.replace(".onnx", ".npz"))
            files[mfile] = dict(files[fname], made_by="mmcv-lite 2.2.0's own ModulatedDeformConv2dFunction.symbolic "
                                "via plain torch.onnx.export(opset_version=11) (mmdeploy never writes the mmcv domain)")

    # INT attributes: mmcv.ops.modulated_deform_conv2d called with plain ints
    fname = "dcn_int_attrs.onnx"
    export(fname, "MMCVModulatedDeformConv2d", M.MDCN(8, 4, (3, 3), 1, 1, 1, 1, 1, True, int_attrs=True),
           dcn_cases(fname, 8, (3, 3), (1, 1), (1, 1), (1, 1), 1), ["input", "offset", "mask"], ["output"], dcn_axes,
           "mmcv.ops.modulated_deform_conv2d(input, offset, mask, weight (4, 8, 3, 3), bias, 1, 1, 1, 1, 1): "
           "plain ints -> INT attributes")

    # 3. and 5.: mmdeploy's multiclass NMS functions, the custom node's output also made graph output
    nms_axes = {"boxes": {0: "batch", 1: "num_boxes"}, "scores": {0: "batch", 1: "num_boxes"},
                "dets": {0: "batch", 1: "num_dets"}, "labels": {0: "batch", 1: "num_dets"}}

    def export_nms(op, name, model, make_cases, thresholds, function, about):
        for iou, score in thresholds:
            fname = f"{name}_iou{iou}_score{score}.onnx"
            export(fname, op, model(iou, score), make_cases(fname, score), ["boxes", "scores"], ["dets", "labels"],
                   nms_axes, f"{function}(boxes, scores, iou_threshold={iou}, score_threshold={score}); {about}",
                   exposed="nms_index")

    # 3. NMSRotated (mmdeploy.mmcv.ops.nms_rotated.multiclass_nms_rotated)
    export_nms("NMSRotated", "nms_rotated", M.NMSRotated, nms_rotated_cases, ((0.1, 0.05), (0.5, 0.3)),
               "mmdeploy.mmcv.ops.nms_rotated.multiclass_nms_rotated",
               "boxes (N, B, 5) = (cx, cy, w, h, angle), scores (N, B, C) transposed to (N, C, B) before the node")

    # 4. MMCVRoIAlignRotated
    for out_size, scale, ratio, aligned, clockwise in (((3, 2), 0.5, 2, True, False), ((2, 2), 1.0, 0, False, True),
                                                       ((4, 3), 0.25, 0, True, True), ((2, 3), 1.0, 2, False, False)):
        fname = (f"roi_align_rotated_{out_size[0]}x{out_size[1]}_scale{scale}_ratio{ratio}_aligned{int(aligned)}"
                 f"_clockwise{int(clockwise)}.onnx")
        export(fname, "MMCVRoIAlignRotated", M.RoIAlignRotated(out_size, scale, ratio, aligned, clockwise),
               roi_cases(fname, scale), ["input", "rois"], ["output"],
               {"input": IMG_AXES, "rois": {0: "num_rois"}, "output": {0: "num_rois"}},
               f"mmcv.ops.RoIAlignRotated({out_size}, {scale}, {ratio}, aligned={aligned}, clockwise={clockwise}); "
               "rois (K, 6) = (batch index, cx, cy, w, h, angle)")

    # 5. NMSMatch (mmdeploy.mmcv.ops.nms_match.multiclass_nms_match)
    export_nms("NMSMatch", "nms_match", M.NMSMatch, nms_match_cases, ((0.5, 0.05), (0.3, 0.4)),
               "mmdeploy.mmcv.ops.nms_match.multiclass_nms_match",
               "boxes (N, B, 4) = (x1, y1, x2, y2), scores (N, B, C) transposed to (N, C, B) before the node; the "
               "thresholds are float initializers")

    # float16: mmdeploy's onnxruntime-fp16 conversion of a few fp32 exports
    for src in ("grid_sampler_bilinear_zeros_ac0.onnx", "grid_sampler_bicubic_border_ac1.onnx", "dcn_bias.onnx",
                "roi_align_rotated_3x2_scale0.5_ratio2_aligned1_clockwise0.onnx"):
        dst = src.replace(".onnx", "_fp16.onnx")
        to_fp16(out / src, out / dst)
        with np.load(out / src.replace(".onnx", ".npz")) as z:
            keep = [c for c in files[src]["cases"] if c != "boundary_and_far_outside"]
            arrays = {k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in z.items()
                      if k.split("__")[0] in keep}
        np.savez_compressed(out / dst.replace(".onnx", ".npz"), **arrays)
        files[dst] = dict(files[src], cases=keep, made_by=f"{src} converted by mmdeploy's onnxruntime-fp16 backend "
                          "(ONNXRuntimeManager.to_backend, precision='fp16': onnxconverter-common "
                          "convert_float_to_float16, keep_io_types=False)")
    return files


# ---- reading the node forms back -----------------------------------------------------------------

def node_form(path: Path, op: str) -> dict:
    import onnx
    import onnx.numpy_helper
    import onnx.shape_inference
    from onnx import helper
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))  # types of the intermediate values
    (node,) = [n for n in model.graph.node if n.op_type == op]
    constants = {n.output[0]: n.attribute[0].t for n in model.graph.node
                 if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"}
    attrs = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        attrs[a.name] = {"type": onnx.AttributeProto.AttributeType.Name(a.type),
                         "value": list(v) if isinstance(v, (list, tuple)) or a.type == a.INTS else v}
    types_ = {vi.name: onnx.TensorProto.DataType.Name(vi.type.tensor_type.elem_type)
              for vi in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info)}
    inits = {i.name: onnx.TensorProto.DataType.Name(i.data_type) for i in model.graph.initializer}

    def describe(i):
        d = {"name": i, "dtype": types_.get(i) or inits.get(i) or "?", "initializer": i in inits}
        if i in constants:
            t = constants[i]
            d.update(constant=onnx.numpy_helper.to_array(t).tolist(), dtype=onnx.TensorProto.DataType.Name(t.data_type),
                     shape=list(t.dims), made_by="Constant node")
        return d
    return {"domain": node.domain, "op_type": node.op_type, "attrs": attrs,
            "inputs": [describe(i) for i in node.input],
            "outputs": [{"name": o, "dtype": types_.get(o, "?")} for o in node.output],
            "opset_import": {o.domain or "ai.onnx": o.version for o in model.opset_import},
            "graph_inputs": [i.name for i in model.graph.input],
            "graph_outputs": [o.name for o in model.graph.output],
            "nodes": [f"{n.domain + '::' if n.domain else ''}{n.op_type}" for n in model.graph.node]}


# ---- mmdeploy's own library, one case per process -----------------------------------------------

def mmdeploy_library() -> str:
    import mmdeploy
    return str(Path(mmdeploy.__file__).parent / "lib" / "libmmdeploy_onnxruntime_ops.so")


def run_one(model: str, npz: str, case: str, result: str, library: str) -> None:
    """Runs one case with mmdeploy's library; writes its outputs to ``result``."""
    import numpy as np
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.register_custom_ops_library(library)
    so.log_severity_level = 3
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    with np.load(npz) as z:
        feeds = {i.name: z[f"{case}__{i.name}"] for i in sess.get_inputs()}
    outs = sess.run(None, feeds)
    np.savez(result, **{o.name: v for o, v in zip(sess.get_outputs(), outs)})


def _case_process(model: str, npz: str, case: str, result: str, library: str, error: str) -> None:
    import os
    import traceback
    try:
        run_one(model, npz, case, result, library)
    except BaseException:
        Path(error).write_text(traceback.format_exc())
        os._exit(1)


def run_with_mmdeploy(out: Path, files: dict) -> None:
    """Each case in a process of its own (mmdeploy's library crashes on some), forked from a server
    that has numpy and onnxruntime imported and no session yet (multiprocessing's forkserver):
    starting a fresh interpreter per case took ~40 s of the 110 cases' ~45."""
    import multiprocessing
    import signal

    import numpy as np
    lib = mmdeploy_library()
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["numpy", "onnxruntime"])
    with tempfile.TemporaryDirectory() as tmp:
        for fname, entry in files.items():
            statuses, stored = {}, {}
            for case in entry["cases"]:
                result, error = Path(tmp) / f"{fname}-{case}.npz", Path(tmp) / f"{fname}-{case}.error"
                process = context.Process(target=_case_process, args=(
                    str(out / fname), str(out / fname.replace(".onnx", ".npz")), case, str(result), lib, str(error)))
                process.start()
                process.join(300)
                if process.exitcode is None:
                    process.kill()
                    process.join()
                    statuses[case] = "timeout"
                elif process.exitcode == 0:
                    statuses[case] = "ok"
                    with np.load(result) as z:
                        for k, v in z.items():
                            key = f"mmdeploy_out_{case}" if k == entry["node_output"] else f"mmdeploy_out_{case}__{k}"
                            stored[key] = v
                elif process.exitcode < 0:
                    sig = signal.Signals(-process.exitcode).name
                    statuses[case] = "segfault" if sig == "SIGSEGV" else f"killed by {sig}"
                else:
                    text = error.read_text() if error.exists() else ""
                    err = text[text.rfind("Traceback"):].strip().splitlines()[-3:]
                    statuses[case] = "error: " + (" ".join(ln.strip() for ln in err) or f"exit {process.exitcode}")[:400]
            npz = out / fname.replace(".onnx", ".npz")
            with np.load(npz) as z:
                arrays = dict(z.items())
            arrays.update(stored)
            np.savez_compressed(npz, **arrays)
            vals = set(statuses.values())
            entry["mmdeploy_status"] = vals.pop() if len(vals) == 1 else "mixed"
            entry["mmdeploy_case_status"] = statuses
            print(f"{fname}: {statuses}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--skip-mmdeploy-run", action="store_true",
                        help="export only; do not run mmdeploy's library on the cases")
    args = parser.parse_args()

    import warnings
    warnings.filterwarnings("ignore")
    _install_fake_mmcv_ext()
    import logging
    import mmcv
    import mmdeploy
    import mmengine
    import numpy as np
    import onnx
    import onnxruntime
    import torch
    import torchvision
    from mmdeploy.utils import get_root_logger
    get_root_logger().setLevel(logging.ERROR)
    torch.manual_seed(0)

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("*.onnx")) + list(out.glob("*.npz")):
        old.unlink()
    files = build(out, _models())
    for fname, entry in files.items():
        form = node_form(out / fname, entry["op"])
        entry.update(domain=form.pop("domain"), op_type=form.pop("op_type"), node=form)
    if not args.skip_mmdeploy_run:
        run_with_mmdeploy(out, files)
    import onnxconverter_common
    manifest = {
        "about": "Genuine mmdeploy 1.3.1 ONNX exports (see tests/mmdeploy_export/export_cases.py); per file: the "
                 "custom node's form, the input cases (npz keys '<case>__<graph input>'), and mmdeploy's own "
                 "libmmdeploy_onnxruntime_ops.so outputs (npz keys 'mmdeploy_out_<case>' = the custom node's "
                 "output, 'mmdeploy_out_<case>__<graph output>' = the other graph outputs).",
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "torchvision": torchvision.__version__, "mmdeploy": mmdeploy.__version__,
                     "mmcv": f"mmcv-lite {mmcv.__version__}", "mmengine": mmengine.__version__,
                     "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
                     "onnxconverter_common": onnxconverter_common.__version__, "numpy": np.__version__},
        "opset": OPSET,
        "patched": "mmcv-lite has no compiled mmcv._ext: modulated_deform_conv_forward (torchvision deform_conv2d), "
                   "nms_rotated (angle-free greedy stand-in), nms_match (greedy), roi_align_rotated_forward (zeros) "
                   "are pure-torch stand-ins used only while tracing; the exported nodes come from mmdeploy's "
                   "symbolics",
        "mmdeploy_library": "mmdeploy/lib/libmmdeploy_onnxruntime_ops.so of the mmdeploy 1.3.1 wheel, in "
                            f"onnxruntime {onnxruntime.__version__}, one subprocess per case",
        "files": files,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    print(f"wrote {len(files)} files, {sum(len(e['cases']) for e in files.values())} cases into {out}")


if __name__ == "__main__":
    main()
