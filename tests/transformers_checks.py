"""transformers' own detectors under ``opforge.patch_transformers()``, checked against the stock
transformers path; run by tests/test_transformers.py with the python of a venv that has
transformers (build/transformers-venvs/*/venv), never imported by pytest itself.

    python tests/transformers_checks.py MODEL CHECK[,CHECK...] OUT.json

MODEL: one of MODELS (tiny configs, random init, no download). CHECK: one of CHECKS (eager, grads,
grads_at_init, export, attention_backends, frozen_backbone, kernels). Writes one JSON object
{check: result} to OUT.json (the exporters print to stdout); a check that raises reports
{"error": traceback} instead of stopping the others.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # random init from configs: nothing to download
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import opforge  # noqa: E402
from opforge import transformers_patch  # noqa: E402

IMAGE = (2, 3, 96, 128)  # batch 2, non-square: a swapped H/W would show (Swin: a multiple of its windows)


# ---- the models ------------------------------------------------------------------------------------


def _resnet(out_features, hidden_sizes=(8, 16, 16, 16)):
    from transformers import ResNetConfig

    return ResNetConfig(embedding_size=8, hidden_sizes=list(hidden_sizes), depths=[1, 1, 1, 1], layer_type="basic",
                        out_features=out_features)


def deformable_detr():
    from transformers import DeformableDetrConfig, DeformableDetrForObjectDetection

    config = DeformableDetrConfig(
        backbone_config=_resnet(["stage2", "stage3", "stage4"]), d_model=32, encoder_layers=1, decoder_layers=2,
        encoder_ffn_dim=32, decoder_ffn_dim=32, encoder_attention_heads=2, decoder_attention_heads=2, num_queries=10,
        num_labels=3, encoder_n_points=2, decoder_n_points=2)
    return DeformableDetrForObjectDetection(config), ("logits", "pred_boxes")


def _rt_detr_config(config_class, decoder_n_points=2, **extra):
    """A tiny RT-DETR-family config (RT-DETR, RT-DETR v2, D-FINE: the same sizes) on a tiny ResNet."""
    from transformers import RTDetrResNetConfig

    backbone = RTDetrResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1],
                                  layer_type="basic", out_features=["stage2", "stage3", "stage4"])
    return config_class(
        backbone_config=backbone, encoder_in_channels=[16, 16, 16], encoder_hidden_dim=32, encoder_ffn_dim=32,
        encoder_attention_heads=2, d_model=32, decoder_in_channels=[32, 32, 32], decoder_ffn_dim=32, decoder_layers=2,
        decoder_attention_heads=2, decoder_n_points=decoder_n_points, num_queries=10, num_labels=3, num_denoising=0,
        initializer_range=0.2, **extra)


def rt_detr():
    from transformers import RTDetrConfig, RTDetrForObjectDetection

    return RTDetrForObjectDetection(_rt_detr_config(RTDetrConfig)), ("logits", "pred_boxes")


def _mask2former(backbone_config):
    """A tiny Mask2Former on ``backbone_config``."""
    from transformers import Mask2FormerConfig, Mask2FormerForUniversalSegmentation

    config = Mask2FormerConfig(
        backbone_config=backbone_config, feature_size=32, mask_feature_size=32, hidden_dim=32,
        encoder_feedforward_dim=32, encoder_layers=1, decoder_layers=2, num_attention_heads=2, dim_feedforward=32,
        num_queries=10, num_labels=3)
    return Mask2FormerForUniversalSegmentation(config), ("class_queries_logits", "masks_queries_logits")


def mask2former():
    return _mask2former(_resnet(["stage1", "stage2", "stage3", "stage4"]))


def mask2former_swin():
    """Mask2Former on its default backbone family, Swin (the other Mask2Former uses a ResNet)."""
    from transformers import SwinConfig

    return _mask2former(SwinConfig(image_size=128, patch_size=4, embed_dim=16, depths=[1, 1, 1, 1],
                                   num_heads=[1, 1, 2, 2], window_size=4,
                                   out_features=["stage1", "stage2", "stage3", "stage4"]))


def rt_detr_v2():
    from transformers import RTDetrV2Config, RTDetrV2ForObjectDetection

    return RTDetrV2ForObjectDetection(_rt_detr_config(RTDetrV2Config)), ("logits", "pred_boxes")


def _d_fine(method: str):
    from transformers import DFineConfig, DFineForObjectDetection

    config = _rt_detr_config(DFineConfig, decoder_n_points=[3, 1, 2], decoder_method=method, lqe_hidden_dim=8,
                             max_num_bins=8)
    return DFineForObjectDetection(config), ("logits", "pred_boxes")


def d_fine():
    """D-FINE with per-level point counts [3, 1, 2] (v2's padded path) and bilinear sampling."""
    return _d_fine("default")


def d_fine_discrete():
    """D-FINE with v2's "discrete" sampling: stays transformers' own."""
    return _d_fine("discrete")


MODELS = {"deformable_detr": deformable_detr, "rt_detr": rt_detr, "mask2former": mask2former,
          "mask2former_swin": mask2former_swin, "rt_detr_v2": rt_detr_v2, "d_fine": d_fine,
          "d_fine_discrete": d_fine_discrete}


def build(name: str, dtype=torch.float32, like_trained: bool = True):
    """The model in eval mode, random init (seeded) made like a trained one (_like_trained); the
    names of the outputs compared; the image."""
    torch.manual_seed(0)
    model, outputs = MODELS[name]()
    if like_trained:
        _like_trained(model)
    model = model.to(dtype).eval()
    image = torch.randn(IMAGE, generator=torch.Generator().manual_seed(1)).to(dtype)
    return model, outputs, image


def _like_trained(model) -> None:
    # transformers initialises several parameters to one value throughout: the deformable
    # attention's sampling_offsets and attention_weights weights are zero (with an integer ring of
    # offset biases), score heads start from one prior bias, norms from ones and zeros. A trained
    # model has none of that, and two artefacts of it would decide these checks instead of MSDA:
    # * every encoder sampling point lies exactly on a pixel grid line, where bilinear sampling has
    #   a kink and the gradient is one-sided (opforge's kernel takes grid_sample's side there:
    #   check_grads_at_init tests that on the unperturbed model);
    # * RT-DETR's encoder scores every anchor the same, so its top-k query selection is decided by
    #   how torch and ONNX Runtime each break ties.
    # Small noise on each such parameter removes both, as training does.
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.numel() > 1 and bool((parameter == parameter.flatten()[0]).all()):
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)


