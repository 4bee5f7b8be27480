"""Side-by-side timing shared by the benchmarks (run as scripts: this directory is on sys.path)."""

from __future__ import annotations

import statistics
import time
from typing import Callable


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
