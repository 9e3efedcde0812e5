#!/usr/bin/env bash
# Debian 12's arm64 python3.11 and the libraries it needs, unpacked from Debian's packages into ROOT (idempotent),
# for qemu-aarch64 -L ROOT ROOT/usr/bin/python3.11 (make test-arm64's world, make test-wheel's aarch64 run). A
# private apt state (ROOT.apt): the host's dpkg architectures stay as they are.
# Usage: python_root.sh ROOT
set -euo pipefail
root=$(realpath -m "${1:?usage: python_root.sh ROOT}")
if [ ! -x "$root/usr/bin/python3.11" ]; then
  echo "arm64: unpacking Debian's arm64 python3.11 into $root"
  apt_dir="$root.apt"
  mkdir -p "$apt_dir/state/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs"
  touch "$apt_dir/status"
  apt_opts=(-o "Dir::State=$apt_dir/state" -o "Dir::State::status=$apt_dir/status" -o "Dir::Cache=$apt_dir/cache"
            -o APT::Architecture=arm64 -o "APT::Architectures::=arm64" -o Debug::NoLocking=1)
  apt-get "${apt_opts[@]}" -q update >/dev/null
  packages=$(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
               --no-breaks --no-replaces --no-enhances --no-pre-depends \
               python3.11-minimal libpython3.11-stdlib libstdc++6 | grep -v '^ ' | grep -v '<' | sort -u)
  (cd "$apt_dir/debs" && apt-get "${apt_opts[@]}" -q download $packages 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
  rm -rf "$root.tmp" && mkdir -p "$root.tmp"
  for deb in "$apt_dir"/debs/*.deb; do dpkg-deb -x "$deb" "$root.tmp"; done
  rm -rf "$root" && mv "$root.tmp" "$root"
fi

