#!/usr/bin/env bash
# Fails when clang-format (.clang-format) would change a tracked C++ file; prints the files.
# --fix rewrites them instead. Seconds over the whole tree.
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cpp' | grep -v '^third_party/')
if [ "${1:-}" = "--fix" ]; then
  "$CLANG_FORMAT" -i "${files[@]}"
  exit 0
fi
# One process for all files; --Werror makes each needed change an "error:" line naming its file.
if ! out=$("$CLANG_FORMAT" --dry-run --Werror "${files[@]}" 2>&1); then
  printf '%s\n' "$out" | grep -oE '^[^:]+:[0-9]+:[0-9]+: error' | cut -d: -f1 | sort -u | sed 's/^/needs clang-format: /'
  echo "check_format: run 'bash scripts/check_format.sh --fix' (clang-format, .clang-format)"
  exit 1
fi
echo "check_format: every C++ file is clang-formatted"
