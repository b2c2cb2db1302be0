"""The config rules and the .tinyloop container (docs/model-format.md), as the Python package
sees them (their schema and constants come from the engine, tinyloop_py)."""

import json
import math
import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyloop import config as C
from tinyloop import format as F
from tinyloop.random_model import main as random_model_main
from tinyloop.random_model import random_tensors, write_random_model

KINDS = ("llama", "huginn", "ouro")
ELEMENT_SIZE = {"F32": 4, "F16": 2, "BF16": 2}


# ---------------------------------------------------------------------------------------
# helpers: take a valid file apart and put a corrupted one together


def _split(path):
    """(header dict, tensor name -> raw bytes) of a safetensors file."""
    blob = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    raw = {k: data[v["data_offsets"][0]:v["data_offsets"][1]]
           for k, v in header.items() if k != "__metadata__"}
    return header, raw


def _assemble(path, header, raw):
    """Write header + tensors back to back in header order, offsets recomputed."""
    offset, parts = 0, []
    out = {"__metadata__": header["__metadata__"]} if "__metadata__" in header else {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        out[k] = dict(v, data_offsets=[offset, offset + len(raw[k])])
        offset += len(raw[k])
        parts.append(raw[k])
    text = json.dumps(out).encode()
    text += b" " * ((-(8 + len(text))) % 64)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(parts))


@pytest.fixture
def model_path(tmp_path):
    return write_random_model(str(tmp_path / "m.tinyloop"), "llama", seed=3)


def _expect_error(path, *words):
    with pytest.raises(ValueError) as err:
        F.read_model(path)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


# ---------------------------------------------------------------------------------------
# config


def test_normalize_fills_every_default():
    c = C.normalize_config(dict(dim=48, vocab_size=10, n_heads=6, ffn_dim=100, n_loop_layers=1))
    assert c["n_kv_heads"] == 6 and c["head_dim"] == 8
    assert c["n_pre_blocks"] == 0 and c["n_post_blocks"] == 0 and c["default_loops"] == 1
    assert c["max_seq_len"] == 2048 and c["norm_type"] == "rmsnorm" and c["norm_eps"] == 1e-5
    assert c["norm_placement"] == "pre" and c["pos_encoding"] == "rope_half"
    assert c["rope_theta"] == 10000.0 and c["mlp"] == "swiglu" and c["embed_scale"] == 1.0
    assert c["init_state"] == "input" and c["inject"] == "none" and c["post_loop_norm"] == "none"
    assert c["final_norm"] is True and c["tie_embeddings"] is False and c["exit_gate"] is False
    assert c["bos_id"] is None and c["eos_ids"] == []
    assert c["qk_norm"] is False and c["prelude_norm"] is False and c["post_loop_proj"] is False
    assert c["value_embed_layers"] == []
    assert C.normalize_config(c) == c  # idempotent
    assert list(c) == [f["name"] for f in C.config_fields()]  # every field of the engine's table


BASE = dict(dim=64, vocab_size=97, n_heads=4, ffn_dim=160, n_loop_layers=1)


@pytest.mark.parametrize("bad, field", [
    (dict(dimm=3), "dimm"),  # unknown field (a typo)
    (dict(dim=None), "dim"),
    (dict(dim=0), "dim"),
    (dict(vocab_size=-1), "vocab_size"),
    (dict(ffn_dim=True), "ffn_dim"),  # a bool is not a size
    (dict(n_loop_layers=0), "n_loop_layers"),
    (dict(n_pre_blocks=-1), "n_pre_blocks"),
    (dict(n_kv_heads=3), "n_kv_heads"),
    (dict(head_dim=15), "head_dim"),  # odd with RoPE
    (dict(dim=66), "head_dim"),  # no default: 66 / 4
    (dict(norm_type="batchnorm"), "norm_type"),
    (dict(norm_bias=True), "norm_bias"),  # rmsnorm
    (dict(init_state="random"), "init_state_std"),
    (dict(post_loop_norm="final", final_norm=False), "post_loop_norm"),
    (dict(bos_id=97), "bos_id"),
    (dict(eos_ids=[1, 97]), "eos_ids"),
    (dict(eos_ids=5), "eos_ids"),
    (dict(init_state_seed=-1), "init_state_seed"),
    (dict(rope_theta=0.0), "rope_theta"),
    (dict(max_seq_len=0), "max_seq_len"),
])
def test_normalize_rejects_naming_the_field(bad, field):
    cfg = dict(BASE)
    cfg.update(bad)
    if bad.get("dim", 1) is None:
        del cfg["dim"]
    with pytest.raises(ValueError, match=f"'{field}'"):
        C.normalize_config(cfg)


