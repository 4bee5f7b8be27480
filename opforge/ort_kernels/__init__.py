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
    ops = {f"{n.domain}::{n.op_type}" for n in proto.graph.node if n.domain == DOMAIN}
    return data, ops


def ort_session(
    model,
    sess_options=None,
    providers: Optional[Sequence] = None,
    *,
    intra_op_num_threads: Optional[int] = None,
    register_opforge: bool = True,
):
    """An ``onnxruntime.InferenceSession`` for ``model`` (ModelProto, bytes or path) with
    libopforge_ort registered.

    With ``register_opforge=False`` (a session as a plain ORT user would make it),
    a model that needs opforge kernels fails with :class:`MissingOpforgeKernels`
    telling what to register, instead of ORT's bare "not a registered function/op".
    """
    import onnxruntime as ort

    so = sess_options if sess_options is not None else ort.SessionOptions()
    if intra_op_num_threads is not None:
        so.intra_op_num_threads = intra_op_num_threads
    if register_opforge:
        so.register_custom_ops_library(ort_library_path())
    data, opforge_ops = _model_bytes_and_domains(model)
    try:
        return ort.InferenceSession(data, so, providers=list(providers or ["CPUExecutionProvider"]))
    except Exception as exc:  # ORT raises its own pybind exception types
        missing = re.search(r"(\S*opforge\S*) is not a registered function/op", str(exc))
        if opforge_ops and (missing or "not a registered function/op" in str(exc)):
            raise MissingOpforgeKernels(
                f"opforge: the model uses {', '.join(sorted(opforge_ops))} but this ONNX Runtime session has no "
                f"opforge kernels. Register them before creating the session: {REGISTER_HINT} "
                f"(or use opforge.ort_session(model)). ORT said: {exc}"
            ) from exc
        raise


__all__ = ["ort_library_path", "ort_session", "MissingOpforgeKernels", "REGISTER_HINT"]
