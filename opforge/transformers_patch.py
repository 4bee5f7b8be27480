"""``opforge.patch_transformers()``: Hugging Face transformers' multi-scale deformable attention
on opforge's kernels, with no change to the model code; and the same layer for transformers'
own kernel mechanism (the ``kernels`` package).

transformers routes multi-scale deformable attention (MSDA) three ways, each a pure-PyTorch
``grid_sample`` form by default:

* the layer class ``MultiScaleDeformableAttention``, decorated with
  ``@use_kernel_forward_from_hub("MultiScaleDeformableAttention")``: deformable_detr, rt_detr,
  grounding_dino, mm_grounding_dino, omdet_turbo, lw_detr, rf_detr, pp_doclayout_v2/v3/v4
  (each modeling module has its own copy of the class);
* the function ``multi_scale_deformable_attention(value, spatial_shapes, locations, weights)``:
  mask2former, oneformer;
* the function ``multi_scale_deformable_attention_v2(..., num_points_list, method)``: rt_detr_v2,
  d_fine, deimv2, with per-level point counts and a ``"default"`` (bilinear) or ``"discrete"``
  sampling method. d_fine and deimv2 store the function on each attention module
  (``self.ms_deformable_attn_core``) when it is built.

What it routes, while active (the families are found by reading the installed transformers'
``models/*/modeling_*.py``, so a release that adds a family with the same layer or function is
covered too):

* every such layer class's ``forward`` (class attribute: existing instances included);
* the module-level functions, where their callers look them up at each call;
* for d_fine and deimv2, a data descriptor on the attention class for ``ms_deformable_attn_core``:
  it answers opforge's function wherever the stored one is transformers' own, so modules built
  before the patch switch too, and a function a user stored there is left alone.

Each replacement calls ``opforge.ms_deform_attn``: eager (CPU, CUDA), autograd, ``torch.compile``
and both exporters (``opforge.ms_deform_attn`` nodes). The v2 function's bilinear method is the
same op: locations (N, Lq, M, sum P_l, 2) are regrouped per level, and where levels have different
point counts each level is padded to the largest with weight 0 at a location outside the map, whose
sample is exactly 0 (the op samples zeros outside), so output and gradients are those of the real
points. The ``"discrete"`` method stays transformers' own: it reads the pixel nearest to
``loc * size`` (rounding toward zero, clamped to the border) with no gradient to the locations, a
gather, while the op samples bilinearly at ``loc * size - 0.5`` with zeros outside.

``patch_transformers()`` returns the active patch (calling it again returns the same one);
``undo()``, :func:`unpatch_transformers` or leaving a ``with`` block puts back the very objects
transformers had. transformers is optional: nothing here imports it before ``patch_transformers()``.

For the ``kernels`` package (``LocalLayerRepository`` / ``register_kernel_mapping`` /
``kernelize``, and transformers' ``use_kernels`` / ``KernelConfig``):
:func:`transformers_kernel_repository` writes a local kernel repository whose layer is opforge's
:class:`MultiScaleDeformableAttention`, and :func:`transformers_kernel_mapping` is the mapping to
register. See docs/ops.md, "transformers".
"""

from __future__ import annotations

import atexit
import importlib
import inspect
import json
import re
import shutil
import sys
import tempfile
import types
from pathlib import Path
from typing import Callable, Optional

import torch

from .ops._registry import Untraced
from .ops.ms_deform_attn import ms_deform_attn

#: The layer name transformers' decorator registers, and the class name the kernel repository serves.
LAYER_NAME = "MultiScaleDeformableAttention"

_DECORATOR = f'use_kernel_forward_from_hub("{LAYER_NAME}")'
_FUNCTION = "multi_scale_deformable_attention"
_FUNCTION_V2 = "multi_scale_deformable_attention_v2"

# The parameters each routed form must have, in order: a release that changes them keeps its own
# form (listed in TransformersPatch.skipped) instead of getting a replacement that misreads it.
_LAYER_PARAMETERS = ("self", "value", "value_spatial_shapes", "value_spatial_shapes_list", "level_start_index",
                     "sampling_locations", "attention_weights", "im2col_step")
