"""Runs opforge-exported models in a bare onnxruntime + numpy environment (no torch, no opforge).

Executed by tests/test_deploy_ort_only.py with a throwaway venv's python:

    python -I deploy_ort_runner.py SPEC.json

SPEC: {"library": path, "cases": [{"name", "model", "inputs": {onnx_name: .npy}, "expected": [.npy],
"rtol", "atol"}]}. Prints one JSON report on stdout. Imports only the stdlib, numpy and onnxruntime:
what a deployment has.
"""

import importlib.util
import json
import os
import sys
import traceback

import numpy as np
import onnxruntime as ort


def mapped_libraries() -> list[str]:
    """Shared objects mapped into this process whose names matter here (torch's, opforge's)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if len(line.split()) >= 6}
    return sorted(p for p in paths if any(k in os.path.basename(p) for k in ("torch", "libc10", "opforge")))


def run_case(case: dict, library: str, result: dict) -> None:
    """Runs one case, recording in ``result["stage"]`` how far it got (so a failure says where)."""
    result["stage"] = "register"
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    try:  # what the library says of its CUDA EP part (a CPU-only build has no entry)
        result["cuda_kernels"] = options.get_session_config_entry(
            "opforge.cuda_kernels." + os.path.basename(library).split(".so")[0])
    except Exception:  # noqa: BLE001 - no entry
        result["cuda_kernels"] = None
    result["stage"] = "session"
    session = ort.InferenceSession(case["model"], options, providers=["CPUExecutionProvider"])
    result["stage"] = "run"
    feeds = {name: np.load(path) for name, path in case["inputs"].items()}
    outputs = session.run(None, feeds)
    result["stage"] = "compare"
    assert len(outputs) == len(case["expected"]), (len(outputs), len(case["expected"]))
    result["max_abs_diff"] = 0.0
    for got, expected_path in zip(outputs, case["expected"]):
        expected = np.load(expected_path)
        assert got.dtype == expected.dtype and got.shape == expected.shape, (got.dtype, got.shape, expected.shape)
        result["max_abs_diff"] = max(result["max_abs_diff"], float(np.max(np.abs(got - expected), initial=0.0)))
        np.testing.assert_allclose(got, expected, rtol=case["rtol"], atol=case["atol"])
    result["stage"] = "done"


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    report = {
        "onnxruntime": ort.__version__,
        "numpy": np.__version__,
        # what the deployment must not need: checked here, in the environment that runs the models
        "importable": {m: importlib.util.find_spec(m) is not None for m in ("torch", "opforge")},
        "cases": {},
    }
    for case in spec["cases"]:
        result = report["cases"][case["name"]] = {"ok": False}
        try:
            run_case(case, spec["library"], result)
            result["ok"] = True
        except Exception as exc:  # noqa: BLE001 - reported to the test, which asserts on it
            result.update(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    report["mapped_libraries"] = mapped_libraries()
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
