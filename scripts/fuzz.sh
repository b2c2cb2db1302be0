#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan) and runs each for
# FUZZ_SECONDS (default 30) from its seed corpus in fuzz/corpus/<target>/. New inputs go to a
# scratch copy, never into the repository. A crash, leak, timeout, out-of-memory or sanitizer
# report fails the script and leaves the reproducer in build/fuzz/artifacts/.
#   FUZZ_SECONDS=3600 scripts/fuzz.sh fuzz_regex    # one target, longer
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER=${FUZZ_SECONDS:-30}
TARGETS=${*:-fuzz_model_file fuzz_config fuzz_regex fuzz_token_masks}
JOBS=${JOBS:-$(nproc)}

CC=clang CXX=clang++ cmake -S . -B build/fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTINYLOOP_FUZZ=ON -DTINYLOOP_BUILD_TESTS=OFF >/dev/null
# shellcheck disable=SC2086
cmake --build build/fuzz -j "$JOBS" --target $TARGETS

mkdir -p build/fuzz/artifacts
for t in $TARGETS; do
  work=$(mktemp -d)
  cp fuzz/corpus/"$t"/* "$work"/
  echo "== $t: ${SECONDS_PER} s"
  log=build/fuzz/artifacts/"$t".log
  set +e
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    build/fuzz/fuzz/"$t" "$work" -max_total_time="$SECONDS_PER" -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix=build/fuzz/artifacts/"$t"- >"$log" 2>&1
  status=$?
  set -e
  grep -E "^(#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::peak_rss_mb)" "$log" || true
  if [ "$status" -ne 0 ]; then tail -n 40 "$log" >&2; fi
  rm -rf "$work"
  if [ "$status" -ne 0 ]; then
    echo "fuzz target $t failed (exit $status); reproducer in build/fuzz/artifacts/" >&2
    exit 1
  fi
done