_FUNCTION_PARAMETERS = ("value", "value_spatial_shapes", "sampling_locations", "attention_weights")
_FUNCTION_V2_PARAMETERS = _FUNCTION_PARAMETERS + ("num_points_list", "method")

# Where a padded point samples: normalised x = y = -2 is at pixel -2*W - 0.5, outside every map,
# so the op's bilinear sample there is exactly 0 (and its weight is 0 too).
_OUTSIDE = -2.0


def _common_dtype(*tensors: torch.Tensor) -> torch.dtype:
    # transformers' grid_sample form multiplies the samples by the weights, which promotes; the op
    # wants one dtype, so it gets the promoted one (the same as the stock result's)
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _run_op(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, im2col_step=64):
    dtype = _common_dtype(value, sampling_locations, attention_weights)
    return ms_deform_attn(value.to(dtype), spatial_shapes.to(torch.int64), level_start_index.to(torch.int64),
                          sampling_locations.to(dtype), attention_weights.to(dtype), im2col_step)


def _index_tensors(value: torch.Tensor, spatial_shapes) -> tuple:
    """``spatial_shapes`` (a (L, 2) tensor, or transformers' list of (H, W)) as the op's
    ``spatial_shapes`` and ``level_start_index`` tensors. From a list of ints both are constants,
    as transformers' own form bakes the sizes into its graph (the exporters specialise them)."""
    if isinstance(spatial_shapes, torch.Tensor):
        shapes = spatial_shapes.to(device=value.device, dtype=torch.int64)
        sizes = shapes.prod(1)
        return shapes, torch.cat([sizes.new_zeros(1), sizes.cumsum(0)[:-1]])
    with Untraced():  # sizes the traced graph holds as constants anyway (as transformers' split does)
        pairs = [(int(h), int(w)) for h, w in spatial_shapes]
    starts = [0]
    for h, w in pairs[:-1]:
        starts.append(starts[-1] + h * w)
    return (torch.tensor(pairs, dtype=torch.int64, device=value.device),
            torch.tensor(starts, dtype=torch.int64, device=value.device))


def _layer_forward(self, value, value_spatial_shapes, value_spatial_shapes_list, level_start_index,
                   sampling_locations, attention_weights, im2col_step):
    """``MultiScaleDeformableAttention.forward`` on ``opforge.ms_deform_attn``: the same arguments
    (``value_spatial_shapes_list`` is the Python copy of ``value_spatial_shapes``, which the op
    takes as a tensor) and the same (N, Lq, M*D) result."""
    return _run_op(value, value_spatial_shapes, level_start_index, sampling_locations, attention_weights,
                   im2col_step)


def _function_forward(value, value_spatial_shapes, sampling_locations, attention_weights):
    """mask2former's / oneformer's ``multi_scale_deformable_attention`` on ``opforge.ms_deform_attn``."""
    spatial_shapes, level_start_index = _index_tensors(value, value_spatial_shapes)
    return _run_op(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)


def _per_level(sampling_locations, attention_weights, num_points_list):
    """v2's (N, Lq, M, sum P_l, 2) locations and (N, Lq, M, sum P_l) weights as the op's
    (N, Lq, M, L, P, 2) and (N, Lq, M, L, P), P = max P_l; shorter levels padded (see _OUTSIDE)."""
    n, lq, m = sampling_locations.shape[:3]
    levels, points = len(num_points_list), max(num_points_list)
    if all(p == points for p in num_points_list):  # the usual case: a plain regrouping
        return (sampling_locations.reshape(n, lq, m, levels, points, 2),
                attention_weights.reshape(n, lq, m, levels, points))
    locations, weights = [], []
    for loc, w in zip(sampling_locations.split(num_points_list, dim=3), attention_weights.split(num_points_list, 3)):
        missing = points - loc.shape[3]
        locations.append(torch.nn.functional.pad(loc, (0, 0, 0, missing), value=_OUTSIDE))
        weights.append(torch.nn.functional.pad(w, (0, missing), value=0.0))
    return torch.stack(locations, 3), torch.stack(weights, 3)


