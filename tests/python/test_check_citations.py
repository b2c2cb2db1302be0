"""scripts/check_citations.py: a source comment that cites a document outside the repository
fails the lint step; a citation of docs/ passes."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "check_citations.py")

# Built from pieces so that this file does not cite them itself.
SPEC_PAGE = "spec/" + "generation.txt"
DESIGN_NOTES = "DESIGN" + ".md"
RESEARCH_NOTE = "research/" + "looped_models.md"


def run_check(*paths):
    return subprocess.run([sys.executable, SCRIPT, *map(str, paths)], capture_output=True, text=True)


@pytest.mark.parametrize("name, text, line", [
    ("early_exit.h", f"// Early exit ({DESIGN_NOTES} section 2).\nint x;\n", 1),
    ("beam.cc", f"int y;\n// Beam search ({SPEC_PAGE} \"Beam search\").\n", 2),
    ("reference.py", f'"""Sampling as in {DESIGN_NOTES} section 4."""\n', 1),
    ("errors.py", f'x = 1\nraise ValueError("see ../shared/{SPEC_PAGE}")\n', 2),
    ("hf_ouro.py", f'"""From modeling_ouro.py ({RESEARCH_NOTE} §2)."""\n', 1),
])
def test_an_outside_citation_fails_and_is_named(tmp_path, name, text, line):
    bad = tmp_path / name
    bad.write_text(text, encoding="utf-8")
    r = run_check(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.startswith(f"{bad}:{line}: cites ")
    assert "cite a docs/*.md section instead" in r.stderr


def test_docs_citations_and_unrelated_text_pass(tmp_path):
    (tmp_path / "ok.h").write_text('// Early exit (docs/loop-depth.md, section 1).\n'
                                   'const char* corpus = "austen.txt";  // the spec\'s margin\n',
                                   encoding="utf-8")
    (tmp_path / "notes.md").write_text(f"not source: {DESIGN_NOTES}\n", encoding="utf-8")
    r = run_check(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == ""


def test_a_missing_path_is_an_error_that_names_it(tmp_path):
    r = run_check(tmp_path / "nowhere")
    assert r.returncode != 0
    assert "no such file or folder" in r.stderr and "nowhere" in r.stderr


def test_the_repository_itself_is_clean():
    r = run_check()
    assert r.returncode == 0, r.stdout
