"""The files an ONNX model names: its external data, confined to the model's own folder.

A model is untrusted input, and an external-data entry is a path the model chooses. Left alone,
``location: "../../etc/passwd"``, an absolute path, a symlink out of the folder or a device such as
``/dev/zero`` make whoever loads or copies the model read files it was not given, or read forever.
:func:`external_data_files` checks every entry before anything reads or writes a byte:

- ``location`` is a relative path inside the base folder: not absolute, no ``..`` part, no NUL,
  and after symlinks are resolved still inside the folder;
- it names a regular file (not a directory, device, FIFO or socket);
- ``offset`` / ``length`` are whole numbers; ``length``, when given, is the tensor's declared size
  (its dims times its element size); the tensor's bytes lie inside the file.

Each file is then known with its *extent*: the last byte any tensor of the model uses. A copy
(``opforge triton-repo``) writes only that much, so what it writes is bounded by the tensors'
declared sizes, whatever the file holds past them.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import onnx
from onnx import TensorProto

__all__ = ["ExternalDataError", "ExternalFile", "external_data_files", "external_tensors", "copy_extent",
           "inline_external_data"]

#: Bytes per element of the types external data can hold (strings cannot be external).
_ITEM_BYTES = {
    TensorProto.FLOAT: 4, TensorProto.UINT8: 1, TensorProto.INT8: 1, TensorProto.UINT16: 2, TensorProto.INT16: 2,
    TensorProto.INT32: 4, TensorProto.INT64: 8, TensorProto.BOOL: 1, TensorProto.FLOAT16: 2, TensorProto.DOUBLE: 8,
    TensorProto.UINT32: 4, TensorProto.UINT64: 8, TensorProto.COMPLEX64: 8, TensorProto.COMPLEX128: 16,
    TensorProto.BFLOAT16: 2,
}
for _name, _bytes in (("FLOAT8E4M3FN", 1), ("FLOAT8E4M3FNUZ", 1), ("FLOAT8E5M2", 1), ("FLOAT8E5M2FNUZ", 1),
                      ("FLOAT8E8M0", 1)):
    if hasattr(TensorProto, _name):
        _ITEM_BYTES[getattr(TensorProto, _name)] = _bytes
#: 4-bit types: two elements a byte, rounded up.
_NIBBLE_TYPES = {getattr(TensorProto, n) for n in ("UINT4", "INT4", "FLOAT4E2M1") if hasattr(TensorProto, n)}


class ExternalDataError(ValueError):
    """An external-data entry of the model is refused (the message names the tensor and why)."""


@dataclass(frozen=True)
class ExternalFile:
    """A file the model's external data lives in: ``location`` as the model writes it, ``path``
    resolved inside the base folder, ``extent`` the bytes of it the model's tensors use."""

    location: str
    path: Path
    extent: int


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto) -> Iterator[TensorProto]:
    for attr in node.attribute:
        if attr.HasField("t"):
            yield attr.t
        yield from attr.tensors
        if attr.HasField("sparse_tensor"):
            yield attr.sparse_tensor.values
            yield attr.sparse_tensor.indices
        for sparse in attr.sparse_tensors:
            yield sparse.values
            yield sparse.indices
        if attr.HasField("g"):
            yield from _graph_tensors(attr.g)
        for sub in attr.graphs:
            yield from _graph_tensors(sub)


def external_tensors(model: onnx.ModelProto) -> list:
    """Every tensor of ``model`` whose data is external: initializers, sparse ones, node attributes,
    subgraphs (If/Loop/Scan bodies) and the model's local functions."""
    tensors = list(_graph_tensors(model.graph))
    for function in model.functions:
        for node in function.node:
            tensors.extend(_node_tensors(node))
    return [t for t in tensors if t.data_location == TensorProto.EXTERNAL]


def _declared_bytes(tensor: TensorProto, where: str) -> int:
    if any(d < 0 for d in tensor.dims):
        raise ExternalDataError(f"{where}: dims {list(tensor.dims)} has a negative size")
    count = 1
    for d in tensor.dims:
        count *= d  # Python ints: no overflow
    if tensor.data_type in _NIBBLE_TYPES:
        return (count + 1) // 2
    if tensor.data_type not in _ITEM_BYTES:
        name = TensorProto.DataType.Name(tensor.data_type) if tensor.data_type in TensorProto.DataType.values() \
            else str(tensor.data_type)
        raise ExternalDataError(f"{where}: element type {name} cannot be stored as external data")
    return count * _ITEM_BYTES[tensor.data_type]


