"""Hugging Face transformers as the oracle of the Llama importer (issue #3): random tiny
`LlamaForCausalLM`s built by transformers itself and written with `save_pretrained` convert
with `tinyloop.convert` and run in `tinyloop_py` with transformers' own logits (within 1e-4
of the logit scale, the measure of tests/python/test_convert_hf.py) and the same greedy
32-token continuation as `model.generate(do_sample=False)`.

Needs torch and transformers (scripts/test-oracles.sh installs the pinned versions); skips,
saying so, without them. The numpy oracle of tests/python/test_convert_hf.py checks the same
mapping against formulas written from the HF code; this one runs the HF code.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not installed (scripts/test-oracles.sh installs it)")
transformers = pytest.importorskip("transformers",
                                   reason="transformers not installed (scripts/test-oracles.sh installs it)")
tl = pytest.importorskip("tinyloop_py")

from convert_oracle import rel_err  # noqa: E402  (tests/python, put on sys.path by conftest)
from tinyloop.convert import convert  # noqa: E402
from tinyloop.format import read_model  # noqa: E402

PROMPT = [1, 17, 5, 40, 8, 61, 23, 2, 11, 70, 9, 33]  # includes BOS and EOS ids mid-prompt
N_GEN = 32
TOL = 1e-4

BASE = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=4,
            num_hidden_layers=3, vocab_size=101, max_position_embeddings=128, rms_norm_eps=1e-5,
            rope_theta=10000.0, bos_token_id=1, eos_token_id=2, pad_token_id=0)

# name -> (config overrides, dtype the weights are saved in)
VARIANTS = {
    "mha_f32": (dict(), torch.float32),
    "gqa_4layers_f32": (dict(num_key_value_heads=2, num_hidden_layers=4, rope_theta=50000.0,
                             rms_norm_eps=1e-6), torch.float32),
    "mqa_tied_f32": (dict(num_key_value_heads=1, tie_word_embeddings=True), torch.float32),
    "attn_mlp_bias_f32": (dict(num_key_value_heads=2, attention_bias=True, mlp_bias=True),
                          torch.float32),
    # head_dim != hidden / heads: q_proj is [H * 24, 64], o_proj [64, H * 24]
    "explicit_head_dim_f32": (dict(head_dim=24, num_key_value_heads=2, num_hidden_layers=2),
                              torch.float32),
    "one_layer_f32": (dict(num_hidden_layers=1), torch.float32),
    "gqa_bias_tied_bf16": (dict(num_key_value_heads=2, attention_bias=True, mlp_bias=True,
                                tie_word_embeddings=True), torch.bfloat16),
    "gqa_head_dim_f16": (dict(num_key_value_heads=2, head_dim=24), torch.float16),
}


def _build(over: dict, seed: int):
    """A transformers LlamaForCausalLM with weights large enough to give distinct logits:
    the library's init (std 0.02) makes near-uniform logits where greedy decoding compares
    ties. Norm weights around 1, matrices ~N(0, 0.2^2), embeddings ~N(0, 0.5^2)."""
    cfg = transformers.LlamaConfig(**{**BASE, **over})
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * r)
            elif name.endswith(".bias"):
                p.copy_(0.1 * r)
            elif "embed_tokens" in name:
                p.copy_(0.5 * r)
            else:
                p.copy_(0.2 * r)
    return model


def _hf_logits(model) -> np.ndarray:
    with torch.inference_mode():
        return model(torch.tensor([PROMPT])).logits[0].double().numpy()  # [T, V]


def _hf_greedy(model) -> list[int]:
    model.generation_config.eos_token_id = None  # never stop early: 32 tokens on both sides
    with torch.inference_mode():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=N_GEN, do_sample=False,
                             pad_token_id=0)
    return out[0].tolist()  # prompt + new tokens


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_save_pretrained_converts_and_matches_transformers(tmp_path, variant):
    over, dtype = VARIANTS[variant]
    model = _build(over, seed=len(variant))
    # Save in the checkpoint dtype; the oracle is transformers in float32 on the SAME rounded
    # weights (bf16 / f16 -> float32 is exact), so only the engine's arithmetic differs.
    # Rounded in place rather than model.to(dtype).float(): that would round the RoPE
    # inv_freq buffer too, a different function.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).float())
    copy.deepcopy(model).to(dtype).save_pretrained(tmp_path / "hf", safe_serialization=True)
    want = _hf_logits(model)

    dst = str(tmp_path / "m.tinyloop")
    convert(str(tmp_path / "hf"), dst, progress=False)
    m = read_model(dst)
    c = model.config
    assert m.config["n_pre_blocks"] + m.config["n_loop_layers"] == c.num_hidden_layers
    assert m.config["tie_embeddings"] == bool(c.tie_word_embeddings)
    stored = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}[dtype]
    assert m.dtypes["loop.0.attn.wq.weight"] == stored

    # kv_mode fp32: generation keeps K/V exactly, as transformers' DynamicCache does.
    with tl.Model(dst, kv_mode="fp32") as engine:
        got = engine.score(np.array(PROMPT, np.int32), loops=1)  # [T, V]
        err = rel_err(got, want)
        print(f"\n{variant}: max |logit diff| {np.max(np.abs(got - want)):.3e}, "
              f"relative to the logit scale {err:.3e} (max |logit| {np.max(np.abs(want)):.2f})")
        assert err < TOL, f"{variant}: {err:.2e}"
        assert (got.argmax(-1) == want.argmax(-1)).all()
        ours = engine.generate(PROMPT, max_tokens=N_GEN, temperature=0.0, stop_at_eos=False)
    theirs = _hf_greedy(model)
    assert len(theirs) == len(PROMPT) + N_GEN
    assert ours == theirs, f"{variant}: greedy continuations differ\n ours   {ours}\n theirs {theirs}"


def test_default_fp16_kv_greedy_matches(tmp_path):
    """The default generation path (fp16 K/V) on a plain GQA model: same 32 greedy tokens."""
    model = _build(dict(num_key_value_heads=2), seed=7)
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    dst = str(tmp_path / "m.tinyloop")
    convert(str(tmp_path / "hf"), dst, progress=False)
    with tl.Model(dst) as engine:
        ours = engine.generate(PROMPT, max_tokens=N_GEN, temperature=0.0, stop_at_eos=False)
    assert ours == _hf_greedy(model)
