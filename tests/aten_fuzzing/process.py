"""The process: its memory cap (RLIMIT_AS), the peak RSS bound, the case selection and the
command line (``main``): each case under the watchdog (SIGALRM), reported as the CASE, PATH,
FAIL, TALLY, PEAK_RSS and DONE lines."""

from __future__ import annotations

import argparse
import collections
import os
import resource
import signal
import sys
import time
import traceback

import torch

from . import __doc__ as HARNESS_DOC
from .cases import all_cases, sample_indices
from .running import run_case
from .schemas import schemas
from .sessions import CaseFailure, Runtime, _short


PEAK_RSS_LIMIT = 1.5e9  # bytes: the bound on a case's peak memory
CAP_BYTES = int(1.5 * 2**30)  # address space a case may add (RLIMIT_AS)

def under_asan() -> bool:
    return "libasan" in os.environ.get("LD_PRELOAD", "")


def cap_memory(extra=CAP_BYTES) -> int | None:
    """RLIMIT_AS = this process's size + ``extra`` (not under ASan, whose shadow memory is
    terabytes of address space). Returns the limit."""
    if under_asan():
        return None
    with open("/proc/self/statm") as f:
        vsize = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = vsize + extra
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return limit


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def select(args) -> list:
    cases = all_cases()
    if args.indices:
        return [cases[int(i)] for i in args.indices.split(",") if i]
    if args.case is not None:
        return [cases[args.case]]
    if args.sample:
        chosen = [cases[i] for i in sample_indices(args.seed, args.per_schema)]
    else:
        chosen = cases
    if args.ops:
        wanted = set(args.ops.split(","))
        chosen = [c for c in chosen if (c.schema.name if c.schema else "_model") in wanted
                  or (c.schema and c.schema.qualname[6:] in wanted)]
    if args.first or args.cases is not None:
        end = args.first + args.cases if args.cases is not None else len(cases)
        chosen = [c for c in chosen if args.first <= c.index < end]
    return chosen


def main(argv=None):
    # no abbreviations: --supervise strips its own options from the children's command line by name
    parser = argparse.ArgumentParser(description=HARNESS_DOC.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--seed", type=int, default=0, help="tensor values and the sample's choice")
    parser.add_argument("--first", type=int, default=0, help="first case index")
    parser.add_argument("--cases", type=int, default=None, help="number of case indices from --first")
    parser.add_argument("--case", type=int, help="run only this case, verbosely")
    parser.add_argument("--ops", help="comma-separated operators (or op.overload); _model: the model cases")
    parser.add_argument("--sample", action="store_true", help="the quick tier's subset (sample_indices)")
    parser.add_argument("--per-schema", type=int, default=2, help="with --sample: hostile variants per overload")
    parser.add_argument("--list", action="store_true", help="list the selected cases and the skipped overloads")
    parser.add_argument("--library", help="libopforge_aten.so to test (default: opforge's)")
    parser.add_argument("--paths", default="ab", help="a: opforge.ort_session, b: plain onnxruntime (default ab)")
    parser.add_argument("--case-timeout", type=int, default=10, help="seconds; a longer case dies by SIGALRM")
    parser.add_argument("--no-memory-cap", action="store_true")
    parser.add_argument("--supervise", action="store_true", help="run in child processes, going on after crashes")
    parser.add_argument("--jobs", type=int, default=1, help="with --supervise: parallel children")
    parser.add_argument("--indices", help="comma-separated case indices (what --supervise gives its children)")
    args = parser.parse_args(argv)
    if args.supervise:
        from .supervisor import supervise  # (here: its children run main)

        return supervise(args, argv if argv is not None else sys.argv[1:])
    chosen = select(args)
    if args.list:
        for c in chosen:
            print(f"{c.index}: {c.desc}")
        ops = {c.schema.qualname for c in chosen if c.schema}
        _, skipped = schemas()
        print(f"{len(chosen)} cases over {len(ops)} overloads; skipped overloads: "
              f"{sum(len(v) for v in skipped.values())}")
        for why, names in sorted(skipped.items()):
            print(f"  skipped ({why}): {len(names)}: {' '.join(names)}")
        return 0
    torch.set_num_threads(1)
    limit = None if args.no_memory_cap else cap_memory()
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    rt = Runtime(args.library)
    print(f"START {len(chosen)} cases, library {rt.library}, address-space cap "
          f"{'none' if limit is None else f'{limit / 2**30:.1f} GiB'}, rss {peak_rss() / 1e6:.0f} MB", flush=True)
    failures, tally = 0, collections.Counter()
    rss_reported = False
    t0 = time.monotonic()
    for c in chosen:
        c.paths = "".join(p for p in c.paths if p in args.paths)
        print(f"CASE {c.index}: {c.desc}", flush=True)
        signal.alarm(args.case_timeout)
        try:
            outcome = run_case(c, rt, args.seed, verbose=args.case is not None)
            tally[outcome] += 1
        except CaseFailure as f:
            failures += 1
            print(f"FAIL {c.index} [{getattr(f, 'path', '-')}] {f.cls}: {f.detail} -- {c.desc}", flush=True)
        except Exception:  # noqa: BLE001 - a bug of the harness: report, go on
            failures += 1
            tb = traceback.format_exc(limit=4).replace("\n", " | ")
            print(f"FAIL {c.index} [-] harness: {_short(tb, 600)} -- {c.desc}", flush=True)
        finally:
            signal.alarm(0)
        if not rss_reported and not under_asan() and peak_rss() > PEAK_RSS_LIMIT:
            rss_reported = True
            failures += 1
            print(f"FAIL {c.index} [-] peak-rss: the process's peak RSS reached {peak_rss() / 1e6:.0f} MB "
                  f"(limit {PEAK_RSS_LIMIT / 1e6:.0f} MB) -- {c.desc}", flush=True)
    print("TALLY " + ", ".join(f"{n} {what}" for what, n in sorted(tally.items())), flush=True)
    print(f"PEAK_RSS {peak_rss()}", flush=True)
    print(f"TIME {time.monotonic() - t0:.1f} s", flush=True)
    print(f"DONE {len(chosen)} cases, {failures} failed", flush=True)
    return 1 if failures else 0
