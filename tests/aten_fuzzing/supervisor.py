"""``--supervise``: the selection run in forked children (``--jobs`` at a time, 1500 cases
each) that go on after a crash or a hang, which is reported as a FAIL line, and one report of
them all."""

from __future__ import annotations

import collections
import os
import re
import signal
import sys
import time
import traceback

from .process import main, select


def _fork_child(child_argv, indices, tmpdir, n):
    """Forks a child running ``main(child_argv + --indices ...)`` with its output in files. The
    supervisor has imported torch but not onnxruntime (whose import starts a thread a fork would
    lose), so a restart after a crash costs a fork, not an interpreter's start-up."""
    out_path, err_path = os.path.join(tmpdir, f"{n}.out"), os.path.join(tmpdir, f"{n}.err")
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            os.setpgid(0, 0)
            for fd, path in ((1, out_path), (2, err_path)):
                f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(f, fd)
                os.close(f)
            sys.stdout = open(1, "w", closefd=False)
            sys.stderr = open(2, "w", closefd=False)
            code = main(child_argv + ["--indices", ",".join(map(str, indices))])
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001 - reported through the exit status
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 70)
    return pid, out_path, err_path


def _crash_line(out, err, status, pending) -> tuple[str, int]:
    """(synthetic FAIL line, index of the case it names) for a child that did not finish."""
    started = [int(m) for m in re.findall(r"^CASE (\d+):", out, re.M)]
    marks = re.findall(r"^(?:CASE \d+:|PATH (\S+))", out, re.M)
    last = started[-1] if started else pending[0]
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        what = ("timeout (SIGALRM: the case ran past --case-timeout)" if sig == signal.SIGALRM else
                f"signal {sig} ({signal.Signals(sig).name})")
    else:
        what = f"exit status {os.WEXITSTATUS(status)}"
    tail = " | ".join(line for line in err.strip().splitlines() if "Warning" not in line)[-300:]
    desc = re.findall(rf"^CASE {last}: (.*)$", out, re.M)
    path = marks[-1] if marks and marks[-1] else "-"
    return (f"FAIL {last} [{path}] crash: {what} -- {desc[0] if desc else ''}" + (f" | stderr: {tail}" if tail else ""),
            last)


def supervise(args, argv):
    import tempfile

    chosen = [c.index for c in select(args)]
    drop = {"--supervise", "--jobs", "--first", "--cases", "--case", "--ops", "--sample", "--indices", "--per-schema"}
    flags = {"--supervise", "--sample", "--no-memory-cap"}
    child_argv, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        key = a.split("=")[0]
        if key in drop:
            skip = "=" not in a and key not in flags
            continue
        child_argv.append(a)
    chunk = 1500
    queue = [chosen[i:i + chunk] for i in range(0, len(chosen), chunk)]
    results = {}  # chunk number -> lines
    running = {}  # pid -> (chunk number, pending indices, out, err, started)
    t0 = time.monotonic()
    n_started = 0
    with tempfile.TemporaryDirectory(prefix="aten-fuzz-") as tmp:
        work = list(enumerate(queue))
        while work or running:
            while work and len(running) < max(1, args.jobs):
                k, pending = work.pop(0)
                pid, out, err = _fork_child(child_argv, pending, tmp, n_started)
                n_started += 1
                running[pid] = (k, pending, out, err, time.monotonic())
            pid, status = os.waitpid(-1, 0)
            if pid not in running:
                continue
            k, pending, out_path, err_path, started = running.pop(pid)
            out, err = (open(p, errors="replace").read() for p in (out_path, err_path))
            lines = results.setdefault(k, [])
            lines += out.splitlines()
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) in (0, 1) and re.search(r"^DONE ", out, re.M):
                continue
            line, last = _crash_line(out, err, status, pending)
            lines.append(line)
            rest = [i for i in pending if i > last]
            if rest:
                work.insert(0, (k, rest))
    failures, peak, tally = 0, 0, collections.Counter()
    for k in sorted(results):
        for line in results[k]:
            if line.startswith(("FAIL", "CASE")):
                print(line)
            if line.startswith("FAIL"):
                failures += 1
            m = re.match(r"PEAK_RSS (\d+)", line)
            if m:
                peak = max(peak, int(m.group(1)))
            m = re.match(r"TALLY (.*)", line)
            if m:
                for part in filter(None, m.group(1).split(", ")):
                    n, what = part.split(" ", 1)
                    tally[what] += int(n)
    print("TALLY " + ", ".join(f"{n} {what}" for what, n in sorted(tally.items())))
    print(f"PEAK_RSS {peak}")
    print(f"TIME {time.monotonic() - t0:.1f} s ({n_started} processes)")
    print(f"DONE {len(chosen)} cases, {failures} failed", flush=True)
    return 1 if failures else 0
