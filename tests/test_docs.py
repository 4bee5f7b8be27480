"""The documentation cannot rot: every ```python block of README.md and docs/*.md runs, each in
a process of its own outside the repository (so the installed opforge is what it imports; forked
from one that has imported torch, tests/preloaded_python.py), and every
relative link points at a file that exists."""

import re
from pathlib import Path

import pytest

from preloaded_python import run_python

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)
LINK = re.compile(r"\]\(([^)#:]+)(#[^)]*)?\)")


def _blocks():
    for page in PAGES:
        text = page.read_text()
        for number, match in enumerate(FENCE.finditer(text), 1):
            indent = len(match.group(1))
            code = "\n".join(line[indent:] for line in match.group(2).splitlines())
            line = text[:match.start()].count("\n") + 1
            yield pytest.param(code, id=f"{page.relative_to(ROOT)}:{line}")


def test_every_page_has_been_found():
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/ops.md", "docs/deploying.md", "docs/architecture.md", "docs/aten.md",
            "docs/your-own-op.md", "docs/performance.md", "docs/building.md"} <= names


@pytest.mark.parametrize("code", list(_blocks()))
def test_python_snippet_runs(code, tmp_path):
    run = run_python(["-c", code], cwd=tmp_path, timeout=600)
    assert run.returncode == 0, f"snippet failed:\n{code}\n--- stderr\n{run.stderr[-4000:]}"


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_relative_links_resolve(page):
    missing = [target for target, _ in LINK.findall(page.read_text())
               if not target.startswith(("http", "mailto")) and not (page.parent / target).exists()]
    assert missing == [], missing
