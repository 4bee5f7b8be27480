#!/usr/bin/env bash
# README command 2: set up everything, then run the test suite (args go to pytest).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
cd "$root"
exec "${OPFORGE_VENV:-$root/.venv}/bin/python" -m pytest "$@"
