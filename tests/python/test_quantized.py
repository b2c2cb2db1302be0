"""int8 / int4 weights (format version 2): the numpy quantizer, the file writer/reader
and its validation, the reference's dequantization, and the engine's forward on
quantized models against the numpy reference."""

import json
import struct

import numpy as np
import pytest

from tinyloop import format as F
from tinyloop import quant_eval
from tinyloop import quantize as Q
import reference
from tinyloop.config import preset_config
from tinyloop.random_model import random_tensors, write_random_model

PROMPT = np.array([5, 17, 3, 42, 8, 91, 23, 60, 11, 2, 77, 30, 9], dtype=np.int32)


# ---------------------------------------------------------------------------------------
# the quantizer


@pytest.mark.parametrize("group", [None, 32, 6])
@pytest.mark.parametrize("scale_dtype", [np.float32, np.float16])
def test_int8_round_trip_error_is_half_a_step(group, scale_dtype):
    w = np.random.default_rng(0).standard_normal((7, 96)).astype(np.float32)
    q, s = Q.quantize_int8(w, group, scale_dtype)
    G = 96 if group is None else group
    assert q.dtype == np.int8 and q.shape == (7, 96)
    assert s.dtype == scale_dtype and s.shape == (7, 96 // G)
    back = Q.dequantize("x", {"x": q, "x.scales": s})
    step = np.repeat(s.astype(np.float64), G, axis=1)
    assert np.all(np.abs(back - w) <= 0.5 * step * (1 + 1e-3) + 1e-7)
    assert np.abs(q).max() == 127  # the largest of each group maps to +-127


@pytest.mark.parametrize("group", [None, 32, 6])
def test_int4_round_trip_and_nibble_order(group):
    w = np.random.default_rng(1).standard_normal((5, 96)).astype(np.float32)
    packed, s, o = Q.quantize_int4(w, group)
    G = 96 if group is None else group
    assert packed.dtype == np.uint8 and packed.shape == (5, 48)
    assert s.shape == o.shape == (5, 96 // G)
    q = Q.unpack_int4(packed)
    assert np.array_equal(q[:, 0], packed[:, 0] & 15) and np.array_equal(q[:, 1], packed[:, 0] >> 4)
    assert np.array_equal(Q.pack_int4(q), packed)
    back = Q.dequantize("x", {"x": packed, "x.scales": s, "x.offsets": o})
    step = np.repeat(s.astype(np.float64), G, axis=1)
    assert np.all(np.abs(back - w) <= 0.5 * step * (1 + 1e-4) + 1e-6)
    # the min and max of each group are hit (up to float rounding)
    assert q.min() == 0 and q.max() == 15


def test_constant_group_is_exact():
    w = np.full((2, 8), 0.25, np.float32)
    q, s = Q.quantize_int8(np.zeros((2, 8)), 4)
    assert np.all(q == 0) and np.all(s == 0)
    p, s, o = Q.quantize_int4(w, 4)
    assert np.array_equal(Q.dequantize("w", {"w": p, "w.scales": s, "w.offsets": o}), w)


def test_quantizer_refuses_bad_groups():
    with pytest.raises(ValueError, match="does not divide"):
        Q.quantize_int8(np.zeros((2, 10)), 4)
    with pytest.raises(ValueError, match="even"):
        Q.quantize_int4(np.zeros((2, 9)), 3)
    with pytest.raises(ValueError, match="float16 or float32"):
        Q.quantize_int8(np.zeros((2, 8)), 4, np.float64)


# ---------------------------------------------------------------------------------------
# the file


def _quantized_model(tmp_path, kind="llama", wd="int4", group=32, scale_dtype="f32", **kw):
    path = str(tmp_path / f"{kind}-{wd}.tinyloop")
    write_random_model(path, preset_config(kind, **kw), seed=4, weight_dtype=wd, group=group,
                       scale_dtype=scale_dtype)
    return path


@pytest.mark.parametrize("wd", ["int8", "int4"])
@pytest.mark.parametrize("scale_dtype", ["f32", "f16"])
def test_write_read_round_trip(tmp_path, wd, scale_dtype):
    cfg = preset_config("huginn")
    t = Q.quantize_tensors(random_tensors(cfg, 2), wd, 16,
                           np.float16 if scale_dtype == "f16" else np.float32)
    path = F.write_model(tmp_path / "q.tinyloop", cfg, t)
    m = F.read_model(path)
    assert m.metadata["format_version"] == "2"
    assert set(m.tensors) == set(t)
    for name, a in t.items():
        np.testing.assert_array_equal(m.tensors[name], a, err_msg=name)
    want_w = "I8" if wd == "int8" else "U8"
    assert m.dtypes["loop.0.attn.wqkv.weight"] == want_w
    assert m.dtypes["embed.weight"] == want_w
    assert m.dtypes["embed.weight.scales"] == scale_dtype.upper()
    assert m.dtypes["final_norm.weight"] == "F32"
    # decreasing element size: every tensor starts on a multiple of its element size
    for name, (begin, _) in m.offsets.items():
        assert begin % {"F32": 4, "F16": 2, "I8": 1, "U8": 1}[m.dtypes[name]] == 0


def test_float_model_stays_version_1(tmp_path):
    path = write_random_model(str(tmp_path / "f.tinyloop"), "llama")
    assert F.read_model(path).metadata["format_version"] == "1"


def test_mixed_quantized_and_float(tmp_path):
    """SmolLM2-style: int4 linears, int8 tied embedding, f16 elsewhere is allowed."""
    cfg = preset_config("llama", tie_embeddings=True)
    t = random_tensors(cfg, 1)
    t = {**Q.quantize_tensors({k: v for k, v in t.items() if k != "embed.weight"}, "int4", 32,
                              np.float16),
         **Q.quantize_tensors({"embed.weight": t["embed.weight"]}, "int8", 32, np.float16)}
    m = F.read_model(F.write_model(tmp_path / "mix.tinyloop", cfg, t))
    assert m.dtypes["embed.weight"] == "I8" and m.dtypes["pre.0.attn.wq.weight"] == "U8"


def _split(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    raw = {k: data[v["data_offsets"][0]:v["data_offsets"][1]]
           for k, v in header.items() if k != "__metadata__"}
    return header, raw


def _assemble(path, header, raw):
    offset, parts, out = 0, [], {"__metadata__": header["__metadata__"]}
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


def _mutated(tmp_path, src, edit):
    header, raw = _split(src)
    edit(header, raw)
    out = str(tmp_path / "bad.tinyloop")
    _assemble(out, header, raw)
    return out


W = "pre.0.attn.wq.weight"  # [64, 64] in the llama preset


def _drop(name):
    def edit(h, r):
        del h[name], r[name]
    return edit


_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I8": 1, "U8": 1}


def _fit(data, n):
    return (data + b"\0" * n)[:n]


def _retype(name, dtype):
    def edit(h, r):
        h[name]["dtype"] = dtype
        r[name] = _fit(r[name], int(np.prod(h[name]["shape"])) * _SIZE[dtype])
    return edit


def _f32_to_f16(name, dtype="F16"):
    def edit(h, r):  # BF16: the same two bytes a value, which is all the reader checks here
        h[name]["dtype"], r[name] = dtype, np.frombuffer(r[name], "<f4").astype("<f2").tobytes()
    return edit


def _reshape(name, shape):
    def edit(h, r):
        n = int(np.prod(shape)) * _SIZE[h[name]["dtype"]]
        h[name]["shape"], r[name] = shape, _fit(r[name], n)
    return edit


def _set_version(v):
    def edit(h, r):
        h["__metadata__"]["format_version"] = v
    return edit


def _add(name, dtype, shape, nbytes):
    def edit(h, r):
        h[name] = {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}
        r[name] = b"\0" * nbytes
    return edit


@pytest.mark.parametrize("wd, edit, words", [
    ("int4", _set_version("1"), ["'embed.weight'", "format_version 2"]),
    ("int8", _set_version("1"), ["'embed.weight'", "format_version 2"]),
    ("int4", _set_version("3"), ["format_version", "'3'"]),
    ("int8", _drop(W + ".scales"), [f"'{W}.scales'", "missing"]),
    ("int4", _drop(W + ".offsets"), [f"'{W}.offsets'", "missing"]),
    ("int4", _retype(W + ".scales", "I32"), [f"'{W}.scales'", "I32"]),
    ("int8", _f32_to_f16(W + ".scales", "BF16"), [f"'{W}.scales'", "F16 or F32"]),
    ("int4", _f32_to_f16(W + ".offsets"), [f"'{W}.offsets'", "must match"]),
    ("int8", _reshape(W + ".scales", [64, 3]), [f"'{W}.scales'", "dividing K = 64"]),
    ("int8", _reshape(W + ".scales", [63, 2]), [f"'{W}.scales'", "[64, K/G]"]),
    ("int4", _reshape(W + ".scales", [64, 64]), [f"'{W}.offsets'", "must match"]),
    ("int4", lambda h, r: (_reshape(W + ".scales", [64, 64])(h, r),
                           _reshape(W + ".offsets", [64, 64])(h, r)), [f"'{W}.scales'", "odd"]),
    ("int8", _add(W + ".offsets", "F32", [64, 2], 512), [f"'{W}.offsets'", "no offsets"]),
    ("int8", _add("final_norm.weight.scales", "F32", [1], 4), ["'final_norm.weight.scales'",
                                                               "leftover"]),
    ("int8", _retype("final_norm.weight", "I8"), ["'final_norm.weight'", "may be quantized"]),
    ("int4", _reshape(W, [64, 30]), [f"'{W}'", "shape"]),
])
def test_reject_bad_quantized(tmp_path, wd, edit, words):
    src = _quantized_model(tmp_path, "llama", wd)
    bad = _mutated(tmp_path, src, edit)
    with pytest.raises(ValueError) as err:
        F.read_model(bad)
    for w in words:
        assert w in str(err.value), f"{w!r} not in {err.value}"


def test_writer_refuses_inconsistent_entries(tmp_path):
    cfg = preset_config("llama")
    t = Q.quantize_tensors(random_tensors(cfg), "int4", 32)
    bad = dict(t)
    del bad[W + ".offsets"]
    with pytest.raises(ValueError, match=f"'{W}.offsets'.*missing"):
        F.write_model(tmp_path / "x.tinyloop", cfg, bad)
    bad = dict(t)
    bad["final_norm.weight"] = np.zeros(64, np.int8)
    with pytest.raises(ValueError, match="'final_norm.weight'.*may be quantized"):
        F.write_model(tmp_path / "x.tinyloop", cfg, bad)
    assert not (tmp_path / "x.tinyloop").exists()


def test_reference_dequantizes(tmp_path):
    """The reference on the file's quantized tensors equals the reference on the
    dequantized float weights, and is close to the unquantized model."""
    cfg = preset_config("huginn")
    t = random_tensors(cfg, 5)
    q = Q.quantize_tensors(t, "int8", 32)
    deq = {n: Q.dequantize(n, q) for n in t}
    got = reference.forward(cfg, q, PROMPT[:6], 2)
    np.testing.assert_array_equal(got, reference.forward(cfg, deq, PROMPT[:6], 2))
    full = reference.forward(cfg, t, PROMPT[:6], 2)
    assert np.max(np.abs(got - full)) / np.max(np.abs(full)) < 0.05


def test_cli_random_model_and_inspect(tmp_path, capsys):
    from tinyloop.cli import main
    out = str(tmp_path / "r.tinyloop")
    assert main(["random-model", out, "--kind", "llama", "--weight-dtype", "int8",
                 "--group", "16", "--scale-dtype", "f16"]) == 0
    assert main(["inspect", out]) == 0
    text = capsys.readouterr().out
    assert "format_version: 2" in text
    assert "int8" in text and "group 16" in text and "F16 scales" in text
    assert ".scales" not in text  # companions are folded into their weight's line


# ---------------------------------------------------------------------------------------
# the engine against the reference


def _engine():
    tl = pytest.importorskip("tinyloop_py")
    return tl


def rel_err(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


ENGINE_CASES = [
    # (kind, weight dtype, group, scale dtype, overrides)
    ("llama", "int8", 32, "f32", {}),
    ("llama", "int4", 32, "f16", {}),
    ("huginn", "int8", 0, "f16", {}),       # per-row scales, tied quantized embed as head
    ("huginn", "int4", 16, "f32", {}),
    ("ouro", "int4", 0, "f32", {"dim": 70, "n_heads": 5, "ffn_dim": 150}),  # odd K/2, G = K
    ("ouro", "int8", 10, "f32", {"dim": 70, "n_heads": 5, "ffn_dim": 150}),
]


# Engine vs reference bound per activation mode. q8: the engine's float32 rows and the
# reference's float64 rows can round a block value to neighbouring int8 steps when x * 127 /
# amax lands within ~1e-5 of a half (a "flip", about one per few thousand values): one step
# of one activation, which on these 64-wide random models moves the logits of its row (and,
# through attention, of the later rows) by up to ~1 %. Whole sequences get that bound, plus
# a check that the engine is nearer the q8 reference than the exact one;
# test_q8_single_rows_are_exact_but_for_flips holds the formula to float rounding.
REL_TOL = {"f32": 1e-4, "q8": 3e-2}


def assert_mode_close(got, want, mode, want_other=None):
    err = rel_err(got, want)
    assert err < REL_TOL[mode], f"{mode}: {err:.2e}"
    if mode == "q8" and want_other is not None and err > 1e-4:  # a flip: still the q8 math?
        scale = np.max(np.abs(want))
        assert np.median(np.abs(got - want)) < np.median(np.abs(got - want_other)), \
            "q8 engine is nearer the exact reference than the q8 one"
        assert np.median(np.abs(got - want)) / scale < 5e-3


@pytest.mark.parametrize("mode", ["f32", "q8"])
@pytest.mark.parametrize("kind, wd, group, sdt, kw", ENGINE_CASES)
def test_engine_forward_matches_reference(tmp_path, kind, wd, group, sdt, kw, mode):
    tl = _engine()
    path = _quantized_model(tmp_path, kind, wd, group or None, sdt, max_seq_len=128, **kw)
    m = F.read_model(path)
    with tl.Model(path, quant_activations=mode) as model:
        assert model.config()["quant_activations"] == mode
        for loops in (1, 3):
            got = model.score(PROMPT, loops=loops)  # [T, V]
            want = reference.forward(m.config, m.tensors, PROMPT, loops, quant_activations=mode)
            other = reference.forward(m.config, m.tensors, PROMPT, loops) if mode == "q8" else None
            assert_mode_close(got, want, mode, other)


def test_q8_single_rows_are_exact_but_for_flips(tmp_path):
    """One-token sequences (no attention to carry a flip to other rows): nearly every row
    equals the q8 reference to float rounding, and every row is off the exact reference."""
    tl = _engine()
    exact = 0
    for wd in ("int8", "int4"):
        path = _quantized_model(tmp_path, "llama", wd, 32, "f16", max_seq_len=128)
        m = F.read_model(path)
        with tl.Model(path, quant_activations="q8") as model:
            for tok in range(1, 97, 4):  # 24 rows
                ids = np.array([tok], np.int32)
                got = model.score(ids, loops=2)
                want = reference.forward(m.config, m.tensors, ids, 2, quant_activations="q8")
                exact += rel_err(got, want) < 1e-5
                assert rel_err(got, want) < REL_TOL["q8"]
                assert rel_err(got, reference.forward(m.config, m.tensors, ids, 2)) > 1e-4
    assert exact >= 44, f"{exact}/48 rows exact"


def test_q8_activations_change_only_blocked_groups(tmp_path):
    """q8 differs from f32 where the group is a multiple of 32, and is the exact path (same
    bits) where it is not (G = 16)."""
    tl = _engine()
    for group, same in ((32, False), (16, True)):
        path = _quantized_model(tmp_path, "llama", "int4", group, "f16", max_seq_len=128)
        with tl.Model(path, quant_activations="q8") as a, tl.Model(path, quant_activations="f32") as b:
            ga, gb = a.score(PROMPT, loops=2), b.score(PROMPT, loops=2)
        assert np.array_equal(ga, gb) == same, f"group {group}"


def test_quant_activations_kwarg_env_and_errors(tmp_path, monkeypatch):
    tl = _engine()
    path = _quantized_model(tmp_path, "llama", "int8", 32, "f16", max_seq_len=128)
    # The default (docs/model-format.md): q8 for int8 / int4 files where a packed q8 kernel
    # runs (x86 with AVX512-VNNI or AVX2), exact elsewhere; a float file always says f32.
    packed = tl.cpu_info()["q8_kernel"] in ("amx-int8", "avx512vnni", "avx2")
    with tl.Model(path) as model:
        assert model.config()["quant_activations"] == ("q8" if packed else "f32")
    float_path = _quantized_model(tmp_path, "llama", "f16", 32, "f16", max_seq_len=128)
    with tl.Model(float_path) as model:
        assert model.config()["quant_activations"] == "f32"
    monkeypatch.setenv("TINYLOOP_QUANT_ACTIVATIONS", "f32")
    with tl.Model(path) as model:
        assert model.config()["quant_activations"] == "f32"
    monkeypatch.setenv("TINYLOOP_QUANT_ACTIVATIONS", "q8")
    with tl.Model(path) as model:
        assert model.config()["quant_activations"] == "q8"
    with tl.Model(path, quant_activations="f32") as model:  # the kwarg wins over the env
        assert model.config()["quant_activations"] == "f32"
    with pytest.raises(ValueError, match="quant_activations"):
        tl.Model(path, quant_activations="int8")
    monkeypatch.setenv("TINYLOOP_QUANT_ACTIVATIONS", "bogus")
    with pytest.raises(ValueError, match="TINYLOOP_QUANT_ACTIVATIONS"):
        tl.Model(path)
    with pytest.raises(ValueError, match="quant_activations"):
        reference.forward(preset_config("llama"), {}, PROMPT, 1, quant_activations="q4")


def test_reference_q8_quantizer_matches_ggml_x86():
    """127 / amax, ties to even, d and s rounded through fp16 (s from the unrounded d)."""
    x = np.zeros((1, 32), np.float32)
    x[0, :6] = [127, 0.5, 1.5, 2.5, -2.5, -126.5]
    q, d, s = reference.quantize_activations_q8(x)
    assert q[0, :6].tolist() == [127, 0, 2, 2, -2, -126] and d[0, 0] == 1 and s[0, 0] == 3
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    q, d, s = reference.quantize_activations_q8(x)
    amax = np.abs(x.reshape(2, 2, 32)).max(-1)
    assert np.array_equal(d, (amax / np.float32(127)).astype(np.float16).astype(np.float32))
    assert np.abs(q).max() == 127 and np.all(np.abs(q.reshape(2, 2, 32)).max(-1) == 127)


@pytest.mark.parametrize("wd", ["int8", "int4"])
def test_engine_decode_matches_prefill(tmp_path, wd):
    """Cached one-row decode (the one-row kernels) gives the prefill's rows."""
    tl = _engine()
    path = _quantized_model(tmp_path, "llama", wd, 32, "f16", max_seq_len=128)
    ids = np.random.default_rng(2).integers(0, 97, size=20).astype(np.int32)
    m = F.read_model(path)
    for mode in ("f32", "q8"):
        with tl.Model(path, kv_mode="fp32", quant_activations=mode) as model:
            got = tl._testing.stepwise_logits(model, ids, 5, loops=2, cache_window=0)
            full = model.score(ids, loops=2)[4:]
        want = reference.forward(m.config, m.tensors, ids, 2, quant_activations=mode)[4:]
        other = reference.forward(m.config, m.tensors, ids, 2)[4:] if mode == "q8" else None
        assert_mode_close(got, want, mode, other)
        # batch invariance: the one-row decode kernels give the prefill's rows
        assert rel_err(got, full) < 1e-5, mode


# ---------------------------------------------------------------------------------------
# tinyloop quantize, and the benchmark's byte count


@pytest.mark.parametrize("wd", ["int8", "int4", "bf16"])
def test_quantize_cli_writes_and_reports(tmp_path, capsys, wd):
    _engine()
    from tinyloop.cli import main
    src = write_random_model(str(tmp_path / "in.tinyloop"), "llama", seed=1)
    out = str(tmp_path / "out.tinyloop")
    assert main(["quantize", src, out, "--weights", wd, "--group", "16", "--max-windows", "2",
                 "--ctx", "24", "--quiet", "--eval-text"]) == 0
    text = capsys.readouterr().out
    assert "top-1 agreement" in text and "random token ids" in text and "perplexity" in text
    m = F.read_model(out)
    want = {"int8": "I8", "int4": "U8", "bf16": "BF16"}[wd]
    assert m.dtypes["pre.0.attn.wq.weight"] == want
    if wd != "bf16":
        assert Q.group_size("pre.0.attn.wq.weight", m.tensors) == 16
    # The quantized model is the quantization of the input's weights.
    src_m = F.read_model(src)
    err = np.abs(Q.dequantize("pre.0.mlp.w_up.weight", m.tensors) - src_m.tensors["pre.0.mlp.w_up.weight"])
    assert 0 < err.max() < 0.1


def test_compare_models_is_zero_against_itself(tmp_path):
    _engine()
    src = write_random_model(str(tmp_path / "a.tinyloop"), "huginn", seed=2, weight_dtype="int4")
    windows, _ = quant_eval.eval_windows(src, [], ctx=16, max_windows=2)
    r = quant_eval.compare_models(src, src, windows, progress=False)
    assert r["mean_kl"] == 0.0 and r["top1_agreement"] == 1.0 and r["ppl_ref"] == r["ppl_test"]


def test_bench_counts_quantized_bytes(tmp_path):
    from tinyloop.bench import Work, read_header
    cfg = preset_config("llama")
    path = write_random_model(str(tmp_path / "b.tinyloop"), cfg, weight_dtype="int4", group=32,
                              scale_dtype="f16")
    header = read_header(path)
    w = Work(header, cfg, loops=1)
    # int4: half a byte a weight plus two F16 per 32 weights (2.25 bits... + 1 byte / 32 * 4)
    logical = sum(e["shape"][0] * e["shape"][1] * 2 for n, e in header.items()
                  if e["dtype"] == "U8" and n != "embed.weight")
    assert w.weight_bytes == pytest.approx(logical * (0.5 + 4 / 32))
    assert w.dtype == "int4"


def test_engine_mixed_smollm2_layout(tmp_path):
    """SmolLM2's GGUF layout: int4 (Q4_1) linears, an int8 (Q8_0) tied embedding used as
    the head, F16 scales, float norms."""
    tl = _engine()
    cfg = preset_config("llama", tie_embeddings=True, max_seq_len=128)
    t = random_tensors(cfg, 3)
    q = {**Q.quantize_tensors({k: v for k, v in t.items() if k != "embed.weight"}, "int4", 32,
                              np.float16),
         **Q.quantize_tensors({"embed.weight": t["embed.weight"]}, "int8", 32, np.float16)}
    path = F.write_model(tmp_path / "mix.tinyloop", cfg, q)
    for mode in ("f32", "q8"):
        with tl.Model(path, quant_activations=mode) as model:
            got = model.score(PROMPT, loops=1)
        want = reference.forward(cfg, q, PROMPT, 1, quant_activations=mode)
        other = reference.forward(cfg, q, PROMPT, 1) if mode == "q8" else None
        assert_mode_close(got, want, mode, other)


@pytest.mark.parametrize("wd", ["int8", "int4"])
@pytest.mark.parametrize("scale_dtype", ["f32", "f16"])
def test_q8_packed_copies_are_counted_and_rows_are_batch_invariant(tmp_path, wd, scale_dtype):
    """On x86 CPUs with AVX512-VNNI or AVX2, quant_activations="q8" repacks every int8 / int4
    matmul weight for the packed kernels (cpu/matmul_q8act_packed.h): vram_usage_mb counts the copies
    (16-row groups x 32-column cells: the weight bytes plus the params in their own dtype)
    instead of the originals, whose mapped pages are released (a tied embedding stays counted),
    and a row's logits do not depend on how many rows are scored with it (3 rows take the
    kernel's decode path, 4 and more its prefill tiles)."""
    tl = _engine()
    path = _quantized_model(tmp_path, "llama", wd, 32, scale_dtype, max_seq_len=128)
    m = F.read_model(path)
    ps = 2 if scale_dtype == "f16" else 4
    expected = 0
    for name, dt in m.dtypes.items():
        if dt not in ("I8", "U8") or (name == "embed.weight" and not m.config["tie_embeddings"]):
            continue
        n, k = m.tensors[name].shape[0], m.tensors[name].shape[1] * (2 if dt == "U8" else 1)
        cell = 512 + 16 * ps if dt == "I8" else 256 + 32 * ps
        expected += -(-n // 16) * (k // 32) * cell
        if name != "embed.weight":  # the originals are no longer counted; a tied embedding's
            # rows are still gathered per token, so it stays counted
            expected -= n * k // (1 if dt == "I8" else 2) + n * (k // 32) * ps * (1 if dt == "I8" else 2)
    with tl.Model(path, quant_activations="q8") as a, tl.Model(path, quant_activations="f32") as b:
        extra = round((a.vram_usage_mb() - b.vram_usage_mb()) * 2**20)
        if tl.cpu_info()["q8_kernel"] in ("amx-int8", "avx512vnni", "avx2"):  # the packed kernels
            assert extra == expected != 0
        else:
            assert extra == 0
        ids = np.array(PROMPT, np.int32)
        full = a.score(ids, loops=2)  # [T, V]
        for t in range(2, len(ids)):  # the last row of each prefix, through a fresh cache
            np.testing.assert_array_equal(a.score(ids[: t + 1], loops=2)[-1], full[t])
