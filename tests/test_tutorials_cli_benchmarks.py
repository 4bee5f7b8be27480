"""The tutorials run as written, the CLI behaves like a CLI, the benchmarks produce their ratios."""

import json
from pathlib import Path

import pytest
import torch

from preloaded_python import run_python

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "tutorials").glob("*.py"))


def run(args, cwd):
    """``python ARGS`` in ``cwd`` (forked from a process that has imported torch: tests/preloaded_python.py)."""
    return run_python(args, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory):
    """``tutorial(name)``: the finished run of ``tutorials/<name>`` and the directory it ran in,
    each tutorial run once for all the tests that read its output."""
    runs = {}

    def run_once(name: str):
        if name not in runs:
            cwd = tmp_path_factory.mktemp(Path(name).stem)
            runs[name] = run([str(ROOT / "tutorials" / name)], cwd=cwd), cwd
        return runs[name]

    return run_once


@pytest.mark.parametrize("name", [t.name for t in TUTORIALS])
def test_tutorial_runs(name, tutorial):
    out, cwd = tutorial(name)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "matches torch" in out.stdout
    assert "Error" not in out.stdout
    assert list(cwd.iterdir()) == []  # tutorials write to their own temp dirs


def test_tutorial_01_covers_the_whole_flow(tutorial):
    out = tutorial("01_my_add.py")[0].stdout
    for line in ("1. torch op", "bad shapes -> opforge::my_add", "opforge::my_add'", "my_add_torchscript.onnx: ORT matches",
                 "my_add_dynamo.onnx: ORT matches", "standard ONNX graph", "6. onnx.reference matches torch"):
        assert line in out, line


def test_tutorial_05_covers_the_toolkit_flow(tutorial):
    out = tutorial("05_your_own_op.py")[0].stdout
    for line in ("1. opforge new-op", "src/tutorial_ops/csrc/swish.h", "torch op tutorial_ops::swish  ->  ONNX node "
                 "com.example.tutorial::swish", "opcheck, gradcheck, numpy reference, float32 attributes, bad inputs: ok",
                 "[dynamo] opforge::my_add, com.example.tutorial::swish", "[torchscript] opforge::my_add, "
                 "com.example.tutorial::swish", "tutorial 05: all checks passed"):
        assert line in out, line
    assert out.count("ORT matches torch at batch 5") == 2


def test_tutorial_07_trains_exports_both_ways_and_runs_at_another_size(tutorial):
    out = tutorial("07_ms_deform_attn.py")[0].stdout
    losses = [float(line.rsplit(" ", 1)[1]) for line in out.splitlines() if line.startswith("2. step")]
    assert len(losses) == 5 and losses[-1] < losses[0]
    for exporter in ("dynamo", "torchscript"):
        assert f"3. {exporter}: exported, custom nodes ['opforge::ms_deform_attn']" in out, exporter
        assert f"4. {exporter}: ORT at batch 3, levels [[20, 12], [10, 6]] (3, 300, 32) matches torch" in out, exporter
    assert "5. standard ONNX (domains ['ai.onnx'], 2 GridSample nodes): plain onnxruntime" in out


def test_tutorial_08_trains_post_processes_exports_both_ways_and_runs_at_another_roi_count(tutorial):
    out = tutorial("08_rotated_detection.py")[0].stdout
    assert "-> roi_align_rotated (208, 16, 7, 7)" in out
    losses = [float(line.rsplit(" ", 1)[1]) for line in out.splitlines() if line.startswith("2. step")]
    assert len(losses) == 5 and losses[-1] < 0.5 * losses[0]
    assert "3. 26 rois -> nms_rotated keeps " in out and "batched_nms_rotated over 2 classes keeps " in out
    nodes = "['opforge::batched_nms_rotated', 'opforge::nms_rotated', 'opforge::roi_align_rotated']"
    kept = {}
    for exporter in ("dynamo", "torchscript"):
        assert f"4. {exporter}: exported, custom nodes {nodes}, rois input ['rois', 6]" in out, exporter
        line = next(line for line in out.splitlines() if line.startswith(f"5. {exporter}: "))
        assert "ORT at 38 rois (exported at 26) matches torch" in line and line.endswith(" identical"), line
        assert float(line.split("max |diff| = ")[1].split(";")[0]) < 1e-4, line
        kept[exporter] = line.split("; keep ")[1]
    assert kept["dynamo"] == kept["torchscript"]  # both exporters' models keep the same boxes


