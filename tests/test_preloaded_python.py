"""tests/preloaded_python.py runs ``python ARGS`` as a fresh interpreter would, as far as a script
can tell: these compare it with real subprocesses."""

import json
import os
import subprocess
import sys
import time

import pytest

import preloaded_python
from preloaded_python import run_python


def _fresh(args, **kwargs):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, **kwargs)


@pytest.mark.parametrize("code", [
    "import sys; print(sys.argv, __name__, repr(__doc__)); sys.exit(3)",
    "raise SystemExit('a message')",
    "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
    "print(torch.ones(1))",  # preloaded, yet not in the script's globals
    "import atexit, threading, time; atexit.register(print, 'atexit');"
    "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()",
    "import sys; print('partial', end=''); sys.stderr.write('err\\n'); 1 / 0",
])
def test_a_run_looks_like_a_fresh_interpreter(code, tmp_path):
    ours, theirs = run_python(["-c", code, "x"], cwd=tmp_path), _fresh(["-c", code, "x"], cwd=tmp_path)
    assert (ours.returncode, ours.stdout) == (theirs.returncode, theirs.stdout)
    assert ours.stderr.splitlines()[-1:] == theirs.stderr.splitlines()[-1:]
    assert ("Traceback" in ours.stderr) == ("Traceback" in theirs.stderr)
    if "Traceback" in theirs.stderr:  # the user's frames only, not the server's
        assert ours.stderr.count('File "') == theirs.stderr.count('File "'), ours.stderr