def test_normalize_accepts_edge_cases():
    assert C.normalize_config(dict(BASE, head_dim=15, pos_encoding="learned"))["head_dim"] == 15
    assert C.normalize_config(dict(BASE, norm_type="layernorm", norm_bias=True))["norm_bias"]
    assert C.normalize_config(dict(BASE, embed_scale=8))["embed_scale"] == 8.0


def _names(cfg):
    return set(C.expected_tensors(cfg))


def test_expected_tensors_plain_pre_layer():
    want = {
        "embed.weight": (97, 64), "final_norm.weight": (64,), "head.weight": (97, 64),
        "loop.0.attn_norm.weight": (64,), "loop.0.mlp_norm.weight": (64,),
        "loop.0.attn.wq.weight": (64, 64), "loop.0.attn.wk.weight": (64, 64),
        "loop.0.attn.wv.weight": (64, 64), "loop.0.attn.wo.weight": (64, 64),
        "loop.0.mlp.w_gate.weight": (160, 64), "loop.0.mlp.w_up.weight": (160, 64),
        "loop.0.mlp.w_down.weight": (64, 160),
    }
    assert C.expected_tensors(BASE) == want


def test_expected_tensors_huginn_preset():
    c = C.preset_config("huginn")
    t = C.expected_tensors(c)
    hd, D = c["head_dim"], c["dim"]
    assert t["loop.1.attn.wqkv.weight"] == ((4 + 2 * 4) * hd, D)
    assert t["loop.1.attn.wqkv.bias"] == ((4 + 2 * 4) * hd,)
    assert "loop.1.attn.wq.weight" not in t and "loop.1.attn.wo.bias" not in t
    assert t["inject.weight"] == (D, 2 * D)
    assert {"pre.0.attn_post_norm.weight", "post.0.mlp_post_norm.weight"} <= set(t)
    assert "head.weight" not in t and "post_loop_norm.weight" not in t  # tied; "final" reuses
    assert "final_norm.weight" in t and "loop_norm.weight" not in t
    assert not any(k.startswith("loop.2.") or k.startswith("pre.1.") for k in t)


def test_expected_tensors_ouro_and_gqa():
    t = C.expected_tensors(C.preset_config("ouro"))
    assert t["exit_gate.weight"] == (1, 64) and t["exit_gate.bias"] == (1,)
    assert "loop_norm.weight" in t and "final_norm.weight" not in t
    assert not any(k.startswith(("pre.", "post.")) for k in t)
    g = C.expected_tensors(C.preset_config("llama"))
    assert g["pre.1.attn.wk.weight"] == (32, 64) and g["pre.1.attn.wq.weight"] == (64, 64)


def test_expected_tensors_bias_and_option_companions():
    c = dict(BASE, norm_type="layernorm", norm_bias=True, attn_out_bias=True, mlp_bias=True,
             attn_qkv_bias=True, mlp="gelu", pos_encoding="learned", max_seq_len=33,
             post_loop_norm="own", loop_norm=True, n_post_blocks=1)
    t = C.expected_tensors(c)
    for norm in ("loop.0.attn_norm", "post.0.mlp_norm", "loop_norm", "post_loop_norm",
                 "final_norm"):
        assert t[norm + ".bias"] == (64,)
    for lin, out in (("attn.wq", 64), ("attn.wk", 64), ("attn.wv", 64), ("attn.wo", 64),
                     ("mlp.w_up", 160), ("mlp.w_down", 64)):
        assert t[f"loop.0.{lin}.bias"] == (out,)
    assert "loop.0.mlp.w_gate.weight" not in t  # gelu has no gate
    assert t["pos_emb.weight"] == (33, 64)
    assert "inject.weight" not in t and "embed.bias" not in t and "head.bias" not in t


