"""Issue 16 (hardening): one regression test per finding of the hostile-input review. The
ones that once crashed, hung or blew up memory run in a child process (hardening_child), so
a regression fails its test instead of killing pytest. docs/limits.md lists every limit and
the error each bad input gets."""
from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np
import pytest

import tinyloop_py as tl

from hardening_child import run_child

PROMPT = np.array([1, 2, 3], dtype=np.int32)


@pytest.fixture(scope="module")
def path(test_models):
    return test_models["huginn"].path


@pytest.fixture()
def model(path):
    with tl.Model(path) as m:
        yield m


def rewrite_header(src: str, dst: str, edit_text=None, edit_header=None) -> str:
    """A copy of model file `src` whose JSON header went through edit_header(dict) -> dict
    and/or edit_text(bytes) -> bytes, re-padded so the data section stays aligned."""
    blob = open(src, "rb").read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    text, data = blob[8:8 + n].rstrip(b" "), blob[8 + n:]
    if edit_header is not None:
        text = json.dumps(edit_header(json.loads(text)), separators=(",", ":")).encode()
    if edit_text is not None:
        text = edit_text(text)
    text += b" " * ((-(8 + len(text))) % 64)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    return dst


def with_config(header: dict, **fields) -> dict:
    cfg = json.loads(header["__metadata__"]["config"])
    cfg.update(fields)
    header["__metadata__"]["config"] = json.dumps(cfg)
    return header


# ---- 1. crashes: sizes from user input or file contents --------------------------------

CRASH_CASES = {
    # Model(max_seq_len=2**62) + a huge max_tokens once sized a KV whose byte count wrapped.
    "max_seq_len": ("tl.Model(PATH, max_seq_len=2**62)", "ValueError", r"max_seq_len must be in \[1, 16777216\]"),
    "max_seq_len_int64": ("tl.Model(PATH, max_seq_len=2**63 - 1).generate(P, 2**62)", "ValueError", "max_seq_len"),
    # K_branches * draft_ahead wrapped past the size check.
    "k_branches": ("m.generate_tree_speculative(P, 4, K_branches=2**62 + 1, draft_ahead=4)", "ValueError",
                   r"K_branches \* draft_ahead must be <= 64"),
    "k_branches_max": ("m.generate_tree_speculative(P, 4, K_branches=2**63 - 1, draft_ahead=2)", "ValueError",
                       "K_branches"),
    "beam_size": ("m.generate(P, 3, beam_size=2**62)", "ValueError", r"beam_size must be <= 4096"),
    "beam_max_tokens": ("m.generate(P, 2**63 - 1, beam_size=2)", "RuntimeError", "exceeds max_seq_len"),
    "loops_int8_kv": ("tl.Model(PATH, kv_mode='int8').generate(P, 3, loops=2**59)", "ValueError", "loops must be in"),
    "resume_max_loops": ("m.build_resume_handle(P, loops=2, max_loops=2**62)", "ValueError", "max_loops must be in"),
    "verify_loops": ("m.generate_speculative(P, 3, verify_loops=2**62)", "ValueError", "verify_loops must be in"),
    "cache_window": ("m.generate(P, 3, cache_window=2**63 - 1)", None, None),
    "draft_ahead": ("m.generate_speculative(P, 3, draft_ahead=2**63 - 1)", None, None),
}


@pytest.mark.parametrize("case", sorted(CRASH_CASES))
def test_huge_sizes_are_refused_by_name_in_a_child(path, case):
    call, exc, match = CRASH_CASES[case]
    r = run_child(f"""
        import re, sys, numpy as np, tinyloop_py as tl
        PATH = sys.argv[1]
        P = np.array([1, 2, 3], dtype=np.int32)
        m = tl.Model(PATH)
        try:
            {call}
        except Exception as e:
            print("RAISED", type(e).__name__, e)
        else:
            print("RETURNED")
    """, args=[path], timeout=120)
    assert r.rc == 0, r.describe()
    if exc is None:
        assert "RETURNED" in r.out, r.describe()
    else:
        assert f"RAISED {exc}" in r.out, r.describe()
        import re
        assert re.search(match, r.out), r.describe()