def test_scripts_and_modules_get_their_argv_path_and_directory(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import os, sys\nprint(__file__, sys.argv, sys.path[0], os.getcwd())\n")
    for args in ([str(script), "a"], ["-m", "script", "b"]):
        ours, theirs = run_python(args, cwd=tmp_path), _fresh(args, cwd=tmp_path)
        assert ours.returncode == theirs.returncode == 0, ours.stderr
        assert ours.stdout == theirs.stdout


def test_a_changed_environment_starts_the_server_again():
    # (decided from what the server started with; not done here with a real server: each start of
    # this interpreter's costs ~8 s of CPU, and so would the next test's, back in the old environment)
    python = sys.executable
    started = preloaded_python._site_state(python)
    os.environ["OPF_X"] = "1"
    try:
        assert preloaded_python._added_pth(started, preloaded_python._site_state(python)) is None
        assert preloaded_python._what_changed(started, preloaded_python._site_state(python)) == "environment: OPF_X"
    finally:
        del os.environ["OPF_X"]
    assert preloaded_python._added_pth(started, preloaded_python._site_state(python)) == []


def test_a_run_past_its_timeout_is_killed_with_what_it_started(tmp_path):
    code = ("import subprocess, sys, time; p = subprocess.Popen(['sleep', '60']); print(p.pid, flush=True);"
            "time.sleep(60)")
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as info:
        run_python(["-c", code], timeout=3, text=False)
    assert time.monotonic() - start < 20
    grandchild = int(info.value.stdout)
    time.sleep(0.2)
    try:  # gone, or a zombie that nobody has reaped yet (its parent was killed too)
        state = open(f"/proc/{grandchild}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z"), state


def test_what_the_server_cannot_mimic_runs_in_a_real_process(monkeypatch):
    calls = []
    real_run = subprocess.run
    monkeypatch.setattr(preloaded_python.subprocess, "run", lambda *a, **k: calls.append(a[0]) or real_run(*a, **k))
    assert run_python(["-I", "-c", "print(1)"]).stdout == "1\n"
    assert run_python(["-c", "import os; print(os.environ['OPF_Y'])"], env=dict(os.environ, OPF_Y="2")).stdout == "2\n"
    assert run_python(["-c", "import sys; print('torch' in sys.modules)"], fresh=True).stdout == "False\n"
    assert len(calls) == 3
    assert run_python(["-c", "import sys; print('torch' in sys.modules)"]).stdout == "True\n"  # the preload
    # with the export stack, but nothing whose import registers ops or starts a thread
    preloaded = ("import sys; print(*(m in sys.modules for m in "
                 "('torch._dynamo', 'onnxscript', 'opforge', 'torchvision', 'onnxruntime')))")
    assert run_python(["-c", preloaded]).stdout == "True True False False False\n"
    assert len(calls) == 3


def test_opforge_switches_and_a_pythonpath_of_the_runs_own_are_forked_as_the_interpreter_would(monkeypatch,
                                                                                               tmp_path):
    """No preloaded module reads OPFORGE_*; a PYTHONPATH goes into sys.path after the script's
    directory, before site-packages (where it shadows an installed module of the same name)."""
    calls = []
    real_run = subprocess.run
    monkeypatch.setattr(preloaded_python.subprocess, "run", lambda *a, **k: calls.append(a[0]) or real_run(*a, **k))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    (tmp_path / "onnxruntime.py").write_text("SHADOW = True\n")
    code = "import os, sys, onnxruntime; print(os.environ['OPFORGE_PROBE'], sys.path[1], onnxruntime.SHADOW)"
    env = dict(os.environ, OPFORGE_PROBE="on", PYTHONPATH=str(tmp_path))
    assert run_python(["-c", code], env=env).stdout == f"on {tmp_path} True\n"
    assert calls == []
    assert run_python(["-c", "import sys; print(sys.path[1] == %r)" % str(tmp_path)]).stdout == "False\n"
    # anything else of its own still takes a real process
    assert run_python(["-c", "pass"], env=dict(env, OPF_NOT_A_SWITCH="1")).returncode == 0
    assert len(calls) == 1


_HOOK_PROBE = '''
import json, os, sys
state = {"torch": "torch" in sys.modules, "pip": any(m.split(".")[0] == "pip" for m in sys.modules),
         "cwd": os.getcwd(), "backend": os.environ.get("_PYPROJECT_HOOKS_BUILD_BACKEND"), "pid": os.getpid()}
from setuptools import setup  # its distutils shim must be on, as in a fresh interpreter
state["distutils"] = sys.modules["distutils"].__file__
with open("hooks.jsonl", "a") as log:
    log.write(json.dumps(state) + "\\n")
if os.path.exists("fail"):
    raise SystemExit("the probe's setup.py failed on purpose")
setup(name="opf_hook_probe", version="0.1", py_modules=["opf_hook_probe"])
'''


def test_pip_and_its_build_hooks_are_forked_and_a_pth_added_later_is_read_by_each_run(tmp_path):
    """`python -m pip` through run_command: each PEP 517 hook is a fork of the preloaded pip process
    (torch imported, ~4 s of CPU saved per hook) that sees no pip module, setuptools' distutils, the
    hook's directory and environment; a failing hook fails the install with its output."""
    from helpers import scratch_venv
    from preloaded_python import run_command

    python = scratch_venv(tmp_path)
    pkg = tmp_path / "probe"
    pkg.mkdir()
    (pkg / "setup.py").write_text(_HOOK_PROBE)
    (pkg / "opf_hook_probe.py").write_text("VALUE = 42\n")
    (pkg / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n')
    install = [python, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index", "-e", str(pkg)]

    def hooks(**kwargs):
        (pkg / "hooks.jsonl").unlink(missing_ok=True)
        done = run_command(install, cwd=tmp_path, **kwargs)
        lines = (pkg / "hooks.jsonl").read_text().splitlines() if (pkg / "hooks.jsonl").exists() else []
        return done, [json.loads(line) for line in lines]

    # The probe tells a fork from a fresh interpreter: a real pip's hooks have no torch. (Real pip
    # first, failing build next: the forked runs then share one server, no install between them.)
    done, real = hooks(fresh=True)
    assert done.returncode == 0 and len(real) >= 2 and not any(h["torch"] for h in real), done.stderr[-3000:]
    (pkg / "fail").write_text("")
    done, failed = hooks()
    assert done.returncode != 0 and len(failed) == 1 and failed[0]["torch"]
    assert "the probe's setup.py failed on purpose" in done.stdout + done.stderr
    (pkg / "fail").unlink()
    # A .pth file added since the server started (what an editable install adds) is read by each
    # run, in place of starting the server again; a rewritten one (the reinstall below) restarts it.
    server = preloaded_python._servers[python]["proc"].pid
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "opf_pth_probe.py").write_text("X = 7\n")
    site = next((tmp_path / "venv" / "lib").glob("python*/site-packages"))
    (site / "zz_opf_probe.pth").write_text(f"{tmp_path / 'mods'}\nimport sys; sys.opf_pth_line = 'ran'\n")
    code = "import sys, opf_pth_probe; print(sys.opf_pth_line, opf_pth_probe.X, sys.path.index(%r) > 0)" % str(
        tmp_path / "mods")
    ours, theirs = run_command([python, "-c", code], cwd="/"), run_command([python, "-c", code], cwd="/", fresh=True)
    assert ours.stdout == theirs.stdout == "ran 7 True\n", ours.stderr + theirs.stderr
    assert preloaded_python._servers[python]["proc"].pid == server
    done, forked = hooks()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Exception ignored" not in done.stderr, done.stderr  # (the preload's exit handlers are not pip's)
    assert len(forked) == len(real) and len({h["pid"] for h in forked}) == len(forked)  # (metadata, build_editable)
    for hook in forked:
        assert hook["torch"] and not hook["pip"], hook
        assert "setuptools/_distutils" in hook["distutils"] and hook["cwd"] == str(pkg), hook
        assert hook["backend"] == "setuptools.build_meta", hook
    assert [{k: v for k, v in h.items() if k not in ("torch", "pid")} for h in real] == \
        [{k: v for k, v in h.items() if k not in ("torch", "pid")} for h in forked]
    # the reinstall rewrote its .pth: the next run would start the server again
    assert preloaded_python._added_pth(preloaded_python._servers[python]["state"],
                                       preloaded_python._site_state(python)) is None
    imported = run_command([python, "-c", "import opf_hook_probe; print(opf_hook_probe.VALUE)"], cwd="/", fresh=True)
    assert imported.stdout == "42\n", imported.stderr


KILLED_RUN_DRIVER = r"""
import sys, threading, time
sys.path.insert(0, sys.argv[1])
import preloaded_python

preloaded_python.run_python(["-c", "pass"])  # the server, started by this (main) thread
server = next(iter(preloaded_python._servers.values()))["proc"].pid
threading.Thread(target=preloaded_python.run_python, daemon=True,
                 args=(["-c", "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"],)).start()
print(server, flush=True)
time.sleep(600)
"""


def _children(pid: int) -> list:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie is gone but for its parent's wait
    except OSError:
        return False


@pytest.mark.parametrize("how", ["SIGKILL to the test process", "SIGTERM to its process group"])
def test_killing_the_test_run_leaves_no_server_and_no_run_behind(how):
    """A test process that started a server and a run (which itself started `sleep`) is killed:
    the server, the run and the run's child all end within seconds."""
    import signal

    driver = subprocess.Popen([sys.executable, "-c", KILLED_RUN_DRIVER, os.path.dirname(__file__)],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        server = int(driver.stdout.readline())
        deadline = time.monotonic() + 60
        while not (_children(server) and _children(_children(server)[0])) and time.monotonic() < deadline:
            time.sleep(0.1)
        (run,) = _children(server)
        (sleeper,) = _children(run)
        if how.startswith("SIGKILL"):
            driver.kill()
        else:
            os.killpg(driver.pid, signal.SIGTERM)
        driver.wait(timeout=30)
        deadline = time.monotonic() + 20
        while any(map(_alive, (server, run, sleeper))) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_alive, (server, run, sleeper))), {p: _alive(p) for p in (server, run, sleeper)}
    finally:
        if driver.poll() is None:
            driver.kill()
