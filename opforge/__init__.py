"""opforge: PyTorch custom operators end to end.

``import opforge`` loads the torch extension (``torch.ops.opforge.*``), registers
every op's fake impl and autograd, its ONNX schema, and its TorchScript symbolics
(so plain ``torch.onnx.export(..., dynamo=False)`` works); ``opforge.export``
also wires the dynamo exporter; ``opforge.ort_session`` / ``ort_library_path``
run the exported models in ONNX Runtime.
"""

from . import ops, spec, symbolics
from .diagnosis import Diagnosis, ExportError, diagnose
from .export import export
from .ops import DeformConv2d, MyAdd, MyAddFunction, deform_conv2d, my_add
from .ort_kernels import MissingOpforgeKernels, aten_library_path, ort_library_path, ort_session
from .symbolics import standard_onnx, translation_table

__version__ = "0.1.0"

#: True when this build has CUDA kernels: torch ops on CUDA tensors, and the ORT
#: library's CUDAExecutionProvider kernels (built with OPFORGE_CUDA=auto|1).
BUILT_WITH_CUDA = bool(getattr(ops._registry._C, "WITH_CUDA", 0))

symbolics.register_all()

__all__ = [
    "BUILT_WITH_CUDA",
    "Diagnosis",
    "ExportError",
    "diagnose",
    "DeformConv2d",
    "deform_conv2d",
    "MissingOpforgeKernels",
    "aten_library_path",
    "MyAdd",
    "MyAddFunction",
    "export",
    "my_add",
    "ops",
    "ort_library_path",
    "ort_session",
    "spec",
    "standard_onnx",
    "symbolics",
    "translation_table",
]
