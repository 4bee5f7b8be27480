#!/usr/bin/env bash
# Fetches ONNX Runtime's C/C++ headers (no pip wheel ships them) from Debian's
# libonnxruntime-dev (trixie, ORT 1.21, includes onnxruntime_lite_custom_op.h)
# into deps/onnxruntime/include/onnxruntime. Uses a private apt state/sources
# dir: the system's apt sources are not touched and nothing is installed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/deps/onnxruntime"
marker="$dest/include/onnxruntime/onnxruntime_lite_custom_op.h"
if [[ -f "$marker" ]]; then
  echo "ORT headers already in $dest/include/onnxruntime"
  exit 0
fi
command -v apt-get >/dev/null || { echo "fetch_ort_headers: needs apt-get (Debian/Ubuntu); otherwise set OPFORGE_ORT_INCLUDE_DIR" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o Dir::State::Status=/dev/null
      -o APT::Architecture=amd64 -o Debug::NoLocking=1 -o APT::Sandbox::User=root -q)
echo "deb [signed-by=$keyring] http://deb.debian.org/debian trixie main" > "$work/sources.list"
echo "fetch_ort_headers: downloading Debian trixie's libonnxruntime-dev ..."
apt-get "${opts[@]}" update >/dev/null
(cd "$work" && apt-get "${opts[@]}" download libonnxruntime-dev >/dev/null)
deb=("$work"/libonnxruntime-dev_*.deb)
dpkg -x "${deb[0]}" "$work/x"
mkdir -p "$dest/include"
rm -rf "$dest/include/onnxruntime"
cp -r "$work/x/usr/include/onnxruntime" "$dest/include/onnxruntime"
basename "${deb[0]}" > "$dest/SOURCE"
echo "fetch_ort_headers: headers in $dest/include/onnxruntime ($(cat "$dest/SOURCE"))"
