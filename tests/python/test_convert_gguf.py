"""tinyloop.convert on tiny GGUF files written here with gguf.GGUFWriter and
gguf.quants.quantize: every tensor type converts losslessly (the converted weights decode
to exactly gguf.quants.dequantize of the source), the engine's logits match an independent
numpy forward of the dequantized GGUF weights (llama.cpp's rope mode 0: adjacent pairs),
and bad inputs are refused by name with nothing left in the output folder."""
from __future__ import annotations

import os

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from tinyloop.convert import convert
from tinyloop.format import read_model
from tinyloop.quantize import dequantize

from convert_oracle import llama_gguf_forward, rel_err

META = dict(block_count=3, embedding_length=64, head_count=4, head_count_kv=2,
            feed_forward_length=96, eps=1e-5, freq_base=10000.0, vocab=72)
IDS = np.array([3, 17, 5, 40, 8, 61, 23, 2, 11, 70, 9], dtype=np.int32)
_LAYER = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
          "ffn_up", "ffn_down")
_OURS = {"attn_norm": "attn_norm", "attn_q": "attn.wq", "attn_k": "attn.wk",
         "attn_v": "attn.wv", "attn_output": "attn.wo", "ffn_norm": "mlp_norm",
         "ffn_gate": "mlp.w_gate", "ffn_up": "mlp.w_up", "ffn_down": "mlp.w_down"}


def _shapes(m):
    D, H, KVH, F = (m["embedding_length"], m["head_count"], m["head_count_kv"],
                    m["feed_forward_length"])
    hd = D // H
    return {"attn_norm": (D,), "attn_q": (H * hd, D), "attn_k": (KVH * hd, D),
            "attn_v": (KVH * hd, D), "attn_output": (D, H * hd), "ffn_norm": (D,),
            "ffn_gate": (F, D), "ffn_up": (F, D), "ffn_down": (D, F)}


