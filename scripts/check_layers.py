#!/usr/bin/env python3
"""Fails when a C++ file includes a header of a layer above its own (docs/ARCHITECTURE.md).

The layers, bottom up, and what each may include (its own headers and those listed):

    base     element types, views, shared inline formats        (nothing)
    cpu      SIMD kernels, threads, AMX                         base
    io       the .tinyloop file and its config                  base
    grammar  regex -> DFA -> token masks                        base
    ops      the op contract, scalar reference, dispatch        base, cpu
    model    weights, KV slots, the looped forward              base, io, ops
    runtime  generation, sampling, serving                      base, io, ops, model, grammar
    frontends (src/api, python/bindings)                        base, io, grammar, runtime

Highway (hwy/) belongs to cpu alone. Every layer may include the public headers of
include/tinyloop/, which themselves include nothing of src/. Tests (``*_test.cc`` and their
helpers) may also include the layer right above theirs, because a kernel is tested against the
op layer's scalar reference. bench/ and fuzz/ are tools, not layers, and are not checked.

Usage: check_layers.py [ROOT]   (default: the repository holding this script). Exit status 1
and one line per offending include when the tree breaks the rule; 0 otherwise.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "cpu": {"base"},
    "io": {"base"},
    "grammar": {"base"},
    "ops": {"base", "cpu"},
    "model": {"base", "io", "ops"},
    "runtime": {"base", "io", "ops", "model", "grammar"},
    "api": {"base", "io", "grammar", "runtime"},
    "bindings": {"base", "io", "grammar", "runtime"},
}
# The layer right above, whose headers a test of this layer may use (the reference it is
# checked against, shared test utilities).
TEST_EXTRA: dict[str, set[str]] = {"cpu": {"ops"}, "base": {"cpu", "ops"}}
LAYER_DIRS = {"src/" + name: name for name in ALLOWED if name != "bindings"}
LAYER_DIRS["python/bindings"] = "bindings"
PUBLIC = "tinyloop"  # include/tinyloop/*.h
# Third-party headers only one layer may use: Highway belongs to the CPU kernels, so a second
# backend never finds SIMD code above the backend boundary.
RESTRICTED: dict[str, set[str]] = {"hwy": {"cpu"}}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([A-Za-z0-9_]+)/[^>"]+[>"]', re.M)
SOURCES = (".h", ".cc", ".cpp", ".hpp", ".inc", ".def")


def is_test(path: Path) -> bool:
    name = path.name
    return "_test" in name or name.startswith("test_") or "test_util" in name or "fuzz" in name


def includes(path: Path) -> list[tuple[int, str, str]]:
    """(line number, first path component, the include line) of each project-style include."""
    text = path.read_text(encoding="utf-8", errors="replace")
    out = []
    for m in INCLUDE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        out.append((line, m.group(1), m.group(0).strip()))
    return out


def check(root: Path) -> list[str]:
    """Every upward (or sideways) include under root, as 'file:line: message' strings."""
    known = set(ALLOWED) - {"api", "bindings"}
    problems: list[str] = []
    for rel_dir, layer in LAYER_DIRS.items():
        base = root / rel_dir
        if not base.is_dir():
            continue
        for path in sorted(p for p in base.rglob("*") if p.suffix in SOURCES):
            allowed = ALLOWED[layer] | {PUBLIC} | ({layer} if layer in known else set())
            if is_test(path):
                allowed = allowed | TEST_EXTRA.get(layer, set())
            for line, first, text in includes(path):
                if first in RESTRICTED and layer not in RESTRICTED[first] and not is_test(path):
                    problems.append(f"{path.relative_to(root)}:{line}: '{first}/' belongs to layer(s) "
                                    f"{sorted(RESTRICTED[first])}, not '{layer}' ({text})")
                if first in known and first not in allowed:
                    problems.append(f"{path.relative_to(root)}:{line}: layer '{layer}' may not include "
                                    f"'{first}/' ({text}); it may include {sorted(allowed & known)}")
    public = root / "include" / PUBLIC
    if public.is_dir():
        for path in sorted(p for p in public.rglob("*") if p.suffix in SOURCES):
            for line, first, text in includes(path):
                if first in known:
                    problems.append(f"{path.relative_to(root)}:{line}: a public header may include only "
                                    f"other public headers, not '{first}/' ({text})")
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) cross a layer boundary (docs/ARCHITECTURE.md)")
        return 1
    print("check_layers: every include stays within its layer or below")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
