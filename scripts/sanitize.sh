#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer run of opforge's native code.
#
# Builds instrumented copies of all three native libraries (the torch extension
# opforge/_C, libopforge_ort.so, libopforge_aten.so) in a scratch copy of the
# source tree (build/sanitize/src: the normal build stays untouched), then runs
# the kernel tests, the crash-proofing regression tests, the concurrency/leak
# tests, the fuzz suite and the ATen runtime's hostile models and fuzz harness (the
# full set: its slow batches included) against them. Any ASan report or UB aborts the
# process, so it fails its test (fuzz batches name the case).
#
# libasan is preloaded together with libstdc++: Python is not instrumented, and
# without libstdc++ preloaded ASan's interceptors miss the C++ exception runtime
# and abort at the first exception torch or ORT throws. Leak detection is off
# (CPython and torch keep process-lifetime allocations); test_concurrency
# measures leaks by RSS instead.
#
#   bash scripts/sanitize.sh                 # default set of tests
#   bash scripts/sanitize.sh tests/test_fuzz.py -k deform   # any pytest arguments
# Env: OPFORGE_SANITIZE (default address,undefined), OPFORGE_FUZZ_SCALE (default 0.5).
# Needs the bootstrap first (venv, ORT headers): bash scripts/bootstrap.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${OPFORGE_VENV:-$root/.venv}"
py="$venv/bin/python"
work="$root/build/sanitize"
src="$work/src"
step() { printf '\n==> [sanitize %s] %s\n' "$1" "$2"; }

[[ -x "$py" ]] || { echo "sanitize: no venv at $venv; run scripts/bootstrap.sh first" >&2; exit 2; }
export OPFORGE_SANITIZE="${OPFORGE_SANITIZE:-address,undefined}"
export OPFORGE_CUDA=0  # device code is not instrumented; the host side of CUDA builds is the same source
export OPFORGE_ORT_INCLUDE_DIR="${OPFORGE_ORT_INCLUDE_DIR:-$root/deps/onnxruntime/include/onnxruntime}"

step 1/3 "scratch copy of the sources in $src"
# tar keeps modification times, so a re-run recompiles only what changed (the
# copy keeps its own build/ directory of objects)
mkdir -p "$src"
(cd "$root" && git ls-files -co --exclude-standard -z | tar --null --ignore-failed-read -T - -cf -) | tar -xf - -C "$src"

step 2/3 "instrumented build (-fsanitize=$OPFORGE_SANITIZE; a few minutes)"
(cd "$src" && "$py" setup.py -q build_ext --inplace 2>&1 | grep -vE '^\s*$' | tail -n 5)

libasan="$(gcc -print-file-name=libasan.so)"
libstdcxx="$(gcc -print-file-name=libstdc++.so)"
[[ -f "$libasan" ]] || { echo "sanitize: libasan not found (gcc -print-file-name=libasan.so)" >&2; exit 2; }

step 3/3 "tests against the instrumented libraries"
tests=("$@")
if [[ ${#tests[@]} -eq 0 ]]; then
  tests=(tests/test_crash_proofing.py tests/test_ort_node_checks.py tests/test_my_add_torch.py
         tests/test_my_add_onnx.py tests/test_deform_conv2d_torch.py tests/test_deform_conv2d_onnx.py
         tests/test_roi_align_rotated.py tests/test_nms_rotated.py
         tests/test_mmdeploy_ops.py tests/test_mmdeploy_grid_sampler.py tests/test_mmdeploy_exported.py
         tests/test_fuzz_mmdeploy.py
         # not: mmdeploy's own (uninstrumented) library in children, the venv re-export
         -k "not own_library and not dcn_defects and not int_attributes_crash and not regenerated"
         tests/test_aten.py tests/test_aten_policy.py tests/test_aten_guards.py tests/test_aten_hostile.py
         tests/test_aten_fuzz.py tests/test_concurrency.py tests/test_fuzz.py -q -p no:cacheprovider)
fi
cd "$src"
# PYTHONPATH puts the copy's opforge ahead of the editable install of the main tree.
env PYTHONPATH="$src" LD_PRELOAD="$libasan $libstdcxx" \
  ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:detect_odr_violation=0:print_summary=1" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  OPFORGE_FUZZ_SCALE="${OPFORGE_FUZZ_SCALE:-0.5}" \
  "$py" -m pytest "${tests[@]}"
