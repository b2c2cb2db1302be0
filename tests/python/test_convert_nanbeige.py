"""tinyloop.convert on tiny random Nanbeige4.2 folders (NanbeigeForCausalLM) written with
the released model's config keys and tensor names: the engine's logits and
tests/python/reference.py's match an independent numpy float64 forward of the SOURCE checkpoint
(tests/python/looped_oracle.py, from the authors' modeling code) at several loop counts,
with and without skip_loop_final_norm; unknown keys and unsupported options are refused
by name and leave nothing behind."""
from __future__ import annotations

import os

import numpy as np
import pytest

import reference
from tinyloop.convert import convert
from tinyloop.format import read_model

from convert_oracle import rel_err, write_hf_folder
from looped_oracle import nanbeige_forward

IDS = np.array([3, 17, 5, 40, 8, 61, 23, 2, 11, 70, 9, 33], dtype=np.int32)

# The released config.json's keys (docs/convert.md, "Nanbeige4.2"), at test size: head_dim
# differs from hidden_size / heads as in the real model (128 vs 3072 / 48 = 64), GQA 4/2.
NANBEIGE = dict(architectures=["NanbeigeForCausalLM"], model_type="nanbeige",
                auto_map={"AutoConfig": "configuration_nanbeige.NanbeigeConfig",
                          "AutoModelForCausalLM": "modeling_nanbeige.NanbeigeForCausalLM"},
                vocab_size=101, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, kv_channels=16,
                hidden_act="silu", max_position_embeddings=256, rope_theta=70000000,
                rope_scaling=None, attention_bias=False, attention_dropout=0.0,
                rms_norm_eps=1e-05, num_loops=2, loop_loss_weights=[],
                skip_loop_final_norm=False, pretraining_tp=1, tie_word_embeddings=False,
                pad_token_id=0, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16",
                initializer_range=0.02)


def _engine(path, loops):
    tl = pytest.importorskip("tinyloop_py")
    with tl.Model(path) as model:
        return model.score(IDS, loops=loops)  # [T, V] float32


def _rand(rng, shape, scale):
    a = rng.standard_normal(shape) * scale
    return (1.0 + a if len(shape) == 1 else a).astype(np.float32)  # norms around 1


def nanbeige_tensors(c, rng):
    D, H, KVH, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    F, V = c["intermediate_size"], c["vocab_size"]
    t = {"model.embed_tokens.weight": _rand(rng, (V, D), 0.5),
         "model.norm.weight": _rand(rng, (D,), 0.1)}
    if not c["tie_word_embeddings"]:
        t["lm_head.weight"] = _rand(rng, (V, D), 0.25)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes = {"self_attn.q_proj": (H * hd, D), "self_attn.k_proj": (KVH * hd, D),
                  "self_attn.v_proj": (KVH * hd, D), "self_attn.o_proj": (D, H * hd),
                  "mlp.gate_proj": (F, D), "mlp.up_proj": (F, D), "mlp.down_proj": (D, F)}
        for name, shape in shapes.items():
            t[p + name + ".weight"] = _rand(rng, shape, 0.15)
            if c["attention_bias"] and name.startswith("self_attn"):
                t[p + name + ".bias"] = _rand(rng, (shape[0],), 0.1) - 1.0
        t[p + "input_layernorm.weight"] = _rand(rng, (D,), 0.1)
        t[p + "post_attention_layernorm.weight"] = _rand(rng, (D,), 0.1)
    return t


VARIANTS = {
    "released": dict(),
    # the norm only once, after the last loop; attention biases; tied head
    "skip_norm_bias_tied": dict(skip_loop_final_norm=True, attention_bias=True,
                                tie_word_embeddings=True),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("loops", [1, 2, 3, 5])
def test_nanbeige_matches_authors_forward(tmp_path, variant, loops):
    c = {**NANBEIGE, **VARIANTS[variant]}
    t = nanbeige_tensors(c, np.random.default_rng(7))
    folder = write_hf_folder(tmp_path / "hf", c, t, generation_config={"eos_token_id": [2, 9]})
    dst = str(tmp_path / "m.tinyloop")
    convert(folder, dst, progress=False)
    m = read_model(dst)
    skip = c["skip_loop_final_norm"]
    assert m.config["default_loops"] == 2 and m.config["n_loop_layers"] == 3
    assert (m.config["loop_norm"], m.config["final_norm"]) == (not skip, skip)
    assert m.config["head_dim"] == 16 and m.config["eos_ids"] == [2, 9]
    want = nanbeige_forward(t, c, IDS, loops)
    assert rel_err(reference.forward(m.config, m.tensors, IDS, loops), want) < 1e-9
    got = _engine(dst, loops)
    assert rel_err(got, want) < 1e-4, f"{variant} loops {loops}: {rel_err(got, want):.2e}"


def test_loop_loss_weights_set_the_loop_count(tmp_path):
    # NanbeigeModel._get_num_loops: a non-empty list runs len + 1 loops, not num_loops.
    c = {**NANBEIGE, "loop_loss_weights": [0.25, 0.25]}
    folder = write_hf_folder(tmp_path / "hf", c, nanbeige_tensors(c, np.random.default_rng(1)))
    dst = str(tmp_path / "m.tinyloop")
    convert(folder, dst, progress=False)
    assert read_model(dst).config["default_loops"] == 3


def _refused(tmp_path, over, match):
    c = {**NANBEIGE, **over}
    folder = write_hf_folder(tmp_path / "hf", c, nanbeige_tensors(NANBEIGE, np.random.default_rng(0)))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match=match):
        convert(str(folder), str(out / "m.tinyloop"), progress=False)
    assert os.listdir(out) == []


def test_unknown_key_is_refused(tmp_path):
    _refused(tmp_path, {"loop_gate_temperature": 0.5},
             r"config key 'loop_gate_temperature' is not understood by the Nanbeige converter")


@pytest.mark.parametrize("key, value", [("qk_layernorm", True), ("enable_double_loop_split", True),
                                        ("enable_hyper_connection", True),
                                        ("enable_depth_attention", True)])
def test_research_options_are_refused(tmp_path, key, value):
    _refused(tmp_path, {key: value}, rf"config field '{key}' = True: this Nanbeige option")


def test_ngram_embeddings_are_refused(tmp_path):
    _refused(tmp_path, {"emb_neighbor_num": 3, "emb_split_num": 4, "ngram_vocab_size_ratio": 0.5},
             r"turn on n-gram embeddings")


@pytest.mark.parametrize("over, match", [
    ({"skip_loop_final_norm": "yes"}, r"'skip_loop_final_norm': expected true or false"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, r"RoPE scaling is not supported"),
    ({"kv_channels": 8}, r"'kv_channels' = 8 differs from head_dim 16"),
    ({"num_loops": 0}, r"'num_loops' must be >= 1"),
])
def test_unsupported_values_are_refused(tmp_path, over, match):
    _refused(tmp_path, over, match)
