"""scripts/check_layers.py: passes on the tree, fails on a planted upward include."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_layers.py"


def run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True)


def copy_tree(tmp_path: Path) -> Path:
    """The C++ layers and public headers of the repository, copied (the check reads nothing else)."""
    root = tmp_path / "repo"
    for part in ("src", "include", "python/bindings"):
        shutil.copytree(ROOT / part, root / part, ignore=shutil.ignore_patterns("*.o"))
    return root


def test_tree_passes():
    r = run(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_planted_upward_include_fails(tmp_path):
    root = copy_tree(tmp_path)
    assert run(root).returncode == 0
    kernel = root / "src" / "cpu" / "planted.cc"
    kernel.write_text('#include "base/views.h"\n#include "model/looped_model.h"\nint f() { return 0; }\n')
    r = run(root)
    assert r.returncode == 1
    assert "src/cpu/planted.cc:2: layer 'cpu' may not include 'model/'" in r.stdout


def test_sideways_and_frontend_crossings_fail(tmp_path):
    root = copy_tree(tmp_path)
    (root / "src" / "io" / "planted.h").write_text('#pragma once\n#include "grammar/dfa.h"\n')
    (root / "python" / "bindings" / "planted.cc").write_text('#include "cpu/kernels.h"\n#include "hwy/targets.h"\n')
    (root / "include" / "tinyloop" / "planted.h").write_text('#pragma once\n#include "runtime/engine.h"\n')
    out = run(root).stdout
    assert "src/io/planted.h:2: layer 'io' may not include 'grammar/'" in out
    assert "python/bindings/planted.cc:1: layer 'bindings' may not include 'cpu/'" in out
    assert "python/bindings/planted.cc:2: 'hwy/' belongs to layer(s) ['cpu']" in out
    assert "include/tinyloop/planted.h:2: a public header may include only other public headers" in out


def test_a_test_may_use_the_reference_above(tmp_path):
    root = copy_tree(tmp_path)
    (root / "src" / "cpu" / "planted_test.cc").write_text('#include "ops/reference.h"\n')
    assert run(root).returncode == 0
    (root / "src" / "cpu" / "planted_test.cc").write_text('#include "runtime/engine.h"\n')
    assert run(root).returncode == 1
