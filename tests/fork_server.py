"""The preloaded-python fork server of tests/preloaded_python.py (read its docstring first).

Run as ``python -c "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')" THIS_FILE``
(so ``sys.path[0]`` is ``""``, as for a ``-c`` program, and this folder's modules cannot shadow
anything the preload imports). It preloads, then forks one child per request line read from stdin
and writes ``{"pid": ...}`` when a child started and ``{"status": ...}`` (waitpid's) when it ended.

It dies with the test process that started it, and takes the run it is serving along: when that
process ends, however it ends, the control pipe reaches end of file; a SIGTERM to the test run's
process group reaches the server too. Either way the server kills the run's whole process group
(the run lives in a group of its own) and exits. A run also gets SIGKILL from the kernel if the
server itself is killed (``PR_SET_PDEATHSIG``). So a killed test run leaves no server and no run
behind (tests/test_preloaded_python.py kills one to check).
"""

import builtins, ctypes, io, json, os, select, signal, site, sys, threading, traceback, types

_PR_SET_PDEATHSIG = 1
_current_run = 0  # the pid (= process group) of the run being served, 0 between runs


def _end_the_run_and_exit(code):
    if _current_run:
        try:
            os.killpg(_current_run, signal.SIGKILL)  # the run, and what it started
        except OSError:
            pass
    os._exit(code)


if __name__ == "__main__":
    # A SIGTERM (to the test run's process group, say) ends the run too, which lives in a group
    # of its own; installed before the preload, so a parent killed during it leaves nothing either.
    signal.signal(signal.SIGTERM, lambda signum, frame: _end_the_run_and_exit(128 + signum))

import numpy, torch  # the preload (torch imports numpy anyway)
try:  # and the export stack most runs load: torch.export (with torch._dynamo), onnx, onnxscript's torchlib
    import onnx, onnxscript.function_libs.torch_lib.ops, torch._dynamo, torch.export._trace
    import torch.onnx._internal.exporter._core
except ImportError:  # an interpreter without them (a bare scratch venv) still serves plain runs
    pass

def _streams(request):
    os.setpgid(0, 0)  # the run and what it starts: one group, killed together on a timeout
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY),
                            (2, request["stderr"], os.O_WRONLY)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    _standard_streams()

def _standard_streams():
    # as a fresh interpreter sets them up for files and pipes
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False))
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), errors="backslashreplace",
                                                   line_buffering=True)

def _main_module(file=None):
    module = types.ModuleType("__main__")
    module.__builtins__ = builtins
    if file is not None:
        module.__file__ = file
    sys.modules["__main__"] = module
    return module

_STARTED_WITH_PYTHONPATH = "PYTHONPATH" in os.environ  # (then every run has the same one: _forkable)

def _python_path(env):
    # A PYTHONPATH of the run's own (the server started without one): its entries go right after
    # sys.path[0], before site-packages, where the interpreter puts them.
    if not _STARTED_WITH_PYTHONPATH:
        sys.path[1:1] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]

def _run(argv):
    import runpy
    if argv[0] == "-c":
        sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
        exec(compile(argv[1], "<string>", "exec"), _main_module().__dict__)
    elif argv[0] == "-m":
        sys.argv, sys.path[0] = [argv[1], *argv[2:]], os.getcwd()
        _main_module()
        runpy._run_module_as_main(argv[1], alter_argv=True)
    else:
        path = argv[0]
        sys.argv, sys.path[0] = list(argv), os.path.dirname(os.path.abspath(path))
        with open(path, "rb") as f:
            source = f.read()
        exec(compile(source, path, "exec"), _main_module(path).__dict__)

