#!/usr/bin/env bash
# Builds an AArch64 world for `make test-arm64` in build/arm64 (idempotent, no root filesystem
# changes beyond the apt packages the Makefile installs):
#   root/  Debian 12 arm64 Python 3.11 and its libraries, unpacked from Debian's packages
#          (a private apt state: the host's dpkg architectures stay as they are)
#   site/  the aarch64 wheels of onnxruntime, numpy and onnx, from PyPI
#   pkg/   quest_ort itself, its op library cross-compiled with Debian's aarch64 toolchain
# qemu-aarch64 -L build/arm64/root runs root's python3.11 with PYTHONPATH=pkg:site.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../../.." && pwd)"
out="$repo/build/arm64"
venv="$repo/.venv"
# The newest onnxruntime whose aarch64 wheel starts under Debian 12's qemu-user 7.2 (1.28 and later
# crash in their static initialisers there); numpy and onnx as on the host.
ORT_VERSION="${QUEST_ARM64_ORT_VERSION:-1.27.0}"
NUMPY_VERSION="$("$venv/bin/python" -c 'import numpy; print(numpy.__version__)')"
ONNX_VERSION="$("$venv/bin/python" -c 'import onnx; print(onnx.__version__)')"

bash "$(dirname "$0")/python_root.sh" "$out/root"

stamp="$out/site/.versions"
wanted="onnxruntime==$ORT_VERSION numpy==$NUMPY_VERSION onnx==$ONNX_VERSION"
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  echo "arm64: aarch64 wheels ($wanted) into $out/site"
  rm -rf "$out/site"
  "$venv/bin/pip" install -q --target "$out/site" --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64 $wanted
  echo "$wanted" > "$stamp"
fi

echo "arm64: cross-compiling the op library and installing quest_ort into $out/pkg"
"$venv/bin/pip" install -q --no-deps --no-build-isolation --upgrade --target "$out/pkg" \
  -C build-dir="$repo/build/arm64-lib" -C cmake.define.CMAKE_TOOLCHAIN_FILE="$repo/cmake/aarch64-linux-gnu.cmake" "$repo"
aarch64-linux-gnu-readelf -h "$out/pkg/quest_ort/ops/libquest_ort_ops.so" | grep -q "Machine: *AArch64" || {
  echo "arm64: $out/pkg/quest_ort/ops/libquest_ort_ops.so is not an aarch64 library" >&2; exit 1; }
