import gc
import json
import os
import shutil
import tempfile

import numpy as np
import pytest
import torch


def pytest_configure(config):
    _collect_less_often()
    # One translation cache for the whole run (opforge.aten.translation.DiskCache), shared by
    # every test, xdist worker and subprocess: the ATen round trips, the coverage measurement
    # and the tutorials export the same calls, and a translation costs about a second. It is
    # fresh for each run, so each call is still translated once; a directory set by the
    # caller is kept (its keys hold the versions and a hash of the sources).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False  # hand out work in the order below, not by group size
    if hasattr(config, "workerinput"):
        _one_share_of_the_cores(config.workerinput.get("workercount", 1))
        return
    config._opforge_tmp = tempfile.mkdtemp(prefix="opforge-tests-")
    os.environ["OPFORGE_TEST_GROUPS"] = os.path.join(config._opforge_tmp, "groups.json")
    if not os.environ.get("OPFORGE_ATEN_CACHE_DIR"):
        os.environ["OPFORGE_ATEN_CACHE_DIR"] = os.path.join(config._opforge_tmp, "aten-cache")
        config._opforge_owns_cache = True


def _collect_less_often() -> None:
    # A test process holds torch, onnx, onnxscript and ORT: a full pass of Python's collector over
    # it takes ~0.4 s, and at the default thresholds (700, 10, 10) the exports and fake-tensor
    # traces of the tests trigger one every few seconds. Measured, in one process: round trips of
    # test_deform_conv2d_onnx, test_aten_lowerings, test_my_add_onnx and test_check_op 205 s, of
    # them 31 s collecting (47 full passes); young passes every 20,000 allocations: 181 s, 7 s
    # collecting (2 full passes); every 50,000 took 90 ATen round trips from 39 to 33 s more, and
    # left 3.6 of 168 s collecting in other modules. Cycles are still collected; what a test
    # checks is unchanged.
    gc.set_threshold(50_000, 20, 20)


def _one_share_of_the_cores(workers: int) -> None:
    # Each xdist worker (and each process it starts: tutorials, generated packages' tests, fuzz
    # batches) gets cores / workers intra-op threads. By default each takes every core: on 2
    # cores, 2 workers run 4 OpenMP threads, and a kernel that goes parallel waits at its
    # barrier for a thread the other worker has descheduled. Measured: the gradchecks of
    # test_torchvision_drop_in take 10-16 s each in the suite and 0.5-1 s alone (the module:
    # 67 s on 2 workers, 28 s with 1 thread each). The kernels' multi-threaded paths are
    # checked on purpose, at set thread counts (tests/test_thread_counts.py, the ORT tests'
    # intra_op_num_threads). A caller's OMP_NUM_THREADS is kept.
    if "OMP_NUM_THREADS" in os.environ:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores // max(1, int(workers)))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


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
# * Work is handed out in collection order, sorted: the long groups and tests first (they overlap
#   the many short tests; one started last leaves the other worker idle at the end), the coverage
#   measurement last (it exports every ATen sample at every opset; by then the round trips have
#   put the translations it needs in the shared cache).
# * The groups are computed where the tests are collected (each worker, with the fixtures
#   known) and handed to the scheduler through a file: pytest-xdist's own loadgroup marks
#   travel in the node id, which pytest 9.2's structured node ids no longer let it change
#   (pytest-xdist issue #1386), so its loadgroup silently stopped grouping.
FIRST = ("test_build.py", "test_new_op_schema.py", "test_new_op.py", "test_prototype.py", "test_deploy_ort_only.py",
         "test_tutorials_cli_benchmarks.py", "test_transformers.py", "test_mmdeploy_exported.py", "test_serving.py")
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