def test_model_file_with_huge_default_loops_is_refused_at_load(tmp_path, path):
    # It used to load, then crash the first generate().
    bad = rewrite_header(path, str(tmp_path / "deep.tinyloop"),
                         edit_header=lambda h: with_config(h, default_loops=2**59))
    r = run_child("""
        import sys, tinyloop_py as tl
        try:
            tl.Model(sys.argv[1]).generate([1, 2, 3], 3)
        except tl.ModelFormatError as e:
            print("REFUSED", e)
    """, args=[bad])
    assert r.rc == 0 and "REFUSED" in r.out, r.describe()
    assert "'default_loops' must be <= 4096" in r.out
    # the Python reader agrees
    from tinyloop.format import read_model
    with pytest.raises(ValueError, match="default_loops"):
        read_model(bad)


def test_model_file_with_huge_max_seq_len_is_refused_at_load(tmp_path, path):
    bad = rewrite_header(path, str(tmp_path / "long.tinyloop"),
                         edit_header=lambda h: with_config(h, max_seq_len=2**62))
    with pytest.raises(tl.ModelFormatError, match="'max_seq_len' must be <= 16777216"):
        tl.Model(bad)


def test_json_object_deep_dict_is_refused_not_a_stack_overflow():
    r = run_child("""
        import tinyloop_py as tl
        d = cur = {}
        for _ in range(20000):
            cur["a"] = {}
            cur = cur["a"]
        cur["a"] = "string"
        try:
            tl.Grammar.json_object(d)
        except ValueError as e:
            print("REFUSED", str(e)[:200])
    """)
    assert r.rc == 0 and "REFUSED json_object: shape nested deeper than 64 levels" in r.out, r.describe()


def test_json_object_nested_arrays_refused_before_memory_blows_up():
    # Each array level writes its item pattern twice: 18 levels once took 1.4 GB.
    r = run_child("""
        import time, tinyloop_py as tl
        from hardening_child import peak_rss_mb
        s = "string"
        for _ in range(18):
            s = [s]
        t = time.time()
        try:
            tl.Grammar.json_object({"a": s})
        except ValueError as e:
            print("REFUSED", e)
        print("SECONDS", time.time() - t)
        print("MAXRSS_MB", peak_rss_mb())
    """, mem_limit_bytes=1 << 30)
    assert r.rc == 0 and "REFUSED" in r.out and "exceeds 1048576 bytes" in r.out, r.describe()
    rss = float(r.out.split("MAXRSS_MB")[1].split()[0])
    assert rss < 400, r.out


def test_json_object_at_the_depth_limit_still_compiles():
    d = cur = {}
    for _ in range(20):
        cur["a"] = {}
        cur = cur["a"]
    cur["a"] = "integer"
    g = tl.Grammar.json_object(d)
    assert g.matches(b'{"a":' * 21 + b"1" + b"}" * 21)


def test_grammar_pattern_size_is_capped():
    with pytest.raises(ValueError, match=r"pattern too large: 1048577 bytes"):
        tl.Grammar("a" * (2**20 + 1))


# ---- 2. hangs -----------------------------------------------------------------------------

def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = str(tmp_path / "model.fifo")
    os.mkfifo(fifo)
    r = run_child("""
        import sys, tinyloop_py as tl
        try:
            tl.Model(sys.argv[1])
        except FileNotFoundError as e:
            print("REFUSED", e)
    """, args=[fifo], timeout=30)
    assert r.rc == 0 and "REFUSED" in r.out and "not a regular file" in r.out, r.describe()


# ---- 3. the right exception, a readable message -------------------------------------------

def test_non_utf8_bytes_in_a_format_error_are_escaped(tmp_path, path):
    # The JSON parser's message quotes the bad byte: it once surfaced as UnicodeDecodeError.
    bad = rewrite_header(path, str(tmp_path / "bin.tinyloop"),
                         edit_text=lambda t: t.replace(b'"format"', b'"form\xff\xfe', 1))
    with pytest.raises(tl.ModelFormatError) as e:
        tl.Model(bad)
    # the parser's excerpt with the bad byte escaped (once raw bytes, then UnicodeDecodeError)
    assert "last read: '\"form\\xff'" in str(e.value), str(e.value)
    bad2 = rewrite_header(path, str(tmp_path / "bin2.tinyloop"),
                          edit_text=lambda t: t.replace(b'{"', b'{\xc3\x28', 1))
    with pytest.raises(tl.ModelFormatError, match="not valid JSON"):
        tl.Model(bad2)


def test_stop_sequences_of_the_wrong_type_name_the_argument(model):
    for bad in (5, 2.5, {1: 2}):
        with pytest.raises(ValueError, match="stop_sequences must be a list"):
            model.generate(PROMPT, 3, stop_sequences=bad)


