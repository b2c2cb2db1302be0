#!/usr/bin/env bash
# The cheap style checks of the test command: ruff (pyflakes + pycodestyle, configured in
# pyproject.toml) over the Python tree. Seconds; fails on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m ruff check python tests bench scripts examples
python3 scripts/check_citations.py   # comments cite docs/, not documents outside the repository
