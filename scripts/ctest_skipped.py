#!/usr/bin/env python3
"""Prints which GoogleTest cases the last ctest run skipped, grouped by reason.

Some kernels can only be tested on a CPU that has their instructions (AVX512-VNNI,
AVX512-BF16, AMX): their cases GTEST_SKIP elsewhere. CTest counts those as "Skipped" among
hundreds of passes; this makes the untested coverage a visible block of the test output.
Usage: ctest_skipped.py BUILD_DIR (reads BUILD_DIR/Testing/Temporary/LastTest.log).
"""
from __future__ import annotations

import collections
import os
import re
import sys


def skipped_cases(log: str) -> dict[str, list[str]]:
    """reason -> [test case], from GoogleTest's "file:line: Skipped" / reason / "[  SKIPPED ] X"."""
    out: dict[str, list[str]] = collections.defaultdict(list)
    reason = None
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if re.search(r":\d+: Skipped$", line):
            reason = lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1].strip() else "(no reason given)"
        m = re.match(r"\[  SKIPPED \] (\S+) \(", line)
        if m:
            out[reason or "(no reason given)"].append(m.group(1))
            reason = None
    return out


def main(argv: list[str]) -> int:
    path = os.path.join(argv[1], "Testing", "Temporary", "LastTest.log")
    if not os.path.exists(path):
        print(f"ctest_skipped: no {path}", file=sys.stderr)
        return 0
    with open(path, encoding="utf-8", errors="replace") as f:
        cases = skipped_cases(f.read())
    if not cases:
        print("== Skipped C++ cases: none (every ISA-specific kernel was tested on this CPU) ==")
        return 0
    total = sum(len(v) for v in cases.values())
    print(f"== Skipped C++ cases: {total} (NOT tested on this CPU) ==")
    for reason, names in sorted(cases.items()):
        print(f"  {len(names):3d} x {reason}: {', '.join(sorted(set(names))[:6])}"
              f"{' ...' if len(set(names)) > 6 else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
