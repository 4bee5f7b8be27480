"""Schema-driven fuzzing of libopforge_aten: every allowed ATen operator, hostile arguments.

For every operator of libopforge_aten's allow-list (``policy.committed()[0]``, sorted) and each
of its overloads that writes into no argument, the cases are generated from the overload's
schema (``torch.ops.aten.<name>.<overload>._schema``), deterministically:

* ``baseline``: a plausible call (small float32 tensors of a rank the op takes, small ints,
  plausible strings), found by trying candidate calls in torch itself; its torch result is the
  reference the ORT result must equal bitwise;
* ``intmin``: every tensor int64, the first INT64_MIN and the others -1 (Scalars -1): INT64_MIN / -1;
* one hostile variant per argument and hostile value of its class, the other arguments kept:
  ints -1, 0, 7, 2^31, 2^40, 2^62, INT64_MIN, INT64_MAX, -2^40; int lists [2^40], [-5],
  [INT64_MIN], [], [2^20, 2^20], [10000, 10000]; floats and Scalars NaN, +-inf, +-1e30 (Scalars
  also INT64_MIN, INT64_MAX, -1, 0); a flipped bool; a bogus string; out-of-range and odd enum
  values (ScalarType, Layout: sparse ones, MemoryFormat); tensors empty, 0-d, NaN- and inf-filled,
  of a mismatched shape, filled with 2^33, -2^40, INT64_MIN, INT64_MAX, -1 and "just past the end"
  (index-like); None for an optional argument;
* the issue's findings, as explicit cases (``EXTRAS``), and a few model-structure cases (a node
  without ``operator``, an empty first output name, an ATen node inside a model-local function).

Each case builds a one-node model (tensors as graph inputs, other arguments as constant inputs,
``opforge_aten_none`` for a None in the middle) and runs it through (a) ``opforge.ort_session``
(outputs left untyped: opforge types them with its meta run) and/or (b) plain onnxruntime with the
library registered (outputs typed from torch). The rules:

* a clean error passes: a Python exception whose text names the op ("aten::<name>", "ATen op",
  "org.pytorch.aten::ATen"); running out of memory is never clean ("can't allocate", bad_alloc,
  MemoryError): the library must refuse before allocating. Path (a) must refuse an op its Python
  policy refuses with ``AtenOpRefused``;
* a result passes only if it holds nothing but data computed from the inputs: each session runs
  twice, with glibc's malloc perturbation (``mallopt(M_PERTURB)``: 0x55, then 0xAA; big blocks come
  from the heap too, ``M_MMAP_THRESHOLD`` 1 GiB) and each input inside a buffer whose 4 KiB guard
  zones before and after it hold that run's byte: the two results must be bitwise equal (a read of
  uninitialised memory or past an input's end differs), the inputs and their guard zones
  unchanged (no write into ORT's read-only inputs), and a baseline result equal to torch's;
* the process caps its address space at its size + 1.5 GiB (not under ASan), dies by SIGALRM when
  a case runs longer than ``--case-timeout`` (a hang), and a case that lifts the peak RSS past
  1.5 GB fails. A crash kills the process: the last ``CASE`` line (and ``PATH a|b`` line) names it.

The baseline search runs its candidate calls in a forked child (``TrialServer``): libtorch itself
crashes on some plausible calls (``native_batch_norm(training=False)`` without running stats), and
that must cost a fork, not the fuzzer.

Output: ``CASE <index>: <description>`` (flushed) before each case and ``PATH a``/``PATH b`` before
each path, ``FAIL <index> [<path>] <class>: <detail> -- <description>`` per failure (classes:
memory, peak-rss, uninitialised, input-changed, differs-from-torch, torch-succeeds, unnamed-error,
python-error, python-policy, not-refused, harness), then ``TALLY ...``, ``PEAK_RSS <bytes>`` and
``DONE <n> cases, <k> failed``. A case index is stable for a given torch and allow-list: ``--case
k`` reruns exactly that case, verbosely. ``--supervise [--jobs N]`` runs the selection in forked
children and goes on after a crash or a hang, reported as ``FAIL <index> [<path>] crash: signal
N (SIGSEGV)`` or ``crash: timeout``, so one run lists every failing case (TALLY then counts only
the children that finished).

    python tests/aten_fuzz.py --list --ops div,segment_reduce
    python tests/aten_fuzz.py --first 0 --cases 2000
    python tests/aten_fuzz.py --case 1234                     # one case, verbose
    python tests/aten_fuzz.py --supervise --library /tmp/oldlib/libopforge_aten.so > out.txt
    python tests/aten_fuzz.py --sample --seed 0                # the quick tier's subset

The package, stage by stage (``tests/aten_fuzz.py`` is its command line, ``process.main``):

* ``hostile``: the hostile values by argument class, and the c10 enum values enums travel as;
* ``schemas``: the overloads to fuzz, from the allow-list and their schemas;
* ``plausible_values``: argument guesses and the candidate calls of a baseline search;
* ``baselines``: the per-op baselines, the baseline search and the trial server it runs in;
* ``findings``: the findings of issue #43 and the model-structure cases;
* ``cases``: the numbered cases, the quick tier's sample and a case's argument values;
* ``models``: a call as a one-node ONNX model;
* ``sessions``: the two paths' sessions, their runs and the judging of errors and results;
* ``running``: one case through the paths;
* ``process``: the memory cap, the watchdog, reporting and the command line;
* ``supervisor``: ``--supervise``, children that go on after a crash.
"""
