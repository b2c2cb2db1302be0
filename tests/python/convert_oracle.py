"""Independent numpy float64 forwards of the SOURCE models, written from the Hugging Face /
llama.cpp formulas and reading the SOURCE tensor names (not through tinyloop.convert's
mapping nor tests/python/reference.py), for the converter tests; plus the tiny checkpoint writers.

Shapes: T tokens, D width, H query heads, KVH kv heads, hd head size, F MLP width, V vocab.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np


def rel_err(a, b) -> float:
    """max |a - b| / max |b| (relative to the logit scale)."""
    b = np.asarray(b, np.float64)
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


def _f(t, name):
    return np.asarray(t[name], dtype=np.float64)


def rms(x, w, eps):
    """HF LlamaRMSNorm / Huginn RMSNorm_llama: x * rsqrt(mean(x^2) + eps) * w."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def _inv_freq(hd, theta):
    return 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)  # [hd/2]


def rope_rotate_half(x, theta):
    """HF apply_rotary_pos_emb: x [T, nh, hd]; cos/sin = cat(freqs, freqs);
    x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1)."""
    T, _, hd = x.shape
    freqs = np.outer(np.arange(T), _inv_freq(hd, theta))  # [T, hd/2]
    emb = np.concatenate([freqs, freqs], axis=-1)[:, None, :]  # [T, 1, hd]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * np.cos(emb) + np.concatenate([-x2, x1], axis=-1) * np.sin(emb)


def rope_adjacent(x, theta):
    """Huginn apply_rotary_emb_complex_like / llama.cpp rope mode 0: the pairs (2i, 2i+1)
    as complex numbers times exp(i * pos * freq_i). x [T, nh, hd]."""
    T, nh, hd = x.shape
    ang = np.outer(np.arange(T), _inv_freq(hd, theta))[:, None, :]  # [T, 1, hd/2]
    z = x[..., 0::2] + 1j * x[..., 1::2]  # [T, nh, hd/2]
    z = z * np.exp(1j * ang)
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


