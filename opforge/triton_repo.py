"""A Triton Inference Server model repository for an exported model (``opforge triton-repo``).

Triton's ONNX Runtime backend (``platform: "onnxruntime_onnx"``) registers a model's custom-op
libraries from its config, ``model_operations { op_library_filename: PATH }``: it hands PATH, as
written, to ONNX Runtime's ``RegisterCustomOpsLibrary`` when it creates each instance's session.
So PATH must be absolute and valid inside the server (its container), and the library must
accept the backend's ONNX Runtime: opforge's libraries are built on the C API of onnxruntime
1.21 (version 21), so the server must be Triton >= 2.56.0 (NGC container 25.03), the first
release whose onnxruntime backend is ONNX Runtime 1.21.0. An older Triton refuses the library
when the model loads (opforge's message names the API version it lacks).

:func:`write_triton_repo` writes ``DIR/NAME/config.pbtxt``, ``DIR/NAME/1/model.onnx`` and the ORT
libraries the model's custom domains need, beside the config (with a CUDA build's companion,
which the library loads from its own directory on a CUDA EP).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import onnx
from onnx import TensorProto

from .model_files import ExternalDataError, copy_extent, external_data_files
from .ort_kernels import ORTX_DOMAINS, cuda_companion_path, custom_ops, ort_library_path
from .spec import ATEN_DOMAIN

#: The ONNX Runtime C API version opforge's libraries ask for (the headers they are built on).
ORT_API_VERSION = 21
#: The first Triton release whose onnxruntime backend has that API: 2.56.0, NGC container 25.03,
#: ONNX Runtime 1.21.0 (DEFAULT_TRITON_VERSION_MAP in triton-inference-server/server's build.py;
#: 25.02 / 2.55.0 has 1.20.1).
MIN_TRITON = ("2.56.0", "25.03", "1.21.0")
VERSION_RULE = (f"opforge's ONNX Runtime libraries need ONNX Runtime C API version >= {ORT_API_VERSION} "
                f"(onnxruntime >= 1.{ORT_API_VERSION}): serve with Triton >= {MIN_TRITON[0]} (NGC container "
                f"{MIN_TRITON[1]} or later), whose onnxruntime backend is ONNX Runtime {MIN_TRITON[2]}; an older "
                "Triton fails to load the model")

#: ONNX element type -> Triton's data_type (model_config.proto's DataType).
TRITON_TYPES = {
    TensorProto.BOOL: "TYPE_BOOL", TensorProto.UINT8: "TYPE_UINT8", TensorProto.UINT16: "TYPE_UINT16",
    TensorProto.UINT32: "TYPE_UINT32", TensorProto.UINT64: "TYPE_UINT64", TensorProto.INT8: "TYPE_INT8",
    TensorProto.INT16: "TYPE_INT16", TensorProto.INT32: "TYPE_INT32", TensorProto.INT64: "TYPE_INT64",
    TensorProto.FLOAT16: "TYPE_FP16", TensorProto.FLOAT: "TYPE_FP32", TensorProto.DOUBLE: "TYPE_FP64",
    TensorProto.BFLOAT16: "TYPE_BF16", TensorProto.STRING: "TYPE_STRING",
}
KINDS = {"auto": None, "cpu": "KIND_CPU", "gpu": "KIND_GPU"}
MODEL_FILE = "model.onnx"


class TritonRepoError(ValueError):
    """The model cannot be served as asked (the message says which tensor or node, and why)."""


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output as Triton sees it: ``dims`` without the batch dim when batching,
    -1 for a dynamic dim."""

    name: str
    data_type: str
    dims: tuple


def _check_tensor_name(name: str, kind: str) -> None:
    """A name Triton cannot take is refused here, naming it. Any other name is written escaped
    (:func:`_quote`), so the config parses back to exactly the model's name."""
    if not name:
        raise TritonRepoError(f"an {kind} of the model has an empty name; Triton addresses tensors by name")
    if "\0" in name:
        raise TritonRepoError(f"{kind} {name!r} has a NUL character: Triton's backend passes names to ONNX Runtime "
                              "as C strings, which would cut it there")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise TritonRepoError(f"{kind} {name!r} is not valid UTF-8, which Triton's config (proto3) requires") from None


