"""Training with opforge's ops past one process: DistributedDataParallel and FSDP2 (``fully_shard``)
on gloo (CPU), each checked against the same training in one process. Run by
tests/test_distributed.py; also by hand:

    torchrun --standalone --nproc-per-node 2 tests/distributed_checks.py --out DIR [--only ddp|fsdp2]

Each rank writes DIR/rank<R>.json: {mode: {check: number}} (a check that raises: {mode: {"error":
traceback}}). The model, ``DcnMsdaNet``, runs both training ops (deform_conv2d, ms_deform_attn) in
float64, so "equal to one process" is measured to rounding. The batch of 4 images is split 2 + 2
across the ranks; one process trains the same model (same seed) on all 4: the mean of the two
ranks' mean losses is the one-process mean loss, so the averaged gradients must be its gradients.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import traceback
import warnings
from pathlib import Path

import torch

import opforge

BATCH = 4  # the global batch: split evenly across the ranks
STEPS = 3  # optimizer steps before the checkpoint
IMAGE = (3, 16, 20)  # C, H, W: non-square, so a swapped H/W would show


class DcnMsdaNet(torch.nn.Module):
    """image (N, 3, H, W) -> scores (N, queries, classes). A strided conv stem, a DCNv2 block
    (offsets and mask predicted by convolutions, ``opforge.DeformConv2d``), a two-level pyramid
    that learned queries attend to through ``opforge.MSDeformAttn`` (Deformable DETR's
    cross-attention), a linear head. The level sizes follow from ``image_size`` (H, W), fixed at
    construction like a detector's input size; the batch is free (and dynamic when exported)."""

    def __init__(self, image_size=IMAGE[1:], channels: int = 8, heads: int = 2, points: int = 2, queries: int = 6,
                 classes: int = 3):
        super().__init__()
        c = channels
        self.stem = torch.nn.Conv2d(3, c, 3, stride=2, padding=1)
        self.offset = torch.nn.Conv2d(c, 2 * 9, 3, padding=1)
        self.mask = torch.nn.Conv2d(c, 9, 3, padding=1)
        self.dcn = opforge.DeformConv2d(c, c, 3, padding=1)
        self.down = torch.nn.Conv2d(c, c, 3, stride=2, padding=1)
        h, w = image_size
        h0, w0 = (h + 1) // 2, (w + 1) // 2
        h1, w1 = (h0 + 1) // 2, (w0 + 1) // 2
        # derived from image_size, not learned: not part of a checkpoint
        self.register_buffer("spatial_shapes", torch.tensor([[h0, w0], [h1, w1]]), persistent=False)
        self.register_buffer("level_start_index", torch.tensor([0, h0 * w0]), persistent=False)
        self.queries = torch.nn.Parameter(torch.randn(queries, c))
        self.reference = torch.nn.Linear(c, 2)
        self.attn = opforge.MSDeformAttn(d_model=c, n_levels=2, n_heads=heads, n_points=points)
        self.head = torch.nn.Linear(c, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        f0 = torch.relu(self.stem(image))
        f0 = torch.relu(self.dcn(f0, self.offset(f0), torch.sigmoid(self.mask(f0))))
        f1 = torch.relu(self.down(f0))
        flat = torch.cat([f0.flatten(2).transpose(1, 2), f1.flatten(2).transpose(1, 2)], 1)  # (N, S, C)
        query = self.queries.expand(image.shape[0], -1, -1)
        reference = torch.sigmoid(self.reference(query))[:, :, None, :].expand(-1, -1, 2, -1)  # (N, Q, levels, 2)
        return self.head(self.attn(query, reference, flat, self.spatial_shapes, self.level_start_index))


def make_model() -> DcnMsdaNet:
    torch.manual_seed(0)  # every rank and the one-process reference start from the same weights
    model = DcnMsdaNet().double()
    with torch.no_grad():  # MSDeformAttn starts with zero attention weights: move off that point
        for p in model.attn.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def global_batch():
    g = torch.Generator().manual_seed(1)
    images = torch.randn(BATCH, *IMAGE, generator=g, dtype=torch.float64)
    targets = torch.randn(BATCH, 6, 3, generator=g, dtype=torch.float64)
    return images, targets


def loss_fn(out, target):
    return torch.nn.functional.mse_loss(out, target)


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-2)


