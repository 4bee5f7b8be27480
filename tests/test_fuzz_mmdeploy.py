"""The mmdeploy fuzz suite (tests/fuzz_mmdeploy.py) in CI: libopforge_mmdeploy.so's five node forms
in ONNX Runtime, random nodes (attributes of every type and value, malformed nodes), shapes,
dtypes and values, valid and invalid. Each batch runs in its own process, so a crash or a hang
fails only its test, which names the case (and the command that reruns it alone). The process is
forked from one that has imported torch (tests/preloaded_python.py).

Fixed seed; about 30 s on 2 cores. Long runs: OPFORGE_FUZZ_SCALE=20 (20x the cases) and
OPFORGE_FUZZ_SEED=<n> (other cases), e.g.
    OPFORGE_FUZZ_SCALE=20 OPFORGE_FUZZ_SEED=7 python -m pytest tests/test_fuzz_mmdeploy.py
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

from preloaded_python import run_python

pytestmark = pytest.mark.slow

FUZZ = Path(__file__).with_name("fuzz_mmdeploy.py")
SCALE = float(os.environ.get("OPFORGE_FUZZ_SCALE", "1"))
SEED = int(os.environ.get("OPFORGE_FUZZ_SEED", "0"))
# A batch's process spends 1-2 s starting (onnxruntime, torchvision, opforge) and 3-4 s on 800 cases
# (a session per case, a reference per valid case; NMSRotated's greedy replay: about 9 s).
BATCH = 800
# target -> batches of BATCH cases at scale 1
PLAN = {"mmdeploy:grid_sampler": 1, "mmdeploy:MMCVModulatedDeformConv2d": 1, "mmdeploy:MMCVRoIAlignRotated": 1,
        "mmdeploy:NMSRotated": 1, "mmdeploy:NMSMatch": 1}
BATCHES = [(target, b) for target, n in PLAN.items() for b in range(max(1, round(n * SCALE)))]


@pytest.mark.parametrize("target,batch", BATCHES, ids=[f"{t.split(':')[1]}-{b}" for t, b in BATCHES])
def test_fuzz_mmdeploy_batch(target, batch):
    first = batch * BATCH
    args = [str(FUZZ), "--target", target, "--seed", str(SEED), "--first", str(first), "--cases", str(BATCH)]
    timeout = 240  # a batch takes seconds: anything near this is a hang
    try:
        proc = run_python(args, timeout=timeout, cwd=FUZZ.parent.parent, text=False)
        out, err, rc, what = proc.stdout.decode(), proc.stderr.decode(), proc.returncode, None
    except subprocess.TimeoutExpired as e:  # its output so far is bytes, text=True or not
        out, err, rc = (e.stdout or b"").decode(), (e.stderr or b"").decode(), None
        what = f"hung (no answer in {timeout} s)"
    if rc == 0:
        assert re.search(rf"DONE {BATCH} cases, 0 failed", out), out[-2000:]
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
            index = re.match(r"FAIL \S+ \d+ (\d+)", f).group(1)
            report.append(f"case {index}: {described.get(index, '?')}\n{f.strip()}")
    elif last:
        report.append(f"last case started: {last[3]}")
        report.append(f"rerun it: python {FUZZ.relative_to(FUZZ.parent.parent)} --target {target} --seed {SEED} "
                      f"--case {last[2]}")
    report.append("stderr tail:\n" + err[-1500:])
    pytest.fail("\n".join(report))