def test_presets_and_overrides():
    for kind in KINDS:
        assert C.normalize_config(C.preset_config(kind)) == C.preset_config(kind)
    c = C.preset_config("llama", pos_encoding="learned", norm_type="layernorm", norm_bias=True,
                        mlp="gelu", inject="add", init_state="zeros")
    assert (c["pos_encoding"], c["norm_type"], c["mlp"], c["inject"], c["init_state"]) == (
        "learned", "layernorm", "gelu", "add", "zeros")
    assert C.preset_config("llama", n_kv_heads=None)["n_kv_heads"] == 4  # None -> default
    with pytest.raises(ValueError, match="preset kind"):
        C.preset_config("gpt")
    with pytest.raises(ValueError, match="'colour'"):
        C.preset_config("ouro", colour=1)


# ---------------------------------------------------------------------------------------
# bf16 conversion


def _bf16_magnitudes(m):
    """Values of the bf16 magnitudes m-1, m, m+1 (sign bit clear; m-1 only when m > 0)."""
    ms = [v for v in (m - 1, m, m + 1) if v >= 0]
    return [float(v) for v in F.from_bf16_bits(np.array(ms, np.uint16))], ms


def test_bf16_rounding_hand_cases():
    cases = {
        1.0: 1.0,
        1 + 2**-8: 1.0,  # exact tie, 1.0 has an even mantissa
        1 + 3 * 2**-8: 1 + 2**-6,  # exact tie, rounds up to the even neighbour
        1 + 2**-8 + 2**-20: 1 + 2**-7,  # just past the tie
        -(1 + 3 * 2**-8): -(1 + 2**-6),
        3.4028234663852886e38: math.inf,  # f32 max rounds past bf16 max
        0.0: 0.0,
    }
    x = np.array(list(cases), np.float32)
    got = F.from_bf16_bits(F.to_bf16_bits(x)).astype(np.float64)
    assert got.tolist() == list(cases.values())
    assert np.isnan(F.from_bf16_bits(F.to_bf16_bits(np.array([np.nan], np.float32)))[0])


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=-2.0**100, max_value=2.0**100, allow_nan=False, width=32))
def test_bf16_is_the_nearest_value_ties_to_even(x):
    bits = int(F.to_bf16_bits(np.array([x], np.float32))[0])
    if x != 0:
        assert (bits >> 15) == (x < 0)  # the sign is kept
    m = bits & 0x7FFF
    values, ms = _bf16_magnitudes(m)
    errs = [abs(abs(x) - v) for v in values]
    err = abs(abs(x) - float(F.from_bf16_bits(np.array([m], np.uint16))[0]))
    # no neighbouring magnitude is closer; on an exact tie the kept mantissa is even
    assert err == min(errs)
    if errs.count(err) > 1:
        assert m % 2 == 0


# ---------------------------------------------------------------------------------------
# write / read round trip


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("wdt", ["f32", "f16", "bf16"])
def test_round_trip_values_and_dtypes(tmp_path, kind, wdt):
    cfg = C.preset_config(kind, norm_type="layernorm", norm_bias=True, mlp_bias=True)
    t = random_tensors(cfg, seed=5)
    # exact ties for bf16 (2^-8) and for f16 (2^-11), and the f16 maximum
    t["embed.weight"][0, :5] = [1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 1 + 3 * 2**-11, 65504.0]
    path = F.write_model(tmp_path / "m.tinyloop", cfg, t, weight_dtype=wdt)
    m = F.read_model(path)
    assert m.config == cfg
    assert set(m.tensors) == set(t)
    stored = {"f32": "F32", "f16": "F16", "bf16": "BF16"}[wdt]
    for name, a in t.items():
        want_dtype = stored if a.ndim == 2 else "F32"
        assert m.dtypes[name] == want_dtype, name
        if want_dtype == "F32":
            exact = a.astype(np.float64)
        elif want_dtype == "F16":
            exact = a.astype(np.float16).astype(np.float64)
        else:
            exact = F.from_bf16_bits(F.to_bf16_bits(a)).astype(np.float64)
        assert m.tensors[name].dtype == np.float64
        np.testing.assert_array_equal(m.tensors[name], exact, err_msg=name)
    e = m.tensors["embed.weight"][0, :5].tolist()  # ties go to the even mantissa
    if wdt == "bf16":
        assert e == [1.0, 1 + 2**-6, 1.0, 1.0, 65536.0]
    if wdt == "f16":
        assert e == [1 + 2**-8, 1 + 3 * 2**-8, 1.0, 1 + 2**-9, 65504.0]
    assert m.metadata["format"] == "tinyloop" and m.metadata["format_version"] == "1"
    assert json.loads(m.metadata["config"]) == cfg


