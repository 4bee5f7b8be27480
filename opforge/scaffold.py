"""``opforge new-op``: writes a standalone, installable package with one working op.

The op is ``y = x * sigmoid(alpha * x)`` with a float attribute ``alpha`` and its backward,
complete in every piece (compute core, torch CPU/CUDA kernels, ORT CPU/CUDA-EP kernels,
spec with fake impl, autograd, numpy reference and standard-ONNX lowering, tests on
:mod:`opforge.testing`, README), so users start by editing working code. The templates
live in ``opforge/templates/new_op`` (``__PKG__``/``__NAME__`` in paths and ``{{PKG}}``,
``{{NAME}}``, ``{{DOMAIN}}`` ... in text are replaced). ``--prototype`` writes the same op as a
pure-Python package instead (``opforge/templates/new_op_prototype``: spec + numpy kernel,
:func:`opforge.register_prototype`).
"""

from __future__ import annotations

import keyword
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates" / "new_op"
#: ``opforge new-op --prototype``: the same op as a spec + numpy kernel (no C++), run in ONNX
#: Runtime through onnxruntime-extensions.
PROTOTYPE_TEMPLATE_DIR = TEMPLATE_DIR.with_name("new_op_prototype")
_DOMAIN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class NewOp:
    name: str
    package: str
    domain: str
    cuda: bool

    @property
    def camel(self) -> str:
        return "".join(part[:1].upper() + part[1:] for part in self.name.split("_") if part)

    def substitutions(self) -> dict[str, str]:
        from . import __version__

        return {
            "PKG": self.package, "NAME": self.name, "NAME_UPPER": self.name.upper(), "NAME_CAMEL": self.camel,
            "DOMAIN": self.domain, "OPFORGE_VERSION": __version__.split("+")[0],
        }


def _check_identifier(kind: str, value: str) -> None:
    if not value.isidentifier() or keyword.iskeyword(value) or not value.isascii():
        raise ValueError(f"opforge new-op: {kind} {value!r} must be a Python identifier (letters, digits, _)")
    if value != value.lower():
        raise ValueError(f"opforge new-op: {kind} {value!r} should be lower case (torch op and package names are)")


def validate(name: str, package: str, domain: Optional[str]) -> NewOp:
    _check_identifier("op name", name)
    _check_identifier("package", package)
    if package in ("opforge", "torch", "onnx", "onnxruntime", "aten", "prim", "torchvision"):
        raise ValueError(f"opforge new-op: package {package!r} would clash with an existing library or namespace")
    domain = domain or package
    if not _DOMAIN_RE.match(domain):
        raise ValueError(f"opforge new-op: domain {domain!r} is not a valid ONNX domain (e.g. com.example)")
    if domain in ("", "ai.onnx", "ai.onnx.ml", "com.microsoft", "opforge", "org.pytorch.aten"):
        raise ValueError(f"opforge new-op: domain {domain!r} belongs to ONNX, ONNX Runtime or opforge; "
                         "choose your own (e.g. com.yourcompany)")
    return NewOp(name, package, domain, cuda=True)


def render(text: str, subs: dict[str, str]) -> str:
    out = text
    for key, value in subs.items():
        out = out.replace("{{" + key + "}}", value)
    leftover = re.findall(r"\{\{[A-Z_]+\}\}", out)
    if leftover:
        raise RuntimeError(f"opforge new-op: template placeholders left unreplaced: {sorted(set(leftover))}")
    return out


def new_op(name: str, package: str, directory: Optional[os.PathLike] = None, *, domain: Optional[str] = None,
           cuda: bool = True, force: bool = False, prototype: bool = False,
           log: Callable[[str], None] = print) -> Path:
    """Writes the package ``package`` with the op ``name`` into ``directory`` (default
    ``./<package>``) and returns that directory. ``cuda=False`` leaves out the CUDA kernels;
    ``prototype=True`` writes a pure-Python package instead (spec + numpy kernel, ONNX Runtime
    through onnxruntime-extensions; see :func:`opforge.register_prototype`)."""
    spec = validate(name, package, domain)
    if prototype:
        cuda = False
    spec = NewOp(spec.name, spec.package, spec.domain, cuda)
    dest = Path(directory) if directory is not None else Path.cwd() / package
    if dest.exists() and any(dest.iterdir()) and not force:
        raise FileExistsError(f"opforge new-op: {dest} exists and is not empty (use --force to write into it)")
    subs = spec.substitutions()
    written = []
    templates = PROTOTYPE_TEMPLATE_DIR if prototype else TEMPLATE_DIR
    for template in sorted(templates.rglob("*.tmpl")):
        rel = template.relative_to(templates).as_posix()[: -len(".tmpl")]
        if not cuda and not prototype and "/cuda/" in f"/{rel}":
            continue
        target = dest / rel.replace("__PKG__", package).replace("__NAME__", name)
        text = render(template.read_text(), subs)
        if target.name == "setup.py" and not cuda:
            text = text.replace(f'CUDA_SOURCES = ["src/{package}/csrc/cuda/*.cu"]', "CUDA_SOURCES = []  # generated --no-cuda")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        written.append(target.relative_to(dest).as_posix())
    kind = ", prototype: numpy kernel, no C++" if prototype else (", CUDA kernels" if cuda else ", CPU only")
    log(f"opforge new-op: wrote package {package!r} with op {package}::{name} (ONNX {spec.domain}::{name}{kind}) "
        f"to {dest}:")
    for w in written:
        log(f"  {w}")
    what = "pure Python, nothing to compile" if prototype else f"builds the torch extension and lib{package}_ort.so"
    log("next:\n"
        f"  pip install --no-build-isolation -e {dest}   # {what}\n"
        f"  python -m pytest {dest}                        # the op end to end")
    return dest


__all__ = ["PROTOTYPE_TEMPLATE_DIR", "TEMPLATE_DIR", "new_op", "validate"]
