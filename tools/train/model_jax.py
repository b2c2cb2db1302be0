"""The looped model of docs/model-format.md in JAX (the subset the demo model uses).

Parameters are a flat dict keyed by the .tinyloop tensor names, linear weights stored
[out, in] and applied as y = x W^T, so export is a straight copy.

Supported config subset: rmsnorm, norm_placement "pre", separate wq/wk/wv, no biases,
rope_half, swiglu, embed_scale, init_state "zeros" | "input" | "random", inject "none" | "add" |
"linear_concat", loop_norm, post_loop_norm "none" | "own" | "final", final_norm,
tie_embeddings, MHA or GQA.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np


def layer_names(cfg):
    out = [f"pre.{i}." for i in range(cfg["n_pre_blocks"])]
    out += [f"loop.{j}." for j in range(cfg["n_loop_layers"])]
    out += [f"post.{k}." for k in range(cfg["n_post_blocks"])]
    return out


def param_shapes(cfg):
    D, V, H = cfg["dim"], cfg["vocab_size"], cfg["n_heads"]
    KVH = cfg.get("n_kv_heads", H)
    hd = cfg.get("head_dim", D // H)
    F = cfg["ffn_dim"]
    s = {"embed.weight": (V, D)}
    if cfg.get("inject") == "linear_concat":
        s["inject.weight"] = (D, 2 * D)
    for p in layer_names(cfg):
        s[p + "attn_norm.weight"] = (D,)
        s[p + "mlp_norm.weight"] = (D,)
        s[p + "attn.wq.weight"] = (H * hd, D)
        s[p + "attn.wk.weight"] = (KVH * hd, D)
        s[p + "attn.wv.weight"] = (KVH * hd, D)
        s[p + "attn.wo.weight"] = (D, H * hd)
        s[p + "mlp.w_gate.weight"] = (F, D)
        s[p + "mlp.w_up.weight"] = (F, D)
        s[p + "mlp.w_down.weight"] = (D, F)
    if cfg.get("loop_norm"):
        s["loop_norm.weight"] = (D,)
    if cfg.get("post_loop_norm", "none") == "own":
        s["post_loop_norm.weight"] = (D,)
    if cfg.get("final_norm", True):
        s["final_norm.weight"] = (D,)
    if not cfg.get("tie_embeddings"):
        s["head.weight"] = (V, D)
    return s


def init_params(cfg, seed):
    """Deterministic init (numpy PCG64 seeded by `seed`, names in sorted order)."""
    rng = np.random.default_rng(seed)
    D = cfg["dim"]
    n_eff = cfg["n_pre_blocks"] + cfg["default_loops"] * cfg["n_loop_layers"] + cfg["n_post_blocks"]
    out_std = 0.02 / math.sqrt(2 * n_eff)
    params = {}
    for name, shape in sorted(param_shapes(cfg).items()):
        if name.endswith("norm.weight"):
            w = np.ones(shape, np.float32)
        elif name == "inject.weight":
            # start as "add" injection: s' = s + x, plus a little noise
            w = np.concatenate([np.eye(D), np.eye(D)], axis=1) + rng.normal(0, 0.02, shape)
        elif name.endswith("attn.wo.weight") or name.endswith("mlp.w_down.weight"):
            w = rng.normal(0, out_std, shape)
        else:
            w = rng.normal(0, 0.02, shape)
        params[name] = jnp.asarray(w, jnp.float32)
    return params


def rmsnorm(x, w, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_tables(T, hd, theta):
    half = hd // 2
    inv = theta ** (-(2.0 * np.arange(half, dtype=np.float64)) / hd)       # theta^(-2i/hd)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]           # [T, hd/2]
    return jnp.asarray(np.cos(ang), jnp.float32), jnp.asarray(np.sin(ang), jnp.float32)


def apply_rope_half(x, cos, sin):
    # x [B, T, H, hd]; pairs (i, i + hd/2): HF rotate_half
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def layer(cfg, p, pre, h, cos, sin):
    """One pre-norm layer. h [B, T, D]."""
    eps = cfg.get("norm_eps", 1e-5)
    B, T, D = h.shape
    H = cfg["n_heads"]
    KVH = cfg.get("n_kv_heads", H)
    hd = cfg.get("head_dim", D // H)
    a = rmsnorm(h, p[pre + "attn_norm.weight"], eps)
    q = (a @ p[pre + "attn.wq.weight"].T).reshape(B, T, H, hd)
    k = (a @ p[pre + "attn.wk.weight"].T).reshape(B, T, KVH, hd)
    v = (a @ p[pre + "attn.wv.weight"].T).reshape(B, T, KVH, hd)
    q = apply_rope_half(q, cos, sin)
    k = apply_rope_half(k, cos, sin)
    if KVH != H:  # query head i uses kv head i // (H / KVH)
        rep = H // KVH
        k = jnp.repeat(k, rep, axis=2)
        v = jnp.repeat(v, rep, axis=2)
    sc = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
    mask = jnp.tril(jnp.ones((T, T), bool))
    sc = jnp.where(mask[None, None], sc, -jnp.inf)
    att = jax.nn.softmax(sc, axis=-1)
    o = jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(B, T, H * hd)
    h = h + o @ p[pre + "attn.wo.weight"].T
    m = rmsnorm(h, p[pre + "mlp_norm.weight"], eps)
    g = m @ p[pre + "mlp.w_gate.weight"].T
    u = m @ p[pre + "mlp.w_up.weight"].T
    h = h + (jax.nn.silu(g) * u) @ p[pre + "mlp.w_down.weight"].T
    return h


def prelude(cfg, p, ids, cos, sin):
    e = p["embed.weight"][ids] * cfg.get("embed_scale", 1.0)
    x = e
    for i in range(cfg["n_pre_blocks"]):
        x = layer(cfg, p, f"pre.{i}.", x, cos, sin)
    return x


def init_state(cfg, x, key=None):
    """s0. For "random" (Huginn): std * standard normal truncated at +-3, drawn from `key`
    (a fresh key every training step; a fixed key in evaluation; the engine draws its own
    from init_state_seed, docs/model-format.md, which has the same distribution)."""
    kind = cfg.get("init_state", "input")
    if kind == "zeros":
        return jnp.zeros_like(x)
    if kind == "input":
        return x
    if kind == "random":
        if key is None:
            key = jax.random.PRNGKey(0)
        z = jax.random.truncated_normal(key, -3.0, 3.0, x.shape, x.dtype)
        return z * cfg["init_state_std"]
    raise NotImplementedError(f"init_state {kind}")


def iteration(cfg, p, s, x, cos, sin):
    """One loop iteration: inject, the shared loop block, optional loop norm."""
    inj = cfg.get("inject", "none")
    if inj == "add":
        s = s + x
    elif inj == "linear_concat":
        s = jnp.concatenate([s, x], axis=-1) @ p["inject.weight"].T
    for j in range(cfg["n_loop_layers"]):
        s = layer(cfg, p, f"loop.{j}.", s, cos, sin)
    if cfg.get("loop_norm"):
        s = rmsnorm(s, p["loop_norm.weight"], cfg.get("norm_eps", 1e-5))
    return s


def coda_logits(cfg, p, s, cos, sin):
    eps = cfg.get("norm_eps", 1e-5)
    plm = cfg.get("post_loop_norm", "none")
    if plm == "own":
        s = rmsnorm(s, p["post_loop_norm.weight"], eps)
    elif plm == "final":
        s = rmsnorm(s, p["final_norm.weight"], eps)
    y = s
    for k in range(cfg["n_post_blocks"]):
        y = layer(cfg, p, f"post.{k}.", y, cos, sin)
    if cfg.get("final_norm", True):
        y = rmsnorm(y, p["final_norm.weight"], eps)
    head = p["embed.weight"] if cfg.get("tie_embeddings") else p["head.weight"]
    return y @ head.T


def forward(cfg, p, ids, loops, key=None):
    """Plain forward: logits [B, T, V] at `loops` iterations (Python int or traced int)."""
    T = ids.shape[1]
    hd = cfg.get("head_dim", cfg["dim"] // cfg["n_heads"])
    cos, sin = rope_tables(T, hd, cfg.get("rope_theta", 10000.0))
    x = prelude(cfg, p, ids, cos, sin)
    s = init_state(cfg, x, key)
    s = jax.lax.fori_loop(0, loops, lambda i, s: iteration(cfg, p, s, x, cos, sin), s)
    return coda_logits(cfg, p, s, cos, sin)


def xent(logits, targets):
    lse = jax.nn.logsumexp(logits, axis=-1)
    tgt = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(lse - tgt)


def xent_masked(logits, targets, mask):
    """Mean cross-entropy over the positions where mask is 1."""
    lse = jax.nn.logsumexp(logits, axis=-1)
    tgt = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.sum((lse - tgt) * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def train_loss(cfg, p, ids, targets, n_nograd, k_grad, mask=None, key=None):
    """Loss with truncated backprop: `n_nograd` (traced) iterations without gradient,
    then `k_grad` (static) iterations with gradient. Total depth L = n_nograd + k_grad.
    `mask` (optional, [B, T]) selects the positions that count in the loss."""
    T = ids.shape[1]
    hd = cfg.get("head_dim", cfg["dim"] // cfg["n_heads"])
    cos, sin = rope_tables(T, hd, cfg.get("rope_theta", 10000.0))
    x = prelude(cfg, p, ids, cos, sin)
    s = init_state(cfg, x, key)
    p_ng = jax.lax.stop_gradient(p)
    x_ng = jax.lax.stop_gradient(x)
    s = jax.lax.stop_gradient(s)
    s = jax.lax.fori_loop(0, n_nograd, lambda i, s: iteration(cfg, p_ng, s, x_ng, cos, sin), s)
    s = jax.lax.stop_gradient(s)
    for _ in range(k_grad):
        s = iteration(cfg, p, s, x, cos, sin)
    logits = coda_logits(cfg, p, s, cos, sin)
    if mask is None:
        return xent(logits, targets)
    return xent_masked(logits, targets, mask)