# ---- comparisons ------------------------------------------------------------------------------------

def _full(t: torch.Tensor) -> torch.Tensor:
    """A parameter or gradient as one whole tensor (FSDP2 holds DTensor shards)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _named(model):
    """name -> parameter, without the wrappers' prefixes (DDP's ``module.``)."""
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    return dict(inner.named_parameters())


@torch.no_grad()
def max_relative_diff(got: dict, want: dict) -> float:
    """max over tensors of max|got - want| / max|want| (want: a whole tensor); the names must match."""
    assert got.keys() == want.keys(), (sorted(got), sorted(want))
    worst = 0.0
    for name, w in want.items():  # (under no_grad: parameters compared as values)
        g = got[name]
        scale = float(w.abs().max()) or 1.0
        worst = max(worst, float((g - w).abs().max()) / scale)
    return worst


def grads(model) -> dict:
    return {n: _full(p.grad).detach().clone() for n, p in _named(model).items()}


def params(model) -> dict:
    return {n: _full(p).detach().clone() for n, p in _named(model).items()}


def opforge_ops_run() -> list:
    """The opforge ops that a forward and backward of the model dispatch to (the check is about
    them: a model that silently ran something else would prove nothing)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "opforge":
                seen.add(func.name())
            return func(*args, **(kwargs or {}))

    images, targets = global_batch()
    model = make_model()
    with Record():
        loss_fn(model(images), targets).backward()
    return sorted(seen)


# ---- the one-process reference ------------------------------------------------------------------------

def reference_run():
    """Gradients of the first step, parameters after STEPS steps and after STEPS + 1, the model and
    optimizer after STEPS: one process, the whole batch."""
    model = make_model()
    opt = make_optimizer(model)
    images, targets = global_batch()
    first_grads = None
    snapshots = []
    for step in range(STEPS + 1):
        opt.zero_grad()
        loss_fn(model(images), targets).backward()
        if step == 0:
            first_grads = grads(model)
        opt.step()
        snapshots.append(params(model))
    return first_grads, snapshots[STEPS - 1], snapshots[STEPS]


# ---- the distributed runs ---------------------------------------------------------------------------------

def _local_batch(rank: int, world: int):
    images, targets = global_batch()
    share = BATCH // world
    return images[rank * share:(rank + 1) * share], targets[rank * share:(rank + 1) * share]


def _train(model, opt, images, targets, steps: int):
    """``steps`` optimizer steps on the local batch; the gradients of the first one."""
    first = None
    for step in range(steps):
        opt.zero_grad()
        loss_fn(model(images), targets).backward()
        if step == 0:
            first = grads(model)
        opt.step()
    return first


def ddp_check(rank: int, world: int, workdir: Path, reference) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    ref_grads, ref_after, ref_after_next = reference
    images, targets = _local_batch(rank, world)
    model = DDP(make_model())
    opt = make_optimizer(model)
    first = _train(model, opt, images, targets, STEPS)
    # the control: one rank's half alone gives other gradients (so the comparison can tell)
    alone = make_model()
    loss_fn(alone(images), targets).backward()
    result = {"grad_rel_diff": max_relative_diff(first, ref_grads),
              "local_batch_only_grad_rel_diff": max_relative_diff(grads(alone), ref_grads),
              "param_rel_diff_after_steps": max_relative_diff(params(model), ref_after)}

    # checkpoint: rank 0 writes the module's and the optimizer's state_dicts; every rank loads them
    # into a new model and optimizer; one more step on both must agree, and with one process
    path = workdir / "ddp.pt"
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optim": opt.state_dict()}, path)
    torch.distributed.barrier()
    state = torch.load(path, map_location="cpu", weights_only=True)
    restored_inner = make_model()
    torch.manual_seed(100 + rank)  # the restored weights must come from the file, not the seed
    with torch.no_grad():
        for p in restored_inner.parameters():
            p.normal_()
    restored_inner.load_state_dict(state["model"])
    restored = DDP(restored_inner)
    restored_opt = make_optimizer(restored)
    restored_opt.load_state_dict(state["optim"])
    result["restored_param_diff"] = max_relative_diff(params(restored), params(model))
    _train(model, opt, images, targets, 1)
    _train(restored, restored_opt, images, targets, 1)
    result["next_step_restored_vs_original"] = max_relative_diff(params(restored), params(model))
    result["next_step_rel_diff_vs_one_process"] = max_relative_diff(params(restored), ref_after_next)
    return result


