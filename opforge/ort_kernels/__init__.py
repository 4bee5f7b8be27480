"""opforge's ONNX Runtime custom-op library (``libopforge_ort.so``).

    so = onnxruntime.SessionOptions()
    so.register_custom_ops_library(opforge.ort_library_path())
    sess = onnxruntime.InferenceSession("model.onnx", so)

or, equivalently, ``opforge.ort_session("model.onnx")``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional, Sequence, Union

import onnx

from ..spec import DOMAIN

_LIB_NAME = "libopforge_ort.so"
_ATEN_LIB_NAME = "libopforge_aten.so"
_ATEN_DOMAIN = "org.pytorch.aten"

#: What users must do when a model with opforge ops meets a session without our kernels.
REGISTER_HINT = "sess_options.register_custom_ops_library(opforge.ort_library_path())"


def ort_library_path() -> str:
    """Absolute path of the built ORT custom-op library."""
    path = Path(__file__).with_name(_LIB_NAME)
    if not path.is_file():
        raise FileNotFoundError(
            f"opforge: {path} is not built. Build opforge with `pip install --no-build-isolation -e .` "
            "(needs ORT headers: bash scripts/fetch_ort_headers.sh)"
        )
    return str(path)


def aten_library_path() -> str:
    """Absolute path of libopforge_aten.so, the ORT kernel for ``org.pytorch.aten::ATen``
    nodes (links libtorch; load it in processes that can load torch's libraries)."""
    path = Path(__file__).with_name(_ATEN_LIB_NAME)
    if not path.is_file():
        raise FileNotFoundError(f"opforge: {path} is not built. Build opforge with `pip install --no-build-isolation -e .`")
    return str(path)


class MissingOpforgeKernels(RuntimeError):
    """A model uses ``opforge`` ops but the ORT session has no opforge kernels."""


def _model_bytes_and_domains(model) -> tuple[Union[str, bytes], set]:
    if isinstance(model, onnx.ModelProto):
        proto = model
        data: Union[str, bytes] = model.SerializeToString()
    elif isinstance(model, (bytes, bytearray)):
        data = bytes(model)
        proto = onnx.load_from_string(data)
    else:
        data = os.fspath(model)
        proto = onnx.load(data, load_external_data=False)
    ops = {f"{n.domain}::{n.op_type}" for n in proto.graph.node if n.domain in (DOMAIN, _ATEN_DOMAIN)}
    return data, ops


def ort_session(
    model,
    sess_options=None,
    providers: Optional[Sequence] = None,
    *,
    intra_op_num_threads: Optional[int] = None,
    register_opforge: bool = True,
    register_aten: Optional[bool] = None,
):
    """An ``onnxruntime.InferenceSession`` for ``model`` (ModelProto, bytes or path) with
    libopforge_ort registered.

    With ``register_opforge=False`` (a session as a plain ORT user would make it),
    a model that needs opforge kernels fails with :class:`MissingOpforgeKernels`
    telling what to register, instead of ORT's bare "not a registered function/op".
    ``register_aten`` (default: when the model has ``org.pytorch.aten::ATen`` nodes)
    also registers libopforge_aten.
    """
    import onnxruntime as ort

    so = sess_options if sess_options is not None else ort.SessionOptions()
    if intra_op_num_threads is not None:
        so.intra_op_num_threads = intra_op_num_threads
    if register_opforge:
        so.register_custom_ops_library(ort_library_path())
    data, opforge_ops = _model_bytes_and_domains(model)
    if register_aten or (register_aten is None and register_opforge and any(o.startswith(_ATEN_DOMAIN) for o in opforge_ops)):
        so.register_custom_ops_library(aten_library_path())
    try:
        return ort.InferenceSession(data, so, providers=list(providers or ["CPUExecutionProvider"]))
    except Exception as exc:  # ORT raises its own pybind exception types
        missing = re.search(r"(\S*opforge\S*) is not a registered function/op", str(exc))
        if opforge_ops and (missing or "not a registered function/op" in str(exc)):
            raise MissingOpforgeKernels(
                f"opforge: the model uses {', '.join(sorted(opforge_ops))} but this ONNX Runtime session has no "
                f"opforge kernels. Register them before creating the session: {REGISTER_HINT} "
                f"(for org.pytorch.aten::ATen nodes: opforge.aten_library_path()) "
                f"(or use opforge.ort_session(model)). ORT said: {exc}"
            ) from exc
        raise


__all__ = ["aten_library_path", "ort_library_path", "ort_session", "MissingOpforgeKernels", "REGISTER_HINT"]