def _tensors(values, kind: str, max_batch: int) -> list:
    specs = []
    for v in values:
        _check_tensor_name(v.name, kind)
        t = v.type.tensor_type
        if not v.type.HasField("tensor_type") or t.elem_type not in TRITON_TYPES:
            raise TritonRepoError(f"{kind} {v.name!r} is not a tensor of a type Triton has "
                                  f"({onnx.helper.printable_type(v.type) or 'no type'})")
        if not t.HasField("shape"):
            raise TritonRepoError(f"{kind} {v.name!r} has no shape in the model; Triton's config needs its rank. "
                                  "Export with shapes (opforge.export records them), or run onnx.shape_inference")
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
        if max_batch > 0:
            if not dims or dims[0] != -1:
                shown = [d.dim_param or d.dim_value for d in t.shape.dim]
                raise TritonRepoError(
                    f"{kind} {v.name!r} has shape {shown}: with --max-batch {max_batch} its first dim is Triton's "
                    "batch dim, so it must be dynamic. Export with a dynamic batch dim (dynamo: "
                    "dynamic_shapes={0: torch.export.Dim('batch')}; TorchScript: dynamic_axes={name: {0: 'batch'}}), "
                    "or pass --max-batch 0 (no batching: the shapes as they are)")
            dims = dims[1:]
        specs.append(TensorSpec(v.name, TRITON_TYPES[t.elem_type], dims))
    return specs


