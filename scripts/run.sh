#!/usr/bin/env bash
# Sets everything up, then runs the main job: generate text with the bundled looped model.
# Extra arguments go to `tinyloop generate` (e.g. --loops 16 --temperature 0).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
MODEL=models/tinyloop-demo.tinyloop
if [ -f "$MODEL" ]; then
  exec tinyloop generate --model "$MODEL" "${PROMPT:-It is a truth universally acknowledged, that}" \
    --max-tokens 96 --seed 1 "$@"
fi
# No bundled model in this checkout yet: show the engine on a random-weights looped model.
echo "(no bundled model at $MODEL: generating token ids from a random Huginn-style model)" >&2
tinyloop random-model /tmp/tinyloop-random.tinyloop --kind huginn >/dev/null
exec tinyloop generate --model /tmp/tinyloop-random.tinyloop --ids "1,2,3,4,5" --max-tokens 32 --seed 1 "$@"
