"""ONNX Runtime custom-op libraries, by ONNX domain.

Each custom ONNX domain is served by one ORT library (ONNX Runtime allows one per
domain and SessionOptions). opforge's own: ``opforge`` -> ``libopforge_ort.so``,
``org.pytorch.aten`` -> ``libopforge_aten.so``; onnxruntime-extensions' library serves
``ai.onnx.contrib`` (its own ops and Python ops) and the domains of opforge's prototype ops
(:func:`opforge.register_prototype`), registered once per session however many of them a
model uses. Other packages add theirs with :func:`register_ort_library`, or declare them as
an entry point (found without importing the package)::

    [project.entry-points."opforge.ort_libraries"]
    "com.example" = "my_ops._ort:library_path"     # a function returning the path

Then ``opforge.ort_session(model)`` registers exactly the libraries the model's
custom domains need, once each::

    sess = opforge.ort_session("model.onnx")
    # or by hand:
    so = onnxruntime.SessionOptions()
    so.register_custom_ops_library(opforge.ort_library_path("com.example"))
"""

from .libraries import (ATEN_DOMAIN, BUILTIN_DOMAINS, ENTRY_POINT_GROUP, MMDEPLOY_DOMAINS, MMDEPLOY_OPS,
                        MissingOrtLibrary, aten_library_path, cuda_companion_path, cuda_companion_status,
                        mmdeploy_library_path, ort_libraries, ort_library_path, register_ort_library)
from .ortx import (ORTX_DISTRIBUTION, ORTX_DOMAIN, ORTX_DOMAINS, ORTX_PIN, ortx_library_path, ortx_python_op_tables,
                   ortx_tables_in_use, ortx_version)
from .session import (REGISTER_HINT, ConflictingOrtLibraries, MissingOpforgeKernels, MissingOrtKernels,
                      check_library_kernels, custom_ops, ort_session)

__all__ = [
    "ATEN_DOMAIN",
    "BUILTIN_DOMAINS",
    "ConflictingOrtLibraries",
    "ENTRY_POINT_GROUP",
    "MMDEPLOY_DOMAINS",
    "MMDEPLOY_OPS",
    "MissingOpforgeKernels",
    "MissingOrtKernels",
    "MissingOrtLibrary",
    "ORTX_DISTRIBUTION",
    "ORTX_DOMAIN",
    "ORTX_DOMAINS",
    "ORTX_PIN",
    "REGISTER_HINT",
    "aten_library_path",
    "check_library_kernels",
    "cuda_companion_path",
    "cuda_companion_status",
    "custom_ops",
    "mmdeploy_library_path",
    "ort_libraries",
    "ort_library_path",
    "ort_session",
    "ortx_library_path",
    "ortx_python_op_tables",
    "ortx_tables_in_use",
    "ortx_version",
    "register_ort_library",
]