def test_layout_alignment_and_order(model_path):
    header, _ = _split(model_path)
    (n,) = struct.unpack_from("<Q", open(model_path, "rb").read(8), 0)
    assert (8 + n) % 64 == 0
    raw_header = open(model_path, "rb").read()[8:8 + n]
    assert raw_header.rstrip(b" ").endswith(b"}")  # padded with spaces only
    spans = sorted((v["data_offsets"], v["dtype"]) for k, v in header.items()
                   if k != "__metadata__")
    pos = 0
    for (b, e), dtype in spans:
        assert b == pos and (8 + n + b) % ELEMENT_SIZE[dtype] == 0
        pos = e
    assert 8 + n + pos == os.path.getsize(model_path)


def test_tensors_ordered_by_decreasing_element_size(tmp_path):
    path = write_random_model(str(tmp_path / "m.tinyloop"), "huginn", weight_dtype="bf16")
    header, _ = _split(path)
    spans = sorted((v["data_offsets"][0], ELEMENT_SIZE[v["dtype"]])
                   for k, v in header.items() if k != "__metadata__")
    sizes = [s for _, s in spans]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == 4 and sizes[-1] == 2


def test_safetensors_reads_the_file(tmp_path):
    from safetensors import safe_open
    from safetensors.numpy import load_file

    cfg = C.preset_config("ouro")
    t = random_tensors(cfg, seed=2)
    for wdt in ("f32", "f16"):
        path = F.write_model(tmp_path / f"{wdt}.tinyloop", cfg, t, weight_dtype=wdt)
        loaded = load_file(path)
        assert set(loaded) == set(t)
        for name, a in t.items():
            np.testing.assert_array_equal(loaded[name].astype(np.float32),
                                          a if (wdt == "f32" or a.ndim == 1)
                                          else a.astype(np.float16).astype(np.float32))
    path = F.write_model(tmp_path / "bf16.tinyloop", cfg, t, weight_dtype="bf16",
                         tokenizer_json='{"model": {}}', chat_template="{{ x }}")
    with safe_open(path, framework="np") as f:
        assert set(f.keys()) == set(t)
        meta = f.metadata()
    assert meta["format"] == "tinyloop" and meta["tokenizer"] == '{"model": {}}'
    assert meta["chat_template"] == "{{ x }}"


def test_tokenizer_and_template_round_trip(tmp_path):
    cfg = C.preset_config("llama")
    tok = json.dumps({"model": {"vocab": {"héllo": 0, "✓": 1}}})
    path = F.write_model(tmp_path / "m.tinyloop", cfg, random_tensors(cfg), tokenizer_json=tok,
                         chat_template="{% for m in messages %}{{ m }}{% endfor %}")
    m = F.read_model(path)
    assert m.tokenizer_json == tok and m.chat_template.startswith("{% for m")
    bare = F.read_model(F.write_model(tmp_path / "n.tinyloop", cfg, random_tensors(cfg)))
    assert bare.tokenizer_json is None and bare.chat_template is None
    assert set(bare.metadata) == {"format", "format_version", "config"}


