"""What the benchmarks share (run as scripts: this directory is on sys.path): their command line,
side-by-side timing, ONNX Runtime sessions that do not disturb each other, and the report."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable


def bench_parser(doc: str, repeats: int, threads: int | None = 2, quick: str | None = None,
                 repeats_help: str | None = None) -> argparse.ArgumentParser:
    """The options every benchmark takes: --repeats, --json, and --threads (unless ``threads`` is
    None) and --quick (given its help: the benchmark's smoke-test size); the benchmark adds its own.
    The description is the first line of ``doc`` (the module docstring)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    if threads is not None:
        p.add_argument("--threads", type=int, default=threads)
    p.add_argument("--repeats", type=int, default=repeats, help=repeats_help)
    if quick is not None:
        p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    return p


def round_robin(candidates: dict[str, Callable[[], object]], repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median milliseconds per candidate. Candidates run one call each per round, so drift,
    turbo and cache state hit all of them alike."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(s) * 1e3 for name, s in samples.items()}


def ort_options(threads: int, library: str | None = None):
    """onnxruntime.SessionOptions for a timed session: ``threads`` intra-op threads that do not spin,
    and a custom-op ``library`` registered if given. Each session has its own thread pool, whose
    threads spin for a while after a run: in a round-robin that steals the cores from the next
    candidate's run (seen: the candidate after ORT's DeformConv measured 1.3x slower than alone).
    Not spinning keeps the comparison fair."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if library:
        so.register_custom_ops_library(library)
    return so


def cpu_session(model, threads: int, library: str | None = None):
    """A plain onnxruntime CPU session of ``model`` (a ModelProto or its bytes) with ort_options."""
    import onnxruntime as ort

    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, ort_options(threads, library), providers=["CPUExecutionProvider"])


def float_node_model(op_type: str, domain: str, inputs, attrs: dict, opsets):
    """A model of one ``domain::op_type`` node with attributes ``attrs``: float32 graph inputs named
    ``inputs``, one float32 output "y"; ``opsets``: (domain, version) pairs."""
    from onnx import TensorProto

    from opforge.testing import node_model

    return node_model(op_type, [(n, TensorProto.FLOAT) for n in inputs], [("y", TensorProto.FLOAT)], domain=domain,
                      opsets=dict(opsets), **attrs)


def print_ms(timings: dict[str, float], width: int, fmt: str = "9.2f") -> None:
    """One row per candidate: its name padded to ``width``, then its time in ``fmt`` and "ms"."""
    for name, ms in timings.items():
        print(f"  {name:<{width}} {ms:{fmt}} ms")


def report(results: dict, as_json: bool, table: Callable[[dict], None]) -> dict:
    """Prints ``results`` as JSON (--json: stdout holds nothing else), else ``table(results)``, the
    benchmark's text; returns ``results``."""
    if as_json:
        print(json.dumps(results, indent=2))
    else:
        table(results)
    return results
