"""Issue 16 (hardening): the `tinyloop` command prints one line and exits non-zero, never a
traceback, for bad input. Each case runs the real command in a child process."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tinyloop.config import preset_config
from tinyloop.format import write_model
from tinyloop.random_model import random_tensors

from hardening_child import _PYTHON_DIR, _TESTS_DIR


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    from test_cli import word_tokenizer_json

    cfg = preset_config("huginn", max_seq_len=512, eos_ids=[0])
    path = str(tmp_path_factory.mktemp("cli_hardening") / "text.tinyloop")
    write_model(path, cfg, random_tensors(cfg, seed=3), tokenizer_json=word_tokenizer_json())
    return path


def tinyloop(*argv, timeout=120) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([p for p in (os.environ.get("PYTHONPATH"), _PYTHON_DIR, _TESTS_DIR) if p])
    return subprocess.run([sys.executable, "-m", "tinyloop.cli", *argv], capture_output=True,
                          timeout=timeout, env=env)


def assert_one_line_error(p: subprocess.CompletedProcess, needle: str) -> None:
    err = p.stderr.decode("utf-8", "replace")
    lines = [ln for ln in err.splitlines() if ln.strip() and "this model has no tokenizer" not in ln]
    assert p.returncode != 0, err
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    assert needle in lines[0], err


def test_non_utf8_prompt(text_model):
    p = tinyloop("generate", text_model, b"w3 \xff\xfe w4", "--max-tokens", "2")
    assert_one_line_error(p, "the prompt is not valid UTF-8")


@pytest.mark.parametrize("argv,needle", [
    (["--seed", "-1"], "seed must be an integer in [0, 2^64)"),
    (["--loops", "576460752303423488"], "loops must be in [1, 4096]"),
    (["--max-seq-len", str(2**62)], "max_seq_len must be in [1, 16777216]"),
    (["--max-tokens", str(2**63 - 1)], "exceeds max_seq_len"),
    (["--beam-size", str(2**40)], "beam_size must be <= 4096"),
])
def test_generate_bad_numbers(test_models, argv, needle):
    p = tinyloop("generate", "--model", test_models["llama"].path, "--ids", "1,2,3", *argv)
    assert_one_line_error(p, needle)


@pytest.mark.parametrize("ids,needle", [
    ("99999999999", "--ids: token id 99999999999 is outside"),
    ("1,x,3", "--ids: 'x' is not a token id"),
    ("1,5000,3", "token id 5000 at index 1 is outside"),
])
def test_generate_bad_ids(test_models, ids, needle):
    p = tinyloop("generate", "--model", test_models["llama"].path, "--ids", ids)
    assert_one_line_error(p, needle)


@pytest.mark.parametrize("argv,needle", [
    (["--ctx", "0"], "--ctx must be >= 2"),
    (["--tail-fraction", "2"], "--tail-fraction must be in (0, 1]"),
    (["--loops", "0,2"], "--loops: every depth must be >= 1"),
])
def test_perplexity_bad_flags(text_model, tmp_path, argv, needle):
    text = tmp_path / "t.txt"
    text.write_text("w3 w4 w5 " * 50)
    p = tinyloop("perplexity", text_model, str(text), *argv)
    assert_one_line_error(p, needle)


def test_huge_random_model(tmp_path):
    out = str(tmp_path / "huge.tinyloop")
    p = tinyloop("random-model", out, "--kind", "llama", "--set", "dim=1000000", "--set", "n_heads=1000")
    assert p.returncode != 0
    err = p.stderr.decode()
    assert "Traceback" not in err and "larger than random-model writes" in err, err
    assert not os.path.exists(out)


@pytest.mark.parametrize("argv,needle", [
    (["-p", "-5"], "-p: every value must be >= 0, got -5"),
    (["-L", "0"], "-L: every value must be >= 1"),
    (["-r", "0"], "-r must be >= 1"),
])
def test_bench_bad_counts(argv, needle):
    p = tinyloop("bench", *argv)
    assert_one_line_error(p, needle)


def test_missing_and_fifo_models(tmp_path):
    p = tinyloop("generate", "--model", str(tmp_path / "nope.tinyloop"), "--ids", "1")
    assert_one_line_error(p, "cannot open model file")
    fifo = str(tmp_path / "m.fifo")
    os.mkfifo(fifo)
    p = tinyloop("generate", "--model", fifo, "--ids", "1", timeout=30)
    assert_one_line_error(p, "is not a regular file")


def test_no_mmap_generates_the_same_tokens(test_models):
    path = test_models["llama"].path
    args = ["generate", "--model", path, "--ids", "1,2,3", "--max-tokens", "5", "--temperature", "0"]
    a, b = tinyloop(*args), tinyloop(*args, "--no-mmap")
    assert a.returncode == 0 and b.returncode == 0, b.stderr.decode()
    assert a.stdout == b.stdout and a.stdout.split()


def test_quantize_checks_before_writing_and_fits_ctx_to_the_model(tmp_path):
    # A model with max_seq_len < --ctx: the report once failed after the file was written.
    from tinyloop.random_model import write_random_model

    src, out = str(tmp_path / "short.tinyloop"), str(tmp_path / "q.tinyloop")
    write_random_model(src, "llama", max_seq_len=64, vocab_size=64)
    p = tinyloop("quantize", src, out, "--weights", "int8", "--group", "16", "--max-windows", "1",
                 "--eval-text", "--quiet")
    assert p.returncode == 0, p.stderr.decode()
    assert "windows of 64 random token ids" in p.stdout.decode()
    p = tinyloop("quantize", src, str(tmp_path / "never.tinyloop"), "--weights", "int8", "--ctx", "1")
    assert_one_line_error(p, "--ctx must be >= 2")
    assert not os.path.exists(tmp_path / "never.tinyloop")