def test_write_is_atomic_and_overwrites(tmp_path):
    path = str(tmp_path / "m.tinyloop")
    write_random_model(path, "llama", seed=1)
    write_random_model(path, "ouro", seed=1)
    assert os.listdir(tmp_path) == ["m.tinyloop"]  # no temp file left behind
    assert F.read_model(path).config["norm_placement"] == "ouro_sandwich"
    cfg = C.preset_config("llama")
    bad = random_tensors(cfg)
    bad["loop.0.attn.wq.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError):
        F.write_model(path, cfg, bad)
    assert os.listdir(tmp_path) == ["m.tinyloop"]
    assert F.read_model(path).config["norm_placement"] == "ouro_sandwich"  # old file intact


@pytest.mark.parametrize("mutate, words", [
    (lambda t: t.pop("final_norm.weight"), ["'final_norm.weight'", "missing"]),
    (lambda t: t.update(extra=np.zeros(3, np.float32)), ["'extra'", "leftover"]),
    (lambda t: t.update({"head.weight": np.zeros((64, 97), np.float32)}),
     ["'head.weight'", "shape"]),
])
def test_write_rejects_wrong_tensors(tmp_path, mutate, words):
    cfg = C.preset_config("llama")
    t = random_tensors(cfg)
    mutate(t)
    with pytest.raises(ValueError) as err:
        F.write_model(tmp_path / "m.tinyloop", cfg, t)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_write_rejects_bad_config_and_dtype(tmp_path):
    cfg = C.preset_config("llama")
    with pytest.raises(ValueError, match="'frobnicate'"):
        F.write_model(tmp_path / "m", dict(cfg, frobnicate=1), random_tensors(cfg))
    with pytest.raises(ValueError, match="weight_dtype"):
        F.write_model(tmp_path / "m", cfg, random_tensors(cfg), weight_dtype="int4")


# ---------------------------------------------------------------------------------------
# corrupted files: every problem is a ValueError that names it


def test_reject_missing_and_tiny_files(tmp_path):
    _expect_error(str(tmp_path / "nope.tinyloop"), "no such")
    p = tmp_path / "tiny"
    p.write_bytes(b"\x01\x02\x03")
    _expect_error(str(p), "truncated")
    p.write_bytes(b"")
    _expect_error(str(p), "truncated")


def test_reject_truncated_data(model_path):
    blob = open(model_path, "rb").read()
    open(model_path, "wb").write(blob[:-10])
    _expect_error(model_path, "past the end", "truncated")


def test_reject_header_length_past_eof(model_path):
    blob = bytearray(open(model_path, "rb").read())
    blob[:8] = struct.pack("<Q", len(blob) + 1)
    open(model_path, "wb").write(bytes(blob))
    _expect_error(model_path, "header length")


def test_reject_bad_json(model_path):
    blob = bytearray(open(model_path, "rb").read())
    blob[8] = ord("[")  # '{' -> '[' : no longer valid JSON
    open(model_path, "wb").write(bytes(blob))
    _expect_error(model_path, "not valid JSON")


def _mutated(path, edit):
    header, raw = _split(path)
    edit(header, raw)
    _assemble(path, header, raw)
    return path


def _set_meta(key, value):
    def edit(h, r):
        h["__metadata__"][key] = value
    return edit


def _set_config(**fields):
    def edit(h, r):
        cfg = json.loads(h["__metadata__"]["config"])
        cfg.update(fields)
        h["__metadata__"]["config"] = json.dumps(cfg)
    return edit


def _drop(name):
    def edit(h, r):
        del h[name], r[name]
    return edit


def _reshape(name, shape):
    def edit(h, r):
        h[name]["shape"] = shape
    return edit


def _add_tensor(name, dtype, shape, nbytes):
    def edit(h, r):
        h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}
        r[name] = b"\0" * nbytes
    return edit


def _norm_as_f16(h, r):
    name = "final_norm.weight"
    a = np.frombuffer(r[name], "<f4").astype("<f2")
    h[name]["dtype"], r[name] = "F16", a.tobytes()


@pytest.mark.parametrize("edit, words", [
    (_set_meta("format_version", "3"), ["format_version", "'3'"]),
    (_set_meta("format", "gguf"), ["'format'", "gguf"]),
    (_set_meta("config", "{not json"), ["'config'", "not valid JSON"]),
    (_set_config(colour="red"), ["'colour'", "unknown"]),
    (_set_config(n_kv_heads=3), ["'n_kv_heads'"]),
    (_drop("final_norm.weight"), ["'final_norm.weight'", "missing"]),
    (_reshape("head.weight", [64, 97]), ["'head.weight'", "shape"]),
    (_reshape("head.weight", [97, 65]), ["'head.weight'", "bytes"]),  # size != offsets
    (_add_tensor("loop.0.attn.wq.scales", "F32", [4], 16), ["'loop.0.attn.wq.scales'",
                                                            "leftover"]),
    (_add_tensor("x.weight", "I8", [4, 4], 16), ["'x.weight'", "I8", "format_version 2"]),
    (_add_tensor("x.weight", "Q9", [4, 4], 16), ["'x.weight'", "unknown dtype"]),
    (_add_tensor("x.weight", "F64", [2, 2], 32), ["'x.weight'", "unsupported dtype"]),
    (_norm_as_f16, ["'final_norm.weight'", "F32"]),
])
def test_reject_bad_contents(model_path, edit, words):
    _expect_error(_mutated(model_path, edit), *words)