def _fully_shard(model, mesh):
    from torch.distributed.fsdp import fully_shard

    # one shard group per block with trainable weights, then the root (the rest: queries, head)
    for block in (model.stem, model.dcn, model.attn, model.down):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def fsdp2_check(rank: int, world: int, workdir: Path, reference) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                         set_state_dict)
    from torch.distributed.device_mesh import init_device_mesh

    ref_grads, ref_after, ref_after_next = reference
    mesh = init_device_mesh("cpu", (world,))
    images, targets = _local_batch(rank, world)
    model = _fully_shard(make_model(), mesh)
    sharded = [n for n, p in model.named_parameters() if hasattr(p, "full_tensor")]
    opt = make_optimizer(model)
    first = _train(model, opt, images, targets, STEPS)
    result = {"sharded_params": len(sharded), "params": len(list(model.parameters())),
              "grad_rel_diff": max_relative_diff(first, ref_grads),
              "param_rel_diff_after_steps": max_relative_diff(params(model), ref_after)}

    # sharded checkpoint (torch.distributed.checkpoint): each rank writes its shards of the model
    # and of the optimizer state; a new sharded model and optimizer load them
    ckpt = workdir / "fsdp2-dcp"
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(ckpt))
    restored = _fully_shard(make_model(), mesh)
    with torch.no_grad():
        for p in restored.parameters():
            p.zero_()  # the restored weights must come from the checkpoint
    restored_opt = make_optimizer(restored)
    r_model_sd, r_optim_sd = get_state_dict(restored, restored_opt)
    state = {"model": r_model_sd, "optim": r_optim_sd}
    dcp.load(state, checkpoint_id=str(ckpt))
    set_state_dict(restored, restored_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    result["restored_param_diff"] = max_relative_diff(params(restored), params(model))

    # the same checkpoint, gathered whole (what a single-process job or an export loads)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        plain = DcnMsdaNet().double()
        plain.load_state_dict(full)
        result["full_state_dict_rel_diff_vs_one_process"] = max_relative_diff(dict(plain.named_parameters()),
                                                                               ref_after)
    _train(model, opt, images, targets, 1)
    _train(restored, restored_opt, images, targets, 1)
    result["next_step_restored_vs_original"] = max_relative_diff(params(restored), params(model))
    result["next_step_rel_diff_vs_one_process"] = max_relative_diff(params(restored), ref_after_next)
    return result


CHECKS = {"ddp": ddp_check, "fsdp2": fsdp2_check}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for rank<R>.json")
    parser.add_argument("--only", choices=sorted(CHECKS), action="append", help="run only these (default: all)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # two ranks on two cores
    # FSDP2 warns when a wrapped module returns a view (an in-place op on it would skip a hook);
    # the model does no in-place op on any module's output
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    if BATCH % world:
        raise SystemExit(f"the batch of {BATCH} does not split over {world} processes")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    reference = reference_run()
    results = {"world_size": world, "opforge_ops": opforge_ops_run()}
    workdir = out / "checkpoints"  # one machine: one directory that every rank sees
    if rank == 0:
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir()
    torch.distributed.barrier()
    for mode in args.only or sorted(CHECKS):
        try:
            results[mode] = CHECKS[mode](rank, world, workdir, reference)
        except Exception:  # noqa: BLE001 - reported to the test, which names the failing check
            results[mode] = {"error": traceback.format_exc()}
        torch.distributed.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(results, indent=1))
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Results written and the group destroyed: skip the interpreter's finalization, where torch's
    # gloo teardown aborted a rank once in a loaded CI run ("terminate called without an active
    # exception", SIGABRT; pytorch/pytorch#179291 discusses that teardown race).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