def write_gguf(path, linear=Q.F32, embed=None, head=None, *, arch="llama", seed=0,
               skip=(), extra=(), bad_shape=None, meta_extra=None, huge=None, m=META,
               tokenizer_model=None):
    """A random tiny llama GGUF. linear/embed/head: GGML types (head None: tied).
    Returns {GGUF name: float32 dequantized values as llama.cpp sees them}."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(m["block_count"])
    w.add_context_length(128)
    w.add_embedding_length(m["embedding_length"])
    w.add_feed_forward_length(m["feed_forward_length"])
    w.add_head_count(m["head_count"])
    w.add_head_count_kv(m["head_count_kv"])
    w.add_rope_freq_base(m["freq_base"])
    w.add_layer_norm_rms_eps(m["eps"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    if tokenizer_model is not None:
        tokens, types, merges = tiny_vocab(m["vocab"])
        w.add_tokenizer_model(tokenizer_model)
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
    for key, (kind, val) in (meta_extra or {}).items():
        getattr(w, f"add_{kind}")(key, val)
    deq = {}

    def add(name, shape, qtype, scale=0.3):
        a = (rng.standard_normal(shape) * scale).astype(np.float32)
        if len(shape) == 1:
            a = (1.0 + a).astype(np.float32)
        if huge is not None and name == huge:
            a[0, :32] *= 4e5  # a block whose Q4_0 scale d = max / -8 puts 8 d past F16's max
        if bad_shape is not None and name == bad_shape:
            a = a[:-1] if len(shape) == 1 else a[:, :-32]
        data = gguf.quants.quantize(a, qtype)
        if qtype in (Q.F32, Q.F16):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=qtype)
        deq[name] = gguf.quants.dequantize(data, qtype).reshape(a.shape).astype(np.float32)

    D, V = m["embedding_length"], m["vocab"]
    shapes = _shapes(m)
    add("token_embd.weight", (V, D), embed or linear)
    for i in range(m["block_count"]):
        for t in _LAYER:
            name = f"blk.{i}.{t}.weight"
            if name in skip:
                continue
            add(name, shapes[t], Q.F32 if len(shapes[t]) == 1 else linear)
    add("output_norm.weight", (D,), Q.F32)
    if head is not None:
        add("output.weight", (V, D), head)
    for name, shape, qtype in extra:
        add(name, shape, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return deq


def tiny_vocab(V):
    """A byte-level BPE vocabulary of V tokens: 3 control tokens, letters, 'Ġ' (the space),
    the merges of 'hello', and filler tokens."""
    merges = ["h e", "l l", "ll o", "he llo"]
    tokens = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + \
        ["\u0120", "he", "ll", "llo", "hello"]
    tokens += [f"x{i}" for i in range(V - len(tokens))]
    types = [3, 3, 3] + [1] * (V - 3)
    return tokens, types, merges


def _our_name(gguf_name: str, n_layers: int) -> str:
    if gguf_name == "token_embd.weight":
        return "embed.weight"
    if gguf_name == "output.weight":
        return "head.weight"
    if gguf_name == "output_norm.weight":
        return "final_norm.weight"
    _, i, t, _ = gguf_name.split(".")
    layer = f"pre.{i}." if int(i) < n_layers - 1 else "loop.0."
    return f"{layer}{_OURS[t]}.weight"


def _engine_logits(path):
    tl = pytest.importorskip("tinyloop_py")
    # exact activations: this checks the conversion is lossless (q8, llama.cpp's activation
    # rounding, is tests/python/test_quantized.py and tests/oracles)
    with tl.Model(path, quant_activations="f32") as model:
        return model.score(IDS, loops=1)


CASES = {  # name: (linear, embed, head)
    "f32": (Q.F32, None, Q.F32),
    "f16_tied": (Q.F16, None, None),
    "bf16": (Q.BF16, None, Q.BF16),
    "q8_0": (Q.Q8_0, Q.Q8_0, Q.F16),
    "q4_0": (Q.Q4_0, Q.F32, Q.Q4_0),
    "q4_1_tied_q8_embed": (Q.Q4_1, Q.Q8_0, None),  # SmolLM2's layout
}


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_converts_losslessly_and_matches_numpy_forward(tmp_path, case):
    linear, embed, head = CASES[case]
    src, dst = str(tmp_path / "m.gguf"), str(tmp_path / "m.tinyloop")
    deq = write_gguf(src, linear, embed, head)
    assert convert(src, dst, progress=False) == dst
    c = read_model(dst)
    cfg = c.config
    n = META["block_count"]
    assert (cfg["n_pre_blocks"], cfg["n_loop_layers"], cfg["n_post_blocks"],
            cfg["default_loops"]) == (n - 1, 1, 0, 1)
    assert cfg["pos_encoding"] == "rope_interleaved" and cfg["tie_embeddings"] == (head is None)
    assert cfg["bos_id"] == 1 and cfg["eos_ids"] == [2] and cfg["max_seq_len"] == 128
    assert c.chat_template == "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    quantized = {Q.Q8_0: "I8", Q.Q4_0: "U8", Q.Q4_1: "U8"}
    for gname, want in deq.items():
        ours = _our_name(gname, n)
        got = dequantize(ours, c.tensors).astype(np.float32)  # float64 of float32 products
        np.testing.assert_array_equal(got, want, err_msg=f"{gname} -> {ours}")
    # quantized tensors stayed quantized, with the GGUF block size as group size
    for gname, qtype in (("blk.0.attn_q.weight", linear), ("token_embd.weight", embed or linear)):
        ours = _our_name(gname, n)
        if qtype in quantized:
            assert c.dtypes[ours] == quantized[qtype]
            assert c.dtypes[ours + ".scales"] == "F16"
            assert c.tensors[ours + ".scales"].shape[1] * 32 == META["embedding_length"]
        else:
            assert c.dtypes[ours] == {Q.F32: "F32", Q.F16: "F16", Q.BF16: "BF16"}[qtype]
    got = _engine_logits(dst)
    want = llama_gguf_forward(deq, META, IDS)
    assert rel_err(got, want) < 1e-4, f"{case}: {rel_err(got, want):.2e}"


def test_q4_0_scale_overflowing_f16_offsets_go_f32(tmp_path):
    src, dst = str(tmp_path / "m.gguf"), str(tmp_path / "m.tinyloop")
    deq = write_gguf(src, Q.Q4_0, Q.F32, Q.F32, huge="blk.0.ffn_up.weight")
    convert(src, dst, progress=False)
    c = read_model(dst)
    assert c.dtypes["pre.0.mlp.w_up.weight.scales"] == "F32"
    assert c.dtypes["pre.0.mlp.w_up.weight.offsets"] == "F32"
    assert c.dtypes["pre.0.mlp.w_gate.weight.offsets"] == "F16"  # only that tensor
    np.testing.assert_array_equal(dequantize("pre.0.mlp.w_up.weight", c.tensors).astype(np.float32),
                                  deq["blk.0.ffn_up.weight"])


def test_gguf_tokenizer_is_embedded(tmp_path):
    pytest.importorskip("tinyloop.gguf_tokenizer")
    from tokenizers import Tokenizer

    src, dst = str(tmp_path / "m.gguf"), str(tmp_path / "m.tinyloop")
    write_gguf(src, tokenizer_model="gpt2")
    convert(src, dst, progress=False)
    tok = Tokenizer.from_str(read_model(dst).tokenizer_json)
    tokens, _, _ = tiny_vocab(META["vocab"])
    assert tok.encode("hello").ids == [tokens.index("hello")]
    assert tok.encode("</s>").ids == [2]  # a control token is matched whole


def test_gguf_without_or_with_unsupported_tokenizer_converts_without_one(tmp_path, capsys):
    pytest.importorskip("tinyloop.gguf_tokenizer")
    src, dst = str(tmp_path / "m.gguf"), str(tmp_path / "m.tinyloop")
    write_gguf(src)  # no tokenizer.ggml.* metadata
    convert(src, dst, progress=False)
    assert read_model(dst).tokenizer_json is None
    write_gguf(src, tokenizer_model="llama")  # SentencePiece without scores: refused by the builder
    convert(src, dst, progress=False)
    assert read_model(dst).tokenizer_json is None
    assert "tokenizer not embedded" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# refusals: a message naming the problem, and nothing left in the output folder


def _refused(tmp_path, src, match, tag="out"):
    out = tmp_path / tag
    out.mkdir()
    with pytest.raises(ValueError, match=match):
        convert(src, str(out / "m.tinyloop"), progress=False)
    assert os.listdir(out) == []


def test_truncated_gguf_is_refused(tmp_path):
    src = str(tmp_path / "m.gguf")
    write_gguf(src, Q.Q8_0)
    size = os.path.getsize(src)
    for cut in (size - 100, size // 2, 40, 3):
        with open(src, "r+b") as f:
            f.truncate(cut)
        _refused(tmp_path, src, r"m\.gguf.*(truncated|corrupt)", tag=f"out{cut}")


def test_unsupported_tensor_type_is_refused(tmp_path):
    src = str(tmp_path / "m.gguf")
    write_gguf(src, Q.Q5_0)
    _refused(tmp_path, src, r"tensor 'token_embd.weight' has type Q5_0")


def test_unknown_type_id_is_refused(tmp_path):
    src = str(tmp_path / "m.gguf")
    write_gguf(src, Q.F32)
    r = gguf.GGUFReader(src)
    field = r.tensors[0].field  # patch the type id of the first tensor to a number ggml lacks
    type_offset = field.offset + sum(p.nbytes for p in field.parts[:4])
    del r
    with open(src, "r+b") as f:
        f.seek(type_offset)
        f.write(np.uint32(250).tobytes())
    _refused(tmp_path, src, r"unknown GGUF tensor type")


def test_missing_tensor_is_refused(tmp_path):
    src = str(tmp_path / "m.gguf")
    write_gguf(src, skip=("blk.1.ffn_up.weight",))
    _refused(tmp_path, src, r"tensor 'blk.1.ffn_up.weight' is missing")


def test_extra_tensor_is_refused(tmp_path):
    src = str(tmp_path / "m.gguf")
    write_gguf(src, extra=[("blk.0.attn_q.bias", (64,), Q.F32)])
    _refused(tmp_path, src, r"tensor 'blk.0.attn_q.bias' is not used")


def test_shape_mismatch_is_refused(tmp_path):
    src = str(tmp_path / "m.gguf")
    write_gguf(src, bad_shape="blk.2.ffn_down.weight")
    _refused(tmp_path, src, r"tensor 'blk.2.ffn_down.weight' has shape \[64, 64\], the config "
                            r"needs \[64, 96\]")


def test_unsupported_architecture_is_refused(tmp_path):
    src = str(tmp_path / "m.gguf")
    write_gguf(src, arch="gpt2")
    _refused(tmp_path, src, r"GGUF architecture 'gpt2' is not supported")


def test_rope_scaling_is_refused(tmp_path):
    src = str(tmp_path / "m.gguf")
    write_gguf(src, meta_extra={"llama.rope.scaling.type": ("string", "linear")})
    _refused(tmp_path, src, r"'llama.rope.scaling.type' = 'linear'")


@pytest.mark.parametrize("key, kind, value", [
    ("llama.attention.clamp_kqv", "float32", 8.0),         # changes attention: unknown, refused
    ("llama.rope.scaling.attn_factor", "float32", 1.5),
    ("falcon.attention.head_count", "uint32", 4),          # another architecture's namespace
    ("mytool.logit_scale", "float32", 2.0),                # an unknown namespace
])
def test_unknown_metadata_is_refused(tmp_path, key, kind, value):
    """No silent acceptance: metadata the importer does not read is refused by name."""
    src = str(tmp_path / "m.gguf")
    write_gguf(src, meta_extra={key: (kind, value)})
    _refused(tmp_path, src, rf"GGUF metadata '{key}' is not understood")


def test_descriptive_metadata_is_accepted(tmp_path):
    src = str(tmp_path / "m.gguf")
    write_gguf(src, meta_extra={"general.license": ("string", "apache-2.0"),
                                "quantize.imatrix.file": ("string", "imatrix.dat"),
                                "llama.expert_used_count": ("uint32", 0)})
    convert(src, str(tmp_path / "m.tinyloop"), progress=False)


def test_not_a_gguf_is_refused(tmp_path):
    src = tmp_path / "m.gguf"
    src.write_bytes(b"GGUX" + b"\0" * 100)
    _refused(tmp_path, str(src), r"not a readable GGUF file")


def test_cli_convert(tmp_path, capsys):
    from tinyloop.cli import main

    src, dst = str(tmp_path / "m.gguf"), str(tmp_path / "m.tinyloop")
    write_gguf(src, Q.Q8_0)
    assert main(["convert", src, dst, "--quiet"]) == 0
    assert read_model(dst).config["n_pre_blocks"] == 2
    assert main(["convert", str(tmp_path / "nope.gguf"), dst]) == 1
    assert "nope.gguf" in capsys.readouterr().err
