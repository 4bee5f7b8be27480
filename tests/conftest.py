import json
import os
import shutil
import tempfile

import numpy as np
import pytest
import torch


def pytest_configure(config):
    # One translation cache for the whole run (opforge.aten.translation.DiskCache), shared by
    # every test, xdist worker and subprocess: the ATen round trips, the coverage measurement
    # and the tutorials export the same calls, and a translation costs about a second. It is
    # fresh for each run, so each call is still translated once; a directory set by the
    # caller is kept (its keys hold the versions and a hash of the sources).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False  # hand out work in the order below, not by group size
    if hasattr(config, "workerinput"):
        return
    config._opforge_tmp = tempfile.mkdtemp(prefix="opforge-tests-")
    os.environ["OPFORGE_TEST_GROUPS"] = os.path.join(config._opforge_tmp, "groups.json")
    if not os.environ.get("OPFORGE_ATEN_CACHE_DIR"):
        os.environ["OPFORGE_ATEN_CACHE_DIR"] = os.path.join(config._opforge_tmp, "aten-cache")
        config._opforge_owns_cache = True


def pytest_unconfigure(config):
    path = getattr(config, "_opforge_tmp", None)
    if path:
        os.environ.pop("OPFORGE_TEST_GROUPS", None)
        if getattr(config, "_opforge_owns_cache", False):
            os.environ.pop("OPFORGE_ATEN_CACHE_DIR", None)
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    np.random.seed(0)


# ---- running the suite on several workers (pytest-xdist) -----------------------------------
#
# scripts/run_tests.sh runs the suite on two workers (`-n 2 --dist loadgroup`). Three rules keep
# that as thorough as one process and cheaper:
# * Tests that share a module- or session-scoped fixture of their module (a built package, a
#   wheel, a coverage measurement, onnxruntime venvs, a tutorial's run) go to one worker, so it
#   is built once; so do tests marked `xdist_group(name)` (the ATen round trips of one sample,
#   which share its translations).
# * Work is handed out in collection order, sorted: the long groups first (they overlap the
#   many short tests), the coverage measurement last (it exports every ATen sample at every
#   opset; by then the round trips have put the translations it needs in the shared cache).
# * The groups are computed where the tests are collected (each worker, with the fixtures
#   known) and handed to the scheduler through a file: pytest-xdist's own loadgroup marks
#   travel in the node id, which pytest 9.2's structured node ids no longer let it change
#   (pytest-xdist issue #1386), so its loadgroup silently stopped grouping.
FIRST = ("test_build.py", "test_new_op_schema.py", "test_new_op.py", "test_prototype.py", "test_deploy_ort_only.py",
         "test_tutorials_cli_benchmarks.py")
LAST = ("test_coverage.py",)


def _group(item):
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    module = item.nodeid.split("::")[0]
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(info, "names_closure", ()):
        for fixturedef in info.name2fixturedefs.get(name, ()):
            if fixturedef.scope in ("module", "session") and fixturedef.baseid == module:
                return module
    return None


def _rank(item):
    module = item.nodeid.split("::")[0].rsplit("/", 1)[-1]
    if module in FIRST:
        return FIRST.index(module)
    return len(FIRST) + 1 if module in LAST else len(FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_rank)  # stable: the order inside each rank is the collection order
    groups_file = os.environ.get("OPFORGE_TEST_GROUPS")
    if hasattr(config, "workerinput") and groups_file:
        groups = {item.nodeid: g for item in items if (g := _group(item))}
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(groups_file))
        with os.fdopen(fd, "w") as f:
            json.dump(groups, f)
        os.replace(tmp, groups_file)  # every worker writes the same map


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup" or not os.environ.get("OPFORGE_TEST_GROUPS"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FixtureGroupScheduling(LoadScopeScheduling):
        """LoadScopeScheduling with a test's scope = its group (above), else the test itself."""

        groups = None

        def _split_scope(self, nodeid):
            if self.groups is None:  # read once, when scheduling starts: every worker has collected
                with open(os.environ["OPFORGE_TEST_GROUPS"]) as f:
                    self.groups = json.load(f)
            return self.groups.get(nodeid, nodeid)

    return FixtureGroupScheduling(config, log)