def test_uint64_and_huge_ids_name_the_argument_and_the_value(model):
    with pytest.raises(ValueError, match=r"prompt: token id 9223372036854775808 at index 0"):
        model.generate(np.array([2**63], dtype=np.uint64), 3)
    with pytest.raises(ValueError, match=r"stop_sequences\[0\]: token id 9223372036854775808 "):
        model.generate(PROMPT, 3, stop_sequences=[[2**63]])  # a uint64 once gave "Unable to cast"
    with pytest.raises(ValueError, match=r"stop_sequences\[0\] must be a list of token ids"):
        model.generate(PROMPT, 3, stop_sequences=[[2**65 + 5]])  # numpy: an object array
    with pytest.raises(ValueError, match=r"stop_sequences\[0\]: token id 18446744073709551615"):
        model.generate(PROMPT, 3, stop_sequences=[np.array([2**64 - 1], dtype=np.uint64)])


def test_seed_out_of_range_names_seed(model):
    for bad in (-1, 2**64, "7"):
        with pytest.raises(ValueError, match="seed must be an integer"):
            model.generate(PROMPT, 3, seed=bad, temperature=1.0)
    assert model.generate(PROMPT, 3, seed=2**64 - 1, temperature=1.0)[:3] == [1, 2, 3]


def test_on_token_exceptions_propagate_unchanged(model):
    class Mine(Exception):
        pass

    err = Mine("from the callback")

    def boom(t):
        raise err

    with pytest.raises(Mine) as e:
        model.generate_stream(PROMPT, boom, max_tokens=4)
    assert e.value is err

    class BadBool:
        def __bool__(self):
            raise KeyError("from __bool__")

    with pytest.raises(KeyError, match="from __bool__"):
        model.generate_stream(PROMPT, lambda t: BadBool(), max_tokens=4)


def test_on_token_non_bool_return_is_named(model):
    with pytest.raises(TypeError, match="on_token must return a bool .* got str"):
        model.generate_stream(PROMPT, lambda t: "yes", max_tokens=4)
    seen = []
    r = model.generate_stream(PROMPT, lambda t: np.bool_(len(seen) < 2) if not seen.append(t) else None,
                              max_tokens=6, stop_at_eos=False)
    assert r["tokens_emitted"] == 2  # np.bool_(False) on the second token stops


# ---- 4. no silent acceptance ---------------------------------------------------------------

def test_nul_in_the_path_is_refused(path):
    with pytest.raises(ValueError, match="NUL"):
        tl.Model(path + "\0ignored")


def test_duplicate_tensor_keys_are_refused(tmp_path, path):
    def dup(text):
        # the first tensor entry written again under the same name, first in the object
        h = json.loads(text)
        name = next(k for k in h if k != "__metadata__")
        entry = json.dumps({name: h[name]}, separators=(",", ":"))[1:-1]
        return b"{" + entry.encode() + b"," + text[1:]
    bad = rewrite_header(path, str(tmp_path / "dup.tinyloop"), edit_text=dup)
    with pytest.raises(tl.ModelFormatError, match="twice"):
        tl.Model(bad)
    from tinyloop.format import read_model
    with pytest.raises(ValueError, match="twice"):
        read_model(bad)


def test_duplicate_config_fields_are_refused(tmp_path, path):
    def dup(h):
        h["__metadata__"]["config"] = h["__metadata__"]["config"][:-1] + ',"default_loops":3}'
        return h
    bad = rewrite_header(path, str(tmp_path / "dupcfg.tinyloop"), edit_header=dup)
    with pytest.raises(tl.ModelFormatError, match="'default_loops' appears twice"):
        tl.Model(bad)


def test_use_mmap_false_reads_the_weights_into_memory(tmp_path, path):
    copy = str(tmp_path / "copy.tinyloop")
    shutil.copy(path, copy)
    with tl.Model(copy) as m:
        want = m.generate(PROMPT, 8, loops=3, stop_at_eos=False)
    # Truncating a mapped model's file kills the process (SIGBUS); a model read into memory
    # does not care.
    r = run_child("""
        import os, sys, tinyloop_py as tl
        m = tl.Model(sys.argv[1], use_mmap=False)
        os.truncate(sys.argv[1], 0)
        print("TOKENS", m.generate([1, 2, 3], 8, loops=3, stop_at_eos=False))
    """, args=[copy])
    assert r.rc == 0, r.describe()
    assert f"TOKENS {want}" in r.out
