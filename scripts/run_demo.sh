#!/usr/bin/env bash
# README command 1: set up everything, then run the demo (export a model using
# MyAddFunction.apply with both exporters, run it in ONNX Runtime, check parity).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
exec "${OPFORGE_VENV:-$root/.venv}/bin/python" -m opforge demo "$@"