def run(model, outputs, image) -> list:
    result = model(pixel_values=image)
    return [getattr(result, o) for o in outputs]


class OpCounter(TorchDispatchMode):
    """Counts the ops that run: which MSDA implementation ran, opforge's or grid_sample."""

    def __init__(self):
        super().__init__()
        self.counts: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))

    def msda(self) -> dict:
        return {"opforge": self.counts.get("opforge::ms_deform_attn", 0),
                "grid_sampler": self.counts.get("aten::grid_sampler_2d", 0),
                "index": self.counts.get("aten::index", 0)}  # v2's discrete sampling is a gather


def counted(model, outputs, image):
    with torch.no_grad(), OpCounter() as counter:
        values = run(model, outputs, image)
    return values, counter.msda()


def _max_abs(a, b) -> float:
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b))


def _routed_objects() -> dict:
    """Every object the patch replaces, as transformers has it now (to check undo restores each)."""
    import importlib

    import transformers

    objects = {}
    for module_name in transformers_patch._modules_with_msda(transformers):
        module = importlib.import_module(module_name)
        for key, value in vars(module).items():
            if key in (transformers_patch._FUNCTION, transformers_patch._FUNCTION_V2):
                objects[f"{module_name}.{key}"] = value
            elif isinstance(value, type) and value.__module__ == module_name:
                for attribute in ("forward", "ms_deformable_attn_core"):
                    if attribute in value.__dict__:
                        objects[f"{module_name}.{key}.{attribute}"] = value.__dict__[attribute]
    return objects


# ---- the checks ------------------------------------------------------------------------------------


