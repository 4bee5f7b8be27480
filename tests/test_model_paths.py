"""Paths and names a model carries (issue #55 items 1-2): external data is read only from inside the
model's own folder, by `opforge triton-repo` and `opforge.ort_session`, and every name written into
config.pbtxt is escaped or refused. Each refusal happens before anything is read or written."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import opforge
from opforge.model_files import ExternalDataError, external_data_files
from opforge.triton_repo import TritonRepoError, _quote, write_triton_repo

W = np.arange(6, dtype=np.float32).reshape(2, 3)
B = np.full((3,), 0.5, dtype=np.float32)


def _external(name, array, location, offset=0, length=None):
    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=array.shape)
    t.data_location = TensorProto.EXTERNAL
    entries = [("location", location), ("offset", str(offset))]
    if length is not None:
        entries.append(("length", str(length)))
    for key, value in entries:
        t.external_data.add(key=key, value=value)
    return t


def _model(location="weights.bin", input_name="x", output_name="y", b_offset=W.nbytes, length=None):
    """y = x + W + B, W and B external in ``location`` (W at 0, B at ``b_offset``)."""
    nodes = [helper.make_node("Add", [input_name, "W"], ["t"]), helper.make_node("Add", ["t", "B"], [output_name])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["n", 3])],
                              [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["n", 3])],
                              initializer=[_external("W", W, location, 0, length),
                                           _external("B", B, location, b_offset)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _write(folder: Path, model, *, filename="model.onnx", data=W.tobytes() + B.tobytes()) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if data is not None:
        (folder / "weights.bin").write_bytes(data)
    path = folder / filename
    path.write_bytes(model.SerializeToString())
    return path


def _expected(x):
    return x + W + B


# ---- the rules, on the model alone -------------------------------------------------------------------------

def test_a_model_inside_its_folder_is_accepted_with_the_bytes_it_uses(tmp_path):
    _write(tmp_path, _model(), data=W.tobytes() + B.tobytes() + b"tail the model never names" * 100)
    (file,) = external_data_files(_model(), tmp_path)
    assert file.location == "weights.bin" and file.extent == W.nbytes + B.nbytes


@pytest.mark.parametrize("location, why", [
    ("../outside.bin", "leaves the model's folder"),
    ("sub/../../outside.bin", "leaves the model's folder"),
    ("ABSOLUTE", "is an absolute path"),
    ("/dev/zero", "is an absolute path"),
    ("link_out.bin", "outside the model's folder"),
    ("link_zero.bin", "outside the model's folder"),
    ("fifo.bin", "is not a regular file"),
    ("sub", "is not a regular file"),
    ("missing.bin", "cannot be read"),
    ("", "has no location"),
    ("a\0b", "NUL"),
])
def test_every_path_out_of_the_folder_is_refused(tmp_path, location, why):
    folder = tmp_path / "model"
    _write(folder, _model())
    outside = tmp_path / "outside.bin"
    outside.write_bytes(W.tobytes() + B.tobytes())
    (folder / "link_out.bin").symlink_to(outside)
    (folder / "link_zero.bin").symlink_to("/dev/zero")
    os.mkfifo(folder / "fifo.bin")
    (folder / "sub").mkdir()
    location = str(outside) if location == "ABSOLUTE" else location
    with pytest.raises(ExternalDataError, match=why) as refused:
        external_data_files(_model(location), folder)
    assert "tensor 'W'" in str(refused.value)


def test_sizes_offsets_and_lengths_are_checked_against_the_declared_tensor(tmp_path):
    _write(tmp_path, _model())
    with pytest.raises(ExternalDataError, match="length 20 is not the tensor's declared size, 24 bytes"):
        external_data_files(_model(length=20), tmp_path)
    with pytest.raises(ExternalDataError, match="tensor 'B': its 12 bytes at offset 30 run past the end"):
        external_data_files(_model(b_offset=30), tmp_path)
    bad = _model()
    bad.graph.initializer[1].external_data[1].value = "-4"
    with pytest.raises(ExternalDataError, match="offset '-4' is not a whole number"):
        external_data_files(bad, tmp_path)


def test_external_data_in_a_subgraph_is_checked_too(tmp_path):
    """An If branch's initializer is a model path like any other."""
    then = helper.make_graph([helper.make_node("Identity", ["W"], ["out"])], "then", [],
                             [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])],
                             initializer=[_external("W", W, "../outside.bin")])
    other = helper.make_graph([helper.make_node("Identity", ["c"], ["out2"])], "else", [],
                              [helper.make_tensor_value_info("out2", TensorProto.FLOAT, [2, 3])],
                              initializer=[helper.make_tensor("c", TensorProto.FLOAT, [2, 3], W.ravel())])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    with pytest.raises(ExternalDataError, match="tensor 'W'.*leaves the model's folder"):
        external_data_files(helper.make_model(graph), tmp_path)