def model_tensors(model: onnx.ModelProto, max_batch: int) -> tuple[list, list]:
    """(inputs, outputs) of ``model`` as :class:`TensorSpec` (initializers are not inputs)."""
    initializers = {i.name for i in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    return _tensors(inputs, "input", max_batch), _tensors(model.graph.output, "output", max_batch)


def libraries_for(model: onnx.ModelProto) -> list[str]:
    """The ORT libraries (paths here) the model's custom domains need, each once."""
    paths = []
    for domain, ops in custom_ops(model).items():
        if domain == ATEN_DOMAIN:
            raise TritonRepoError(
                f"the model has ATen-fallback nodes ({', '.join(ops)}): their library, libopforge_aten.so, runs "
                "them through libtorch, which Triton's onnxruntime backend does not have. Export without "
                "aten_fallback")
        if domain in ORTX_DOMAINS:
            raise TritonRepoError(
                f"the model has nodes of {domain!r} ({', '.join(ops)}), onnxruntime-extensions' domain, where "
                "opforge's prototype ops run as Python: Triton's onnxruntime backend has no Python. Move the op "
                "to C++ (opforge new-op --schema) or serve the model with Triton's Python backend")
        path = ort_library_path(domain)
        if path not in paths:
            paths.append(path)
    return paths


def _quote(s: str) -> str:
    """``s`` as a protobuf text-format string: printable ASCII as is (quotes and backslashes
    escaped), every other byte of its UTF-8 as an octal escape. A newline or any other control
    character thus never reaches the file raw, and Triton's parser gives back exactly ``s``."""
    out = []
    for byte in s.encode("utf-8"):
        if byte in (0x22, 0x27, 0x5C):  # " ' backslash
            out.append("\\" + chr(byte))
        elif 0x20 <= byte < 0x7F:
            out.append(chr(byte))
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _comment(text: str) -> str:
    """``text`` for a ``#`` comment line: control characters escaped, so it stays one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _tensor_block(spec: TensorSpec) -> str:
    lines = [f"    name: {_quote(spec.name)}", f"    data_type: {spec.data_type}"]
    if spec.dims:
        lines.append(f"    dims: [ {', '.join(map(str, spec.dims))} ]")
    else:  # a per-request scalar: Triton's dims are never empty; reshape gives the model its rank 0
        lines += ["    dims: [ 1 ]", "    reshape: { shape: [ ] }"]
    return "  {\n" + "\n".join(lines) + "\n  }"


def _check_options(max_batch: int, instances: int, kind: str) -> None:
    if instances < 1:
        raise TritonRepoError(f"--instances must be >= 1, got {instances}")
    if max_batch < 0:
        raise TritonRepoError(f"--max-batch must be >= 0 (0: no batching), got {max_batch}")
    if kind not in KINDS:
        raise TritonRepoError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")


def triton_config(name: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], *, max_batch: int,
                  instances: int, kind: str = "auto", library_paths: Sequence[str] = (),
                  queue_delay_us: int = 100, header: str = "") -> str:
    """The text of ``config.pbtxt`` (protobuf text format of Triton's ModelConfig)."""
    _check_options(max_batch, instances, kind)
    text = [header,
            f"name: {_quote(name)}",
            'platform: "onnxruntime_onnx"',
            f"max_batch_size: {max_batch}",
            "input [\n" + ",\n".join(_tensor_block(s) for s in inputs) + "\n]",
            "output [\n" + ",\n".join(_tensor_block(s) for s in outputs) + "\n]"]
    if max_batch > 0:
        # requests queue up to queue_delay_us, then run as one batch of up to max_batch
        text.append(f"dynamic_batching {{\n  max_queue_delay_microseconds: {queue_delay_us}\n}}")
    group = [f"    count: {instances}"] + ([f"    kind: {KINDS[kind]}"] if KINDS[kind] else [])
    text.append("instance_group [\n  {\n" + "\n".join(group) + "\n  }\n]")
    if library_paths:
        text.append("model_operations {\n" + "".join(f"  op_library_filename: {_quote(p)}\n"
                                                     for p in library_paths) + "}")
    return "\n".join(t for t in text if t) + "\n"


def _copy_model(src: Path, dest_dir: Path, external: list) -> None:
    """The .onnx file, and its external data files (checked by external_data_files: relative paths
    inside the model's folder), each cut to the bytes the model's tensors use."""
    dest_dir.mkdir(parents=True)
    shutil.copyfile(src, dest_dir / MODEL_FILE)
    for file in external:
        dest = dest_dir / file.location
        dest.parent.mkdir(parents=True, exist_ok=True)
        copy_extent(file, dest)


@dataclass(frozen=True)
class TritonRepo:
    """What :func:`write_triton_repo` wrote."""

    model_dir: Path
    config: Path
    model: Path
    libraries: tuple  # paths in the repository, copied from here
    op_library_filenames: tuple  # the paths the config gives the server
    inputs: tuple
    outputs: tuple


def write_triton_repo(model_path: Union[str, os.PathLike], repo_dir: Union[str, os.PathLike], *,
                      name: Optional[str] = None, max_batch: int = 8, instances: int = 1, kind: str = "auto",
                      server_repo: Optional[str] = None, force: bool = False) -> TritonRepo:
    """Writes the Triton model ``name`` (default: the file's stem) for the exported ONNX model at
    ``model_path`` into the model repository ``repo_dir``: ``config.pbtxt`` (inputs and outputs
    from the model; ``max_batch`` > 0: the first dim of each is the batch dim and dynamic
    batching is on; ``instances`` copies of the model on ``kind`` devices), ``1/model.onnx`` and
    the ORT libraries its custom domains need. ``server_repo``: ``repo_dir``'s path as the server
    sees it (e.g. ``/models`` in a container), for ``op_library_filename``; default: its
    absolute path here. An existing ``repo_dir/name`` is replaced only with ``force``."""
    _check_options(max_batch, instances, kind)  # before anything is written
    src = Path(model_path)
    if not src.is_file():
        raise TritonRepoError(f"no model at {src}")
    model = onnx.load(str(src), load_external_data=False)
    name = name or src.stem
    if not name or name.startswith(".") or any(c in name for c in "/\\") or not name.isprintable():
        raise TritonRepoError(f"{name!r} is not a model name: it is the repository's folder name, so no '/', "
                              "no leading '.', no control characters (pass --name)")
    try:  # every path the model names, checked before anything is written
        external = external_data_files(model, src.parent)
    except ExternalDataError as exc:
        raise TritonRepoError(f"{src.name}: {exc}") from None
    libraries = libraries_for(model)  # first: a model the backend cannot run at all says so
    inputs, outputs = model_tensors(model, max_batch)
    repo = Path(repo_dir)
    model_dir = repo / name
    server_dir = (server_repo.rstrip("/") if server_repo else str(repo.resolve())) + "/" + name
    if not server_dir.startswith("/"):
        raise TritonRepoError(f"--server-repo must be an absolute path (the server opens it as is), got {server_repo!r}")
    if model_dir.exists():
        if not force:
            raise TritonRepoError(f"{model_dir} exists; pass --force to replace it")
        shutil.rmtree(model_dir)
    _copy_model(src, model_dir / "1", external)
    copied, op_paths = [], []
    for library in libraries:
        for path in [library] + ([cuda_companion_path(library)] if cuda_companion_path(library) else []):
            copied.append(Path(shutil.copy2(path, model_dir / Path(path).name)))
        op_paths.append(f"{server_dir}/{Path(library).name}")  # the companion is loaded by the library
    from . import __version__

    header = (f"# Written by `opforge triton-repo` (opforge {__version__}) from {_comment(src.name)}.\n"
              + "".join(f"# {line}\n" for line in (_wrap(VERSION_RULE) if libraries else [])))
    text = triton_config(name, inputs, outputs, max_batch=max_batch, instances=instances, kind=kind,
                         library_paths=op_paths if libraries else (), header=header.rstrip("\n"))
    config = model_dir / "config.pbtxt"
    config.write_text(text)
    return TritonRepo(model_dir, config, model_dir / "1" / MODEL_FILE, tuple(copied), tuple(op_paths),
                      tuple(inputs), tuple(outputs))


def _wrap(text: str, width: int = 96) -> list:
    import textwrap

    return textwrap.wrap(text, width)
