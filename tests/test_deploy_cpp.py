"""tutorials/cpp: the exported model runs from C++ through ONNX Runtime's C++ API with
libopforge_ort.so and matches torch; a wrong expected value or a bad library fails the run."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime

import opforge
import opforge.build

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "tutorials" / "cpp"


def run(args, **kwargs):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, **kwargs)


def ort_library() -> Path:
    # The wheel ships the library under its full version name only (libonnxruntime.so.1.<minor>.<patch>).
    candidates = sorted((Path(onnxruntime.__file__).parent / "capi").glob("libonnxruntime.so*"))
    assert candidates, "the onnxruntime package has no libonnxruntime.so*"
    return candidates[0]


def test_cpp_example_matches_torch_and_fails_on_mismatch(tmp_path):
    data, build = tmp_path / "data", tmp_path / "build"
    exported = run([sys.executable, EXAMPLE / "export_model.py", data])
    assert exported.returncode == 0, exported.stderr[-4000:]
    custom_nodes = {n.op_type for n in onnx.load(data / "model.onnx").graph.node if n.domain == opforge.spec.DOMAIN}
    assert custom_nodes == {"deform_conv2d", "my_add"}  # the run below needs the library for both

    configured = run(["cmake", "-S", EXAMPLE, "-B", build, f"-DORT_INCLUDE_DIR={opforge.build.ort_include_dir()}",
                      f"-DORT_LIBRARY={ort_library()}"])
    assert configured.returncode == 0, configured.stdout[-4000:] + configured.stderr[-4000:]
    built = run(["cmake", "--build", build])
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    demo = build / "opforge_cpp_demo"
    library = opforge.ort_library_path()

    ok = run([demo, data / "model.onnx", library, data])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    for output in ("out", "features"):
        assert f"{output}: shape [3,8,16,16], max abs error" in ok.stdout
    assert ok.stdout.count(": ok\n") == 2
    assert "all 2 outputs match torch's" in ok.stdout

    # One value of torch's output moved by 1e-2 (100x the tolerance) must fail the check.
    wrong = tmp_path / "wrong"
    shutil.copytree(data, wrong)
    expected = np.fromfile(wrong / "output_out.bin", dtype="<f4")
    expected[100] += 1e-2
    expected.tofile(wrong / "output_out.bin")
    mismatch = run([demo, data / "model.onnx", library, wrong])
    assert mismatch.returncode == 1, mismatch.stdout + mismatch.stderr
    assert "out: shape [3,8,16,16]" in mismatch.stdout and "MISMATCH in 1 of 6144 values" in mismatch.stdout
    assert "features: shape [3,8,16,16]" in mismatch.stdout and "MISMATCH: 1 of 2 outputs differ" in mismatch.stdout

    # A library ORT cannot load raises Ort::Exception: reported, with exit status 2, not a crash.
    not_a_library = run([demo, data / "model.onnx", tmp_path / "missing.so", data])
    assert not_a_library.returncode == 2
    assert "ONNX Runtime error" in not_a_library.stderr and "missing.so" in not_a_library.stderr
