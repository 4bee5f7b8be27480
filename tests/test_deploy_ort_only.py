"""Deployment without torch: opforge-exported models run in a Python environment that has only
onnxruntime and numpy, with libopforge_ort.so copied in as the one file, across the supported
onnxruntime range (>= 1.21: the library is built on the 1.21 headers); an older runtime gets a clear
error naming the API version it lacks.

Throwaway venvs live in build/deploy-venvs/ (gitignored), made once and reused across runs
(helpers.cached_venv); the first run needs PyPI. tests/deploy_ort_runner.py is what runs inside them.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import opforge

from helpers import DCNv1Block, DCNv2Block, cached_venv, to_numpy, without_cuda

REPO = Path(__file__).resolve().parents[1]
VENV_ROOT = REPO / "build" / "deploy-venvs"
RUNNER = Path(__file__).with_name("deploy_ort_runner.py")

# onnxruntime version -> what the venv gets. 1.21.0 is the oldest runtime the library supports (its
# headers' API version), 1.32.0 the newest tested; 1.17.3 is too old and has no numpy 2 build.
SUPPORTED = {"1.21.0": ["onnxruntime==1.21.0", "numpy"], "1.32.0": ["onnxruntime==1.32.0", "numpy"]}
TOO_OLD = {"1.17.3": ["onnxruntime==1.17.3", "numpy<2"]}
NEEDED_API_VERSION = 21  # ORT_API_VERSION of the headers libopforge_ort is built on


def _run(cmd, what: str, timeout: int = 900, **kw) -> subprocess.CompletedProcess:
    """Runs ``cmd``; a non-zero exit fails the test with the command's whole output."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    if proc.returncode != 0:
        pytest.fail(f"{what} failed (exit {proc.returncode}): {' '.join(map(str, cmd))}\n"
                    f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}", pytrace=False)
    return proc


def deploy_venv(version: str, requirements: list[str]) -> Path:
    """The python of build/deploy-venvs/ort-<version>/venv: python3.11 with ``requirements`` only
    (the onnxruntime pins have cp311 wheels; 1.17.3 has none for newer Pythons)."""
    return Path(cached_venv(VENV_ROOT / f"ort-{version}", requirements, what=f"onnxruntime {version}"))


@pytest.fixture(scope="session")
def supported_runtime_venvs() -> dict[str, Path]:
    return {version: deploy_venv(version, reqs) for version, reqs in SUPPORTED.items()}


@pytest.fixture(scope="session")
def too_old_runtime_venvs() -> dict[str, Path]:
    return {version: deploy_venv(version, reqs) for version, reqs in TOO_OLD.items()}


# ---- the models, exported here (torch + opforge), run there (onnxruntime + numpy only) --------------

class MyAddModel(torch.nn.Module):
    def forward(self, a, b):
        return opforge.my_add(a, b)


# Tolerances. my_add: 2·a is exact in float32 and the add rounds once, in the same header-only core
# in both kernels, so ORT must equal torch bit for bit. deform_conv2d models: our kernel shares its
# core with torch's too, but the offset/mask convolutions run in ORT's Conv (MLAS) vs torch's
# (oneDNN) with another summation order, and those ~1e-6 relative differences move the bilinear
# sampling points (measured: 6e-7 max abs, in 1.21.0 and 1.32.0); 1e-4 is what the suite's
# deform_conv2d round trips use, with room for other MLAS code paths on other CPUs.
DCN_TOL = 1e-4


