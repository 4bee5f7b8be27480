"""``run_python(args)``: ``python ARGS`` for the tests, in ~0.1 s of start-up instead of ~4 s.

Why: a fresh interpreter spends 3-3.5 s of CPU importing torch and ~1 s tearing it down again
(measured on the 2-core CI machine: ``python -c "import torch"`` 4.0-4.5 s, the same ending in
``os._exit`` 2.6-3.2 s; tutorial 01 as a fresh process 12.0-12.6 s, forked 6.5 s). The suite
starts about seventy such processes for scripts (tutorials, benchmarks, the CLI, documentation
snippets, fuzz batches, generated packages' checks and tests) whose start-up is not what they test.

How: a server process per interpreter (this one; a scratch venv's) imports torch (and numpy,
which torch pulls in) and the export stack (torch.export with torch._dynamo, onnx, onnxscript's
torchlib: another ~4 s of CPU in each run that exports) once, then forks a child for each run.
Not onnxruntime (importing it starts a native thread, which a forked child would lack) and not
opforge or torchvision (their import registers ops: a script that forgets to import them must
still fail). The child is the run: it takes the run's argv, working directory, environment,
stdin (/dev/null), stdout and stderr, runs the script, module or ``-c`` code as ``__main__`` in a
fresh ``__main__`` module (its own globals: a script that forgets ``import torch`` still fails),
exits as an interpreter does (non-daemon threads joined, atexit handlers run, streams flushed)
and skips only the interpreter's teardown (``os._exit``). Its exit status is the script's, -N for
a signal, as ``subprocess`` reports it.

pip is forked too, and so are the PEP 517 hooks it starts for a build (``_fork_build_hooks``):
pip starts each as a fresh interpreter, and a hook that runs the setup.py of a package built on
opforge imports torch (two per ``pip install -e``).

What differs from a fresh process is that these modules are already imported, with the
environment and site-packages the server started with. So a server is started again when the
environment changed (pytest's PYTEST_CURRENT_TEST aside) or a .pth file was rewritten or removed;
one added since it started (an editable install) each run reads before it starts, as the
interpreter reads it (after those read at start-up, where the interpreter goes by name). A run goes
to a plain ``subprocess.run`` where the difference could matter: interpreter options before the
script (``-I``, ``-X``, ...), an environment of its own (``env=`` other than os.environ: torch's
import would not have seen it; but for opforge's OPFORGE_* switches and Hugging Face's HF_* ones,
which only modules the server does not import read, and a PYTHONPATH, which the child puts into
sys.path as the interpreter would), or ``fresh=True``.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

#: The server (tests/fork_server.py), started as a ``-c`` program runs: sys.path[0] is "".
_SERVER_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fork_server.py")
_SERVER_BOOT = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"

_LOCK = threading.Lock()
_MAX_SERVERS = 5  # each holds torch and the export stack (~0.6 GB): the main interpreter's, a test module's
# scratch venv's, a fresh one's (a wheel installed into it) and the two transformers venvs'; with
# two, a worker alternating between them started a server (~8 s of CPU) at each switch
_servers: dict = {}  # interpreter -> {"proc": the server, "state": what it started with}


def _site_state(python: str) -> tuple:
    """What a server of ``python`` read at start-up and a later change would hide from it: the
    environment, and the .pth files (editable installs) of its venv's site-packages."""
    venv = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    pth = []
    if os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        for site in glob.glob(os.path.join(venv, "lib", "python*", "site-packages")):
            with contextlib.suppress(OSError):
                pth += [(e.path, e.stat().st_mtime_ns) for e in os.scandir(site) if e.name.endswith(".pth")]
    return tuple(sorted(_environment().items())), tuple(sorted(pth))