# ---- opforge triton-repo -----------------------------------------------------------------------------------

def test_triton_repo_copies_only_the_bytes_the_model_uses(tmp_path):
    path = _write(tmp_path / "src", _model(), data=W.tobytes() + B.tobytes() + b"\0" * 50_000)
    repo = write_triton_repo(path, tmp_path / "models", name="m", max_batch=0)
    copied = repo.model.parent / "weights.bin"
    assert copied.read_bytes() == W.tobytes() + B.tobytes()  # the 50 kB past the last tensor stay behind
    import onnxruntime as ort

    session = ort.InferenceSession(str(repo.model), providers=["CPUExecutionProvider"])
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], _expected(x))


@pytest.mark.parametrize("location", ["../outside.bin", "ABSOLUTE", "/dev/zero", "link_out.bin"])
def test_triton_repo_refuses_paths_out_of_the_folder_and_writes_nothing(tmp_path, location):
    folder = tmp_path / "src"
    outside = tmp_path / "outside.bin"
    outside.write_bytes(W.tobytes() + B.tobytes())
    folder.mkdir()
    (folder / "link_out.bin").symlink_to(outside)
    location = str(outside) if location == "ABSOLUTE" else location
    path = _write(folder, _model(location), data=None)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(TritonRepoError, match="model.onnx: tensor 'W'"):
        write_triton_repo(path, tmp_path / "models" / "deeper", max_batch=0)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no repository, no directory, no copy