def _export_case(root: Path, name: str, model, export_args, run_args, *, dynamo: bool, opset: int,
                 input_names, op: str, rtol: float, atol: float, **dynamic) -> dict:
    """Exports ``model`` (custom nodes forced: standard_onnx=False), saves model, ``run_args`` and
    torch's outputs for them; returns the runner's case entry."""
    case_dir = root / name
    case_dir.mkdir()
    model = model.eval()
    proto = opforge.export(model, export_args, str(case_dir / "model.onnx"), dynamo=dynamo, opset_version=opset,
                           standard_onnx=False, input_names=input_names, **dynamic)
    nodes = [(n.domain, n.op_type) for n in proto.graph.node]
    assert ("opforge", op) in nodes, nodes  # the library, not a standard-ONNX lowering, must run it
    with torch.no_grad():
        expected = model(*run_args)
    inputs = {}
    for input_name, value in zip(input_names, run_args):
        np.save(case_dir / f"{input_name}.npy", to_numpy(value))
        inputs[input_name] = str(case_dir / f"{input_name}.npy")
    np.save(case_dir / "expected0.npy", to_numpy(expected))
    return {"name": name, "model": str(case_dir / "model.onnx"), "inputs": inputs,
            "expected": [str(case_dir / "expected0.npy")], "rtol": rtol, "atol": atol}


@pytest.fixture(scope="session")
def deployment(tmp_path_factory) -> Path:
    """A spec for the runner: the exported cases, and the library copied alone into its own directory."""
    models = tmp_path_factory.mktemp("deploy-models")
    torch.manual_seed(0)
    dims = {0: torch.export.Dim("n"), 2: torch.export.Dim("h", min=4), 3: torch.export.Dim("w", min=4)}
    cases = [
        # run shapes differ from the export shapes: dynamic dims survive the trip too
        _export_case(models, "my_add-broadcast-dynamo18", MyAddModel(),
                     (torch.randn(2, 3, 4), torch.randn(3, 1)), (torch.randn(5, 3, 4), torch.randn(3, 1)),
                     dynamo=True, opset=18, input_names=["a", "b"], op="my_add", rtol=0, atol=0,
                     dynamic_shapes=({0: torch.export.Dim("batch")}, None)),
        _export_case(models, "deform_conv2d-dcnv2-mask-bias-torchscript17", DCNv2Block(opforge.DeformConv2d, o=6),
                     (torch.randn(2, 4, 9, 11),), (torch.randn(3, 4, 12, 7),),
                     dynamo=False, opset=17, input_names=["x"], op="deform_conv2d", rtol=DCN_TOL, atol=DCN_TOL,
                     dynamic_axes={"x": {0: "n", 2: "h", 3: "w"}}),
        _export_case(models, "deform_conv2d-dcnv1-dynamo18", DCNv1Block(),
                     (torch.randn(2, 4, 9, 11),), (torch.randn(3, 4, 12, 7),),
                     dynamo=True, opset=18, input_names=["x"], op="deform_conv2d", rtol=DCN_TOL, atol=DCN_TOL,
                     dynamic_shapes=(dims,)),
    ]
    library_dir = tmp_path_factory.mktemp("deploy-lib")
    library = Path(shutil.copy2(opforge.ort_library_path(), library_dir))
    assert library.name == "libopforge_ort.so" and os.listdir(library_dir) == [library.name]
    spec = tmp_path_factory.mktemp("deploy-spec") / "spec.json"
    spec.write_text(json.dumps({"library": str(library), "cases": cases}))
    return spec