def _environment(env=None) -> dict:
    """``env`` (default: os.environ) without what pytest changes at every test (each run gets
    the whole environment of its moment; only a change of the rest restarts a server)."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k != "PYTEST_CURRENT_TEST"}


def _server(python: str) -> tuple[subprocess.Popen, list]:
    """The server of ``python``, and the .pth files added to its site-packages since it started
    (its children read them, as the interpreter does at start-up: ``_added_pth``)."""
    state = _site_state(python)
    entry = _servers.pop(python, None)  # (re-inserted below: the dict's order is the use order)
    added = None if entry is None else _added_pth(entry["state"], state)
    why = "first" if entry is None else None
    if entry is not None and (entry["proc"].poll() is not None or added is None):
        why = "exited" if entry["proc"].poll() is not None else _what_changed(entry["state"], state)
        _stop(entry["proc"])
        entry = None
    if entry is None:
        while len(_servers) >= _MAX_SERVERS:
            evicted = next(iter(_servers))
            _log_start(evicted, "evicted")
            _stop(_servers.pop(evicted)["proc"])
        _log_start(python, why)
        proc = subprocess.Popen([python, "-c", _SERVER_BOOT, _SERVER_FILE], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, cwd="/",
                                env=dict(os.environ))
        entry, added = {"proc": proc, "state": state}, []
    _servers[python] = entry
    return entry["proc"], added


def _what_changed(started: tuple, now: tuple) -> str:
    (env_started, pth_started), (env_now, pth_now) = map(lambda st: (dict(st[0]), set(st[1])), (started, now))
    keys = sorted(k for k in set(env_started) | set(env_now) if env_started.get(k) != env_now.get(k))
    return f"environment: {', '.join(keys)}" if keys else f"pth: {sorted(p for p, _ in pth_started - pth_now)}"


def _log_start(python: str, why: str) -> None:
    """OPFORGE_TEST_SERVER_LOG=<file>: a line per server start or stop and why (for the suite's time:
    a start costs ~8 s of CPU)."""
    log = os.environ.get("OPFORGE_TEST_SERVER_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {os.environ.get('PYTEST_CURRENT_TEST', '-').split(' ')[0]} {python}: {why}\n")


def _added_pth(started: tuple, now: tuple) -> list | None:
    """The .pth files in ``now`` that were not there when the server started (``started``), in
    the order the interpreter reads them (sorted); None when anything else changed (the
    environment, a .pth rewritten or removed): the server must start again. An editable install
    adds one (a path line or an import line installing a finder), which a child reads before
    its run; a rewritten one could name a finder module the server already imported."""
    (env_started, pth_started), (env_now, pth_now) = started, now
    if env_started != env_now or not set(pth_started) <= set(pth_now):
        return None
    return sorted(path for path, _ in set(pth_now) - set(pth_started))


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@atexit.register
def _stop_all() -> None:
    while _servers:
        _stop(_servers.popitem()[1]["proc"])


def _read_line(proc: subprocess.Popen, deadline: float | None) -> dict | None:
    """The server's next message, or None at the deadline."""
    fd = proc.stdout.fileno()
    timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError("the preloaded-python server exited")
    return json.loads(line)


def _forkable(args, env, fresh: bool) -> bool:
    if fresh or not args or os.name != "posix":
        return False
    if env is not None and not _only_read_after_the_preload(_environment(env), _environment()):
        return False
    if args[0] in ("-c", "-m"):
        return len(args) >= 2
    return not args[0].startswith("-")


def _only_read_after_the_preload(env: dict, server_env: dict) -> bool:
    """Whether ``env`` differs from the environment servers start with (os.environ) only in what
    no preloaded module reads: opforge's OPFORGE_* switches (opforge is not preloaded), Hugging
    Face's HF_* ones (huggingface_hub is not either), and a PYTHONPATH where the server had none
    (the child puts it into sys.path)."""
    changed = {k for k in env.keys() | server_env.keys() if env.get(k) != server_env.get(k)}
    return all(k.startswith(("OPFORGE_", "HF_")) or (k == "PYTHONPATH" and k not in server_env) for k in changed)


def run_python(args, *, python=None, cwd=None, env=None, timeout=None, text=True,
               fresh=False, fork_build_hooks=False) -> subprocess.CompletedProcess:
    """``subprocess.run([python, *args], capture_output=True, ...)`` (``python``: this interpreter
    unless given, a scratch venv's say), started from a preloaded server of that interpreter where
    nothing can tell the difference (module docstring). Raises ``subprocess.TimeoutExpired``
    (with the output so far) past ``timeout``, as subprocess.run does."""
    python = str(python or sys.executable)
    args = [str(a) for a in args]
    cmd = [python, *args]
    if not _forkable(args, env, fresh):
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=text, timeout=timeout)
    with _LOCK, tempfile.TemporaryDirectory(prefix="opforge-run-") as tmp:
        proc, added_pth = _server(python)
        paths = {name: os.path.join(tmp, name) for name in ("stdout", "stderr")}
        for path in paths.values():
            open(path, "wb").close()
        request = {"argv": args, "cwd": os.path.abspath(cwd or os.getcwd()), "env": dict(env or os.environ),
                   "fork_build_hooks": fork_build_hooks, "added_pth": added_pth, **paths}
        proc.stdin.write((json.dumps(request) + "\n").encode())
        proc.stdin.flush()
        pid = _read_line(proc, None)["pid"]
        deadline = None if timeout is None else time.monotonic() + timeout
        done = _read_line(proc, deadline)
        if done is None:  # past the timeout: the run and everything it started
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            _read_line(proc, None)
        out, err = (open(paths[n], "rb").read() for n in ("stdout", "stderr"))
        if text:  # as subprocess's text mode reads them: decoded, universal newlines
            out, err = (b.decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n") for b in (out, err))
        if done is None:
            raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err)
        return subprocess.CompletedProcess(cmd, os.waitstatus_to_exitcode(done["status"]), out, err)



def run_command(cmd, *, fresh=False, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, **kwargs)``, where ``cmd`` starts a
    Python interpreter (``cmd[0]`` named python*) through :func:`run_python`, pip too, with its
    build hooks forked from it (``_fork_build_hooks``; what pip installs restarts the server at
    its next run, as any change of the venv does). A ``fresh`` run is a real process."""
    if not fresh and os.path.basename(str(cmd[0])).startswith("python"):
        return run_python(cmd[1:], python=cmd[0], fork_build_hooks=list(cmd[1:3]) == ["-m", "pip"], **kwargs)
    return subprocess.run(cmd, capture_output=True, text=True, **kwargs)