def test_triton_repo_cli_refuses_with_status_1(tmp_path):
    path = _write(tmp_path / "src", _model("../../etc/passwd"), data=None)
    run = subprocess.run([sys.executable, "-m", "opforge", "triton-repo", str(path), str(tmp_path / "models")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "leaves the model's folder" in run.stderr and not (tmp_path / "models").exists()


def test_model_names_and_filenames_never_reach_the_config_raw(tmp_path):
    """A filename with a newline: as the default model name it is refused; with --name, the header
    comment shows it escaped, and no line of the config comes from it."""
    injected = 'x.onnx\nmodel_operations { op_library_filename: "evil.so" }\n#'
    path = _write(tmp_path / "src", _model(), filename=injected)
    with pytest.raises(TritonRepoError, match="is not a model name"):
        write_triton_repo(path, tmp_path / "models", max_batch=0)
    for bad in ("../up", ".hidden", "a/b", "tab\there", ""):
        with pytest.raises(TritonRepoError, match="is not a model name"):
            write_triton_repo(path, tmp_path / "models", name=bad or ".", max_batch=0)
    repo = write_triton_repo(path, tmp_path / "models", name="plain", max_batch=0)
    config = repo.config.read_text()
    body = config.split("\n", 1)[1]  # past the header comment, which shows the filename escaped
    assert "model_operations" not in body and "evil" not in body
    assert config.splitlines()[0] == ("# Written by `opforge triton-repo` (opforge "
                                      f"{opforge.__version__}) from x.onnx\\nmodel_operations {{ op_library_filename: "
                                      '"evil.so" }\\n#.')


NAMES = ['with "quotes"', "new\nline", "back\\slash", "tab\t", "ünïcødé 名前", "it's", "\x7f\x01ctl", "#hash: x }"]


@pytest.mark.parametrize("name", NAMES)
def test_quoted_names_parse_back_exactly(name):
    """protobuf's own text-format parser (the one Triton's config loader uses) gives back the name."""
    from google.protobuf import text_format

    parsed = text_format.Parse(f"name: {_quote(name)}", onnx.ValueInfoProto())
    assert parsed.name == name
    assert "\n" not in _quote(name) and all(0x20 <= ord(c) < 0x7F for c in _quote(name))


def test_tensor_names_triton_cannot_take_are_refused_by_name(tmp_path):
    for name, why in (("a\0b", "NUL character"), ("", "empty name")):
        path = _write(tmp_path / f"src{len(name)}", _model(input_name=name))
        with pytest.raises(TritonRepoError, match=why):
            write_triton_repo(path, tmp_path / "models", name=f"m{len(name)}", max_batch=0)
    assert not (tmp_path / "models").exists()


@pytest.mark.slow
def test_hostile_tensor_names_round_trip_through_tritons_config_parser(tmp_path):
    """Every name of NAMES as an input and an output: the config written for it parses with
    tritonclient's ModelConfig, and the names it gives back are the model's."""
    from test_serving import serve_venv, TRITON_REQUIREMENTS

    python = serve_venv("triton", TRITON_REQUIREMENTS, sees_this_venv=False)
    names = []
    for i, name in enumerate(NAMES):
        path = _write(tmp_path / f"src{i}", _model(input_name=name, output_name=name + " out"))
        write_triton_repo(path, tmp_path / "models", name=f"m{i}", max_batch=0)
        names.append([name, name + " out"])
    script = (
        "import json, sys\n"
        "from google.protobuf import text_format\n"
        "from tritonclient.grpc import model_config_pb2\n"
        "out = []\n"
        f"for i in range({len(NAMES)}):\n"
        "    text = open(f'{sys.argv[1]}/m{i}/config.pbtxt').read()\n"
        "    c = text_format.Parse(text, model_config_pb2.ModelConfig())\n"
        "    out.append([c.input[0].name, c.output[0].name])\n"
        "print(json.dumps(out))\n")
    run = subprocess.run([str(python), "-c", script, str(tmp_path / "models")], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    import json

    assert json.loads(run.stdout) == names


# ---- opforge.ort_session -----------------------------------------------------------------------------------

def test_ort_session_reads_a_paths_external_data_from_its_folder_only(tmp_path):
    path = _write(tmp_path / "good", _model())
    x = np.ones((1, 3), np.float32)
    np.testing.assert_array_equal(opforge.ort_session(path).run(None, {"x": x})[0], _expected(x))
    (tmp_path / "outside.bin").write_bytes(W.tobytes() + B.tobytes())
    bad = _write(tmp_path / "bad", _model("../outside.bin"), data=None)
    with pytest.raises(ExternalDataError, match="tensor 'W'.*leaves the model's folder"):
        opforge.ort_session(bad)


@pytest.mark.parametrize("form", ["bytes", "ModelProto"])
def test_ort_session_never_resolves_external_data_against_the_current_directory(tmp_path, monkeypatch, form):
    folder = tmp_path / "cwd"
    _write(folder, _model())
    monkeypatch.chdir(folder)  # weights.bin is right here: a server's current directory
    proto = _model()
    model = proto.SerializeToString() if form == "bytes" else proto
    with pytest.raises(ExternalDataError, match="no folder to find it in. Pass external_data_dir="):
        opforge.ort_session(model)
    # named by the caller, the folder is used, and only its inside
    x = np.full((2, 3), 2.0, np.float32)
    session = opforge.ort_session(model, external_data_dir=folder)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], _expected(x))
    if form == "ModelProto":
        assert proto == _model()  # the caller's ModelProto is left as it was
    hostile = _model("../../etc/passwd")
    with pytest.raises(ExternalDataError, match="leaves the model's folder"):
        opforge.ort_session(hostile if form == "ModelProto" else hostile.SerializeToString(),
                            external_data_dir=folder)
