"""``opforge new-op``: writes a standalone, installable package with one working op.

Without ``--schema`` the op is ``y = x * sigmoid(alpha * x)`` with a float attribute ``alpha`` and
its backward, complete in every piece (compute core, torch CPU/CUDA kernels, ORT CPU/CUDA-EP
kernels, spec with fake impl, autograd, numpy reference and standard-ONNX lowering, tests on
:mod:`opforge.testing`, README), so users start by editing working code. The templates live in
``opforge/templates/new_op`` (``__PKG__``/``__NAME__`` in paths and ``{{PKG}}``, ``{{NAME}}``,
``{{DOMAIN}}`` ... in text are replaced). ``--prototype`` writes the same op as a pure-Python package
instead (``opforge/templates/new_op_prototype``: spec + numpy kernel,
:func:`opforge.register_prototype`).

With ``--schema "NAME(Tensor x, Tensor index, float alpha) -> Tensor"`` the package is written for
that signature (any mix of ``Tensor``, ``Tensor?``, ``int``, ``float``, ``bool``, ``int[]``, ``float[]``
arguments, one or several Tensor outputs; ``--dtypes index=int64`` for inputs of other element
types than the op's float types): the argument list appears once, in the schema, and every other
piece (OpSpec args, checks, fake impl, torch and ORT kernels with the right C++ types, the core's
argument struct, wrapper, module, tests, benchmark) is generated from it
(``opforge/templates/new_op_schema``, over the shared files of ``new_op``). Its math is a
placeholder, stated as such everywhere: every output is the first float input with a gradient
times ``1 + the sum of the float attributes``. ``backward="cpp"`` (``--backward cpp``) writes the backward
as a C++ op of its own (``_NAME_backward``, in the spec's ``helper_ops``) whose autograd kernel
refuses double backward with a clear error; the default is a Python autograd formula. ``--no-grad
rois`` marks a float tensor input without a gradient (the spec's ``TensorArg(differentiable=False)``,
None from the autograd formula, nothing computed or allocated for it by a C++ backward). Each tensor
input has an example shape of its own (``EXAMPLE_SHAPES`` in the spec module: ints and named sizes,
``batch`` the dim 0 the tests double), which the tests and the benchmark (``--size``, ``--shape
NAME=2x3x4``) take; the op's description (README, module docstring, ``OpSpec(doc=...)``) is written
once, by :func:`.python_blocks.description`. The glue between the runtimes and the core
(``opforge/glue/*.h``: ``core_tensor.h``, ``torch_glue.h``, ``ort_glue.h``) is not generated: it is
installed with opforge, in ``opforge/csrc`` (on every package's include path through
:mod:`opforge.build`), so a fix to it reaches existing packages at their next build.

The package: this module (names, templates, :func:`new_op`); :mod:`.schema` (the schema parsed
into an :class:`~.schema.OpSignature`); :mod:`.cpp_blocks` and :mod:`.python_blocks` (each piece
of generated code, from the signature).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable, Optional

from .names import NewOp, validate
from .python_blocks import schema_substitutions
from .schema import OWN_DTYPES, OpSignature, SchemaArg, parse_dtypes, parse_names, parse_schema

TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "templates" / "new_op"
#: ``opforge new-op --prototype``: the same op as a spec + numpy kernel (no C++), run in ONNX
#: Runtime through onnxruntime-extensions.
PROTOTYPE_TEMPLATE_DIR = TEMPLATE_DIR.with_name("new_op_prototype")
#: ``opforge new-op --schema``: the op-specific files for a given signature; the other files
#: (pyproject.toml, setup.py, _ort.py, __init__.py) come from :data:`TEMPLATE_DIR`.
SCHEMA_TEMPLATE_DIR = TEMPLATE_DIR.with_name("new_op_schema")
#: Files of :data:`TEMPLATE_DIR` that belong to its example op alone, left out of ``--schema``
#: packages: the checks its CPU and CUDA torch kernels share (a ``--schema`` package's torch kernel
#: has its checks in its one source).
EXAMPLE_ONLY = frozenset({"src/__PKG__/csrc/__NAME___torch.h"})


def render(text: str, subs: dict[str, str]) -> str:
    out = text
    for key, value in subs.items():
        out = out.replace("{{" + key + "}}", value)
    leftover = re.findall(r"\{\{[A-Z_]+\}\}", out)
    if leftover:
        raise RuntimeError(f"opforge new-op: template placeholders left unreplaced: {sorted(set(leftover))}")
    return out


def _output_path(template: Path, root: Path) -> str:
    """A template's output path: its path below ``root`` without ``.tmpl``; ``gitignore``
    becomes ``.gitignore`` (a dotfile would not be shipped in opforge's wheel)."""
    rel = template.relative_to(root).as_posix()[: -len(".tmpl")]
    return rel[: -len("gitignore")] + ".gitignore" if rel.split("/")[-1] == "gitignore" else rel


def _template_files(prototype: bool, schema: bool, cuda: bool) -> dict:
    """{relative output path (still with __PKG__/__NAME__): template file} for the package kind."""
    if prototype:
        return {_output_path(t, PROTOTYPE_TEMPLATE_DIR): t for t in sorted(PROTOTYPE_TEMPLATE_DIR.rglob("*.tmpl"))}
    files = {_output_path(t, TEMPLATE_DIR): t for t in sorted(TEMPLATE_DIR.rglob("*.tmpl"))}
    if not cuda:
        files = {rel: t for rel, t in files.items() if "/cuda/" not in f"/{rel}"}
    if schema:  # the op-specific files for the schema, over the shared ones (pyproject, setup.py, _ort.py, __init__)
        files = {rel: t for rel, t in files.items() if rel not in EXAMPLE_ONLY}
        files.update({_output_path(t, SCHEMA_TEMPLATE_DIR): t for t in sorted(SCHEMA_TEMPLATE_DIR.rglob("*.tmpl"))})
    return dict(sorted(files.items()))


def new_op(name: str, package: str, directory: Optional[os.PathLike] = None, *, domain: Optional[str] = None,
           cuda: bool = True, force: bool = False, prototype: bool = False, schema: Optional[str] = None,
           dtypes=None, backward: Optional[str] = None, no_grad=None, log: Callable[[str], None] = print) -> Path:
    """Writes the package ``package`` with the op ``name`` into ``directory`` (default
    ``./<package>``) and returns that directory. ``cuda=False`` leaves out the CUDA kernels;
    ``prototype=True`` writes a pure-Python package instead (spec + numpy kernel, ONNX Runtime
    through onnxruntime-extensions; see :func:`opforge.register_prototype`).

    ``schema``: the op's torch schema (``"NAME(Tensor x, Tensor index, float alpha) -> Tensor"``):
    the package is generated for that signature, with placeholder math (CPU kernels only).
    ``dtypes``: element types of its non-float tensor inputs, ``{"index": "int64"}`` or
    ``["index=int64", ...]`` (``--dtypes``); ``backward``: ``"python"`` (default: an autograd formula
    in the spec) or ``"cpp"`` (a C++ backward op, ``_NAME_backward``); ``no_grad``: float tensor
    inputs without a gradient, ``["rois"]`` or ``"rois,boxes"`` (``--no-grad``): ``TensorArg(...,
    differentiable=False)`` in the spec, None from the autograd formula, no gradient computed or
    allocated by a C++ backward."""
    spec = validate(name, package, domain)
    signature = None
    if schema is None:
        if dtypes or backward is not None or no_grad:
            raise ValueError("opforge new-op: --dtypes, --backward and --no-grad describe a --schema op; give "
                             "--schema too")
    else:
        if prototype:
            raise ValueError("opforge new-op: --schema writes compiled kernels; it does not combine with --prototype")
        dtypes = dict(dtypes) if isinstance(dtypes, dict) else parse_dtypes(dtypes)
        signature = parse_schema(name, schema, dtypes, backward=backward or "python", package=package,
                                 no_grad=no_grad)
        cuda = False  # the schema's kernels are CPU only (the README says how to add CUDA)
    if prototype:
        cuda = False
    spec = NewOp(spec.name, spec.package, spec.domain, cuda)
    dest = Path(directory) if directory is not None else Path.cwd() / package
    if dest.exists() and any(dest.iterdir()) and not force:
        raise FileExistsError(f"opforge new-op: {dest} exists and is not empty (use --force to write into it)")
    subs = schema_substitutions(signature, spec, dtypes) if signature else spec.substitutions()
    written = []
    for rel, template in _template_files(prototype, signature is not None, cuda).items():
        target = dest / rel.replace("__PKG__", package).replace("__NAME__", name)
        text = render(template.read_text(), subs)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        written.append(target.relative_to(dest).as_posix())
    if signature:
        kind = f", from the schema {signature.schema}; PLACEHOLDER math, CPU kernels only"
    else:
        kind = ", prototype: numpy kernel, no C++" if prototype else (", CUDA kernels" if cuda else ", CPU only")
    log(f"opforge new-op: wrote package {package!r} with op {package}::{name} (ONNX {spec.domain}::{name}{kind}) "
        f"to {dest}:")
    for w in written:
        log(f"  {w}")
    what = "pure Python, nothing to compile" if prototype else f"builds lib{package}_torch.so and lib{package}_ort.so"
    log("next:\n"
        f"  pip install --no-build-isolation -e {dest}   # {what}\n"
        f"  python -m pytest {dest}                        # the op end to end")
    if signature:
        bw = f"csrc/{name}.h: {name}_backward, " if signature.backward == "cpp" else f"{name}.py: _backward, "
        log(f"then replace the PLACEHOLDER math: csrc/{name}.h: {name}_forward, {bw}"
            f"csrc/{name}.h: {name}_output_shapes, {name}.py: _reference, EXAMPLE_SHAPES and example_args "
            f"(see {dest / 'README.md'})")
    return dest


__all__ = ["NewOp", "OWN_DTYPES", "OpSignature", "PROTOTYPE_TEMPLATE_DIR", "SCHEMA_TEMPLATE_DIR", "SchemaArg", "TEMPLATE_DIR", "new_op", "parse_dtypes",
           "parse_names", "parse_schema", "schema_substitutions", "validate"]