def check_eager(name: str) -> dict:
    model, outputs, image = build(name)
    before = _routed_objects()
    stock, stock_counts = counted(model, outputs, image)
    with opforge.patch_transformers() as patch:
        again = opforge.patch_transformers() is patch
        patched, patched_counts = counted(model, outputs, image)
        during = _routed_objects()
    after = _routed_objects()
    undone, undone_counts = counted(model, outputs, image)
    return {
        "routed": patch.patched, "skipped": patch.skipped, "same_handle_twice": again,
        "stock_counts": stock_counts, "patched_counts": patched_counts, "undone_counts": undone_counts,
        "max_abs_diff": _max_abs(stock, patched), "scale": max(float(v.abs().max()) for v in stock),
        "undone_bitwise_equal": all(torch.equal(a, b) for a, b in zip(stock, undone)),
        "objects_replaced": sorted(k for k in before if during.get(k) is not before[k]),
        "objects_not_restored": sorted(k for k in before if after.get(k) is not before[k]),
        "active_after_undo": patch.active,
    }


def _gradients(model, outputs, image) -> dict:
    image = image.clone().requires_grad_()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(4)  # the same dropout masks for both sides (neither MSDA draws random numbers)
    values = run(model, outputs, image)
    weights = torch.Generator().manual_seed(3)
    loss = sum((v * torch.randn(v.shape, generator=weights, dtype=v.dtype)).sum() for v in values)
    loss.backward()
    grads = {"pixel_values": image.grad.clone()}
    grads.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    return grads


def check_grads(name: str) -> dict:
    model, outputs, image = build(name, torch.float64)
    model.train()  # fine-tuning, dropout included
    stock = _gradients(model, outputs, image)
    with opforge.patch_transformers(), OpCounter() as counter:
        patched = _gradients(model, outputs, image)
    differences = {k: float((stock[k] - patched[k]).abs().max()) for k in stock if k in patched}
    scales = {k: float(stock[k].abs().max()) for k in stock}
    worst = max(differences, key=differences.get)
    return {"same_parameters": sorted(stock) == sorted(patched), "parameters": len(stock),
            "max_abs_diff": differences[worst], "max_scale": max(scales.values()), "worst": worst,
            "worst_scale": scales[worst], "counts": counter.msda(),
            "backward_ops": counter.counts.get("opforge::_ms_deform_attn_backward", 0)}


def check_grads_at_init(name: str) -> dict:
    """Gradients of transformers' own initialisation, where the encoder's sampling points lie on
    the pixel grid (see _like_trained): which gradients differ from stock, and by how much."""
    model, outputs, image = build(name, torch.float64, like_trained=False)
    model.train()
    stock = _gradients(model, outputs, image)
    with opforge.patch_transformers():
        patched = _gradients(model, outputs, image)
    differences = {k: float((stock[k] - patched[k]).abs().max()) for k in stock}
    scale = max(float(g.abs().max()) for g in stock.values())
    return {"differing": sorted(k for k, d in differences.items() if d > 1e-10 * scale),
            "max_abs_diff_elsewhere": max(d for k, d in differences.items() if "sampling_offsets" not in k),
            "max_abs_diff": max(differences.values()), "max_scale": scale}


class _Wrapped(torch.nn.Module):
    """The model with tensor outputs only, for the exporters."""

    def __init__(self, model, outputs):
        super().__init__()
        self.model, self.outputs = model, outputs

    def forward(self, pixel_values):
        return tuple(run(self.model, self.outputs, pixel_values))


def _grid_types(proto) -> list:
    """The element types (ONNX names) of the grids of the graph's GridSample nodes, by inference."""
    import onnx

    if not any(n.op_type == "GridSample" for n in proto.graph.node):
        return []
    inferred = onnx.shape_inference.infer_shapes(proto)
    types = {v.name: v.type.tensor_type.elem_type for v in list(inferred.graph.value_info) + list(inferred.graph.input)}
    return sorted({onnx.TensorProto.DataType.Name(types.get(n.input[1], 0))
                   for n in inferred.graph.node if n.op_type == "GridSample"})


