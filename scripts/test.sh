#!/usr/bin/env bash
# Sets everything up, then runs every test: a lint of the Python tree (scripts/lint.sh), the
# C++ GoogleTest suites (Release, then again under AddressSanitizer + UBSan) through CTest, a
# short libFuzzer run of every fuzz target (scripts/fuzz.sh, FUZZ_SECONDS each, default 30),
# and the Python suite with pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
JOBS=${JOBS:-$(nproc)}

echo "== Lint (ruff) =="
bash scripts/lint.sh

echo "== C++ tests (Release) =="
cmake -S . -B build/cpp-release -DCMAKE_BUILD_TYPE=Release -DTINYLOOP_BUILD_TESTS=ON >/dev/null
cmake --build build/cpp-release -j "$JOBS"
ctest --test-dir build/cpp-release --output-on-failure -j "$JOBS"
python3 scripts/ctest_skipped.py build/cpp-release  # ISA-specific cases this CPU cannot run

echo "== C++ API (installed, example built out of tree against it) =="
bash scripts/test_cpp_api.sh build/cpp-release

echo "== C++ tests (AddressSanitizer + UBSan) =="
cmake -S . -B build/cpp-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTINYLOOP_BUILD_TESTS=ON -DTINYLOOP_SANITIZE=ON >/dev/null
cmake --build build/cpp-asan -j "$JOBS"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build/cpp-asan --output-on-failure -j "$JOBS"

echo "== Fuzz (libFuzzer + ASan/UBSan, ${FUZZ_SECONDS:-30} s per target) =="
bash scripts/fuzz.sh

echo "== Python tests =="
python3 -m pytest -q tests/python
