"""The fuzz suite (tests/fuzz.py) in CI: every op through torch and ONNX Runtime, random shapes,
attributes and dtypes, valid and invalid. Each batch runs in its own process, so a crash or a
hang fails only its test, which names the case (and the command that reruns it alone). The
process is forked from one that has imported torch (tests/preloaded_python.py).

Fixed seed; about a minute on 2 cores. Long runs: OPFORGE_FUZZ_SCALE=20 (20x the cases) and
OPFORGE_FUZZ_SEED=<n> (other cases), e.g.
    OPFORGE_FUZZ_SCALE=50 OPFORGE_FUZZ_SEED=7 python -m pytest tests/test_fuzz.py
"""

import os
from pathlib import Path

import pytest

from fuzz_batch import run_fuzz_batch

FUZZ = Path(__file__).with_name("fuzz.py")
SCALE = float(os.environ.get("OPFORGE_FUZZ_SCALE", "1"))
SEED = int(os.environ.get("OPFORGE_FUZZ_SEED", "0"))
# A batch's process spends about 8 s starting (torch, torchvision, opforge) and 1-2 s on 800
# cases: batches of 800, not 400, cover the same cases (a case is its index) with half the starts.
BATCH = 800
# Targets whose cases cost more (a python reference per case: nms_rotated's all-pairs IoU, the
# ORT targets' session per case): smaller batches, so a batch stays a few seconds of cases.
BATCH_OF = {"roi_align_rotated:ort": 400, "nms_rotated:torch": 400, "nms_rotated:ort": 400}
# target -> batches of its batch size at scale 1
PLAN = {"deform_conv2d:torch": 2, "deform_conv2d:ort": 2, "ms_deform_attn:torch": 1, "ms_deform_attn:ort": 1,
        "roi_align_rotated:torch": 1, "roi_align_rotated:ort": 1, "nms_rotated:torch": 1, "nms_rotated:ort": 1,
        "my_add:torch": 1, "my_add:ort": 1, "aten:ort": 1}
BATCHES = [(target, b) for target, n in PLAN.items() for b in range(max(1, round(n * SCALE)))]


@pytest.mark.parametrize("target,batch", BATCHES, ids=[f"{t}-{b}" for t, b in BATCHES])
def test_fuzz_batch(target, batch):
    run_fuzz_batch(FUZZ, target, SEED, batch, BATCH_OF.get(target, BATCH))
