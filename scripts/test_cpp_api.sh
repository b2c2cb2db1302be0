#!/usr/bin/env bash
# The public C++ API end to end (docs/cpp-api.md): install the library from a configured
# build tree into a temporary prefix, build examples/cpp out of tree against it with
# find_package(tinyloop), run it on the bundled model and check it printed text.
#   scripts/test_cpp_api.sh [BUILD_DIR]   (default build/cpp-release; `tinyloop` is built there)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/cpp-release}
model=models/tinyloop-demo.tinyloop
[[ -f "$build/CMakeCache.txt" ]] || { echo "test_cpp_api: $build is not a configured build tree" >&2; exit 1; }
[[ -f "$model" ]] || { echo "test_cpp_api: $model is missing" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --build "$build" --target tinyloop -j "${JOBS:-2}"
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
# Only the API's headers are installed, so a header reaching into src/ fails the build below.
ls "$tmp/prefix/include/tinyloop"
cmake -S examples/cpp -B "$tmp/example" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/example" -j "${JOBS:-2}"

prompt="Once upon a time"
"$tmp/example/generate_text" "$model" "$prompt" >"$tmp/out.txt" 2>"$tmp/err.txt" || {
  cat "$tmp/out.txt" "$tmp/err.txt" >&2
  echo "test_cpp_api: the example failed" >&2
  exit 1
}
cat "$tmp/out.txt" "$tmp/err.txt"
# The output starts with the prompt, then at least one non-space generated character.
continuation=$(tr -d '\n' <"$tmp/out.txt")
continuation=${continuation#"$prompt"}
if [[ -z "${continuation//[[:space:]]/}" ]]; then
  echo "test_cpp_api: the example printed no generated text" >&2
  exit 1
fi
grep -q "tokens, mean loops" "$tmp/err.txt" || { echo "test_cpp_api: no generation summary" >&2; exit 1; }
# A missing model: tinyloop::FileNotFound crosses the library boundary and is caught by type.
if "$tmp/example/generate_text" "$tmp/no-such-model.tinyloop" >/dev/null 2>"$tmp/err.txt"; then
  echo "test_cpp_api: the example accepted a missing model" >&2
  exit 1
fi
grep -q "model not found: .*no-such-model.tinyloop" "$tmp/err.txt" || {
  cat "$tmp/err.txt" >&2
  echo "test_cpp_api: a missing model did not raise tinyloop::FileNotFound naming the path" >&2
  exit 1
}
echo "test_cpp_api: OK"