def run_deployed(python: Path, spec: Path, *, wrap=lambda cmd: cmd, **extra_env) -> dict:
    """The runner's report from ``python``: isolated (-I: no PYTHONPATH, user site or script dir on
    sys.path), from a neutral directory, and with no LD_ paths, so nothing of the main environment helps."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LD_"))}
    proc = _run(wrap([python, "-I", RUNNER, spec]), f"the deployment runner in {python.parents[1].name}",
                timeout=300, cwd=spec.parent, env=dict(env, **extra_env))
    return json.loads(proc.stdout)


def _assert_bare_environment(report: dict, version: str) -> None:
    assert report["onnxruntime"] == version
    assert report["importable"] == {"torch": False, "opforge": False}


@pytest.mark.parametrize("version", list(SUPPORTED))
def test_exported_models_run_with_only_the_library_copied(version, supported_runtime_venvs, deployment):
    report = run_deployed(supported_runtime_venvs[version], deployment)
    _assert_bare_environment(report, version)
    spec = json.loads(deployment.read_text())
    assert list(report["cases"]) == [case["name"] for case in spec["cases"]]
    failed = {name: result for name, result in report["cases"].items() if not result["ok"]}
    assert not failed, "\n\n".join(f"{name} (at {r['stage']}): {r['traceback']}" for name, r in failed.items())
    # the copied file is the only opforge library the process mapped, and nothing of torch's
    assert report["mapped_libraries"] == [os.path.realpath(spec["library"])], report["mapped_libraries"]


@pytest.mark.parametrize("version", list(TOO_OLD))
def test_too_old_onnxruntime_is_refused_with_the_api_version(version, too_old_runtime_venvs, deployment):
    report = run_deployed(too_old_runtime_venvs[version], deployment)
    _assert_bare_environment(report, version)
    for name, result in report["cases"].items():
        assert not result["ok"] and result["stage"] == "register", (name, result)
        # init_api's message: "... needs ONNX Runtime API version 21 (onnxruntime >= 1.21), but this
        # runtime is onnxruntime 1.17.3; upgrade onnxruntime"
        assert f"needs ONNX Runtime API version {NEEDED_API_VERSION} " in result["error"], result["error"]
        assert f"this runtime is onnxruntime {version};" in result["error"], result["error"]


def test_exported_models_run_on_a_box_without_cuda(supported_runtime_venvs, deployment):
    """The library as built (a CUDA build where nvcc exists: its CUDA companion beside it) on a
    simulated box with no CUDA runtime at all. It loads and runs every model on the CPU; its
    CUDA part, asked for with OPFORGE_ORT_CUDA=always, is reported unavailable with the
    loader's reason rather than failing the registration."""
    spec = json.loads(deployment.read_text())
    spec["library"] = opforge.ort_library_path()
    in_place = deployment.with_name("spec-in-place.json")
    in_place.write_text(json.dumps(spec))
    newest = max(SUPPORTED, key=lambda v: tuple(map(int, v.split("."))))
    report = run_deployed(supported_runtime_venvs[newest], in_place, wrap=without_cuda, OPFORGE_ORT_CUDA="always")
    failed = {name: result for name, result in report["cases"].items() if not result["ok"]}
    assert not failed, "\n\n".join(f"{name} (at {r['stage']}): {r['traceback']}" for name, r in failed.items())
    statuses = {result["cuda_kernels"] for result in report["cases"].values()}
    if opforge.BUILT_WITH_CUDA:
        (status,) = statuses
        assert status.startswith("unavailable: libopforge_ort's CUDA kernels could not be loaded: libcudart.so.13: "
                                 "cannot open shared object file"), status
    else:
        assert statuses == {None}


# ---- libopforge_mmdeploy.so: mmdeploy's node forms, the library copied alone --------------------

def _node_case(root: Path, name: str, model, inputs: dict, expected, tol: float) -> dict:
    case_dir = root / name
    case_dir.mkdir()
    (case_dir / "model.onnx").write_bytes(model.SerializeToString())
    paths = {}
    for key, value in inputs.items():
        np.save(case_dir / f"{key}.npy", to_numpy(value))
        paths[key] = str(case_dir / f"{key}.npy")
    np.save(case_dir / "expected0.npy", expected)
    return {"name": name, "model": str(case_dir / "model.onnx"), "inputs": paths,
            "expected": [str(case_dir / "expected0.npy")], "rtol": tol, "atol": tol}


