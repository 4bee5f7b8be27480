#!/usr/bin/env bash
# Sets up everything opforge needs on a fresh machine, idempotently:
#   1. a virtualenv in .venv (override with OPFORGE_VENV)
#   2. the pinned packages of requirements.txt (torch 2.14.1, onnxruntime, ...)
#   3. ONNX Runtime's C/C++ headers in deps/ (opforge's own fetcher, `opforge fetch-ort-headers`,
#      run from the source file: opforge is not built yet)
#   4. the native build: libopforge_torch.so (stable ABI), libopforge_ort.so, libopforge_aten.so (editable install,
#      no build isolation; ninja rebuilds only what changed)
# Re-running it is cheap: each step is skipped or incremental when up to date.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${OPFORGE_VENV:-$root/.venv}"
python="${PYTHON:-$(command -v python3.11 || command -v python3)}"
step() { printf '\n==> [bootstrap %s] %s\n' "$1" "$2"; }

step 1/4 "virtualenv $venv"
if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi

step 2/4 "pinned packages (requirements.txt; first run installs torch, ~2 min)"
stamp="$venv/.opforge-requirements"
if [[ ! -f "$stamp" ]] || ! cmp -s "$root/requirements.txt" "$stamp"; then
  "$venv/bin/python" -m pip install --progress-bar off -r "$root/requirements.txt"
  cp "$root/requirements.txt" "$stamp"
else
  echo "up to date"
fi

step 3/4 "ONNX Runtime C/C++ headers"
if [[ -n "${OPFORGE_ORT_INCLUDE_DIR:-}" ]]; then
  echo "using OPFORGE_ORT_INCLUDE_DIR=$OPFORGE_ORT_INCLUDE_DIR"
else
  "$venv/bin/python" "$root/opforge/build.py" fetch-ort-headers --dest "$root/deps/onnxruntime"
fi

step 4/4 "build opforge (libopforge_torch.so, libopforge_ort.so, libopforge_mmdeploy.so, libopforge_aten.so)"
cd "$root"
"$venv/bin/python" -m pip install --no-build-isolation --no-deps -e . 2>&1 | grep -vE '^\s*$' | tail -n 3
"$venv/bin/python" -c "import opforge; print('opforge ready:', opforge.ort_library_path())"
