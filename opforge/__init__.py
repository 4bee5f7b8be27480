"""opforge: PyTorch custom operators end to end.

``import opforge`` loads the torch op library (``torch.ops.opforge.*``) and registers
every built-in op through the same public API a package uses for its own ops:
:func:`register_op` (fake impl, autograd, ONNX schema, TorchScript symbolics; the
dynamo translation and ``onnx.reference`` op read the registry), and ORT libraries by
ONNX domain (:func:`register_ort_library`, :func:`ort_library_path`,
:func:`ort_session`). :func:`register_prototype` makes an op from a spec and a numpy function
alone (torch, both exporters, and ONNX Runtime through onnxruntime-extensions), before any C++
exists. :mod:`opforge.build` builds a package's own kernels;
:mod:`opforge.testing` checks an op end to end; ``opforge new-op`` writes a working one.
"""

from . import aten, ops, spec, symbolics
from .aten import AtenOpRefused, Diagnosis, ExportError, diagnose
from .export import export
from .ops import (MSDeformAttn, MultiScaleDeformableAttnFunction, MyAdd, MyAddFunction, RoIAlignRotated,
                  RoIAlignRotatedFunction, batched_nms_rotated, deform_conv2d, ms_deform_attn, my_add, nms_rotated,
                  roi_align_rotated)
from .ort_kernels import (
    ConflictingOrtLibraries,
    MissingOpforgeKernels,
    MissingOrtKernels,
    MissingOrtLibrary,
    aten_library_path,
    mmdeploy_library_path,
    ort_libraries,
    ort_library_path,
    ort_session,
    ortx_version,
    register_ort_library,
)
from .prototype import PrototypeKernelWarning, register_prototype
from .registration import OpInputError, OpRegistrationError, check_library, check_same_device, register_op
from .shape_rule import ShapeRule
from .spec import AttrArg, OpSpec, TensorArg
from .aoti import aoti_compile_and_package
from .torch_library import TorchLibrary, load_torch_library
from .torchvision_patch import TorchvisionPatch, patch_torchvision, unpatch_torchvision
from .transformers_patch import (TransformersPatch, patch_transformers, transformers_kernel_mapping,
                                 transformers_kernel_repository, unpatch_transformers)
from .symbolics import standard_onnx, translation_table

__version__ = "0.2.0"

#: True when this build has CUDA kernels: torch ops on CUDA tensors, and the ORT
#: library's CUDAExecutionProvider kernels (built with OPFORGE_CUDA=auto|1).
BUILT_WITH_CUDA = bool(getattr(ops._registry._C, "WITH_CUDA", 0))


def torch_library_path() -> str:
    """The path of libopforge_torch.so, the library that registers every opforge op in torch
    (``torch.ops.opforge.*``) with no Python in the process: a C++ program (an AOTInductor runner)
    ``dlopen``s it before it loads a ``.pt2`` that calls opforge's ops. Built once on LibTorch's
    stable ABI, it loads in every torch from 2.10 on; its CUDA kernels load from
    libopforge_torch_cuda.so beside it where a CUDA runtime is present."""
    return ops._registry.LIBRARY_PATH


def set_budget(name: str, value) -> int:
    """Sets one of opforge's op budgets in torch, process-wide, and returns the value it had:
    ``name`` as in :func:`budgets` (the same names as the ONNX Runtime session config entries
    of those budgets, e.g. ``"opforge.roi_align_rotated.max_samples"``), ``value`` a positive int
    or None for the default. For trusted callers: a budget bounds the memory and work one call
    of an op may take, checked before it runs (docs/ops.md)."""
    return ops._registry._C.set_budget(name, value)


def budgets() -> dict:
    """opforge's op budgets in torch: ``{name: (value, default)}`` (:func:`set_budget`)."""
    return ops._registry._C.budgets()


aten.register_all()


def __getattr__(name: str):
    if name == "DeformConv2d":  # made on first use: it subclasses torchvision's, which is slow to import
        return ops.DeformConv2d
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "aoti_compile_and_package",
    "load_torch_library",
    "torch_library_path",
    "budgets",
    "set_budget",
    "AtenOpRefused",
    "AttrArg",
    "BUILT_WITH_CUDA",
    "TorchLibrary",
    "ConflictingOrtLibraries",
    "DeformConv2d",
    "Diagnosis",
    "ExportError",
    "MissingOpforgeKernels",
    "MissingOrtKernels",
    "MissingOrtLibrary",
    "MyAdd",
    "MyAddFunction",
    "RoIAlignRotated",
    "RoIAlignRotatedFunction",
    "OpInputError",
    "OpRegistrationError",
    "OpSpec",
    "PrototypeKernelWarning",
    "ShapeRule",
    "TensorArg",
    "TorchvisionPatch",
    "TransformersPatch",
    "aten",
    "aten_library_path",
    "mmdeploy_library_path",
    "batched_nms_rotated",
    "check_library",
    "check_same_device",
    "deform_conv2d",
    "diagnose",
    "export",
    "my_add",
    "ms_deform_attn",
    "nms_rotated",
    "roi_align_rotated",
    "MSDeformAttn",
    "MultiScaleDeformableAttnFunction",
    "ops",
    "ort_libraries",
    "ort_library_path",
    "ort_session",
    "patch_torchvision",
    "patch_transformers",
    "ortx_version",
    "register_op",
    "register_prototype",
    "register_ort_library",
    "spec",
    "standard_onnx",
    "symbolics",
    "translation_table",
    "transformers_kernel_mapping",
    "transformers_kernel_repository",
    "unpatch_torchvision",
    "unpatch_transformers",
]
