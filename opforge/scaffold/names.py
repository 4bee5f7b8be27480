"""What a new op and its package are called: checked names, and the substitutions every
template takes (``{{PKG}}``, ``{{NAME}}``, ``{{DOMAIN}}`` ...)."""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass
from typing import Optional

from ..ort_kernels.libraries import BUILTIN_DOMAINS, MMDEPLOY_DOMAINS
from ..spec import ATEN_DOMAIN, DOMAIN

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
        from .. import __version__

        return {
            "PKG": self.package, "NAME": self.name, "NAME_UPPER": self.name.upper(), "NAME_CAMEL": self.camel,
            "DOMAIN": self.domain, "OPFORGE_VERSION": __version__.split("+")[0],
            "CUDA_SOURCES": self.cuda_sources(),
        }

    def cuda_sources(self, why: str = "generated --no-cuda") -> str:
        """setup.py's ``CUDA_SOURCES`` list: the package's .cu files, or none (``why`` says so)."""
        return f'["src/{self.package}/csrc/cuda/*.cu"]' if self.cuda else f"[]  # {why}"


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
    if domain in BUILTIN_DOMAINS or domain in (DOMAIN, ATEN_DOMAIN, *MMDEPLOY_DOMAINS):
        raise ValueError(f"opforge new-op: domain {domain!r} belongs to ONNX, ONNX Runtime or opforge; "
                         "choose your own (e.g. com.yourcompany)")
    return NewOp(name, package, domain, cuda=True)
