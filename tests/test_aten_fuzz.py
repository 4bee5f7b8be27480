"""The ATen runtime's fuzz harness (tests/aten_fuzz.py) in CI: every allowed ATen operator, each
argument replaced by hostile values, through ``opforge.ort_session`` and plain onnxruntime with
libopforge_aten. Each batch runs in its own process (forked from one that imported torch,
tests/preloaded_python.py) under a memory cap; a crash or a hang fails its test, naming the case
and the command that reruns it alone, and the batch goes on after it, so one run lists every
failing case. A batch also fails when its process's peak RSS reaches 1.5 GB.

The quick tier runs a fixed sample (every overload's baseline and INT64_MIN/-1 cases, two hostile
variants each, every finding of issue #43); the full set's batches are marked slow, and a run
that selects all of them deselects the sample, whose cases they include (tests/conftest.py:
STAND_INS). Knobs:

* OPFORGE_ATEN_LIBRARY=/path/libopforge_aten.so: test another build of the library (path (b)
  registers it, path (a) points ``opforge.register_ort_library`` at it);
* OPFORGE_FUZZ_SEED=<n>: other tensor values and another sample;
* OPFORGE_FUZZ_SCALE=<x>: the sample takes 2x hostile variants per overload.

Under ASan (``bash scripts/sanitize.sh tests/test_aten_fuzz.py``) the memory cap and the RSS
bound are off (shadow memory) and cases get 3x the time.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

from preloaded_python import run_python

FUZZ = Path(__file__).with_name("aten_fuzz.py")
ROOT = FUZZ.parent.parent
SEED = int(os.environ.get("OPFORGE_FUZZ_SEED", "0"))
SCALE = float(os.environ.get("OPFORGE_FUZZ_SCALE", "1"))
LIBRARY = os.environ.get("OPFORGE_ATEN_LIBRARY")
ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")
PEAK_RSS_LIMIT = 1.5e9
#: the full set (about 26,000 cases on torch 2.14) in batches of this many case indices; the last
#: batch runs to the end, however many there are
BATCH = 2500
FULL_BATCHES = 11
CASE_TIMEOUT = 30 if ASAN else 10  # seconds one case may take (the harness's SIGALRM)
BATCH_TIMEOUT = 1800 if ASAN else 600  # seconds a batch's process may take (a batch takes ~20 s)
MAX_RESTARTS = 40  # crashes after which a batch stops going on


def _common_args():
    args = ["--seed", str(SEED), "--case-timeout", str(CASE_TIMEOUT)]
    if LIBRARY:
        args += ["--library", LIBRARY]
    return args


def _rerun(index):
    lib = f" --library {LIBRARY}" if LIBRARY else ""
    return f"python {FUZZ.relative_to(ROOT)} --case {index} --seed {SEED}{lib}"


def run_batch(select: list, first: int, end) -> tuple[list, int, list]:
    """Runs the cases [first, end) of the selection ``select`` (aten_fuzz options), going on after a
    crash or a hang. Returns (failure lines, peak RSS in bytes, [(case, what)] of crashes)."""
    failures, crashes, peak = [], [], 0
    start = first
    for _ in range(MAX_RESTARTS + 1):
        args = [str(FUZZ), *select, *_common_args(), "--first", str(start)]
        if end is not None:
            args += ["--cases", str(end - start)]
        try:
            proc = run_python(args, timeout=BATCH_TIMEOUT, cwd=ROOT, text=False)
            out, err, rc, hung = proc.stdout.decode(), proc.stderr.decode(), proc.returncode, False
        except subprocess.TimeoutExpired as e:
            out, err, rc, hung = (e.stdout or b"").decode(), (e.stderr or b"").decode(), None, True
        failures += re.findall(r"^FAIL .*$", out, re.M)
        peak = max([peak] + [int(m) for m in re.findall(r"^PEAK_RSS (\d+)$", out, re.M)])
        if not hung and rc in (0, 1) and re.search(r"^DONE \d+ cases", out, re.M):
            return failures, peak, crashes
        cases = re.findall(r"^CASE (\d+): (.*)$", out, re.M)
        paths = re.findall(r"^(?:CASE \d+:|PATH (\S+))", out, re.M)
        if not cases:  # died before its first case: nothing to go on from
            crashes.append((None, f"the batch's process died before its first case (exit status {rc}):\n"
                                  f"{err[-1500:]}"))
            return failures, peak, crashes
        index, desc = int(cases[-1][0]), cases[-1][1]
        path = paths[-1] if paths and paths[-1] else "-"
        if hung:
            what = f"hung: no answer in {BATCH_TIMEOUT} s"
        elif rc is not None and rc < 0:
            what = ("ran past its time (SIGALRM, a hang)" if rc == -14 else f"killed by signal {-rc}")
        else:
            what = f"exited with status {rc}"
        tail = " | ".join(line for line in err.strip().splitlines()[-4:] if "Warning" not in line)
        crashes.append((index, f"case {index} [path {path}] {what}: {desc}\n    rerun it: {_rerun(index)}"
                               + (f"\n    stderr: {tail[-400:]}" if tail else "")))
        start = index + 1
        if end is not None and start >= end:
            return failures, peak, crashes
    crashes.append((None, f"gave up after {MAX_RESTARTS} crashes"))
    return failures, peak, crashes


def _check(label, failures, peak, crashes):
    report = []
    if crashes:
        report.append(f"{len(crashes)} case(s) crashed or hung the process:")
        report += ["  " + c for _, c in crashes[:20]]
    if failures:
        report.append(f"{len(failures)} case(s) failed:")
        report += ["  " + f[:500] + f"\n    rerun it: {_rerun(f.split()[1])}" for f in failures[:30]]
    if not ASAN and peak >= PEAK_RSS_LIMIT:
        report.append(f"the batch's peak RSS was {peak / 1e6:.0f} MB (limit {PEAK_RSS_LIMIT / 1e6:.0f} MB)")
    if report:
        pytest.fail(f"{label}:\n" + "\n".join(report), pytrace=False)


def test_aten_fuzz_sample():
    """Quick tier: every overload's baseline and INT64_MIN case, 2 hostile variants of each, every finding."""
    per_schema = max(1, round(2 * SCALE))
    failures, peak, crashes = run_batch(["--sample", "--per-schema", str(per_schema)], 0, None)
    _check(f"aten fuzz sample (seed {SEED})", failures, peak, crashes)


FULL = [(b * BATCH, (b + 1) * BATCH if b < FULL_BATCHES - 1 else None) for b in range(FULL_BATCHES)]


@pytest.mark.slow
@pytest.mark.parametrize("first,end", FULL, ids=[f"cases-{f}-{e if e is not None else 'end'}" for f, e in FULL])
def test_aten_fuzz_full(first, end):
    failures, peak, crashes = run_batch([], first, end)
    _check(f"aten fuzz cases [{first}, {end if end is not None else 'end'}) (seed {SEED})", failures, peak, crashes)
