"""Serving past one process (issue #42): ``opforge triton-repo`` and its config, a real Triton server
(pytriton's bundled ``tritonserver``, Python backend) and a Ray Serve deployment, each answering
concurrent requests that are checked against torch.

ray, tritonclient and pytriton are optional (``opforge[serve]``): they live in throwaway venvs
under build/serve-venvs/NAME/venv, made here once and reused (their stamps name the requirements):
  ray/     a venv that sees this one's packages (torch, onnxruntime, opforge) plus ray[serve];
  triton/  a plain python3.11 venv with nvidia-pytriton, tritonclient and onnxruntime 1.21.0 --
           no torch: the server side of a deployment, on the ONNX Runtime of Triton 2.56's
           onnxruntime backend, the oldest this library supports.
Without the package index the venvs cannot be made and those tests skip, saying so. What runs in
them is tests/serving_checks.py; the models and torch's outputs are made here.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import opforge
from opforge.ort_kernels import cuda_companion_path
from opforge.triton_repo import MIN_TRITON, TritonRepoError, write_triton_repo

from distributed_checks import IMAGE, DcnMsdaNet
from helpers import cached_venv

REPO = Path(__file__).resolve().parents[1]
VENV_ROOT = REPO / "build" / "serve-venvs"
CHECKS = Path(__file__).with_name("serving_checks.py")
RAY_REQUIREMENTS = ["ray[serve]==2.60.0"]
TRITON_REQUIREMENTS = ["nvidia-pytriton==0.7.0", "tritonclient[grpc,http]==2.73.0", "onnxruntime==1.21.0",
                       "numpy<2"]  # (pytriton 0.7.0 needs numpy < 2)
# The model runs in ORT's Conv (MLAS) for the offset/mask/stem convolutions and in torch's (oneDNN)
# with another summation order; those ~1e-7 differences move deform_conv2d's and ms_deform_attn's
# bilinear sampling points (measured here: 3e-8 max abs on outputs up to 0.15); as in the other
# deform_conv2d round trips, 1e-4.
TOL = 1e-4


def serve_venv(name: str, requirements: list, *, sees_this_venv: bool) -> Path:
    """The python of build/serve-venvs/NAME/venv with ``requirements``. ``sees_this_venv``: a scratch
    venv that sees this venv's packages (so torch, onnxruntime and opforge are not installed twice);
    else a plain python3.11 venv."""
    return Path(cached_venv(VENV_ROOT / name, requirements, sees_this_venv=sees_this_venv, what=name))


@pytest.fixture(scope="session")
def ray_python() -> Path:
    return serve_venv("ray", RAY_REQUIREMENTS, sees_this_venv=True)


@pytest.fixture(scope="session")
def triton_python() -> Path:
    return serve_venv("triton", TRITON_REQUIREMENTS, sees_this_venv=False)


# ---- the exported model, and torch's outputs -----------------------------------------------------------

def _export(model, path: Path, dynamic_batch: bool = True) -> onnx.ModelProto:
    return opforge.export(model, (torch.randn(2, *IMAGE),), str(path), dynamo=True, standard_onnx=False,
                          input_names=["image"], output_names=["scores"],
                          dynamic_shapes=({0: torch.export.Dim("batch")},) if dynamic_batch else None)


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> Path:
    """CASE_DIR of tests/serving_checks.py: the DCN + MSDA model exported with a dynamic batch (custom
    nodes: opforge's library must run them), 40 images and torch's outputs for them."""
    case_dir = tmp_path_factory.mktemp("serving-case")
    torch.manual_seed(0)
    model = DcnMsdaNet().eval()
    proto = _export(model, case_dir / "model.onnx")
    ops = {(n.domain, n.op_type) for n in proto.graph.node}
    assert {("opforge", "deform_conv2d"), ("opforge", "ms_deform_attn")} <= ops, ops
    images = torch.randn(40, *IMAGE, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(images)
    np.save(case_dir / "images.npy", images.numpy())
    np.save(case_dir / "expected.npy", expected.numpy())
    return case_dir


def _cli(*args, cwd) -> subprocess.CompletedProcess:
    from preloaded_python import run_python

    return run_python(["-m", "opforge", *map(str, args)], cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def triton_models(case, tmp_path_factory) -> Path:
    """A model repository written by the command: DIR/dcn_msda, 2 instances, batches up to 8."""
    repo = tmp_path_factory.mktemp("triton-repo") / "models"
    run = _cli("triton-repo", case / "model.onnx", repo, "--name", "dcn_msda", "--instances", "2",
               cwd=case)
    assert run.returncode == 0, run.stderr
    return repo


# ---- opforge triton-repo (no optional package needed) -----------------------------------------------------

def test_triton_repo_writes_config_model_and_library(case, triton_models):
    model_dir = triton_models / "dcn_msda"
    assert sorted(p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*")) == sorted(
        ["1", "1/model.onnx", "config.pbtxt", "libopforge_ort.so"]
        + (["libopforge_ort_cuda.so"] if cuda_companion_path(opforge.ort_library_path()) else []))
    assert (model_dir / "1" / "model.onnx").read_bytes() == (case / "model.onnx").read_bytes()
    assert (model_dir / "libopforge_ort.so").read_bytes() == Path(opforge.ort_library_path()).read_bytes()
    config = (model_dir / "config.pbtxt").read_text()
    library = (model_dir / "libopforge_ort.so").resolve()
    assert f'op_library_filename: "{library}"' in config
    for line in ('name: "dcn_msda"', 'platform: "onnxruntime_onnx"', "max_batch_size: 8",
                 "dims: [ 3, 16, 20 ]", "dims: [ 6, 3 ]", "max_queue_delay_microseconds: 100", "count: 2"):
        assert line in config, (line, config)
    assert f"Triton >= {MIN_TRITON[0]}" in config  # the version rule travels with the config


def test_triton_repo_states_the_version_rule(case, tmp_path):
    run = _cli("triton-repo", case / "model.onnx", tmp_path / "models", "--max-batch", "4", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "ONNX Runtime C API version >= 21" in run.stdout
    assert "Triton >= 2.56.0 (NGC container 25.03 or later), whose onnxruntime backend is ONNX Runtime 1.21.0" \
        in run.stdout
    assert "inputs:  image TYPE_FP32 ['batch', 3, 16, 20]" in run.stdout
    assert "dynamic batching up to 4" in run.stdout


def test_triton_repo_refuses_a_fixed_batch_dim_and_names_the_input(tmp_path):
    fixed = tmp_path / "fixed.onnx"
    _export(DcnMsdaNet().eval(), fixed, dynamic_batch=False)
    run = _cli("triton-repo", fixed, tmp_path / "models", cwd=tmp_path)
    assert run.returncode == 1
    assert "opforge triton-repo: error: input 'image' has shape [2, 3, 16, 20]: with --max-batch 8 its first dim " \
           "is Triton's batch dim, so it must be dynamic" in run.stderr
    assert not (tmp_path / "models" / "fixed").exists()
    # without batching, the shapes as exported
    repo = write_triton_repo(fixed, tmp_path / "models", max_batch=0)
    config = repo.config.read_text()
    assert "max_batch_size: 0" in config and "dims: [ 2, 3, 16, 20 ]" in config and "dynamic_batching" not in config


def test_triton_repo_paths_for_the_server(case, tmp_path):
    repo = write_triton_repo(case / "model.onnx", tmp_path / "models", name="m", server_repo="/models/")
    assert repo.op_library_filenames == ("/models/m/libopforge_ort.so",)
    assert 'op_library_filename: "/models/m/libopforge_ort.so"' in repo.config.read_text()
    with pytest.raises(TritonRepoError, match="exists; pass --force"):
        write_triton_repo(case / "model.onnx", tmp_path / "models", name="m")
    with pytest.raises(TritonRepoError, match="--server-repo must be an absolute path"):
        write_triton_repo(case / "model.onnx", tmp_path / "models", name="m", server_repo="models", force=True)
    assert repo.config.exists()  # refused before anything was replaced


def test_triton_repo_instances_and_kind(case, tmp_path):
    # the console script, as users call it (python -m opforge is the same main)
    opforge_script = Path(sys.executable).with_name("opforge")
    run = subprocess.run([str(opforge_script), "triton-repo", str(case / "model.onnx"), str(tmp_path / "models"),
                          "--instances", "3", "--kind", "cpu", "--name", "cpu_model"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    config = (tmp_path / "models" / "cpu_model" / "config.pbtxt").read_text()
    assert "instance_group [\n  {\n    count: 3\n    kind: KIND_CPU\n  }\n]" in config
    with pytest.raises(TritonRepoError, match="--instances must be >= 1, got 0"):
        write_triton_repo(case / "model.onnx", tmp_path / "models", name="none", instances=0)
    assert not (tmp_path / "models" / "none").exists()


def test_triton_repo_refuses_what_the_onnxruntime_backend_cannot_run(tmp_path):
    from helpers import aten_model
    from onnx import TensorProto, helper

    aten = tmp_path / "aten.onnx"
    onnx.save(aten_model("relu", "", [("x", TensorProto.FLOAT)]), aten)
    with pytest.raises(TritonRepoError, match="ATen-fallback nodes .* libtorch"):
        write_triton_repo(aten, tmp_path / "models", max_batch=0)
    node = helper.make_node("MyPrototypeOp", ["x"], ["y"], domain="ai.onnx.contrib")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    proto = tmp_path / "proto.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("ai.onnx.contrib", 1)]), proto)
    with pytest.raises(TritonRepoError, match="onnxruntime-extensions' domain.*has no Python"):
        write_triton_repo(proto, tmp_path / "models")
    assert not (tmp_path / "models").exists()


# ---- in the serving venvs ----------------------------------------------------------------------------------

def _check(python: Path, command: str, *args, out: Path, timeout=600) -> dict:
    """Runs ``serving_checks.py COMMAND ARGS`` (its OUT.json is ``out``) in a serving venv; its result."""
    args = (command, *args[:2], out, *args[2:]) if command != "ray" else (command, args[0], out, *args[1:])
    proc = subprocess.run([str(python), str(CHECKS), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    result = json.loads(out.read_text())
    assert "error" not in result, result["error"] + "\n--- stderr\n" + proc.stderr[-4000:]
    return result


@pytest.mark.slow
def test_the_config_parses_with_tritons_model_config(triton_python, triton_models, case, tmp_path):
    r = _check(triton_python, "triton-config", triton_models / "dcn_msda", case, out=tmp_path / "config.json")
    assert (r["name"], r["platform"], r["max_batch_size"]) == ("dcn_msda", "onnxruntime_onnx", 8)
    assert r["dynamic_batching"] and r["max_queue_delay_microseconds"] == 100
    assert (r["instance_counts"], r["instance_kinds"]) == ([2], ["KIND_AUTO"])
    assert r["op_library_filename"] == [str((triton_models / "dcn_msda" / "libopforge_ort.so").resolve())]
    # the config's tensors are the model's, as ONNX Runtime reads them (batch dim: -1)
    assert r["inputs"]["config"] == [["image", "TYPE_FP32", [-1, 3, 16, 20]]]
    assert r["outputs"]["config"] == [["scores", "TYPE_FP32", [-1, 6, 3]]]
    for io in (r["inputs"], r["outputs"]):
        assert [[name, dims] for name, _, dims in io["config"]] == [[name, dims] for name, _, dims in io["session"]]
        assert io["types_agree"]
    # the session made as the onnxruntime backend makes it, in ORT 1.21.0 (Triton 2.56's), runs the model
    assert r["onnxruntime"] == "1.21.0"
    assert r["max_abs_err"] < TOL


@pytest.mark.slow
def test_a_triton_server_answers_concurrent_requests(triton_python, triton_models, case, tmp_path):
    r = _check(triton_python, "triton-serve", triton_models / "dcn_msda", case, "--requests", "60",
               "--concurrency", "6", out=tmp_path / "serve.json")
    assert r["server"] == {"name": "triton", "version": "2.51.0"}  # pytriton 0.7.0's tritonserver
    assert r["server_live"] and r["model_ready"]
    served = r["served_config"]
    assert (served["name"], served["max_batch_size"]) == ("dcn_msda", 8)
    assert [g["count"] for g in served["instance_group"]] == [2]
    assert [i["dims"] for i in served["input"]] == [[3, 16, 20]]
    load = r["load"]
    assert (load["requests"], load["ok"], load["failed"]) == (60, 60, 0), load["errors"]
    assert load["max_abs_err"] < TOL
    # 60 requests of 1-3 images: 120 images; Triton's dynamic batcher ran them in fewer model calls
    assert r["inference_count"] == 120
    assert r["execution_count"] < 60


@pytest.mark.slow
def test_ray_serve_replicas_answer_and_recover_from_a_killed_one(ray_python, case, tmp_path):
    concurrency = 4
    r = _check(ray_python, "ray", case, "--replicas", "2", "--requests", "4000", "--concurrency", concurrency,
               "--kill-after", "40", out=tmp_path / "ray.json")
    assert r["ray"] == "2.60.0"
    load = r["load"]
    assert load["max_abs_err"] < TOL  # every answer, before, during and after the kill
    assert r["replica_actors_before"] == 2
    assert r["max_batched_requests"] > 1  # @serve.batch merged concurrent requests
    # killed under load: at most the requests in flight on it fail (one per client thread)
    assert load["failed"] <= concurrency, (load["failed"], load["errors"], r["failed_indices"])
    # 500: the replica died under the request; 408: the request hung and Serve's request_timeout_s ended it
    assert all(e.startswith(("RuntimeError: HTTP 500", "RuntimeError: HTTP 408")) for e in load["errors"]), \
        load["errors"]
    # the deployment recovers: a new replica, two running, and it answers with the rest
    assert (r["new_replicas"], r["running_after"], r["killed_still_listed"]) == (1, 2, False)
    assert r["recovered_s"] < 120
    assert r["requests_after_recovery"] > 0 and r["failed_after_recovery"] == 0
    assert r["new_replica_answered"]
    assert r["replicas_answering"] == 3
    print(f"\nray: {load['failed']} of {load['requests']} requests failed; recovered in {r['recovered_s']:.1f} s")