def _v2_replacement(stock: Callable) -> Callable:
    """``multi_scale_deformable_attention_v2`` on the op for the bilinear method; ``stock`` for the
    discrete one, and for argument shapes the stock form does not define either."""

    def multi_scale_deformable_attention_v2(value, value_spatial_shapes, sampling_locations, attention_weights,
                                            num_points_list, method="default"):
        if method != "default" or sampling_locations.dim() != 5 or sampling_locations.shape[3] != sum(num_points_list):
            return stock(value, value_spatial_shapes, sampling_locations, attention_weights, num_points_list, method)
        spatial_shapes, level_start_index = _index_tensors(value, value_spatial_shapes)
        locations, weights = _per_level(sampling_locations, attention_weights, list(num_points_list))
        return _run_op(value, spatial_shapes, level_start_index, locations, weights)

    multi_scale_deformable_attention_v2.__doc__ = _v2_replacement.__doc__
    multi_scale_deformable_attention_v2.opforge_stock = stock
    return multi_scale_deformable_attention_v2


class _StoredFunctionRoute:
    """A data descriptor for an attribute each instance sets in ``__init__`` to transformers' v2
    function (d_fine's ``self.ms_deformable_attn_core``). A data descriptor on the class wins over
    the instance's ``__dict__``, so instances built before the patch are routed as well; writes
    still land in the instance's ``__dict__``, so removing the descriptor brings back exactly what
    each instance stored."""

    def __init__(self, name: str, stock: Callable, replacement: Callable):
        self.name, self.stock, self.replacement = name, stock, replacement

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        try:
            stored = instance.__dict__[self.name]
        except KeyError:
            raise AttributeError(self.name) from None
        return self.replacement if stored is self.stock else stored

    def __set__(self, instance, value):
        instance.__dict__[self.name] = value

    def __delete__(self, instance):
        del instance.__dict__[self.name]


def _parameters(fn) -> tuple:
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return ()


def _modules_with_msda(transformers) -> list:
    """The modeling modules of the installed transformers that define or import an MSDA form (by
    their source text: importing each of the ~400 modeling modules to look would take long)."""
    root = Path(transformers.__file__).parent / "models"
    found = []
    for path in sorted(root.glob("*/modeling_*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        if _DECORATOR in text or _FUNCTION in text:
            found.append(f"{transformers.__name__}.models.{path.parent.name}.{path.stem}")
    return found


class TransformersPatch:
    """An active :func:`patch_transformers`; ``undo()`` (or leaving ``with``) reverts it.

    ``patched``: what it routes (``module.Class.forward``, ``module.function``,
    ``module.Class.attribute``); ``skipped``: forms it found and left alone, with the reason."""

    def __init__(self):
        self._undo: list = []  # callables putting back transformers' objects, in patching order
        self.patched: list = []
        self.skipped: dict = {}
        self._applied = True

    @property
    def active(self) -> bool:
        return self._applied

    def _set_class_attribute(self, cls, name: str, value, label: str) -> None:
        had, original = name in cls.__dict__, cls.__dict__.get(name)
        setattr(cls, name, value)
        self._undo.append(lambda: setattr(cls, name, original) if had else delattr(cls, name))
        self.patched.append(label)

    def _set_module_attribute(self, module, name: str, value, label: str) -> None:
        original = getattr(module, name)
        setattr(module, name, value)
        self._undo.append(lambda: setattr(module, name, original))
        self.patched.append(label)

    def undo(self) -> None:
        global _active
        if not self._applied:
            return
        for restore in reversed(self._undo):
            restore()
        self._undo.clear()
        self._applied = False
        if _active is self:
            _active = None

    def __enter__(self) -> "TransformersPatch":
        return self

    def __exit__(self, *exc) -> None:
        self.undo()

    def __repr__(self) -> str:
        state = "active" if self.active else "undone"
        return f"<opforge.TransformersPatch {state}: {len(self.patched)} routed, {len(self.skipped)} skipped>"


def _route_module(patch: TransformersPatch, module) -> None:
    name = module.__name__
    layer = getattr(module, LAYER_NAME, None)
    if isinstance(layer, type) and issubclass(layer, torch.nn.Module) and layer.__module__ == name:
        label = f"{name}.{LAYER_NAME}.forward"
        if _parameters(layer.forward) == _LAYER_PARAMETERS:
            patch._set_class_attribute(layer, "forward", _layer_forward, label)
        else:
            patch.skipped[label] = f"forward{_parameters(layer.forward)} is not the form opforge routes"
    stock = getattr(module, _FUNCTION, None)
    if inspect.isfunction(stock):
        label = f"{name}.{_FUNCTION}"
        if _parameters(stock) == _FUNCTION_PARAMETERS:
            patch._set_module_attribute(module, _FUNCTION, _function_forward, label)
        else:
            patch.skipped[label] = f"{_FUNCTION}{_parameters(stock)} is not the form opforge routes"
    stock_v2 = getattr(module, _FUNCTION_V2, None)
    if inspect.isfunction(stock_v2):
        label = f"{name}.{_FUNCTION_V2}"
        if _parameters(stock_v2) != _FUNCTION_V2_PARAMETERS:
            patch.skipped[label] = f"{_FUNCTION_V2}{_parameters(stock_v2)} is not the form opforge routes"
            return
        replacement = _v2_replacement(stock_v2)
        patch._set_module_attribute(module, _FUNCTION_V2, replacement, label)
        _route_stored_functions(patch, module, stock_v2, replacement)


def _route_stored_functions(patch: TransformersPatch, module, stock: Callable, replacement: Callable) -> None:
    # d_fine, deimv2: `self.<attribute> = multi_scale_deformable_attention_v2` in an __init__
    assignment = re.compile(rf"self\.(\w+)\s*=\s*{_FUNCTION_V2}\b")
    for cls in vars(module).values():
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module) and cls.__module__ == module.__name__):
            continue
        init = cls.__dict__.get("__init__")
        try:
            source = inspect.getsource(init) if init is not None else ""
        except (OSError, TypeError):
            continue
        for attribute in sorted(set(assignment.findall(source))):
            patch._set_class_attribute(cls, attribute, _StoredFunctionRoute(attribute, stock, replacement),
                                       f"{module.__name__}.{cls.__name__}.{attribute}")