def attention(q, k, v):
    """Causal softmax attention, GQA by repeating kv heads. q [T, H, hd], k/v [T, KVH, hd]
    -> [T, H * hd]."""
    T, H, hd = q.shape
    rep = H // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)  # [T, H, hd]
    s = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd)  # [H, T, T]
    s = np.where(np.tril(np.ones((T, T), bool))[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", p, v).reshape(T, H * hd)


def _lin(t, name, x):
    y = x @ _f(t, name + ".weight").T
    return y + _f(t, name + ".bias") if name + ".bias" in t else y


# ---------------------------------------------------------------------------------------
# HF LlamaForCausalLM (modeling_llama.py)


def llama_hf_forward(t, c, ids):
    D, H = c["hidden_size"], c["num_attention_heads"]
    KVH = c.get("num_key_value_heads", H)
    hd = c.get("head_dim") or D // H
    eps, theta = c["rms_norm_eps"], c.get("rope_theta", 10000.0)
    h = _f(t, "model.embed_tokens.weight")[ids]  # [T, D]
    T = len(ids)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms(h, _f(t, p + "input_layernorm.weight"), eps)
        q = rope_rotate_half(_lin(t, p + "self_attn.q_proj", x).reshape(T, H, hd), theta)
        k = rope_rotate_half(_lin(t, p + "self_attn.k_proj", x).reshape(T, KVH, hd), theta)
        v = _lin(t, p + "self_attn.v_proj", x).reshape(T, KVH, hd)
        h = h + _lin(t, p + "self_attn.o_proj", attention(q, k, v))
        x = rms(h, _f(t, p + "post_attention_layernorm.weight"), eps)
        g = _lin(t, p + "mlp.gate_proj", x)
        h = h + _lin(t, p + "mlp.down_proj", silu(g) * _lin(t, p + "mlp.up_proj", x))
    h = rms(h, _f(t, "model.norm.weight"), eps)
    head = "model.embed_tokens.weight" if c.get("tie_word_embeddings") else "lm_head.weight"
    return h @ _f(t, head).T  # [T, V]


# ---------------------------------------------------------------------------------------
# GGUF llama as llama.cpp runs it (llm_build_llama): rope mode 0 = adjacent pairs


def llama_gguf_forward(t, m, ids):
    """t: GGUF tensor names -> float arrays [rows, cols] (dequantized); m: metadata dict."""
    D, H, KVH = m["embedding_length"], m["head_count"], m["head_count_kv"]
    hd, eps, theta = D // H, m["eps"], m["freq_base"]
    h = _f(t, "token_embd.weight")[ids]
    T = len(ids)
    for i in range(m["block_count"]):
        p = f"blk.{i}."
        x = rms(h, _f(t, p + "attn_norm.weight"), eps)
        q = rope_adjacent((x @ _f(t, p + "attn_q.weight").T).reshape(T, H, hd), theta)
        k = rope_adjacent((x @ _f(t, p + "attn_k.weight").T).reshape(T, KVH, hd), theta)
        v = (x @ _f(t, p + "attn_v.weight").T).reshape(T, KVH, hd)
        h = h + attention(q, k, v) @ _f(t, p + "attn_output.weight").T
        x = rms(h, _f(t, p + "ffn_norm.weight"), eps)
        g, u = x @ _f(t, p + "ffn_gate.weight").T, x @ _f(t, p + "ffn_up.weight").T
        h = h + (silu(g) * u) @ _f(t, p + "ffn_down.weight").T
    h = rms(h, _f(t, "output_norm.weight"), eps)
    head = "output.weight" if "output.weight" in t else "token_embd.weight"
    return h @ _f(t, head).T


# ---------------------------------------------------------------------------------------
# Huginn-0125 (raven_modeling_minimal.py)


def _sandwich(t, c, p, x):
    D, H = c["n_embd"], c["num_attention_heads"]
    hd, eps, T = D // H, c["norm_eps"], x.shape[0]
    y = rms(x, _f(t, p + "norm_1.weight"), eps)
    qkv = y @ _f(t, p + "attn.Wqkv.weight").T  # [T, 3D] rows q|k|v
    q, k, v = (a.reshape(T, H, hd) for a in np.split(qkv, 3, axis=1))
    if c.get("qk_bias"):
        b = _f(t, p + "attn.qk_bias")  # [2, 1, H, hd]
        q, k = q + b[0], k + b[1]
    q, k = rope_adjacent(q, c["rope_base"]), rope_adjacent(k, c["rope_base"])
    a = attention(q, k, v) @ _f(t, p + "attn.proj.weight").T
    x = rms(a + x, _f(t, p + "norm_2.weight"), eps)
    fc = rms(x, _f(t, p + "norm_3.weight"), eps) @ _f(t, p + "mlp.fc.weight").T  # [T, 2F]
    g, u = np.split(fc, 2, axis=1)
    m = (silu(g) * u) @ _f(t, p + "mlp.proj.weight").T
    return rms(m + x, _f(t, p + "norm_4.weight"), eps)


def huginn_forward(t, c, ids, num_steps, state):
    """state: the initial latent [T, D] (Huginn draws it at random; zeros at init_scale 0)."""
    eps = c["norm_eps"]
    e = _f(t, "transformer.wte.weight")[ids] * math.sqrt(c["n_embd"])
    for i in range(c["n_layers_in_prelude"]):
        e = _sandwich(t, c, f"transformer.prelude.{i}.", e)
    x = np.asarray(state, np.float64)
    for _ in range(num_steps):
        x = np.concatenate([x, e], axis=1) @ _f(t, "transformer.adapter.weight").T
        for i in range(c["n_layers_in_recurrent_block"]):
            x = _sandwich(t, c, f"transformer.core_block.{i}.", x)
    x = rms(x, _f(t, "transformer.ln_f.weight"), eps)
    for i in range(c["n_layers_in_coda"]):
        x = _sandwich(t, c, f"transformer.coda.{i}.", x)
    x = rms(x, _f(t, "transformer.ln_f.weight"), eps)
    head = "transformer.wte.weight" if c.get("tie_embeddings") else "lm_head.weight"
    return x @ _f(t, head).T


# ---------------------------------------------------------------------------------------
# Ouro (modeling_ouro.py)


def ouro_forward(t, c, ids, steps):
    D, H = c["hidden_size"], c["num_attention_heads"]
    KVH, hd = c.get("num_key_value_heads", H), c.get("head_dim") or D // H
    eps, theta, T = c["rms_norm_eps"], c["rope_theta"], len(ids)
    h = _f(t, "model.embed_tokens.weight")[ids]
    for _ in range(steps):
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            x = rms(h, _f(t, p + "input_layernorm.weight"), eps)
            q = rope_rotate_half(_lin(t, p + "self_attn.q_proj", x).reshape(T, H, hd), theta)
            k = rope_rotate_half(_lin(t, p + "self_attn.k_proj", x).reshape(T, KVH, hd), theta)
            v = _lin(t, p + "self_attn.v_proj", x).reshape(T, KVH, hd)
            a = _lin(t, p + "self_attn.o_proj", attention(q, k, v))
            h = h + rms(a, _f(t, p + "input_layernorm_2.weight"), eps)
            x = rms(h, _f(t, p + "post_attention_layernorm.weight"), eps)
            m = _lin(t, p + "mlp.down_proj", silu(_lin(t, p + "mlp.gate_proj", x)) *
                     _lin(t, p + "mlp.up_proj", x))
            h = h + rms(m, _f(t, p + "post_attention_layernorm_2.weight"), eps)
        h = rms(h, _f(t, "model.norm.weight"), eps)
    head = "model.embed_tokens.weight" if c.get("tie_word_embeddings") else "lm_head.weight"
    return h @ _f(t, head).T


# ---------------------------------------------------------------------------------------
# writing HF folders


def write_hf_folder(folder, config: dict, tensors: dict, shards: int = 1,
                    tokenizer_json: str | None = None, tokenizer_config: dict | None = None,
                    generation_config: dict | None = None):
    """config.json + *.safetensors (sharded with model.safetensors.index.json when
    shards > 1) + optional tokenizer files. tensors: name -> float32/float16 array."""
    from safetensors.numpy import save_file

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    names = list(tensors)
    if shards == 1:
        save_file({n: np.ascontiguousarray(tensors[n]) for n in names},
                  os.path.join(folder, "model.safetensors"))
    else:
        weight_map = {}
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = names[s::shards]
            save_file({n: np.ascontiguousarray(tensors[n]) for n in part},
                      os.path.join(folder, fname))
            weight_map.update({n: fname for n in part})
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
    if tokenizer_json is not None:
        with open(os.path.join(folder, "tokenizer.json"), "w") as f:
            f.write(tokenizer_json)
    if tokenizer_config is not None:
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump(tokenizer_config, f)
    if generation_config is not None:
        with open(os.path.join(folder, "generation_config.json"), "w") as f:
            json.dump(generation_config, f)
    return folder


def save_bf16_safetensors(path, tensors: dict):
    """A safetensors file with BF16 tensors (safetensors.numpy cannot write them): the
    values are rounded to bfloat16 first; returns the float32 values actually stored."""
    import struct

    from tinyloop.format import from_bf16_bits, to_bf16_bits

    header, blobs, offset, stored = {}, [], 0, {}
    for name, a in tensors.items():
        bits = to_bf16_bits(np.asarray(a, np.float32)).astype("<u2")
        stored[name] = from_bf16_bits(bits)
        header[name] = {"dtype": "BF16", "shape": list(bits.shape),
                        "data_offsets": [offset, offset + bits.nbytes]}
        blobs.append(bits.tobytes())
        offset += bits.nbytes
    text = json.dumps(header).encode()
    text += b" " * ((-len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return stored
