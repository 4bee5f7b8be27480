"""Serving throughput with 1 and 2 replicas, side by side: Ray Serve and a Triton server.

    python benchmarks/bench_serving.py [--requests 400] [--concurrency 8] [--repeats 1] [--quick] [--json]
                                       [--ray-python PATH] [--triton-python PATH]

The model: tests/test_serving.py's DCN + MSDA model (a DCNv2 block, multi-scale deformable
attention; 3x16x20 images), exported with opforge's custom nodes and a dynamic batch. Requests
carry 1 to 3 images (2 on average); every answer is checked against torch before it counts.
  Ray Serve: docs/serving.md's deployment, N replicas (num_cpus=1, one ORT thread each),
             @serve.batch up to 8 requests; HTTP with a .npy body.
  Triton:    `opforge triton-repo`'s repository served by pytriton's tritonserver (Python
             backend), N model instances (one ORT session and thread each), dynamic batching
             up to 8; tritonclient over HTTP.
Each configuration starts its own server (not timed), takes --warmup requests, then --requests
from --concurrency client threads; requests/s and images/s over the wall time, and the median
latency. The clients run on the same machine as the servers and take their share of the cores.
Needs the serving venvs of tests/test_serving.py (build/serve-venvs/{ray,triton}/venv; run
`pytest tests/test_serving.py` once to make them) or --ray-python / --triton-python.
--quick: 40 requests per configuration, a smoke test. Never used to gate CI.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import opforge
from opforge.triton_repo import write_triton_repo
from timing import bench_parser

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ROOT / "tests" / "serving_checks.py"
VENVS = ROOT / "build" / "serve-venvs"


def _model():
    sys.path.insert(0, str(ROOT / "tests"))  # the model the serving and training tests use
    from distributed_checks import IMAGE, DcnMsdaNet

    torch.manual_seed(0)
    return DcnMsdaNet().eval(), IMAGE


def make_case(case_dir: Path) -> None:
    model, image = _model()
    with contextlib.redirect_stdout(sys.stderr):  # the exporter's progress lines: not the report
        opforge.export(model, (torch.randn(2, *image),), str(case_dir / "model.onnx"), dynamo=True,
                       standard_onnx=False, input_names=["image"], output_names=["scores"],
                       dynamic_shapes=({0: torch.export.Dim("batch")},))
    images = torch.randn(40, *image, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        np.save(case_dir / "expected.npy", model(images).numpy())
    np.save(case_dir / "images.npy", images.numpy())


def run_check(python: Path, args: list, out: Path) -> dict:
    proc = subprocess.run([str(python), str(CHECKS), *map(str, args)], capture_output=True, text=True, timeout=900)
    result = json.loads(out.read_text()) if out.exists() else {"error": proc.stderr[-3000:]}
    if proc.returncode != 0 or "error" in result:
        raise SystemExit(f"bench_serving: {' '.join(map(str, args[:1]))} failed:\n{result.get('error')}")
    return result


def main() -> int:
    p = bench_parser(__doc__, repeats=1, threads=None, quick="40 requests per configuration",
                     repeats_help="runs of each configuration (the median is reported)")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--warmup", type=int, default=24)
    p.add_argument("--ray-python", type=Path, default=VENVS / "ray" / "venv" / "bin" / "python")
    p.add_argument("--triton-python", type=Path, default=VENVS / "triton" / "venv" / "bin" / "python")
    p.add_argument("--only", choices=["ray", "triton"], default=None)
    args = p.parse_args()
    if args.quick:
        args.requests, args.warmup = 40, 8
    engines = [e for e in ("ray", "triton") if args.only in (None, e)]
    for engine in engines:
        python = getattr(args, f"{engine}_python")
        if not python.exists():
            print(f"bench_serving: no {engine} venv at {python}: run `pytest tests/test_serving.py` once "
                  f"(it makes build/serve-venvs/), or pass --{engine}-python", file=sys.stderr)
            return 1
    results: dict = {"requests": args.requests, "concurrency": args.concurrency, "warmup": args.warmup}
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        tmp = Path(tmp)
        case = tmp / "case"
        case.mkdir()
        make_case(case)
        repo = write_triton_repo(case / "model.onnx", tmp / "models", name="dcn_msda")
        load = ["--requests", args.requests, "--concurrency", args.concurrency, "--warmup", args.warmup]
        for engine in engines:
            for n in (1, 2):
                runs = []
                for r in range(args.repeats):
                    out = tmp / f"{engine}-{n}-{r}.json"
                    if engine == "ray":
                        res = run_check(args.ray_python, ["ray", case, out, "--replicas", n, *load], out)
                        res["version"] = f"ray {res['ray']}"
                    else:
                        res = run_check(args.triton_python, ["triton-serve", repo.model_dir, case, out,
                                                             "--instances", n, *load], out)
                        res["version"] = f"tritonserver {res['server']['version']}"
                    if res["load"]["failed"] or res["load"]["max_abs_err"] > 1e-4:
                        raise SystemExit(f"bench_serving: {engine} x{n}: {res['load']['failed']} failed requests, "
                                         f"max |diff| vs torch {res['load']['max_abs_err']}")
                    runs.append(res)
                results[f"{engine}_{n}"] = {
                    "version": runs[0]["version"],
                    "requests_per_s": statistics.median(x["load"]["requests_per_s"] for x in runs),
                    "images_per_s": statistics.median(x["load"]["images_per_s"] for x in runs),
                    "median_latency_ms": statistics.median(x["load"]["median_latency_ms"] for x in runs),
                    "max_abs_err": max(x["load"]["max_abs_err"] for x in runs)}
            results[f"{engine}_speedup_2_vs_1"] = (results[f"{engine}_2"]["requests_per_s"]
                                                   / results[f"{engine}_1"]["requests_per_s"])
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"{args.requests} requests (1-3 images each) from {args.concurrency} client threads, after "
          f"{args.warmup} warm-up requests; every answer checked against torch")
    print(f"{'':30}{'1 replica':>24}{'2 replicas':>24}{'2 vs 1':>9}")
    for engine in engines:
        one, two = results[f"{engine}_1"], results[f"{engine}_2"]
        cell = lambda r: f"{r['requests_per_s']:7.1f} req/s {r['median_latency_ms']:5.1f} ms"  # noqa: E731
        print(f"{engine + ' (' + one['version'] + ')':30}{cell(one):>24}{cell(two):>24}"
              f"{results[engine + '_speedup_2_vs_1']:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