def test_read_refuses_bytes_other_than_the_checked_file(model_path, monkeypatch):
    """read_model decodes the bytes it read; the engine checked the file on disk. Bytes that
    no longer fit the checked layout (the file changed in between) are refused."""
    blob = open(model_path, "rb").read()
    for changed in (blob[:-4], blob + b"\0" * 4, b"\xff" * len(blob)):
        monkeypatch.setattr(F, "_read_bytes", lambda path, b=changed: b)
        with pytest.raises(ValueError, match="changed on disk"):
            F.read_model(model_path)


def test_reject_overlap_hole_and_trailing_bytes(model_path):
    header, raw = _split(model_path)
    n = json.dumps(header).encode()
    names = [k for k in header if k != "__metadata__"]
    first, second = sorted(names, key=lambda k: header[k]["data_offsets"][0])[:2]

    def rewrite(h, tail=b""):
        text = json.dumps(h).encode()
        text += b" " * ((-(8 + len(text))) % 64)
        data = open(model_path, "rb").read()
        (old_n,) = struct.unpack_from("<Q", data, 0)
        body = data[8 + old_n:]
        with open(model_path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + body + tail)

    h = json.loads(n)
    h[second]["data_offsets"] = [x - 4 for x in h[second]["data_offsets"]]
    rewrite(h)
    _expect_error(model_path, "overlaps", second)
    h = json.loads(n)
    h[second]["data_offsets"] = [x + 4 for x in h[second]["data_offsets"]]
    rewrite(h, tail=b"\0" * 4)
    _expect_error(model_path, "hole", second)
    rewrite(json.loads(n), tail=b"\0" * 4)
    _expect_error(model_path, "not covered")


# ---------------------------------------------------------------------------------------
# random models and the CLI


def test_random_tensors_are_deterministic_and_float32():
    cfg = C.preset_config("huginn")
    a, b = random_tensors(cfg, seed=9), random_tensors(cfg, seed=9)
    c = random_tensors(cfg, seed=10)
    assert set(a) == set(C.expected_tensors(cfg))
    for k in a:
        assert a[k].dtype == np.float32 and a[k].shape == C.expected_tensors(cfg)[k]
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["embed.weight"], c["embed.weight"])
    assert np.all(np.abs(a["loop.0.attn.wqkv.bias"]) > 0)  # biases nonzero
    assert 0.8 < a["final_norm.weight"].mean() < 1.2


def test_cli_writes_a_model(tmp_path, capsys):
    out = str(tmp_path / "cli.tinyloop")
    rc = random_model_main([out, "--kind", "huginn", "--dim", "32", "--n-heads", "2",
                            "--weight-dtype", "bf16", "--seed", "4",
                            "--set", "pos_encoding=learned", "--set", "eos_ids=[1, 2]"])
    assert rc == 0 and capsys.readouterr().out.strip() == out
    m = F.read_model(out)
    assert m.config["dim"] == 32 and m.config["head_dim"] == 16
    assert m.config["pos_encoding"] == "learned" and m.config["eos_ids"] == [1, 2]
    assert m.dtypes["embed.weight"] == "BF16"
    assert random_model_main([out, "--set", "bogus=1"]) == 2


def test_written_file_honours_the_umask(tmp_path):
    """mkstemp makes 0600 files; a written model must be readable like any other file."""
    import os
    from tinyloop.config import preset_config
    from tinyloop.format import write_model
    from tinyloop.random_model import random_tensors

    cfg = preset_config("llama")
    old = os.umask(0o022)
    try:
        path = write_model(str(tmp_path / "m.tinyloop"), cfg, random_tensors(cfg))
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o644
