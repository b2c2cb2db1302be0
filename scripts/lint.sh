#!/usr/bin/env bash
# The cheap style checks of the test command, seconds each, failing on any finding:
#   ruff (pyflakes + pycodestyle, configured in pyproject.toml) over the Python tree;
#   scripts/check_layers.py: no C++ #include reaches up a layer (docs/ARCHITECTURE.md);
#   scripts/check_format.sh: every C++ file is clang-formatted (.clang-format).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m ruff check python tests bench scripts examples tools
python3 scripts/check_citations.py   # comments cite docs/, not documents outside the repository
python3 scripts/check_layers.py
bash scripts/check_format.sh