_active: Optional[TransformersPatch] = None


def patch_transformers() -> TransformersPatch:
    """Route transformers' multi-scale deformable attention (the ``MultiScaleDeformableAttention``
    layers, mask2former's and oneformer's function, v2's bilinear method) to opforge's op;
    opt-in and reversible. See the module docstring for exactly what changes."""
    global _active
    if _active is not None:
        return _active
    try:
        import transformers
    except ImportError as e:
        raise ImportError(f"opforge.patch_transformers: transformers is not importable ({e}); install it "
                          "(pip install transformers), or call opforge.ms_deform_attn / opforge.MSDeformAttn "
                          "directly") from e
    patch = TransformersPatch()
    try:
        for module_name in _modules_with_msda(transformers):
            try:
                module = importlib.import_module(module_name)
            except Exception as e:  # a family whose own dependencies are missing: the others still go
                patch.skipped[module_name] = f"importing it failed: {type(e).__name__}: {e}"
                continue
            _route_module(patch, module)
    except BaseException:
        patch.undo()
        raise
    if not patch.patched:
        patch.undo()
        raise RuntimeError(
            f"opforge.patch_transformers: found no multi-scale deformable attention to route in transformers "
            f"{getattr(transformers, '__version__', '?')} ({Path(transformers.__file__).parent}): no modeling module "
            f"defines a {LAYER_NAME} layer or {_FUNCTION}(_v2) in the form opforge knows"
            + (f"; left alone: {patch.skipped}" if patch.skipped else ""))
    _active = patch
    return patch


def unpatch_transformers() -> None:
    """Undo :func:`patch_transformers` (nothing happens if it is not active)."""
    if _active is not None:
        _active.undo()


# ---- transformers' own kernel mechanism: the `kernels` package -----------------------------------


class MultiScaleDeformableAttention(torch.nn.Module):
    """transformers' ``MultiScaleDeformableAttention`` layer on ``opforge.ms_deform_attn``, in the
    form the ``kernels`` package swaps in (``kernelize`` checks it): stateless, no constructor of
    its own, the same ``forward`` signature. ``kernelize`` binds this ``forward`` to the model's own
    layer instances."""

    has_backward = True  # autograd through the op: serves kernels' Mode.TRAINING as well
    can_torch_compile = True  # the op has a fake impl: serves Mode.TORCH_COMPILE as well
    forward = _layer_forward


