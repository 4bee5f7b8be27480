"""Every op's torch kernels, this checkout against another build of opforge (e.g. the last commit
before the stable-ABI port), side by side in one run: each round runs one fresh process per build,
alternating, on the same workloads; the ratio (this / other, lower is better) is reported as
min / median / max over the rounds, one line per workload.

    python benchmarks/bench_stable_abi.py --other /path/to/other/checkout [--rounds 5] [--threads 2]

The other checkout must be built in place (``python setup.py build_ext --inplace``). Workloads:
my_add (broadcast, 4M float32), deform_conv2d forward and forward+backward at the issue's three
shapes, ms_deform_attn forward and forward+backward (Deformable-DETR decoder and encoder sizes),
roi_align_rotated forward and forward+backward, nms_rotated (2,000 boxes). Never used to gate CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, statistics, sys, time
import torch
torch.set_num_threads(int(sys.argv[1]))
import opforge

def timed(fn, repeat):
    # at least `repeat` calls and half a second of them, after two warm-up calls; the median
    fn(); fn()
    times, begin = [], time.perf_counter()
    while len(times) < repeat or time.perf_counter() - begin < 0.5:
        start = time.perf_counter(); fn(); times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3

g = torch.Generator().manual_seed(0)
out = {}
a, b = torch.randn(1024, 4096, generator=g), torch.randn(4096, generator=g)
out["my_add 1024x4096 + 4096"] = timed(lambda: opforge.my_add(a, b), 20)
for n, c, s in ((4, 64, 56), (2, 256, 28), (8, 32, 64)):
    x = torch.randn(n, c, s, s, generator=g, requires_grad=True)
    w = torch.randn(c, c, 3, 3, generator=g, requires_grad=True)
    off = torch.randn(n, 18, s, s, generator=g, requires_grad=True)
    mask = torch.rand(n, 9, s, s, generator=g, requires_grad=True)
    with torch.no_grad():
        out[f"deform_conv2d fwd N{n} C{c} {s}^2"] = timed(lambda: opforge.deform_conv2d(x, off, w, padding=(1, 1), mask=mask), 5)
    out[f"deform_conv2d fwd+bwd N{n} C{c} {s}^2"] = timed(
        lambda: opforge.deform_conv2d(x, off, w, padding=(1, 1), mask=mask).sum().backward(), 3)
levels = torch.tensor([[64, 64], [32, 32], [16, 16], [8, 8]])
starts = torch.cat([torch.zeros(1, dtype=torch.long), (levels[:, 0] * levels[:, 1]).cumsum(0)[:-1]])
S = int((levels[:, 0] * levels[:, 1]).sum())
for name, n, lq in (("decoder N2 Lq300", 2, 300), ("encoder N1 Lq=S", 1, S)):
    v = torch.randn(n, S, 8, 32, generator=g, requires_grad=True)
    loc = torch.rand(n, lq, 8, 4, 4, 2, generator=g, requires_grad=True)
    attn = torch.rand(n, lq, 8, 4, 4, generator=g, requires_grad=True)
    with torch.no_grad():
        out[f"ms_deform_attn fwd {name}"] = timed(lambda: opforge.ms_deform_attn(v, levels, starts, loc, attn), 5)
    out[f"ms_deform_attn fwd+bwd {name}"] = timed(lambda: opforge.ms_deform_attn(v, levels, starts, loc, attn).sum().backward(), 3)
feat = torch.randn(2, 256, 64, 64, generator=g, requires_grad=True)
boxes = torch.rand(512, 5, generator=g) * torch.tensor([60, 60, 20, 20, 3.0]) + torch.tensor([2, 2, 4, 4, 0])
rois = torch.cat([torch.randint(0, 2, (512, 1), generator=g).float(), boxes], 1)
with torch.no_grad():
    out["roi_align_rotated fwd 512 rois 7x7"] = timed(lambda: opforge.roi_align_rotated(feat, rois, (7, 7), 0.5, 2), 10)
out["roi_align_rotated fwd+bwd 512 rois 7x7"] = timed(lambda: opforge.roi_align_rotated(feat, rois, (7, 7), 0.5, 2).sum().backward(), 5)
nb = torch.rand(2000, 5, generator=g) * torch.tensor([200, 200, 20, 20, 3.0])
ns = torch.rand(2000, generator=g)
out["nms_rotated 2000 boxes"] = timed(lambda: opforge.nms_rotated(nb, ns, 0.5), 10)
print(json.dumps(out))
"""


def run(root: Path, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(threads)], cwd="/", env=env, capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"the benchmark failed for {root}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", type=Path, required=True, help="another opforge checkout, built in place")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ratios: dict = {}
    for r in range(args.rounds):
        first, second = (ROOT, args.other) if r % 2 == 0 else (args.other, ROOT)  # alternate who goes first
        times = {first: run(first, args.threads), second: run(second, args.threads)}
        for key, ms in times[ROOT].items():
            ratios.setdefault(key, []).append(ms / times[args.other][key])
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    rows = {k: (min(v), statistics.median(v), max(v)) for k, v in ratios.items()}
    if args.json:
        print(json.dumps(rows))
        return
    print(f"this / other, {args.threads} threads, {args.rounds} rounds: min / median / max (lower is better)")
    for key, (lo, med, hi) in rows.items():
        print(f"{key:45s} {lo:5.2f} / {med:5.2f} / {hi:5.2f}")


if __name__ == "__main__":
    main()
