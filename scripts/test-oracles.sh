#!/usr/bin/env bash
# The slow oracle tests (not part of scripts/test.sh): installs the peers they compare against,
# llama.cpp through llama-cpp-python built from source (AMX off because of the GCC 12
# tile-config pitfall, as in scripts/bench-peers.sh; ~17 minutes on 2 cores the first time),
# the GGUF reader, and torch + transformers (pinned; ~3 minutes from PyPI, torch's default wheel
# pulls its CUDA libraries, ~3 GB) and lm-evaluation-harness (its API extra: no torch), then
# runs tests/oracles: SmolLM2 through llama.cpp vs TinyLoop, save_pretrained LlamaForCausalLMs
# vs transformers' own logits / generate, and lm_eval scoring the bundled model through
# `tinyloop serve` (checked against Model.score / Model.generate).
# The SmolLM2 GGUF is fetched once into ~/.cache/tinyloop (or $TINYLOOP_CACHE).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python3 -m pip install -q gguf==0.19.0 jinja2==3.1.6
python3 -m pip install -q torch==2.9.1 transformers==4.57.3  # a no-op once installed
python3 -m pip install -q "lm_eval[api]==0.4.13"
if ! python3 -c "import llama_cpp" 2>/dev/null; then
  CMAKE_ARGS="-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' -DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'" \
    python3 -m pip install -q --no-build-isolation llama-cpp-python==0.3.36
fi
exec python3 -m pytest -q -s -rxX tests/oracles "$@"