#: What the kernel repository's ``__init__.py`` exposes as ``layers``.
kernel_layers = types.SimpleNamespace(MultiScaleDeformableAttention=MultiScaleDeformableAttention)

_REPOSITORY_INIT = '''"""A local kernel repository written by opforge.transformers_kernel_repository(): serves
opforge's MultiScaleDeformableAttention layer (from the installed opforge) to the kernels package."""

from opforge.transformers_patch import kernel_layers as layers
'''

_default_repository: Optional[Path] = None


# kernels' metadata.json: "id" is the module name kernels imports the repository's __init__.py as;
# "backend" is required, and read only when a repository holds one build per backend (this one has
# a single, device-independent variant: the op dispatches on the tensors' device).
_METADATA = {"name": "opforge-transformers", "id": "opforge_transformers_kernel", "version": 1,
             "license": "BSD-3-Clause", "python-depends": [], "backend": {"type": "cpu"}}


def transformers_kernel_repository(directory: Optional[str | Path] = None) -> Path:
    """Writes a local kernel repository for the ``kernels`` package into ``directory`` (default: a
    temporary directory of this process, removed at exit) and returns its path.

    It is the variant directory ``kernels.LocalLayerRepository`` loads: ``metadata.json`` and an
    ``__init__.py`` whose ``layers.MultiScaleDeformableAttention`` is opforge's layer, imported from
    the installed opforge (the repository holds no code of its own). Use it as
    ``LocalLayerRepository(repo_path=path, layer_name="MultiScaleDeformableAttention")`` or, in
    transformers, ``KernelConfig({"MultiScaleDeformableAttention": f"{path}:MultiScaleDeformableAttention"},
    use_local_kernel=True)``."""
    global _default_repository
    if directory is None:
        if _default_repository is None:
            _default_repository = Path(tempfile.mkdtemp(prefix="opforge-kernel-repository-"))
            atexit.register(shutil.rmtree, _default_repository, ignore_errors=True)
        path = _default_repository
    else:
        path = Path(directory).resolve()
        path.mkdir(parents=True, exist_ok=True)
    (path / "metadata.json").write_text(json.dumps(_METADATA, indent=2) + "\n")
    (path / "__init__.py").write_text(_REPOSITORY_INIT)
    return path


def transformers_kernel_mapping(directory: Optional[str | Path] = None) -> dict:
    """The ``kernels`` mapping that serves opforge's layer for ``MultiScaleDeformableAttention`` on
    CPU and CUDA: pass it to ``kernels.register_kernel_mapping`` (then transformers' ``use_kernels``
    or ``kernels.kernelize``) or ``kernels.use_kernel_mapping``. The repository is
    :func:`transformers_kernel_repository` (``directory``).

    transformers registers its own default for CUDA (a Hub kernel) each time ``use_kernels`` is set
    and each time such a model switches between train and eval; kernels picks, per device, the
    entry with the narrowest range of CUDA capabilities. opforge's CUDA entry covers every
    capability but the very largest, one narrower than the default's, so it stays the one picked."""
    try:
        from kernels import CUDAProperties, Device, LocalLayerRepository
    except ImportError as e:
        raise ImportError(f"opforge.transformers_kernel_mapping: the kernels package is not importable ({e}); "
                          "install it (pip install kernels, the version your transformers accepts), or use "
                          "opforge.patch_transformers() instead") from e
    repository = LocalLayerRepository(repo_path=transformers_kernel_repository(directory), layer_name=LAYER_NAME)
    every_capability_but_the_last = CUDAProperties(min_capability=0, max_capability=sys.maxsize - 1)
    return {LAYER_NAME: {"cpu": repository,
                         Device(type="cuda", properties=every_capability_but_the_last): repository}}


__all__ = ["MultiScaleDeformableAttention", "TransformersPatch", "patch_transformers", "transformers_kernel_mapping",
           "transformers_kernel_repository", "unpatch_transformers"]
