"""One fuzz batch in its own process, for tests/test_fuzz.py and tests/test_fuzz_mmdeploy.py: a
crash or a hang fails only that batch's test, whose message names the failed cases (with their
descriptions) or the case that was running, and the command that reruns it alone. The process
is forked from one that has imported torch (tests/preloaded_python.py)."""

import re
import subprocess
from pathlib import Path

import pytest

from preloaded_python import run_python

TIMEOUT = 240  # a batch takes seconds: anything near this is a hang


def run_fuzz_batch(script: Path, target: str, seed: int, batch: int, size: int) -> None:
    """Runs cases [batch * size, (batch + 1) * size) of ``target`` with ``script`` (tests/fuzz.py's
    command line); fails the calling test unless all of them pass."""
    first = batch * size
    args = [str(script), "--target", target, "--seed", str(seed), "--first", str(first), "--cases", str(size)]
    try:
        proc = run_python(args, timeout=TIMEOUT, cwd=script.parent.parent, text=False)
        out, err, rc, what = proc.stdout.decode(), proc.stderr.decode(), proc.returncode, None
    except subprocess.TimeoutExpired as e:  # its output so far is bytes, text=True or not
        out, err, rc = (e.stdout or b"").decode(), (e.stderr or b"").decode(), None
        what = f"hung (no answer in {TIMEOUT} s)"
    if rc == 0:
        assert re.search(rf"DONE {size} cases, 0 failed", out), out[-2000:]
        return
    cases = re.findall(r"^CASE (\S+) (\d+) (\d+): (.*)$", out, re.M)
    failed = re.findall(r"^FAIL .*?(?=^CASE|^TALLY|\Z)", out, re.M | re.S)
    if what is None and failed:
        what = f"{len(failed)} case(s) failed"
    elif what is None:
        what = f"crashed (exit status {rc})"
    last = cases[-1] if cases else None
    report = [f"{target} batch {batch}: {what}"]
    if failed:
        described = {index: desc for _, _, index, desc in cases}
        for f in failed[:5]:
            index = re.match(r"FAIL \S+ \d+ (\d+)", f)
            report.append(f"case {index.group(1)}: {described.get(index.group(1), '?')}\n{f.strip()}" if index
                          else f.strip())
    elif last:
        report.append(f"last case started: {last[3]}")
        report.append(f"rerun it: python {script.relative_to(script.parent.parent)} --target {target} --seed {seed} "
                      f"--case {last[2]}")
    report.append("stderr tail:\n" + err[-1500:])
    pytest.fail("\n".join(report))
