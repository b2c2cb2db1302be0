"""tinyloop.convert on tiny random Parcae folders written with the authors' config.json
layout (their config dataclass as a dict) and state-dict tensor names: the engine's logits
and tests/python/reference.py's match an independent numpy float64 forward of the SOURCE
checkpoint (tests/python/looped_oracle.py, from parcae_lm's modeling code) at several
recurrence counts, for the diagonal (released), linear and additive injections; unknown
keys, unsupported options and value embeddings are refused by name, leaving nothing."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

import reference
from tinyloop.convert import convert
from tinyloop.format import read_model

from convert_oracle import rel_err, write_hf_folder
from looped_oracle import parcae_forward

IDS = np.array([3, 17, 5, 40, 8, 61, 23, 2, 11, 70, 9, 33], dtype=np.int32)

# Every field parcae_lm's Config + ParcaeConfig dataclasses write (asdict, less the popped
# _class_name / init), with parcae-small-140m's values at test size: 2 / 2 / 2 layers,
# diagonal injection, qk_norm, ReLU2 MLP, prelude norm, tied embeddings.
PARCAE = dict(
    name="parcae-tiny", hf_config={"org": "SandyResearch", "name": "parcae-tiny"},
    block_size=128, n_embd=48, intermediate_size=96, num_attention_heads=4,
    num_key_value_heads=4, vocab_size=97, padding_multiple=64, padded_vocab_size=128,
    rope_settings={"use_rope": True, "rope_condense_ratio": 1, "rope_base": 50000},
    use_abacus=False, randomize_positions_from=None, block_class_name="TransformerPreNormBlock",
    norm_class_name="RMSNorm", attn_impl="flash", norm_eps=1e-5, mlp_class_name="BaseMLP",
    nonlin_name="ReLU2", bias=False, qk_bias=False, init_strategy="scaled-zero",
    init_orthogonal=True, skip_initialization=False, mup_model_scaling_factor=1,
    use_fused_head="pytorch", debias_attention=False, center_attention=False, clip_qkv=None,
    qk_norm=True, logit_softcap=None, causal=True, activation_checkpoint_impl="per-iteration",
    simple_ops=False, strategy="single", injection_type="diagonal",
    n_layers_in_recurrent_block=2, n_layers_in_prelude=2, n_layers_in_coda=2,
    state_init="zero", recurrent_embedding_dimension=48,
    recurrent_intermediation_embedding_dimension=96, recurrent_num_attention_heads=None,
    prelude_norm=True, sampling_scheme="poisson-truncated-full", mean_recurrence=8,
    mean_backprop_depth=4, lockstep_n=False, lockstep_k=False, curriculum_target="forward",
    recurrent_iteration_method="per-sequence", tie_embeddings=True, model_class_name="Parcae",
    _is_recurrent_block_config=False)


def _engine(path, loops):
    tl = pytest.importorskip("tinyloop_py")
    with tl.Model(path) as model:
        return model.score(IDS, loops=loops)  # [T, V] float32


def _rand(rng, shape, scale):
    a = rng.standard_normal(shape) * scale
    return (1.0 + a if len(shape) == 1 else a).astype(np.float32)  # norms around 1


def parcae_tensors(c, rng):
    D, F, V = c["n_embd"], c["intermediate_size"], c["padded_vocab_size"]
    t = {"transformer.wte.weight": _rand(rng, (V, D), 0.5),
         "transformer.C.weight": _rand(rng, (D, D), 0.15),
         "transformer.ln_f.weight": _rand(rng, (D,), 0.1),
         "freqs_cis": rng.standard_normal((1, c["block_size"], 12, 2)).astype(np.float32)}
    if c["prelude_norm"]:
        t["transformer.ln_prelude.weight"] = _rand(rng, (D,), 0.1)
    if c["injection_type"] == "diagonal":
        # A_log, dt_bias around their init (A = 1, decay ~ sqrt(1/5)), B near identity
        t["transformer.adapter.A_log"] = _rand(rng, (D,), 0.3) - 1.0
        t["transformer.adapter.dt_bias"] = _rand(rng, (D,), 0.3) - 0.5
        t["transformer.adapter.B"] = (np.eye(D) + rng.standard_normal((D, D)) * 0.1).astype(np.float32)
    elif c["injection_type"] == "linear":
        t["transformer.adapter.adapter.weight"] = _rand(rng, (D, 2 * D), 0.08)
    if c["tie_embeddings"]:
        t["lm_head.weight"] = t["transformer.wte.weight"].copy()  # a tied state dict's copy
    else:
        t["lm_head.weight"] = _rand(rng, (V, D), 0.25)
    for group, n in (("prelude", c["n_layers_in_prelude"]),
                     ("core_block", c["n_layers_in_recurrent_block"]),
                     ("coda", c["n_layers_in_coda"])):
        for i in range(n):
            p = f"transformer.{group}.{i}."
            t[p + "norm_1.weight"] = _rand(rng, (D,), 0.1)
            t[p + "norm_2.weight"] = _rand(rng, (D,), 0.1)
            for name in ("attn.c_q", "attn.c_k", "attn.c_v", "attn.c_proj"):
                t[p + name + ".weight"] = _rand(rng, (D, D), 0.15)
            t[p + "mlp.fc.weight"] = _rand(rng, (F, D), 0.15)
            t[p + "mlp.proj.weight"] = _rand(rng, (D, F), 0.15)
    return t


def add_value_embeddings(t, rng, layers=(1, 3, 5), gates=("prelude.1", "core_block.1")):
    """Tables value_embeds.{n} [V, D] and gates attn.ve_gate [KVH, 32] as the authors' code
    makes them; layer 5 (coda.1) gets a table but no gate, which their attention ignores."""
    for n in layers:
        t[f"value_embeds.{n}.weight"] = _rand(rng, (128, 48), 0.4)
    for name in gates:
        t[f"transformer.{name}.attn.ve_gate.weight"] = _rand(rng, (4, 32), 0.3)
    return t


VARIANTS = {
    "released_diagonal": dict(),
    "linear_untied_no_prelude_norm": dict(injection_type="linear", tie_embeddings=False,
                                          prelude_norm=False, qk_norm=False),
    "add": dict(injection_type="add", n_layers_in_recurrent_block=1),
    "value_embeddings": dict(),  # + add_value_embeddings
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("steps", [1, 2, 3, 5])
def test_parcae_matches_authors_forward(tmp_path, variant, steps):
    c = {**PARCAE, **VARIANTS[variant]}
    rng = np.random.default_rng(11)
    t = parcae_tensors(c, rng)
    if variant == "value_embeddings":
        add_value_embeddings(t, rng)
    folder = write_hf_folder(tmp_path / "hf", c, t)
    dst = str(tmp_path / "m.tinyloop")
    convert(folder, dst, progress=False)
    m = read_model(dst)
    assert m.config["default_loops"] == 8 and m.config["vocab_size"] == 128
    assert m.config["init_state"] == "zeros" and m.config["mlp"] == "relu2"
    assert m.config["post_loop_proj"] and m.config["qk_norm"] == c["qk_norm"]
    assert m.config["value_embed_layers"] == ([1, 3] if variant == "value_embeddings" else [])
    want = parcae_forward(t, c, IDS, steps, np.zeros((len(IDS), c["n_embd"])))
    assert rel_err(reference.forward(m.config, m.tensors, IDS, steps), want) < 1e-6
    got = _engine(dst, steps)
    assert rel_err(got, want) < 1e-4, f"{variant} steps {steps}: {rel_err(got, want):.2e}"


def test_like_init_state_keeps_the_authors_distribution(tmp_path):
    c = {**PARCAE, "state_init": "like-init"}
    t = parcae_tensors(c, np.random.default_rng(12))
    folder = write_hf_folder(tmp_path / "hf", c, t)
    dst = str(tmp_path / "m.tinyloop")
    convert(folder, dst, progress=False)
    m = read_model(dst)
    std = math.sqrt(2 / (5 * 48))  # scaled-zero: get_std("embedding"), emb_scale 1
    assert m.config["init_state"] == "random"
    assert m.config["init_state_std"] == pytest.approx(std)
    # The same distribution, drawn by the engine's documented generator (not torch's RNG).
    s0 = reference.random_state(m.config["init_state_seed"], np.arange(len(IDS)), 48, std)
    want = parcae_forward(t, c, IDS, 3, s0)
    assert rel_err(reference.forward(m.config, m.tensors, IDS, 3), want) < 1e-6
    assert rel_err(_engine(dst, 3), want) < 1e-4


def test_cached_decode_and_store_h_kv(tmp_path):
    # qk_norm also runs on K rebuilt from stored h (store-h modes) and on decoded tokens.
    tl = pytest.importorskip("tinyloop_py")
    c = dict(PARCAE)
    t = parcae_tensors(c, np.random.default_rng(13))
    dst = str(tmp_path / "m.tinyloop")
    convert(write_hf_folder(tmp_path / "hf", c, t), dst, progress=False)
    m = read_model(dst)
    with tl.Model(dst, kv_mode="fp32") as model:
        got = model.generate(IDS[:5], max_tokens=8, loops=3, stop_at_eos=False)
    assert got == reference.generate(m.config, m.tensors, IDS[:5], 8, 3, eos_ids=[])
    with tl.Model(dst, kv_mode="h_fp16") as model:  # prefill 4 tokens, decode the rest
        store_h = tl._testing.stepwise_logits(model, IDS, 4, loops=3)
    want = parcae_forward(t, c, IDS, 3, np.zeros((len(IDS), 48)))
    assert rel_err(store_h, want[3:]) < 1e-2  # rows of positions 3 .. T-1; h stored as halves


def _refused(tmp_path, over, match, edit=None):
    c = {**PARCAE, **over}
    t = parcae_tensors(PARCAE, np.random.default_rng(0))
    if edit:
        edit(t)
    folder = write_hf_folder(tmp_path / "hf", c, t)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match=match):
        convert(str(folder), str(out / "m.tinyloop"), progress=False)
    assert os.listdir(out) == []


def test_unknown_key_is_refused(tmp_path):
    _refused(tmp_path, {"state_noise_std": 0.1},
             r"config key 'state_noise_std' is not understood by the Parcae converter")


def test_value_embeddings_decode_with_their_tokens_and_refuse_store_h(tmp_path):
    # Every decoded token looks up its own table row in each of its layers.
    tl = pytest.importorskip("tinyloop_py")
    c = dict(PARCAE)
    rng = np.random.default_rng(14)
    t = add_value_embeddings(parcae_tensors(c, rng), rng)
    dst = str(tmp_path / "m.tinyloop")
    convert(write_hf_folder(tmp_path / "hf", c, t), dst, progress=False)
    m = read_model(dst)
    with tl.Model(dst, kv_mode="fp32") as model:
        got = model.generate(IDS[:5], max_tokens=8, loops=3, stop_at_eos=False)
        stepwise = tl._testing.stepwise_logits(model, IDS, 4, loops=3)  # prefill 4 tokens, decode the rest
    assert got == reference.generate(m.config, m.tensors, IDS[:5], 8, 3, eos_ids=[])
    want = parcae_forward(t, c, IDS, 3, np.zeros((len(IDS), 48)))
    assert rel_err(stepwise, want[3:]) < 1e-4  # rows of positions 3 .. T-1
    with tl.Model(dst, kv_mode="fp32") as model:  # warm-start resume keeps the prompt's tokens
        h = model.build_resume_handle(IDS[:5], loops=2, max_loops=4, max_tokens=8)
        assert model.resume_generate(h, loops=3, stop_at_eos=False) == got
    # Store-h rebuilds V from stored h rows, which carry no token: refused, not wrong.
    with tl.Model(dst, kv_mode="h_fp16") as model:
        with pytest.raises(ValueError, match=r"store-h kv_mode .* does not support value embeddings"):
            tl._testing.stepwise_logits(model, IDS, 4, loops=3)


def test_value_embedding_of_a_missing_layer_is_refused(tmp_path):
    # value_embeds.{n} for n beyond the 6 layers belongs to no layer of this config.
    _refused(tmp_path, {}, r"tensor 'value_embeds.9.weight' is not used",
             edit=lambda t: t.update({"value_embeds.9.weight": np.zeros((128, 48), np.float32)}))


@pytest.mark.parametrize("over, match", [
    ({"nonlin_name": "GELU"}, r"'nonlin_name' = 'GELU' is not supported \(only 'ReLU2'"),
    ({"logit_softcap": 15.0}, r"'logit_softcap' = 15.0 is not supported"),
    ({"init_strategy": "takase"}, r"'init_strategy' = 'takase' is not supported"),
    ({"num_key_value_heads": 2}, r"'num_key_value_heads' = 2 differs from 4: .*grouped-query"),
    ({"recurrent_embedding_dimension": 64}, r"'recurrent_embedding_dimension' = 64 differs"),
    ({"injection_type": "swiglu-add"}, r"'injection_type' = 'swiglu-add' is not supported"),
    ({"state_init": "unit"}, r"'state_init' = 'unit' is not supported"),
    ({"use_fused_head": "full-triton"}, r"'use_fused_head' = 'full-triton' is not supported"),
    ({"rope_settings": {"use_rope": True, "rope_condense_ratio": 2, "rope_base": 50000}},
     r"'rope_settings' .* only use_rope true with rope_condense_ratio 1"),
])
def test_unsupported_values_are_refused(tmp_path, over, match):
    _refused(tmp_path, over, match)