def _fork_build_hooks():
    # A run of pip: pip starts each PEP 517 hook of a build (get_requires_for_build_*,
    # prepare_metadata_for_build_*, build_*) as a fresh interpreter, and a setup.py built on opforge
    # imports torch in each that runs it, ~4 s of CPU twice a `pip install -e`. Here each is a fork of
    # this one (torch imported), given what pip gives the process: the hook's argv, directory,
    # environment, one output pipe; a fresh interpreter's warning filters, logging and exit
    # handlers (not pip's). Any other command pip starts, and any hook while pip runs a thread,
    # is a real process.
    import atexit, logging, subprocess, warnings
    # What pip changes of the process, taken before it runs: its warning filters, and its modules
    # with the import machinery it alters. (Importing pip turns setuptools' distutils shim off for
    # the process, which setuptools' import then misses: "AssertionError: .../distutils/core.py".)
    fresh_filters, fresh_modules, fresh_meta_path = list(warnings.filters), set(sys.modules), list(sys.meta_path)
    # The preloaded modules' exit handlers are not pip's (torch._dynamo's imports a module at exit,
    # which pip's import blocker refuses once it has installed something).
    atexit._clear()
    import pip._internal.utils.subprocess as pip_subprocess

    class ForkedHook:  # what pip uses of a Popen
        def __init__(self, cmd, kwargs):
            read_fd, write_fd = os.pipe()
            self.pid = os.fork()
            if self.pid == 0:
                os.close(read_fd)
                code = 1
                try:
                    os.chdir(kwargs.get("cwd") or os.getcwd())
                    if kwargs.get("env") is not None:
                        os.environ.clear()
                        os.environ.update(kwargs["env"])
                    null = os.open(os.devnull, os.O_RDONLY)
                    for fd, target in ((0, null), (1, write_fd), (2, write_fd)):
                        os.dup2(target, fd)
                    os.close(null)
                    os.close(write_fd)
                    _standard_streams()
                    atexit._clear()
                    warnings.filters[:] = fresh_filters
                    for name in [m for m in sys.modules if m not in fresh_modules]:
                        del sys.modules[name]
                    sys.meta_path[:] = fresh_meta_path
                    shim = getattr(sys.modules.get("_distutils_hack"), "DISTUTILS_FINDER", None)
                    if shim is not None:
                        vars(shim).pop("spec_for_distutils", None)
                    logging.root.handlers.clear()
                    logging.root.setLevel(logging.WARNING)
                    code = _finish(_ran(list(cmd[1:])))
                finally:
                    os._exit(code)
            os.close(write_fd)
            self.args, self.returncode, self.stderr = cmd, None, None
            self.stdin = open(os.devnull, "w")
            self.stdout = io.open(read_fd, "r", encoding=kwargs.get("encoding") or "locale", errors=kwargs.get("errors"))

        def wait(self, timeout=None):
            if self.returncode is None:
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            return self.returncode

        def poll(self):
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def popen(cmd, *args, **kwargs):
        cmd = [str(c) for c in cmd]
        if (not args and len(cmd) == 4 and os.path.basename(cmd[1]) == "_in_process.py"
                and os.path.realpath(cmd[0]) == os.path.realpath(sys.executable)
                and kwargs.get("stdout") == subprocess.PIPE and kwargs.get("stderr") == subprocess.STDOUT
                and threading.active_count() == 1):
            return ForkedHook(cmd, kwargs)
        return subprocess.Popen(cmd, *args, **kwargs)

    pip_subprocess.subprocess = types.SimpleNamespace(**{**vars(subprocess), "Popen": popen})

def _child(request):
    code = 1
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's handler is not the run's
    # The run dies with this server however the server ends, SIGKILL included (the kernel's
    # parent-death signal; reliable here: the server is single-threaded).
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        _streams(request)
        for pth in request.get("added_pth", ()):  # installed since this server started
            site.addpackage(os.path.dirname(pth), os.path.basename(pth), None)
        _python_path(request["env"])
        if request.get("fork_build_hooks"):
            _fork_build_hooks()
        code = _ran(request["argv"])
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(_finish(code))

def _ran(argv):
    """Runs ``argv`` as __main__; its exit status, as the interpreter would end."""
    try:
        _run(argv)
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException as exc:
        # without this server's two frames (_ran, _run), as the interpreter prints it
        tb = exc.__traceback__
        tb = tb.tb_next.tb_next if tb is not None and tb.tb_next is not None else tb
        traceback.print_exception(type(exc), exc, tb)
        return 1
    return 0

def _finish(code):
    try:  # what Py_FinalizeEx does before tearing down: join threads, run atexit, flush
        threading._shutdown()
        import atexit
        atexit._run_exitfuncs()
        sys.stdout.flush(); sys.stderr.flush()
    except BaseException:
        code = code or 1
    return code & 0xFF

def _wait(pid, control_fd):
    """waitpid(pid)'s status, while watching the control pipe: end of file there means the test
    process that started this server has ended (it holds the pipe's only write end), and then the
    run is killed and the server exits. A pidfd wakes the wait when the run ends."""
    try:
        run_fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # an old kernel: poll
        run_fd = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            watched = [control_fd] + ([run_fd] if run_fd is not None else [])
            ready, _, _ = select.select(watched, [], [], None if run_fd is not None else 0.05)
            if control_fd in ready and not os.read(control_fd, 1):  # (no request comes during a run)
                _end_the_run_and_exit(1)
    finally:
        if run_fd is not None:
            os.close(run_fd)


def serve():
    global _current_run
    control_in, control_out = sys.stdin.buffer, sys.stdout.buffer
    for line in control_in:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        try:
            os.setpgid(pid, pid)  # also here: the group exists before the test can signal it
        except OSError:
            pass
        _current_run = pid
        control_out.write((json.dumps({"pid": pid}) + "\n").encode()); control_out.flush()
        status = _wait(pid, control_in.fileno())
        _current_run = 0
        control_out.write((json.dumps({"status": status}) + "\n").encode()); control_out.flush()


if __name__ == "__main__":
    serve()
