#!/usr/bin/env bash
# Sets everything up, then runs the main job with the bundled looped model
# (models/tinyloop-demo.tinyloop, docs/bundled-model.md): an addition it has never seen,
# answered at 1 loop and at its default depth (6), then an English continuation. Extra
# arguments go to the last `tinyloop generate` (e.g. --loops 16 --temperature 0);
# PROMPT=... changes its prompt, SUM=... the addition (4 digits each, zero-padded: 0482+0377=).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
model=models/tinyloop-demo.tinyloop
sum=${SUM:-1843+8190=}
echo "== $sum (held out from training; the answer is zero-padded to 5 digits) =="
for loops in 1 6; do
  echo "-- loops $loops:"
  tinyloop generate --model "$model" "$sum" --loops "$loops" --max-tokens 6 --temperature 0
done
echo "== English, default depth =="
exec tinyloop generate --model "$model" \
  "${PROMPT:-It is a truth universally acknowledged, that}" --max-tokens 96 --seed 1 "$@"