def test_cli_demo(tmp_path):
    out = run(["-m", "opforge", "demo", "--out", str(tmp_path)], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.count("-> PASS") == 2 and "all parity checks passed" in out.stdout
    assert sorted(p.name for p in tmp_path.glob("*.onnx")) == ["demo_dynamo_opset18.onnx", "demo_torchscript_opset17.onnx"]


def test_cli_conventions(tmp_path):
    version = run(["-m", "opforge", "--version"], cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("opforge ")
    lib = run(["-m", "opforge", "ort-library-path"], cwd=tmp_path)
    assert lib.returncode == 0 and lib.stdout.strip().endswith("libopforge_ort.so") and Path(lib.stdout.strip()).is_file()
    info = run(["-m", "opforge", "info"], cwd=tmp_path)
    assert info.returncode == 0 and "opforge::my_add(Tensor a, Tensor b) -> Tensor" in info.stdout
    bad = run(["-m", "opforge", "demo", "--exporter", "torchscript", "--opset", "42", "--out", str(tmp_path)], cwd=tmp_path)
    assert bad.returncode == 1 and "opforge demo: error:" in bad.stderr and "opsets 9..20" in bad.stderr
    usage = run(["-m", "opforge", "frobnicate"], cwd=tmp_path)
    assert usage.returncode == 2 and "invalid choice" in usage.stderr


def test_my_add_benchmark_reports_ratios(tmp_path):
    out = run([str(ROOT / "benchmarks" / "bench_my_add.py"), "--numel", "65536", "--repeats", "3", "--json"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout)
    for key in ("ratio_vs_torch_add_alpha", "ratio_vs_2a_plus_b", "ratio_ort_vs_mul_add"):
        assert result[key] > 0
    assert set(result["torch_ms"]) == {"opforge.my_add", "2*a+b", "torch.add(alpha=2)"}


def test_deform_conv2d_benchmark_reports_ratios(tmp_path):
    out = run([str(ROOT / "benchmarks" / "bench_deform_conv2d.py"), "--batch", "1", "--channels", "8", "--size", "12",
               "--repeats", "2", "--tv-repeats", "1", "--json"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout)
    for key in ("ort_vs_builtin", "forward_vs_conv2d", "speedup_forward_vs_torchvision", "speedup_fwd_bwd_vs_torchvision"):
        assert result[key] > 0


def test_ms_deform_attn_benchmark_reports_speedups_and_agreement(tmp_path):
    out = run([str(ROOT / "benchmarks" / "bench_ms_deform_attn.py"), "--quick", "--json"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout)
    for shape in ("decoder", "encoder"):
        for key in ("speedup_forward", "speedup_fwd_bwd", "speedup_ort"):
            assert result[shape][key] > 0
        assert set(result[shape]["max_abs_diff"]) == {"output", "grad_value", "grad_locations", "grad_weights",
                                                      "ort_output", "ort_vs_torch_output"}


def test_roi_align_rotated_benchmark_reports_ratios_and_agreement(tmp_path):
    out = run([str(ROOT / "benchmarks" / "bench_roi_align_rotated.py"), "--quick", "--json"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout)
    assert result["ratio_forward"] > 0 and result["ratio_fwd_bwd"] > 0  # timing: reported, never gated
    assert result["shape"]["rois_crossing_border"] > 0  # the border rules are part of the agreement
    diffs = result["max_abs_diff"]
    assert set(diffs) == {"output", "grad_input", "ort_vs_torch_output"}
    assert max(diffs.values()) < 1e-4, diffs  # opforge == the grid_sample anchor, torch and ORT
    assert result["ort_ms"] > 0


def test_nms_rotated_benchmark_reports_the_ratio_and_identical_keep(tmp_path):
    out = run([str(ROOT / "benchmarks" / "bench_nms_rotated.py"), "--quick", "--json"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout)
    assert result["ratio"] > 0 and result["ratio_all_pairs"] > 0  # timing: reported, never gated
    assert result["identical_keep"] == {"pruned": True, "all_pairs": True}
    shape = result["shape"]
    assert 0 < shape["kept"] < shape["boxes"] and 0 < shape["pruned_pairs"] < shape["all_pairs"]


def test_mmdeploy_dcn_benchmark_reports_ratios_and_agreement(tmp_path):
    out = run([str(ROOT / "benchmarks" / "bench_mmdeploy_dcn.py"), "--quick", "--json"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    results = json.loads(out.stdout)["results"]
    assert [(r["shape"]["groups"], r["shape"]["deform_groups"]) for r in results] == [(1, 1), (2, 2)]
    for r in results:
        assert r["ratio_vs_opforge"] > 0 and r["speedup_vs_ort_builtin"] > 0  # timing: reported, never gated
        assert max(r["max_abs_error_vs_torchvision"].values()) < 1e-3, r


def test_torchvision_patch_benchmark_reports_speedups_and_agreement(tmp_path):
    out = run([str(ROOT / "benchmarks" / "bench_torchvision_patch.py"), "--batch", "1", "--size", "64",
               "--repeats", "1", "--json"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout)
    assert result["inference_speedup"] > 0 and result["train_step_speedup"] > 0
    assert result["max_relative_output_difference"] < 1e-4  # the patched model computes the same thing


def test_aten_fallback_benchmark_reports_overhead(tmp_path):
    out = run([str(ROOT / "benchmarks" / "bench_aten_fallback.py"), "--nodes", "8", "--repeats", "5", "--json"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout)
    assert result["ort_aten_us_per_node"] > 0 and "overhead_us_per_node" in result


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message; tests/test_cuda.py runs it on a GPU")
def test_cuda_benchmark_without_a_gpu_says_so(tmp_path):
    out = run([str(ROOT / "benchmarks" / "bench_cuda.py"), "--json"], cwd=tmp_path)
    assert out.returncode == 1 and "bench_cuda: no CUDA GPU visible to torch" in out.stderr


def test_prototype_benchmark_reports_prices(tmp_path):
    out = run([str(ROOT / "benchmarks" / "bench_prototype.py"), "--sizes", "1", "4096", "--repeats", "3", "--json"],
              cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout)
    assert [r["numel"] for r in result["rows"]] == [1, 4096]
    for row in result["rows"]:
        assert set(row["us"]) == {"torch prototype", "torch compiled", "ORT prototype", "ORT plain onnx_op",
                                  "ORT compiled"}
        assert row["torch_prototype_vs_compiled"] > 0 and row["ort_prototype_vs_compiled"] > 0


def test_bridge_export_benchmark_runs(tmp_path):
    # It asserts itself that a model without bridged ops never loads the bridge.
    out = run([str(ROOT / "benchmarks" / "bench_bridge_export.py"), "--repeat", "2"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "ratio" in out.stdout and "cached" in out.stdout


def test_dynamo_export_benchmark_reports_the_speedup_on_the_same_model(tmp_path):
    out = run([str(ROOT / "benchmarks" / "bench_dynamo_export.py"), "--repeats", "1", "--json"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout)
    assert result["same_model"] is True and set(result["ms"]) == {"torch.onnx.export", "opforge.export"}
    assert result["speedup_vs_torch"] > 0