def _export_and_run(wrapped, image, dynamo: bool, **options) -> dict:
    try:
        proto = opforge.export(wrapped, (image,), dynamo=dynamo, input_names=["pixel_values"], **options)
    except Exception as e:  # the stock export may fail: reported, and the test says which may
        return {"exported": False, "error": f"{type(e).__name__}: {str(e)[-6000:]}"}
    nodes = [n.op_type for n in proto.graph.node] + [n.op_type for f in proto.functions for n in f.node]
    result = {"exported": True, "opforge_nodes": nodes.count("ms_deform_attn"),
              "grid_samples": nodes.count("GridSample"), "grid_types": _grid_types(proto)}
    try:
        session = opforge.ort_session(proto)
        result["outputs"] = session.run(None, {session.get_inputs()[0].name: image.numpy()})
    except Exception as e:
        result.update(ran=False, error=f"{type(e).__name__}: {str(e)[:1500]}")
        return result
    result["ran"] = True
    return result


# The v2 families' attention checks the levels' sizes with a tensor assertion (aten::_is_all_true),
# which the dynamo exporter cannot translate, stock or patched; opforge.export's aten_fallback takes it.
NEEDS_ATEN_FALLBACK = {"rt_detr_v2", "d_fine", "d_fine_discrete"}


def check_export(name: str) -> dict:
    """Each exporter, stock and patched, run in ONNX Runtime; the errors are against the eager stock
    model in float32 (what was exported) and in float64 (closer to the exact values; RT-DETR's
    top-k query selection can pick other queries in float32 than in float64, so there it is only
    reported)."""
    model, outputs, image = build(name)
    reference_model, _, image64 = build(name, torch.float64)
    with torch.no_grad():
        eager = [v.numpy() for v in run(model, outputs, image)]
        truth = [v.numpy() for v in run(reference_model, outputs, image64)]
    report = {"scale": max(float(np.abs(t).max()) for t in eager),
              "eager_float32_vs_float64": max(float(np.abs(e - t).max()) for e, t in zip(eager, truth))}
    for dynamo in (False, True):
        exporter = "dynamo" if dynamo else "torchscript"
        sides = {}
        if not (dynamo and name in NEEDS_ATEN_FALLBACK):
            # (those fail in dynamo without the fallback, stock as patched: the patched failure and
            # the fallback's export say it; a stock failure would add 17 s and nothing else)
            sides["stock"] = _export_and_run(_Wrapped(model, outputs), image, dynamo)
        with opforge.patch_transformers():
            sides["patched"] = _export_and_run(_Wrapped(model, outputs), image, dynamo)
            if dynamo and name in NEEDS_ATEN_FALLBACK:
                sides["patched_aten_fallback"] = _export_and_run(_Wrapped(model, outputs), image, dynamo,
                                                                 aten_fallback=True)
        for side in sides.values():
            if side.get("ran"):
                ran = side.pop("outputs")
                side["error_vs_eager"] = max(float(np.abs(o - e).max()) for o, e in zip(ran, eager))
                side["error_vs_float64"] = max(float(np.abs(o - t).max()) for o, t in zip(ran, truth))
        report[exporter] = sides
    return report


def check_attention_backends(name: str) -> dict:
    """Mask2Former on Swin with the dynamo exporter: patched on transformers' default attention
    (SDPA), then patched and stock on eager attention (``set_attn_implementation("eager")``)."""
    model, outputs, image = build(name)
    with torch.no_grad():
        eager = [v.numpy() for v in run(model, outputs, image)]
    report = {}
    with opforge.patch_transformers():
        report["patched_sdpa"] = _export_and_run(_Wrapped(model, outputs), image, True)
        model.set_attn_implementation("eager")
        report["patched_eager_attention"] = _export_and_run(_Wrapped(model, outputs), image, True)
    report["stock_eager_attention"] = _export_and_run(_Wrapped(model, outputs), image, True)
    for side in report.values():
        if side.get("ran"):
            side["error_vs_eager"] = max(float(np.abs(o - e).max()) for o, e in zip(side.pop("outputs"), eager))
    return report


