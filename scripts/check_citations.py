#!/usr/bin/env python3
"""Fail when a source file cites a document that readers of this repository do not have.

The product spec pages, the design notes and the research notes live outside the
repository (in the shared folder the engineers work from), so a comment, docstring or
error message pointing at them sends a reader nowhere. Cite the docs/*.md page that
says the same thing instead (docs/ARCHITECTURE.md lists the pages).

Usage: python3 scripts/check_citations.py [PATH ...]
With no PATH it scans the source trees of the repository. Prints one line per finding,
`path:line: cites <what>: <text>`, and exits 1 if there is any, 0 otherwise.
"""
from __future__ import annotations

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_TREES = ("src", "include", "python", "tests", "bench", "tools", "fuzz", "scripts", "examples")
SOURCE_SUFFIXES = (".cc", ".h", ".cpp", ".hpp", ".c", ".py", ".pyi", ".sh", ".cmake")
SKIP_DIRS = {".git", "build", "__pycache__", ".venv", ".cache", "node_modules"}

# What counts as a citation of a document outside the repository. Written so that this
# file's own source does not match them.
OUTSIDE_DOCUMENTS = (
    ("the spec pages", re.compile(r"\bspec/[A-Za-z0-9_.-]*\.txt\b")),
    ("the spec folder", re.compile(r"\bshared/spec\b")),
    ("the design notes", re.compile(r"\bDESIGN\.md\b")),
    ("the research notes", re.compile(r"\bresearch/[A-Za-z0-9_.-]+\.md\b")),
)


def is_source(name: str) -> bool:
    return name.endswith(SOURCE_SUFFIXES) or name == "CMakeLists.txt"


def source_files(paths: list[str]) -> list[str]:
    """Every source file under `paths` (files are taken as given), sorted."""
    found = []
    for path in paths:
        if os.path.isfile(path):
            found.append(path)
            continue
        if not os.path.isdir(path):
            raise FileNotFoundError(f"check_citations: no such file or folder: {path}")
        for folder, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("build"))
            found.extend(os.path.join(folder, f) for f in files if is_source(f))
    return sorted(found)


def findings_in(path: str) -> list[str]:
    """One `path:line: cites ...` line per outside citation in the file."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            for what, pattern in OUTSIDE_DOCUMENTS:
                if pattern.search(line):
                    out.append(f"{path}:{number}: cites {what}: {line.strip()}")
    return out


def main(argv: list[str]) -> int:
    paths = argv or [os.path.join(ROOT, tree) for tree in SOURCE_TREES
                     if os.path.isdir(os.path.join(ROOT, tree))]
    findings = [line for path in source_files(paths) for line in findings_in(path)]
    for line in findings:
        print(line)
    if findings:
        print(f"check_citations: {len(findings)} citation(s) of documents outside this repository; "
              "cite a docs/*.md section instead", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
