#!/usr/bin/env bash
# Sets everything up, then runs the main job: generate text with the bundled looped model
# (models/tinyloop-demo.tinyloop, docs/bundled-model.md). Extra arguments go to
# `tinyloop generate` (e.g. --loops 16 --temperature 0); PROMPT=... changes the prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec tinyloop generate --model models/tinyloop-demo.tinyloop \
  "${PROMPT:-It is a truth universally acknowledged, that}" --max-tokens 96 --seed 1 "$@"
