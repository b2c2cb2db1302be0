"""Independent numpy float64 forwards of Nanbeige4.2 and Parcae, written from the authors'
modeling code (sources in docs/convert.md) and reading the SOURCE tensor names, for the
converter tests. They share only the textbook pieces (RMSNorm, RoPE, causal attention) with
tests/python/convert_oracle.py, never tinyloop.convert's mapping or tests/python/reference.py.

Shapes: T tokens, D width, H query heads, KVH kv heads, hd head size, F MLP width, V vocab.
"""
from __future__ import annotations

import numpy as np

from convert_oracle import _f, _lin, attention, rms, rope_adjacent, rope_rotate_half, silu

# ---------------------------------------------------------------------------------------
# Nanbeige4.2 (modeling_nanbeige.py: NanbeigeModel.forward, NanbeigeDecoderLayer)


def _nanbeige_layer(t, c, p, h):
    D, H = c["hidden_size"], c["num_attention_heads"]
    KVH, hd = c.get("num_key_value_heads", H), c.get("head_dim") or D // H
    eps, theta, T = c["rms_norm_eps"], c["rope_theta"], h.shape[0]
    x = rms(h, _f(t, p + "input_layernorm.weight"), eps)
    q = rope_rotate_half(_lin(t, p + "self_attn.q_proj", x).reshape(T, H, hd), theta)
    k = rope_rotate_half(_lin(t, p + "self_attn.k_proj", x).reshape(T, KVH, hd), theta)
    v = _lin(t, p + "self_attn.v_proj", x).reshape(T, KVH, hd)
    h = h + _lin(t, p + "self_attn.o_proj", attention(q, k, v))
    x = rms(h, _f(t, p + "post_attention_layernorm.weight"), eps)
    m = silu(_lin(t, p + "mlp.gate_proj", x)) * _lin(t, p + "mlp.up_proj", x)
    return h + _lin(t, p + "mlp.down_proj", m)


def nanbeige_forward(t, c, ids, loops):
    """logits [T, V] after `loops` passes over the layer stack (the model's num_loops when
    run as released)."""
    skip, eps = c.get("skip_loop_final_norm", False), c["rms_norm_eps"]
    norm = _f(t, "model.norm.weight")
    h = _f(t, "model.embed_tokens.weight")[ids]  # [T, D]
    for _ in range(loops):
        for i in range(c["num_hidden_layers"]):
            h = _nanbeige_layer(t, c, f"model.layers.{i}.", h)
        if not skip:
            h = rms(h, norm, eps)  # every loop output, the last included
    if skip:
        h = rms(h, norm, eps)  # only once, after the last loop
    head = "model.embed_tokens.weight" if c.get("tie_word_embeddings") else "lm_head.weight"
    return h @ _f(t, head).T


# ---------------------------------------------------------------------------------------
# Parcae (parcae_lm: models/parcae/parcae.py, modules/{blocks,mixer,mlp,injection}.py)


def _unit_rms(x, eps):
    """torch.nn.functional.rms_norm without a weight over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def _relu2(x):
    """parcae_lm.modules.basic.Relu2: relu(x)^2 * 0.5."""
    return 0.5 * np.maximum(x, 0.0) ** 2


def _parcae_block(t, c, p, layer, x, ids):
    """TransformerPreNormBlock with CausalSelfAttention (value embedding when the layer has
    one) and BaseMLP. x [T, D]; `layer` is the value-embedding index of the block."""
    D, H = c["n_embd"], c["num_attention_heads"]
    KVH, hd = c.get("num_key_value_heads") or H, D // H
    eps, T = c["norm_eps"], x.shape[0]
    theta = c["rope_settings"]["rope_base"]
    y = rms(x, _f(t, p + "norm_1.weight"), eps)
    q = _lin(t, p + "attn.c_q", y).reshape(T, H, hd)
    k = _lin(t, p + "attn.c_k", y).reshape(T, KVH, hd)
    v = _lin(t, p + "attn.c_v", y).reshape(T, KVH, hd)
    ve_name, gate_name = f"value_embeds.{layer}.weight", p + "attn.ve_gate.weight"
    if ve_name in t and gate_name in t:
        ve = _f(t, ve_name)[ids].reshape(T, KVH, hd)
        gate = 2.0 / (1.0 + np.exp(-(y[:, :32] @ _f(t, gate_name).T)))  # [T, KVH] in (0, 2)
        v = v + gate[:, :, None] * ve
    q, k = rope_adjacent(q, theta), rope_adjacent(k, theta)
    if c.get("qk_norm"):
        q, k = _unit_rms(q, np.finfo(np.float32).eps), _unit_rms(k, np.finfo(np.float32).eps)
    x = x + _lin(t, p + "attn.c_proj", attention(q, k, v))
    y = rms(x, _f(t, p + "norm_2.weight"), eps)
    return x + _lin(t, p + "mlp.proj", _relu2(_lin(t, p + "mlp.fc", y)))


def _parcae_inject(t, kind, x, e):
    """modules/injection.py: Diagonal, Linear or Additive injection of e into the state x."""
    if kind == "diagonal":
        dt = np.log1p(np.exp(_f(t, "transformer.adapter.dt_bias")))  # softplus [D]
        decay = np.exp(-dt * np.exp(_f(t, "transformer.adapter.A_log")))  # [D]
        return x * decay + dt * (e @ _f(t, "transformer.adapter.B").T)
    if kind == "linear":
        return np.concatenate([x, e], axis=1) @ _f(t, "transformer.adapter.adapter.weight").T
    return x + e


def parcae_forward(t, c, ids, steps, state):
    """Parcae.forward at `steps` recurrences from the initial state [T, D] (the authors
    draw it at random with state_init like-init; zeros with state_init zero)."""
    p, r, n = c["n_layers_in_prelude"], c["n_layers_in_recurrent_block"], c["n_layers_in_coda"]
    eps = c["norm_eps"]
    e = _f(t, "transformer.wte.weight")[ids]  # emb_scale is 1 for init_strategy scaled-zero
    for i in range(p):
        e = _parcae_block(t, c, f"transformer.prelude.{i}.", i, e, ids)
    if c.get("prelude_norm"):
        e = rms(e, _f(t, "transformer.ln_prelude.weight"), eps)
    x = np.asarray(state, np.float64)
    for _ in range(steps):
        x = _parcae_inject(t, c["injection_type"], x, e)
        for i in range(r):
            x = _parcae_block(t, c, f"transformer.core_block.{i}.", p + i, x, ids)
    x = x @ _f(t, "transformer.C.weight").T
    for i in range(n):
        x = _parcae_block(t, c, f"transformer.coda.{i}.", p + r + i, x, ids)
    x = rms(x, _f(t, "transformer.ln_f.weight"), eps)
    head = "transformer.wte.weight" if c.get("tie_embeddings") else "lm_head.weight"
    return (x @ _f(t, head).T) * 1.0  # init.logit_scale is 1 for scaled-zero