def check_frozen_backbone(name: str) -> dict:
    model, outputs, image = build(name)
    model.train()
    backbone = next(m for n, m in model.named_modules() if n.endswith("backbone") or n.endswith("pixel_level_module"))
    backbone.eval()  # the usual fine-tuning set-up: a frozen eval-mode backbone inside a training model
    flags = {n: m.training for n, m in model.named_modules()}
    report = {"training": sum(flags.values()), "eval": len(flags) - sum(flags.values())}
    with opforge.patch_transformers():
        for dynamo in (False, True):
            exporter = "dynamo" if dynamo else "torchscript"
            try:
                opforge.export(_Wrapped(model, outputs), (image,), dynamo=dynamo)
                report[exporter] = "exported"
            except Exception as e:
                report[exporter] = f"export failed: {type(e).__name__}: {str(e)[:300]}"
            changed = sorted(n for n, m in model.named_modules() if m.training != flags[n])
            report[f"{exporter}_changed_flags"] = changed
    return report


def check_kernels(name: str) -> dict:
    """transformers' own kernel mechanism: ``use_kernels`` with opforge's mapping registered."""
    from transformers.utils.import_utils import is_kernels_available

    if not is_kernels_available():
        import transformers

        return {"available": False, "transformers": transformers.__version__}
    import kernels
    from kernels import Mode, kernelize, register_kernel_mapping

    model, outputs, image = build(name)
    layers = [m for m in model.modules()
              if getattr(type(m), "kernel_layer_name", None) == transformers_patch.LAYER_NAME]
    stock, stock_counts = counted(model, outputs, image)
    model.use_kernels = True  # transformers' default mapping alone: it has nothing for this layer on CPU
    default_counts = counted(model, outputs, image)[1]

    register_kernel_mapping(opforge.transformers_kernel_mapping())
    model.use_kernels = False
    model.use_kernels = True  # transformers' path: registers its own defaults, then kernelize()

    def served() -> list:
        return [getattr(m.forward, "__func__", None) is transformers_patch._layer_forward for m in layers]

    report = {"available": True, "kernels": kernels.__version__, "layers": len(layers),
              "stock_counts": stock_counts, "default_mapping_counts": default_counts}
    kernelized, report["kernelized_counts"] = counted(model, outputs, image)
    report["served_inference"] = served()
    report["max_abs_diff"] = _max_abs(stock, kernelized)
    model.train()  # transformers kernelizes again, in Mode.TRAINING
    report["served_training"] = served()
    model.eval()
    proto = opforge.export(_Wrapped(model, outputs), (image,), dynamo=True)
    report["export_opforge_nodes"] = [n.op_type for n in proto.graph.node].count("ms_deform_attn")

    # On a CUDA machine transformers registers its Hub kernel for this layer at each use_kernels
    # and train/eval switch; kernels must still pick opforge's. The selection is what is checked
    # (no GPU needed): the capability lookup answers as a GPU would, kernelize is told "cuda".
    from transformers.integrations.hub_kernels import register_kernel_mapping_transformers
    import kernels.layer.repos as repos

    register_kernel_mapping_transformers()
    lookup = repos._find_capability
    repos._find_capability = lambda: 90
    try:
        for layer in layers:  # each alone: the model's other layers map to Hub kernels (offline here)
            del layer.forward  # back to the class's: what kernelize is to replace
            kernelize(layer, mode=Mode.INFERENCE, device="cuda")
        report["served_cuda_selection"] = served()
    finally:
        repos._find_capability = lookup
    return report


CHECKS = {"eager": check_eager, "grads": check_grads, "grads_at_init": check_grads_at_init, "export": check_export, "frozen_backbone": check_frozen_backbone,
          "attention_backends": check_attention_backends,
          "kernels": check_kernels}


def main(argv) -> int:
    name, checks, out = argv[0], argv[1].split(","), argv[2]
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    warnings.simplefilter("ignore")  # the tracer's and exporters' notes about these models: not what is checked
    report = {}
    for check in checks:
        try:
            report[check] = CHECKS[check](name)
        except Exception:
            report[check] = {"error": traceback.format_exc()[-4000:]}
        finally:
            opforge.unpatch_transformers()
    with open(out, "w") as f:
        json.dump(report, f, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
