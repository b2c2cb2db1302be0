"""tinyloop.convert on tiny random Hugging Face folders written here with the exact tensor
names and config fields of LlamaForCausalLM, Huginn-0125 (huginn_raven) and Ouro: the
engine's logits match an independent numpy float64 forward of the SOURCE checkpoint
(tests/python/convert_oracle.py, written from the HF formulas) within 1e-4 of the logit
scale; bad folders are refused by name and leave nothing behind."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

from tinyloop.convert import convert
from tinyloop.format import read_model
import reference

from convert_oracle import (huginn_forward, llama_hf_forward, ouro_forward, rel_err,
                            save_bf16_safetensors, write_hf_folder)

IDS = np.array([3, 17, 5, 40, 8, 61, 23, 2, 11, 70, 9, 33], dtype=np.int32)


def _engine(path, loops):
    tl = pytest.importorskip("tinyloop_py")
    with tl.Model(path) as model:
        return model.score(IDS, loops=loops)  # [T, V] float32


def _rand(rng, shape, scale=0.25, dtype=np.float32):
    a = rng.standard_normal(shape) * scale
    if len(shape) == 1:
        a = 1.0 + a  # norm weights around 1
    return a.astype(dtype)


def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3},
                                     unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok.to_str()


# ---------------------------------------------------------------------------------------
# Llama


LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64,
             intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=3, rms_norm_eps=1e-5, rope_theta=10000.0,
             max_position_embeddings=128, vocab_size=101, tie_word_embeddings=False,
             attention_bias=False, mlp_bias=False, hidden_act="silu", bos_token_id=1,
             eos_token_id=2, rope_scaling=None, pretraining_tp=1, torch_dtype="float32")


def llama_tensors(c, rng, dtype=np.float32):
    D, H = c["hidden_size"], c["num_attention_heads"]
    KVH, hd = c["num_key_value_heads"], c.get("head_dim") or D // H
    F, V = c["intermediate_size"], c["vocab_size"]
    t = {"model.embed_tokens.weight": _rand(rng, (V, D), 0.5, dtype),
         "model.norm.weight": _rand(rng, (D,), 0.1, dtype)}
    if not c["tie_word_embeddings"]:
        t["lm_head.weight"] = _rand(rng, (V, D), 0.25, dtype)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes = {"self_attn.q_proj": (H * hd, D), "self_attn.k_proj": (KVH * hd, D),
                  "self_attn.v_proj": (KVH * hd, D), "self_attn.o_proj": (D, H * hd),
                  "mlp.gate_proj": (F, D), "mlp.up_proj": (F, D), "mlp.down_proj": (D, F)}
        for name, shape in shapes.items():
            t[p + name + ".weight"] = _rand(rng, shape, 0.2, dtype)
            bias = c["mlp_bias"] if name.startswith("mlp") else c["attention_bias"]
            if bias:
                t[p + name + ".bias"] = _rand(rng, (shape[0],), 0.1, dtype) - 1.0
        t[p + "input_layernorm.weight"] = _rand(rng, (D,), 0.1, dtype)
        t[p + "post_attention_layernorm.weight"] = _rand(rng, (D,), 0.1, dtype)
    return t


LLAMA_VARIANTS = {
    "plain_f32": (dict(), np.float32, 1),
    # tied head, q/k/v/o and MLP biases, head_dim != hidden/heads, 2 shards, F16 storage
    "tied_bias_headdim_sharded_f16": (dict(tie_word_embeddings=True, attention_bias=True,
                                           mlp_bias=True, head_dim=24, num_key_value_heads=1),
                                      np.float16, 2),
    "one_layer": (dict(num_hidden_layers=1, num_key_value_heads=4), np.float32, 1),
}


@pytest.mark.parametrize("variant", list(LLAMA_VARIANTS))
def test_llama_matches_hf_formulas(tmp_path, variant):
    over, dtype, shards = LLAMA_VARIANTS[variant]
    c = {**LLAMA, **over}
    t = llama_tensors(c, np.random.default_rng(1), dtype)
    tok = _tokenizer_json()
    folder = write_hf_folder(tmp_path / "hf", c, t, shards=shards, tokenizer_json=tok,
                             tokenizer_config={"chat_template": "{{ messages }}"},
                             generation_config={"eos_token_id": [2, 7]})
    dst = str(tmp_path / "m.tinyloop")
    convert(folder, dst, progress=False)
    m = read_model(dst)
    N = c["num_hidden_layers"]
    assert (m.config["n_pre_blocks"], m.config["n_loop_layers"], m.config["default_loops"]) == (N - 1, 1, 1)
    assert m.config["pos_encoding"] == "rope_half" and m.config["eos_ids"] == [2, 7]
    assert m.config["bos_id"] == 1 and m.config["tie_embeddings"] == c["tie_word_embeddings"]
    assert m.tokenizer_json == tok and m.chat_template == "{{ messages }}"
    assert m.dtypes["embed.weight"] == ("F16" if dtype == np.float16 else "F32")
    want = llama_hf_forward(t, c, IDS)
    assert rel_err(reference.forward(m.config, m.tensors, IDS, 1), want) < 1e-9
    got = _engine(dst, 1)
    assert rel_err(got, want) < 1e-4, f"{variant}: {rel_err(got, want):.2e}"


def test_llama_bf16_checkpoint_keeps_bf16(tmp_path):
    c = dict(LLAMA)
    t = llama_tensors(c, np.random.default_rng(2))
    folder = tmp_path / "hf"
    write_hf_folder(folder, c, {}, shards=1)
    os.remove(folder / "model.safetensors")
    t = save_bf16_safetensors(folder / "model.safetensors", t)  # the values really stored
    dst = str(tmp_path / "m.tinyloop")
    convert(str(folder), dst, progress=False)
    m = read_model(dst)
    assert m.dtypes["pre.0.attn.wq.weight"] == "BF16" and m.dtypes["final_norm.weight"] == "F32"
    np.testing.assert_array_equal(m.tensors["head.weight"], t["lm_head.weight"])
    got, want = _engine(dst, 1), llama_hf_forward(t, c, IDS)
    assert rel_err(got, want) < 1e-4


def test_transformers_llama_save_pretrained(tmp_path):
    try:
        import torch
        import transformers
    except ImportError as e:
        pytest.skip(f"torch / transformers not installed ({e}); the HF-formula oracle above "
                    f"covers the mapping")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4,
                                   num_key_value_heads=2, num_hidden_layers=2, vocab_size=101,
                                   max_position_embeddings=128, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    with torch.no_grad():
        want = model(torch.tensor(IDS[None], dtype=torch.long)).logits[0].double().numpy()
    dst = str(tmp_path / "m.tinyloop")
    convert(str(tmp_path / "hf"), dst, progress=False)
    assert rel_err(_engine(dst, 1), want) < 1e-4


# ---------------------------------------------------------------------------------------
# Huginn-0125


HUGINN = dict(architectures=["RavenForCausalLM"], model_type="huginn_raven", n_embd=64,
              num_attention_heads=4, num_key_value_heads=4, intermediate_size=96,
              vocab_size=101, padded_vocab_size=101, n_layers=4, n_layers_in_prelude=1,
              n_layers_in_recurrent_block=2, n_layers_in_coda=1, injection_type="linear",
              state_init="zero", mean_recurrence=5, mean_backprop_depth=2,
              block_class_name="SandwichBlock", mlp_class_name="GatedMLP", nonlin_name="SiLU",
              norm_class_name="RMSNorm_llama", norm_eps=1e-6, qk_bias=True,
              tie_embeddings=True, rope_base=50000.0, block_size=128, bias=False,
              bos_token_id=1, eos_token_id=2)


def huginn_tensors(c, rng):
    D, H, F, V = c["n_embd"], c["num_attention_heads"], c["intermediate_size"], c["vocab_size"]
    hd = D // H
    # Matrices small enough that the loop contracts: random weights with larger ones make
    # an expanding map, where float32 rounding grows ~10x every few iterations.
    t = {"transformer.wte.weight": _rand(rng, (V, D), 0.15),
         "transformer.adapter.weight": _rand(rng, (D, 2 * D), 0.09),
         "transformer.ln_f.weight": _rand(rng, (D,), 0.1),
         "freqs_cis": rng.standard_normal((1, c["block_size"], 1, hd // 2, 2)).astype(np.float32)}
    if c["tie_embeddings"]:
        t["lm_head.weight"] = t["transformer.wte.weight"].copy()  # the released duplicate
    else:
        t["lm_head.weight"] = _rand(rng, (V, D), 0.25)
    for group, n in (("prelude", c["n_layers_in_prelude"]),
                     ("core_block", c["n_layers_in_recurrent_block"]),
                     ("coda", c["n_layers_in_coda"])):
        for i in range(n):
            p = f"transformer.{group}.{i}."
            for k in range(1, 5):
                t[p + f"norm_{k}.weight"] = _rand(rng, (D,), 0.1)
            t[p + "attn.Wqkv.weight"] = _rand(rng, (3 * D, D), 0.12)
            t[p + "attn.qk_bias"] = _rand(rng, (2, 1, H, hd), 0.3)
            t[p + "attn.proj.weight"] = _rand(rng, (D, D), 0.12)
            t[p + "mlp.fc.weight"] = _rand(rng, (2 * F, D), 0.12)
            t[p + "mlp.proj.weight"] = _rand(rng, (D, F), 0.12)
    return t


@pytest.mark.parametrize("steps", [1, 3, 8])
def test_huginn_zero_state_matches_hf_formulas(tmp_path, steps):
    c = dict(HUGINN)
    t = huginn_tensors(c, np.random.default_rng(3))
    folder = write_hf_folder(tmp_path / "hf", c, t, shards=3,
                             generation_config={"eos_token_id": [2, 5]})
    dst = str(tmp_path / "m.tinyloop")
    convert(folder, dst, progress=False)
    m = read_model(dst)
    assert m.config["default_loops"] == 5 and m.config["init_state"] == "zeros"
    assert m.config["embed_scale"] == pytest.approx(8.0) and m.config["eos_ids"] == [2, 5]
    want = huginn_forward(t, c, IDS, steps, np.zeros((len(IDS), 64)))
    got = _engine(dst, steps)
    assert rel_err(got, want) < 1e-4, f"steps {steps}: {rel_err(got, want):.2e}"


def test_huginn_like_init_state_and_untied_head(tmp_path):
    c = {**HUGINN, "state_init": "like-init", "tie_embeddings": False, "qk_bias": False}
    t = huginn_tensors(c, np.random.default_rng(4))
    t = {k: v for k, v in t.items() if not k.endswith("qk_bias")}
    c["init_values"] = {"std": math.sqrt(2 / (5 * 64)), "embed_scale": 8.0}
    folder = write_hf_folder(tmp_path / "hf", c, t)
    dst = str(tmp_path / "m.tinyloop")
    convert(folder, dst, progress=False)
    m = read_model(dst)
    std = math.sqrt(2 / (5 * 64)) * 8.0  # initialize_state: trunc_normal(std) * emb_scale
    assert m.config["init_state"] == "random"
    assert m.config["init_state_std"] == pytest.approx(std)
    # Same distribution as Huginn's, but drawn by the engine's documented generator.
    s0 = reference.random_state(m.config["init_state_seed"], np.arange(len(IDS)), 64, std)
    want = huginn_forward(t, c, IDS, 2, s0)
    got = _engine(dst, 2)
    assert rel_err(got, want) < 1e-4


# ---------------------------------------------------------------------------------------
# Ouro


OURO = dict(architectures=["OuroForCausalLM"], model_type="ouro", hidden_size=64,
            intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            num_hidden_layers=2, rms_norm_eps=1e-6, rope_theta=1000000.0,
            max_position_embeddings=128, vocab_size=101, tie_word_embeddings=False,
            total_ut_steps=4, early_exit_threshold=1.0, hidden_act="silu",
            use_sliding_window=False, sliding_window=None, rope_scaling=None,
            layer_types=["full_attention", "full_attention"], bos_token_id=1, eos_token_id=2)


def ouro_tensors(c, rng):
    D, H = c["hidden_size"], c["num_attention_heads"]
    KVH, hd = c["num_key_value_heads"], c.get("head_dim") or D // H
    F, V = c["intermediate_size"], c["vocab_size"]
    t = {"model.embed_tokens.weight": _rand(rng, (V, D), 0.5),
         "model.norm.weight": _rand(rng, (D,), 0.1),
         "model.early_exit_gate.weight": _rand(rng, (1, D), 0.2),
         "model.early_exit_gate.bias": _rand(rng, (1,), 0.2) - 1.0,
         "lm_head.weight": _rand(rng, (V, D), 0.25)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, shape in {"self_attn.q_proj": (H * hd, D), "self_attn.k_proj": (KVH * hd, D),
                            "self_attn.v_proj": (KVH * hd, D), "self_attn.o_proj": (D, H * hd),
                            "mlp.gate_proj": (F, D), "mlp.up_proj": (F, D),
                            "mlp.down_proj": (D, F)}.items():
            t[p + name + ".weight"] = _rand(rng, shape, 0.2)
        for n in ("input_layernorm", "input_layernorm_2", "post_attention_layernorm",
                  "post_attention_layernorm_2"):
            t[p + n + ".weight"] = _rand(rng, (D,), 0.1)
    return t


@pytest.mark.parametrize("steps", [1, 4, 8])
def test_ouro_matches_hf_formulas(tmp_path, steps):
    c = dict(OURO)
    t = ouro_tensors(c, np.random.default_rng(5))
    folder = write_hf_folder(tmp_path / "hf", c, t)
    dst = str(tmp_path / "m.tinyloop")
    convert(folder, dst, progress=False)
    m = read_model(dst)
    assert m.config["default_loops"] == 4 and m.config["exit_gate"] and m.config["loop_norm"]
    np.testing.assert_array_equal(m.tensors["exit_gate.bias"], t["model.early_exit_gate.bias"])
    want = ouro_forward(t, c, IDS, steps)
    got = _engine(dst, steps)
    assert rel_err(got, want) < 1e-4, f"steps {steps}: {rel_err(got, want):.2e}"


# ---------------------------------------------------------------------------------------
# refusals: a message naming the problem, and nothing left in the output folder


def _refused(tmp_path, folder, match):
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match=match):
        convert(str(folder), str(out / "m.tinyloop"), progress=False)
    assert os.listdir(out) == []


def _llama_folder(tmp_path, config_over=None, edit=None):
    c = {**LLAMA, **(config_over or {})}
    t = llama_tensors({**LLAMA, **{k: v for k, v in (config_over or {}).items()
                                   if k in LLAMA}}, np.random.default_rng(0))
    if edit:
        edit(t)
    return write_hf_folder(tmp_path / "hf", c, t)


def test_missing_tensor_is_refused(tmp_path):
    folder = _llama_folder(tmp_path, edit=lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    _refused(tmp_path, folder, r"tensor 'model.layers.1.mlp.up_proj.weight' is missing")


def test_unexpected_tensor_is_refused(tmp_path):
    folder = _llama_folder(tmp_path, edit=lambda t: t.update(
        {"model.layers.0.self_attn.q_norm.weight": np.ones(16, np.float32)}))
    _refused(tmp_path, folder, r"tensor 'model.layers.0.self_attn.q_norm.weight' is not used")


def test_shape_mismatch_is_refused(tmp_path):
    folder = _llama_folder(tmp_path, edit=lambda t: t.update(
        {"model.layers.2.self_attn.k_proj.weight": np.ones((64, 64), np.float32)}))
    _refused(tmp_path, folder, r"tensor 'model.layers.2.self_attn.k_proj.weight' has shape "
                               r"\[64, 64\], the config needs \[32, 64\]")


def test_integer_tensor_is_refused(tmp_path):
    folder = _llama_folder(tmp_path, edit=lambda t: t.update(
        {"model.layers.0.mlp.up_proj.weight": np.ones((96, 64), np.int8)}))
    _refused(tmp_path, folder, r"tensor 'model.layers.0.mlp.up_proj.weight' has dtype I8")


def test_rope_scaling_is_refused(tmp_path):
    folder = _llama_folder(tmp_path, {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    _refused(tmp_path, folder, r"config field 'rope_scaling'.*RoPE scaling is not supported")


def test_unsupported_activation_is_refused(tmp_path):
    folder = _llama_folder(tmp_path, {"hidden_act": "gelu"})
    _refused(tmp_path, folder, r"config field 'hidden_act' = 'gelu'")


def test_unsupported_architecture_is_refused(tmp_path):
    folder = _llama_folder(tmp_path, {"architectures": ["MistralForCausalLM"],
                                      "model_type": "mistral"})
    _refused(tmp_path, folder, r"architecture 'MistralForCausalLM' is not supported")


def test_huginn_unsupported_injection_is_refused(tmp_path):
    c = {**HUGINN, "injection_type": "add"}
    folder = write_hf_folder(tmp_path / "hf", c, huginn_tensors(HUGINN, np.random.default_rng(0)))
    _refused(tmp_path, folder, r"config field 'injection_type' = 'add' is not supported")


@pytest.mark.parametrize("key, value", [("partial_rotary_factor", 0.5), ("logit_scale", 2.0),
                                        ("attn_logit_softcapping", 30.0)])
def test_llama_unknown_config_key_is_refused(tmp_path, key, value):
    """No silent acceptance: a key the converter does not know may change outputs."""
    folder = _llama_folder(tmp_path, {key: value})
    _refused(tmp_path, folder, rf"config key '{key}' is not understood by the Llama converter")


def test_llama_ignorable_config_keys_are_accepted(tmp_path):
    folder = _llama_folder(tmp_path, {"torch_dtype": "bfloat16", "_name_or_path": "x/y",
                                      "initializer_range": 0.02, "use_cache": True,
                                      "rope_interleaved": False, "is_llama_config": True})
    convert(folder, str(tmp_path / "m.tinyloop"), progress=False)


@pytest.mark.parametrize("extra, match", [
    ({"center_attn": True}, r"config key 'center_attn' is not understood by the Huginn converter"),
    ({"rope_settings": {"use_rope": False}}, r"'rope_settings.use_rope' = False"),
    ({"rope_settings": {"rope_scale": 2}}, r"config key 'rope_settings.rope_scale' is not understood"),
    ({"init_values": {"embed_scale": 1.0}}, r"'init_values.embed_scale' = 1.0 differs"),
])
def test_huginn_unknown_or_unsupported_config_is_refused(tmp_path, extra, match):
    folder = write_hf_folder(tmp_path / "hf", {**HUGINN, **extra},
                             huginn_tensors(HUGINN, np.random.default_rng(0)))
    _refused(tmp_path, folder, match)


def test_ouro_sliding_window_is_refused(tmp_path):
    c = {**OURO, "layer_types": ["full_attention", "sliding_attention"]}
    folder = write_hf_folder(tmp_path / "hf", c, ouro_tensors(OURO, np.random.default_rng(0)))
    _refused(tmp_path, folder, r"'layer_types' has \['sliding_attention'\]")


def test_broken_shard_index_is_refused(tmp_path):
    c = dict(LLAMA)
    folder = write_hf_folder(tmp_path / "hf", c, llama_tensors(c, np.random.default_rng(0)),
                             shards=2)
    os.remove(os.path.join(folder, "model-00002-of-00002.safetensors"))
    _refused(tmp_path, folder, r"shard 'model-00002-of-00002.safetensors' is missing")


def test_missing_config_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    _refused(tmp_path, tmp_path / "empty", r"no config.json")


def test_chat_template_sources(tmp_path):
    from tinyloop.convert.hf_folder import HFFolder

    c = dict(LLAMA)
    folder = write_hf_folder(tmp_path / "hf", c, llama_tensors(c, np.random.default_rng(0)),
                             tokenizer_config={"chat_template": [
                                 {"name": "tool_use", "template": "T"},
                                 {"name": "default", "template": "D"}]})
    assert HFFolder(folder).chat_template() == "D"
    with open(os.path.join(folder, "chat_template.jinja"), "w") as f:
        f.write("J")  # newer transformers save the template beside tokenizer_config.json
    assert HFFolder(folder).chat_template() == "J"