def _whole_number(text: str, key: str, where: str) -> int:
    if not text.isdigit() or not text.isascii():
        raise ExternalDataError(f"{where}: external-data {key} {text!r} is not a whole number")
    return int(text)


def _confined(base: Path, location: str, where: str) -> Path:
    if not location:
        raise ExternalDataError(f"{where}: external data has no location")
    if "\0" in location:
        raise ExternalDataError(f"{where}: external-data location {location!r} has a NUL character")
    parts = location.replace("\\", "/").split("/")
    if location.startswith(("/", "\\")) or os.path.isabs(location):
        raise ExternalDataError(f"{where}: external-data location {location!r} is an absolute path; a model may "
                                "name only files inside its own folder")
    if ".." in parts:
        raise ExternalDataError(f"{where}: external-data location {location!r} leaves the model's folder ('..')")
    root = base.resolve()
    path = (root / location).resolve()
    if path != root and root not in path.parents:
        raise ExternalDataError(f"{where}: external-data location {location!r} resolves to {path}, outside the "
                                f"model's folder {root} (a symlink out)")
    try:
        info = path.stat()
    except OSError as exc:
        raise ExternalDataError(f"{where}: external-data file {location!r} cannot be read in {root}: "
                                f"{exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ExternalDataError(f"{where}: external-data location {location!r} is not a regular file")
    return path


def external_data_files(model: onnx.ModelProto, base_dir) -> list:
    """The :class:`ExternalFile` of every file ``model``'s external data names, each checked to lie
    inside ``base_dir`` (the model file's folder) as the module docstring says. Raises
    :class:`ExternalDataError` naming the tensor at the first entry refused. Reads no data."""
    base = Path(base_dir)
    extents: dict = {}
    for tensor in external_tensors(model):
        where = f"tensor {tensor.name!r}"
        entries: dict = {}
        for entry in tensor.external_data:
            if entry.key in entries:
                raise ExternalDataError(f"{where}: external-data key {entry.key!r} is given twice")
            entries[entry.key] = entry.value
        location = entries.get("location", "")
        path = _confined(base, location, where)
        offset = _whole_number(entries.get("offset", "0"), "offset", where)
        size = _declared_bytes(tensor, where)
        if "length" in entries and _whole_number(entries["length"], "length", where) != size:
            raise ExternalDataError(f"{where}: external-data length {entries['length']} is not the tensor's "
                                    f"declared size, {size} bytes (dims {list(tensor.dims)})")
        file_size = path.stat().st_size
        if offset + size > file_size:
            raise ExternalDataError(f"{where}: its {size} bytes at offset {offset} run past the end of "
                                    f"{location!r} ({file_size} bytes)")
        known = extents.get(path)
        extents[path] = ExternalFile(known.location if known else location, path,
                                     max(offset + size, known.extent if known else 0))
    return list(extents.values())


def copy_extent(file: ExternalFile, dest: Path, chunk: int = 1 << 20) -> None:
    """Copies the first ``file.extent`` bytes of ``file`` to ``dest`` (new; its folder must exist):
    never more than the model's tensors use."""
    left = file.extent
    with open(file.path, "rb") as src, open(dest, "xb") as out:
        while left > 0:
            block = src.read(min(chunk, left))
            if not block:
                raise ExternalDataError(f"external-data file {file.location!r} shrank while it was copied")
            out.write(block)
            left -= len(block)


def inline_external_data(model: onnx.ModelProto, base_dir) -> onnx.ModelProto:
    """A copy of ``model`` with every external tensor's bytes read into it from ``base_dir``, after
    :func:`external_data_files` has checked them: each tensor reads exactly its declared size at its
    offset, never the rest of the file. ``model`` itself is left as it was."""
    external_data_files(model, base_dir)  # refuses before any byte is read
    inlined = onnx.ModelProto()
    inlined.CopyFrom(model)
    root = Path(base_dir).resolve()
    for tensor in external_tensors(inlined):
        entries = {e.key: e.value for e in tensor.external_data}
        with open((root / entries["location"]).resolve(), "rb") as f:
            f.seek(int(entries.get("offset", "0")))
            tensor.raw_data = f.read(_declared_bytes(tensor, tensor.name))
        del tensor.external_data[:]
        tensor.data_location = TensorProto.DEFAULT
    return inlined
