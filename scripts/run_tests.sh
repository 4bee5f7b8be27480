#!/usr/bin/env bash
# README command 2: set up everything, then run the test suite (args go to pytest).
# The suite runs on OPFORGE_TEST_WORKERS workers (default 2: this project's CI machine has two
# cores; tests/conftest.py groups the tests that share a built fixture). Pass -n yourself, or
# OPFORGE_TEST_WORKERS=0, to run in one process.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
cd "$root"
# --max-worker-restart=0: a worker that crashes (a segfault) fails the run at once, naming the
# test; restarted, it left the crashed test's group unscheduled and the run waiting (seen once).
workers=("-n" "${OPFORGE_TEST_WORKERS:-2}" "--dist" "loadgroup" "--max-worker-restart=0")
for arg in "$@"; do
  case "$arg" in -n|-n*|--numprocesses*|no:xdist|-pno:xdist) workers=() ;; esac
done
if [[ "${OPFORGE_TEST_WORKERS:-2}" == 0 ]]; then workers=(); fi
exec "${OPFORGE_VENV:-$root/.venv}/bin/python" -m pytest "${workers[@]}" "$@"
