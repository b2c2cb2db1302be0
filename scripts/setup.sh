#!/usr/bin/env bash
# Installs everything TinyLoop needs on a fresh Debian 12 machine and builds + installs the
# Python package (distribution `loopformer`: the tinyloop_py extension, the tinyloop package
# and the `tinyloop` command). Safe to run again: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

# clang + libclang-rt-14-dev: the libFuzzer targets of fuzz/ (scripts/fuzz.sh)
APT_PACKAGES="cmake g++ make clang-format libgtest-dev nlohmann-json3-dev libhwy-dev chromium chromium-driver clang libclang-rt-14-dev"
missing=""
for p in $APT_PACKAGES; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi

PY=${PYTHON:-python3}
$PY -m pip install -q --disable-pip-version-check -r requirements-dev.txt
# --no-build-isolation: build with the pinned scikit-build-core/pybind11 just installed.
$PY -m pip install -q --disable-pip-version-check --no-build-isolation .