# ---- the quick tier: `-m "not slow"` ------------------------------------------------------
#
# For iteration; CI runs everything. Left out whole: modules that build something (a package, a
# wheel, a library, a venv) or run minutes of subprocesses. Left out one by one: tests measured
# at 5 s or more (on the 2-core CI machine) whose behaviour a quicker test of the tier also
# checks. The ATen round trips mark themselves (tests/test_aten_bridge.py, QUICK).
SLOW_MODULES = {
    "test_new_op.py": "builds a generated package, with CUDA where nvcc is",
    "test_new_op_schema.py": "builds three generated packages and runs their tests",
    "test_coverage.py": "exports every ATen sample at every opset",
    "test_tutorials_cli_benchmarks.py": "runs every tutorial and benchmark as a subprocess",
    "test_deploy_ort_only.py": "creates venvs with older onnxruntime wheels",
    "test_deploy_cpp.py": "compiles the C++ example",
    "test_fuzz.py": "fuzz batches against torch and ORT",
    "test_fuzz_mmdeploy.py": "fuzz batches of mmdeploy's node forms against ORT",
    "test_gpu_cores_emulated.py": "compiles the GPU cores for the host",
    "test_concurrency.py": "session create/run/destroy loops, memory over time",
}
SLOW_TESTS = (
    "test_check_op.py::test_my_add[export_dynamo]", "test_check_op.py::test_my_add[onnx_reference]",
    "test_check_op.py::test_deform_conv2d[export_dynamo]", "test_check_op.py::test_deform_conv2d[onnx_reference]",
    "test_ms_deform_attn.py::test_check_op[export_dynamo]", "test_ms_deform_attn.py::test_check_op[onnx_reference]",
    "test_roi_align_rotated.py::test_check_op[export_dynamo]", "test_roi_align_rotated.py::test_check_op[onnx_reference]",
    "test_nms_rotated.py::test_check_op_nms_rotated[export_dynamo]",
    "test_nms_rotated.py::test_check_op_nms_rotated[onnx_reference]",
    "test_nms_rotated.py::test_check_op_batched_nms_rotated[export_dynamo]",
    "test_nms_rotated.py::test_check_op_batched_nms_rotated[onnx_reference]",
    "test_prototype.py::test_generated_prototype_package", "test_prototype.py::test_import_",
    "test_prototype.py::test_poly_checks[export_dynamo]",
    "test_aten_bridge.py::test_translations_persist_across_processes",
    "test_aten_bridge.py::test_each_op_torch_rules_that_carries_complex_values_matches_torch[stft]",
    "test_aten_bridge.py::test_a_dynamic_dim_fixed_in_the_translation_is_refused",
    "test_aten_lowerings.py::test_log_mel_spectrogram", "test_aten_lowerings.py::test_stft_below_opset_17",
    "test_aten_lowerings.py::test_grid_sample_modes_at_opset_11[", "test_aten_lowerings.py::test_bincount_with_weights",
    "test_deform_conv2d_onnx.py::test_round_trip[", "test_deform_conv2d_onnx.py::test_small_dcn_resnet_runs_in_ort[",
    "test_deform_conv2d_torch.py::test_every_cpu_isa_path", "test_my_add_torch.py::test_every_cpu_isa_path",
    "test_docs.py::test_python_snippet_runs[",
    "test_torchvision_drop_in.py::test_import_opforge_does_not_import_torchvision",
    "test_torchvision_drop_in.py::test_gradcheck_every_input[",
    # download mmdeploy's wheel (once) and run its library in a child
    "test_mmdeploy_ops.py::test_mmdeploy_own_library_", "test_mmdeploy_ops.py::test_mmdeploy_dcn_defects_",
    "test_mmdeploy_ops.py::test_int_attributes_crash_mmdeploy_",
)


def _is_slow(item) -> bool:
    path, _, test = item.nodeid.partition("::")  # (a parameter id may hold "/": docs/ops.md:64)
    module = path.rsplit("/", 1)[-1]
    return module in SLOW_MODULES or f"{module}::{test}".startswith(SLOW_TESTS)


def pytest_collection_modifyitems(config, items):
    config._opforge_collected = {full: sum(item.nodeid.startswith(full) for item in items)
                                 for full in STAND_INS.values()}
    items.sort(key=_rank)  # stable: the order inside each rank is the collection order
    for item in items:
        if _is_slow(item):
            item.add_marker(pytest.mark.slow)
    groups_file = os.environ.get("OPFORGE_TEST_GROUPS")
    if hasattr(config, "workerinput") and groups_file:
        groups = {item.nodeid: g for item in items if (g := _group(item))}
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(groups_file))
        with os.fdopen(fd, "w") as f:
            json.dump(groups, f)
        os.replace(tmp, groups_file)  # every worker writes the same map


# ---- stand-ins: quick-tier tests whose cases a selected slow test runs anyway --------------------
#
# test_aten_fuzz_sample runs a subset (same seed, same case numbers) of the cases the full set's
# batches run: the quick tier's stand-in for them. Where the batches are selected too (a full run,
# CI), it is deselected (reported as such, not skipped): its ~4,000 cases would run twice.
STAND_INS = {"tests/test_aten_fuzz.py::test_aten_fuzz_sample": "tests/test_aten_fuzz.py::test_aten_fuzz_full["}


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")  # after -m / -k selection
def pytest_collection_modifyitems_stand_ins(config, items):  # (a hook name must start with pytest_)
    collected = getattr(config, "_opforge_collected", {})  # before selection (the hook above)
    selected = {item.nodeid for item in items}
    covered = [item for item in items if (full := STAND_INS.get(item.nodeid))
               and 0 < sum(n.startswith(full) for n in selected) == collected.get(full)]
    if covered:
        config.hook.pytest_deselected(items=covered)
        items[:] = [item for item in items if item not in covered]


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: `-p no:xdist` must still run
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