@pytest.fixture(scope="session")
def mmdeploy_deployment(tmp_path_factory) -> Path:
    """One node of each of mmdeploy's five forms with references computed here, and
    libopforge_mmdeploy.so copied alone into its own directory."""
    import torch.nn.functional as F
    from onnx import TensorProto

    import test_mmdeploy_ops as mm
    from test_roi_align_rotated import torch_roi_align_rotated

    root = tmp_path_factory.mktemp("mmdeploy-models")
    x, offset, mask, weight, bias = mm.dcn_inputs()
    dcn = mm.dcn_model(torch.float32, stride=1, padding=1, dilation=1, groups=2, deform_groups=2)
    feat = torch.randn(2, 3, 10, 12, generator=torch.Generator().manual_seed(1))
    rois = mm.rotated_rois(5, 2, 20.0, seed=2).float()
    grid = torch.rand(2, 6, 7, 2, generator=torch.Generator().manual_seed(3)) * 2.4 - 1.2
    boxes, scores = mm.detections(2, 30, 3, seed=4)
    aa_boxes, aa_scores = mm.axis_aligned(2, 30, 2, seed=5)
    thresholds = [torch.tensor([0.3]), torch.tensor([0.1])]
    cases = [
        _node_case(root, "grid_sampler-bicubic-border", mm.mmdeploy_model(
            "grid_sampler", [("input", TensorProto.FLOAT), ("grid", TensorProto.FLOAT)], [("output", TensorProto.FLOAT)],
            interpolation_mode=2, padding_mode=1, align_corners=0), {"input": feat, "grid": grid},
            to_numpy(F.grid_sample(feat, grid, mode="bicubic", padding_mode="border", align_corners=False)), 1e-4),
        _node_case(root, "dcn-int-attrs-groups2-dg2", dcn,
                   dict(input=x, offset=offset, mask=mask, weight=weight, bias=bias),
                   to_numpy(mm.torchvision_dcn(x, offset, mask, weight, bias, 1, 1, 1).float()), 1e-4),
        _node_case(root, "roi_align_rotated", mm.roi_model(torch.float32, output_height=2, output_width=3,
                                                           spatial_scale=0.5, sampling_ratio=0, aligned=1, clockwise=1),
                   {"input": feat, "rois": rois},
                   to_numpy(torch_roi_align_rotated(feat, rois, (2, 3), 0.5, 0, True, True).float()), 1e-4),
        _node_case(root, "nms_rotated", mm.nms_rotated_model(torch.float32, iou_threshold=0.2, score_threshold=0.1),
                   {"boxes": boxes, "scores": scores}, mm.nms_rotated_reference(boxes, scores, 0.2, 0.1), 0),
        _node_case(root, "nms_match", mm.nms_match_model(torch.float32),
                   {"boxes": aa_boxes, "scores": aa_scores, "iou_threshold": thresholds[0],
                    "score_threshold": thresholds[1]},
                   mm.nms_match_reference(aa_boxes, aa_scores, thresholds[0].item(), thresholds[1].item()), 0),
    ]
    library_dir = tmp_path_factory.mktemp("mmdeploy-lib")
    library = Path(shutil.copy2(opforge.mmdeploy_library_path(), library_dir))
    assert os.listdir(library_dir) == ["libopforge_mmdeploy.so"]
    spec = tmp_path_factory.mktemp("mmdeploy-spec") / "spec.json"
    spec.write_text(json.dumps({"library": str(library), "cases": cases}))
    return spec


@pytest.mark.parametrize("version", list(SUPPORTED))
def test_mmdeploy_node_forms_run_with_only_the_library_copied(version, supported_runtime_venvs, mmdeploy_deployment):
    report = run_deployed(supported_runtime_venvs[version], mmdeploy_deployment)
    _assert_bare_environment(report, version)
    failed = {name: result for name, result in report["cases"].items() if not result["ok"]}
    assert not failed, "\n\n".join(f"{name} (at {r['stage']}): {r['traceback']}" for name, r in failed.items())
    assert len(report["cases"]) == 5
    spec = json.loads(mmdeploy_deployment.read_text())
    assert report["mapped_libraries"] == [os.path.realpath(spec["library"])], report["mapped_libraries"]


@pytest.mark.parametrize("version", list(TOO_OLD))
def test_mmdeploy_library_refuses_too_old_onnxruntime(version, too_old_runtime_venvs, mmdeploy_deployment):
    report = run_deployed(too_old_runtime_venvs[version], mmdeploy_deployment)
    for name, result in report["cases"].items():
        assert not result["ok"] and result["stage"] == "register", (name, result)
        assert (f"libopforge_mmdeploy needs ONNX Runtime API version {NEEDED_API_VERSION} " in result["error"]
                and f"this runtime is onnxruntime {version};" in result["error"]), result["error"]
