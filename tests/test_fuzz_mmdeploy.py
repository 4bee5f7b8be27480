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
from pathlib import Path

import pytest

from fuzz_batch import run_fuzz_batch

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
    run_fuzz_batch(FUZZ, target, SEED, batch, BATCH)
