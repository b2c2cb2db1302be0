#!/usr/bin/env bash
# The slow, optional side of the benchmarks: installs the peer engine (llama.cpp through
# llama-cpp-python, built from source with AMX off because of the GCC 12 tile-config
# pitfall, ~17 minutes on 2 cores) and the GGUF writer, then runs bench/compare.py
# (TinyLoop vs llama.cpp on the benchmark model unrolled into a GGUF). Not part of the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python3 -m pip install -q gguf==0.19.0
if ! python3 -c "import llama_cpp" 2>/dev/null; then
  CMAKE_ARGS="-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' -DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'" \
    python3 -m pip install -q --no-build-isolation llama-cpp-python==0.3.36
fi
exec python3 bench/compare.py "$@"
