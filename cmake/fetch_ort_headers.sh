#!/usr/bin/env bash
# Fetch ONNX Runtime's C/C++ headers from Debian's libonnxruntime-dev without installing it.
# Usage: fetch_ort_headers.sh DEST_DIR   (leaves DEST_DIR/include/onnxruntime/onnxruntime_cxx_api.h)
# No PyPI wheel of onnxruntime ships the headers; Debian 13 (trixie) packages them (API 21).
set -euo pipefail
dest=${1:?usage: fetch_ort_headers.sh DEST_DIR}
if [ -f "$dest/include/onnxruntime/onnxruntime_cxx_api.h" ]; then exit 0; fi
command -v apt-get >/dev/null || { echo "fetch_ort_headers: apt-get not found; set ORT_INCLUDE_DIR to a folder holding onnxruntime_cxx_api.h" >&2; exit 1; }
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || { echo "fetch_ort_headers: $keyring missing (install debian-archive-keyring) or set ORT_INCLUDE_DIR" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
echo "deb [signed-by=$keyring] http://deb.debian.org/debian trixie main" > "$work/sources.list"
apt_opts=(-q -oDir::Etc::SourceList="$work/sources.list" -oDir::Etc::SourceParts=/dev/null
          -oDir::State::Lists="$work/lists" -oDir::Cache="$work/cache" -oAPT::Sandbox::User=root)
echo "fetch_ort_headers: downloading libonnxruntime-dev from Debian trixie" >&2
apt-get "${apt_opts[@]}" update >/dev/null
(cd "$work" && apt-get "${apt_opts[@]}" download libonnxruntime-dev >/dev/null)
dpkg-deb -x "$work"/libonnxruntime-dev_*.deb "$work/root"
mkdir -p "$dest/include"
rm -rf "$dest/include/onnxruntime"
cp -r "$work/root/usr/include/onnxruntime" "$dest/include/onnxruntime"
echo "fetch_ort_headers: headers in $dest/include/onnxruntime" >&2
