"""Independent numpy float64 reference of the TinyLoop model family and its generation loop.

Written straight from docs/model-format.md ("Forward", the layer formulas, the random
initial state) and docs/generation.md (sampling). This is the oracle the C++ engine is
tested against (it lives with the tests, not in the shipped `tinyloop` package), so it
favours plain, literal code over speed: no KV cache, one head at a time, every step of
generation re-runs the whole sequence.

Shapes: T tokens, D = dim, V = vocab_size, H query heads, KVH kv heads, hd = head_dim,
F = ffn_dim, L = loops.
"""

from __future__ import annotations

import math

import numpy as np

from tinyloop.config import (QK_NORM_EPS, VALUE_GATE_DIM, check_tensor_shapes, layer_prefixes,
                             normalize_config, uses_rope)
from tinyloop.quantize import dequantize, logical_shapes

__all__ = [
    "forward",
    "embed",
    "pre_blocks",
    "initial_state",
    "loop_iteration",
    "readout",
    "layer",
    "random_state",
    "splitmix64",
    "sample_next",
    "sampling_distribution",
    "apply_repetition_penalty",
    "generate",
]

_MASK64 = (1 << 64) - 1


# ---------------------------------------------------------------------------------------
# small ops


def _w(tensors: dict, name: str) -> np.ndarray:
    """A tensor as float64; an int8/int4 weight (format version 2) is dequantized."""
    if name + ".scales" in tensors:
        return dequantize(name, tensors)
    return np.asarray(tensors[name], dtype=np.float64)


class _Q8Tensors(dict):
    """The tensors of a forward run with quant_activations="q8" (the engine's default):
    every int8 / int4 weight whose group is a multiple of 32 takes its input rows quantized
    as llama.cpp does (quantize_activations_q8)."""

    quant_activations = "q8"


def quantize_activations_q8(x: np.ndarray):
    """Rows x [T, K] (K a multiple of 32) quantized per block of 32 exactly as ggml's x86 CPU
    backend does for a quantized matmul (quantize_row_q8_0 / q8_1, AVX2 path), in float32:
    amax = max |x|, d = fp16(amax / 127), q = round_half_even(x * (127 / amax)),
    s = fp16((amax / 127) * sum q). Returns q [T, K] int64, d and s [T, K / 32] float32."""
    x = np.asarray(x, dtype=np.float32)
    T, K = x.shape
    xb = x.reshape(T, K // 32, 32)  # [T, nb, 32]
    amax = np.abs(xb).max(axis=-1)  # [T, nb]
    df = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv[..., None]).astype(np.int64)  # rint: ties to even, as _mm256_round_ps
    d = df.astype(np.float16).astype(np.float32)
    s = (df * q.sum(axis=-1).astype(np.float32)).astype(np.float16).astype(np.float32)
    return q.reshape(T, K), d, s


def _matmul_q8(tensors: dict, name: str, x: np.ndarray):
    """x W^T with q8 activations (ops/matmul_q8act.h), or None when W does not take that path:
    y = sum_b d_w d_x isum_b + o_w s_x, in float64 with exact integer block sums."""
    if getattr(tensors, "quant_activations", "f32") != "q8" or name + ".scales" not in tensors:
        return None
    from tinyloop.quantize import unpack_int4

    raw = np.asarray(tensors[name])
    scales = np.asarray(tensors[name + ".scales"], dtype=np.float32).astype(np.float64)  # [N, ng]
    int4 = name + ".offsets" in tensors
    qw = (unpack_int4(raw) if int4 else raw).astype(np.int64)  # [N, K]
    N, K = qw.shape
    G = K // scales.shape[1]
    if G % 32 != 0:
        return None
    q, d, s = quantize_activations_q8(x)  # [T, K], [T, nb], [T, nb]
    bpg = G // 32
    y = np.zeros((q.shape[0], N))  # [T, N]
    for b in range(K // 32):
        cols = slice(32 * b, 32 * b + 32)
        isum = (q[:, cols] @ qw[:, cols].T).astype(np.float64)  # [T, N] exact
        y += isum * scales[:, b // bpg][None, :] * d[:, b].astype(np.float64)[:, None]
        if int4:
            o = np.asarray(tensors[name + ".offsets"], dtype=np.float32).astype(np.float64)
            y += o[:, b // bpg][None, :] * s[:, b].astype(np.float64)[:, None]
    return y


def _matmul(tensors: dict, name: str, x: np.ndarray) -> np.ndarray:
    """x [T, in] @ W^T for weight `name` [out, in] -> [T, out], in the run's activation mode."""
    y = _matmul_q8(tensors, name, x)
    return x @ _w(tensors, name).T if y is None else y


def _linear(tensors: dict, name: str, x: np.ndarray) -> np.ndarray:
    """y = x W^T (+ b). W [out, in]; x [T, in] -> [T, out]."""
    y = _matmul(tensors, name + ".weight", x)  # [T, out]
    if name + ".bias" in tensors:
        y = y + _w(tensors, name + ".bias")
    return y


def _norm(cfg: dict, tensors: dict, name: str, x: np.ndarray) -> np.ndarray:
    """RMSNorm or LayerNorm over the last axis with weights `name.weight` (+ `name.bias`)."""
    eps = cfg["norm_eps"]
    w = _w(tensors, name + ".weight")  # [D]
    if cfg["norm_type"] == "rmsnorm":
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w  # [T, D]
    else:
        mean = np.mean(x, axis=-1, keepdims=True)  # [T, 1]
        var = np.mean((x - mean) ** 2, axis=-1, keepdims=True)  # [T, 1] population variance
        y = (x - mean) / np.sqrt(var + eps) * w  # [T, D]
    if cfg["norm_bias"]:
        y = y + _w(tensors, name + ".bias")
    return y


_erf = np.vectorize(math.erf, otypes=[np.float64])  # numpy has no erf; math.erf is exact enough


def _activation(kind: str, x: np.ndarray) -> np.ndarray:
    if kind == "silu":
        return x / (1.0 + np.exp(-x))
    if kind == "gelu":
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
    if kind == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    if kind == "relu2":
        return np.maximum(x, 0.0) ** 2
    raise AssertionError(kind)


def _softmax(z: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; -inf entries get exactly 0."""
    m = np.max(z, axis=-1, keepdims=True)
    e = np.exp(z - m)
    return e / np.sum(e, axis=-1, keepdims=True)


# ---------------------------------------------------------------------------------------
# positions


def _rope(cfg: dict, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Rotate one head's vectors x [T, hd] by their absolute positions [T].

    Pair i (i < hd/2) turns by angle p * theta^(-2i/hd). rope_half pairs (i, i + hd/2)
    (HF rotate_half); rope_interleaved pairs (2i, 2i + 1).
    """
    hd = x.shape[-1]
    half = hd // 2
    inv_freq = cfg["rope_theta"] ** (-2.0 * np.arange(half) / hd)  # [hd/2]
    ang = positions[:, None].astype(np.float64) * inv_freq[None, :]  # [T, hd/2]
    cos, sin = np.cos(ang), np.sin(ang)  # [T, hd/2]
    if cfg["pos_encoding"] == "rope_half":
        a_idx, b_idx = np.arange(half), np.arange(half) + half
    else:
        a_idx, b_idx = 2 * np.arange(half), 2 * np.arange(half) + 1
    a, b = x[:, a_idx], x[:, b_idx]  # [T, hd/2] each
    out = np.empty_like(x)  # [T, hd]
    out[:, a_idx] = a * cos - b * sin
    out[:, b_idx] = b * cos + a * sin
    return out


def _visible(positions: np.ndarray, window: int) -> np.ndarray:
    """mask[q, k]: query at positions[q] may read key at positions[k] (causal, and within
    the last `window` positions when window > 0). [T, T] bool."""
    pq, pk = positions[:, None], positions[None, :]
    mask = pk <= pq
    if window > 0:
        mask &= pk >= pq - window + 1
    return mask


# ---------------------------------------------------------------------------------------
# one layer


def _qkv(cfg: dict, tensors: dict, p: str, h: np.ndarray):
    """q [T, H hd], k [T, KVH hd], v [T, KVH hd], biases added (before RoPE)."""
    H, KVH, hd = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    if cfg["qkv_fused"]:
        qkv = _linear(tensors, p + "attn.wqkv", h)  # [T, (H + 2 KVH) hd], rows q, k, v
        q = qkv[:, : H * hd]
        k = qkv[:, H * hd: (H + KVH) * hd]
        v = qkv[:, (H + KVH) * hd:]
        return q, k, v
    return (_linear(tensors, p + "attn.wq", h), _linear(tensors, p + "attn.wk", h),
            _linear(tensors, p + "attn.wv", h))


def _unit_rms(x: np.ndarray) -> np.ndarray:
    """qk_norm: x [T, hd] / sqrt(mean(x^2) + 2^-23), per row."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + QK_NORM_EPS)


def _value_embedding(tensors: dict, p: str, h: np.ndarray, ids, kvh: int) -> np.ndarray:
    """What layer `p`'s value embedding adds to v [T, KVH hd]: per kv head g,
    2 sigmoid(value_gate[g] . h[:, :32]) * value_embed[ids] (Parcae's ve / ve_gate)."""
    if ids is None:
        raise ValueError(f"layer {p[:-1]} has a value embedding: its rows' token ids are needed")
    table = _w(tensors, p + "attn.value_embed.weight")[np.asarray(ids).reshape(-1)]  # [T, KVH hd]
    z = h[:, :VALUE_GATE_DIM] @ _w(tensors, p + "attn.value_gate.weight").T  # [T, KVH]
    gate = 2.0 / (1.0 + np.exp(-z))  # [T, KVH] in (0, 2)
    return np.repeat(gate, table.shape[1] // kvh, axis=1) * table  # [T, KVH hd]


def _attention(cfg: dict, tensors: dict, p: str, h: np.ndarray, positions: np.ndarray,
               window: int, ids=None) -> np.ndarray:
    """Multi-head (GQA) causal attention of layer `p` on h [T, D] -> [T, D]; ids [T] are
    the rows' tokens (layers with a value embedding need them)."""
    H, KVH, hd = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    q, k, v = _qkv(cfg, tensors, p, h)
    if p + "attn.value_embed.weight" in tensors:
        v = v + _value_embedding(tensors, p, h, ids, KVH)
    mask = _visible(positions, window)  # [T, T]
    heads = []
    for i in range(H):
        g = i // (H // KVH)  # the kv head query head i reads
        qi = q[:, i * hd:(i + 1) * hd]  # [T, hd]
        kg = k[:, g * hd:(g + 1) * hd]  # [T, hd]
        vg = v[:, g * hd:(g + 1) * hd]  # [T, hd]
        if uses_rope(cfg):
            qi, kg = _rope(cfg, qi, positions), _rope(cfg, kg, positions)
        if cfg["qk_norm"]:  # each head's vector over its RMS, no weight, after RoPE
            qi, kg = _unit_rms(qi), _unit_rms(kg)
        scores = qi @ kg.T / math.sqrt(hd)  # [T, T]
        scores = np.where(mask, scores, -np.inf)
        heads.append(_softmax(scores) @ vg)  # [T, hd]
    return _linear(tensors, p + "attn.wo", np.concatenate(heads, axis=1))  # [T, D]


def _mlp(cfg: dict, tensors: dict, p: str, h: np.ndarray) -> np.ndarray:
    """swiglu: down(silu(gate h) * up h); gelu* / relu2: down(act(up h)). h [T, D] -> [T, D]."""
    up = _linear(tensors, p + "mlp.w_up", h)  # [T, F]
    if cfg["mlp"] == "swiglu":
        hidden = _activation("silu", _linear(tensors, p + "mlp.w_gate", h)) * up  # [T, F]
    else:
        hidden = _activation(cfg["mlp"], up)  # [T, F]
    return _linear(tensors, p + "mlp.w_down", hidden)  # [T, D]


def layer(cfg: dict, tensors: dict, p: str, h: np.ndarray, positions: np.ndarray,
          window: int = 0, ids=None) -> np.ndarray:
    """One transformer layer with tensor prefix `p` by norm_placement. h [T, D] -> [T, D];
    ids [T]: the rows' tokens, for a layer with a value embedding."""
    n = lambda name, x: _norm(cfg, tensors, p + name, x)  # noqa: E731
    attn = lambda x: _attention(cfg, tensors, p, x, positions, window, ids)  # noqa: E731
    mlp = lambda x: _mlp(cfg, tensors, p, x)  # noqa: E731
    placement = cfg["norm_placement"]
    if placement == "pre":
        h = h + attn(n("attn_norm", h))
        return h + mlp(n("mlp_norm", h))
    if placement == "huginn_sandwich":
        h = n("attn_post_norm", h + attn(n("attn_norm", h)))
        return n("mlp_post_norm", h + mlp(n("mlp_norm", h)))
    # ouro_sandwich
    h = h + n("attn_post_norm", attn(n("attn_norm", h)))
    return h + n("mlp_post_norm", mlp(n("mlp_norm", h)))


def _layers(cfg, tensors, prefixes, h, positions, window, trace=None, ids=None):
    for p in prefixes:
        h = layer(cfg, tensors, p, h, positions, window, ids)
        if trace is not None:
            trace.append(h)
    return h


# ---------------------------------------------------------------------------------------
# the random initial state (counter-based, docs/model-format.md)


def splitmix64(x: int) -> int:
    """One splitmix64 step on a Python int, arithmetic modulo 2^64."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _state_element(seed: int, p: int, i: int) -> float:
    """The standard normal z of element (p, i), truncated at |z| <= 3 by redrawing."""
    key = splitmix64(splitmix64(splitmix64(seed & _MASK64) ^ p) ^ i)
    u = lambda k: (splitmix64((key + k) & _MASK64) >> 11) * 2.0 ** -53  # noqa: E731
    c = 0
    while True:
        z = math.sqrt(-2.0 * math.log(1.0 - u(2 * c))) * math.cos(2.0 * math.pi * u(2 * c + 1))
        if abs(z) <= 3.0:
            return z
        c += 1


def call_state_seed(cfg: dict, seed: int) -> int:
    """The state seed of a generate call with `seed` (src/runtime/state_draw.cc): a model with
    init_state_per_call draws from the call's seed, any other keeps init_state_seed."""
    if not cfg.get("init_state_per_call", False):
        return int(cfg["init_state_seed"])
    return splitmix64((int(seed) ^ 0x1417E5EED0FCA11) & _MASK64)


def random_state(seed: int, positions, dim: int, std: float) -> np.ndarray:
    """s0[t, i] = std * z(seed, positions[t], i). [T, dim] float64."""
    positions = [int(p) for p in np.asarray(positions).reshape(-1)]
    out = np.empty((len(positions), dim), dtype=np.float64)  # [T, D]
    for t, p in enumerate(positions):
        for i in range(dim):
            out[t, i] = std * _state_element(int(seed), p, i)
    return out


# ---------------------------------------------------------------------------------------
# the forward, in the pieces the runtime also exposes (embed, loop iteration, readout)


def _prepare(cfg, tensors):
    cfg = normalize_config(cfg)
    check_tensor_shapes(cfg, logical_shapes({n: np.shape(t) for n, t in tensors.items()}))
    return cfg


def embed(cfg: dict, tensors: dict, ids, positions=None) -> np.ndarray:
    """e = embed[ids] * embed_scale (+ pos_emb[positions] when learned). [T, D]."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)  # [T]
    positions = np.arange(len(ids)) if positions is None else np.asarray(positions)  # [T]
    V = cfg["vocab_size"]
    if np.any(ids < 0) or np.any(ids >= V):
        raise ValueError(f"ids: token id outside [0, {V})")
    e = _w(tensors, "embed.weight")[ids] * cfg["embed_scale"]  # [T, D]
    if cfg["pos_encoding"] == "learned":
        if len(positions) and positions.max() >= cfg["max_seq_len"]:
            raise ValueError(f"positions: {positions.max()} >= max_seq_len {cfg['max_seq_len']}"
                             f" (rows of pos_emb)")
        e = e + _w(tensors, "pos_emb.weight")[positions]  # [T, D]
    return e


def pre_blocks(cfg, tensors, e, positions, window=0, trace=None, ids=None) -> np.ndarray:
    """x = pre_blocks(e), then prelude_norm when the config has one. [T, D]."""
    x = _layers(cfg, tensors, layer_prefixes(cfg)["pre"], e, positions, window, trace, ids)
    return _norm(cfg, tensors, "prelude_norm", x) if cfg["prelude_norm"] else x


def initial_state(cfg: dict, x: np.ndarray, positions) -> np.ndarray:
    """s0 by init_state: x itself | zeros | the seeded random state. [T, D]."""
    kind = cfg["init_state"]
    if kind == "input":
        return x.copy()
    if kind == "zeros":
        return np.zeros_like(x)
    return random_state(cfg["init_state_seed"], positions, cfg["dim"], cfg["init_state_std"])


def _inject(cfg: dict, tensors: dict, s: np.ndarray, x: np.ndarray) -> np.ndarray:
    kind = cfg["inject"]
    if kind == "none":
        return s
    if kind == "add":
        return s + x
    return _matmul(tensors, "inject.weight", np.concatenate([s, x], axis=1))  # [T, 2D] -> [T, D]


def loop_iteration(cfg, tensors, s, x, positions=None, window=0, ids=None) -> np.ndarray:
    """One iteration: inject, the loop block, loop_norm. s, x [T, D] -> [T, D]."""
    cfg = normalize_config(cfg)
    positions = np.arange(len(s)) if positions is None else np.asarray(positions)
    s = _inject(cfg, tensors, s, x)
    s = _layers(cfg, tensors, layer_prefixes(cfg)["loop"], s, positions, window, ids=ids)
    if cfg["loop_norm"]:
        s = _norm(cfg, tensors, "loop_norm", s)
    return s


def _readout(cfg, tensors, s, positions, window, states=None, ids=None) -> np.ndarray:
    """post_loop_norm, post_loop_proj, post blocks, final norm, head. s [T, D] -> logits [T, V]."""
    if cfg["post_loop_norm"] == "final":
        s = _norm(cfg, tensors, "final_norm", s)  # Huginn's ln_f, used a second time below
    elif cfg["post_loop_norm"] == "own":
        s = _norm(cfg, tensors, "post_loop_norm", s)
    if cfg["post_loop_proj"]:
        s = _matmul(tensors, "post_loop_proj.weight", s)  # Parcae's C [D, D]
    post = [] if states is not None else None
    y = _layers(cfg, tensors, layer_prefixes(cfg)["post"], s, positions, window, post, ids)
    if cfg["final_norm"]:
        y = _norm(cfg, tensors, "final_norm", y)
    if states is not None:
        states["post"], states["final"] = post, y
    # head [V, D]
    return _matmul(tensors, "embed.weight" if cfg["tie_embeddings"] else "head.weight", y)  # [T, V]


def readout(cfg, tensors, state, positions=None, window=0, ids=None) -> np.ndarray:
    """Logits [T, V] the model emits from a loop state [T, D] (used by the logit lens)."""
    cfg = normalize_config(cfg)
    positions = np.arange(len(state)) if positions is None else np.asarray(positions)
    return _readout(cfg, tensors, np.asarray(state, dtype=np.float64), positions, window, ids=ids)


def forward(cfg, tensors, ids, loops, window=0, return_states=False, quant_activations="f32"):
    """Logits [T, V] of the whole model at `loops` iterations, positions 0..T-1.

    window = 0: full causal attention; window = W > 0: the query at p sees keys
    max(0, p-W+1)..p in every layer application (positions stay absolute).
    With return_states, also a dict: "embed" [T, D] (after scale and pos_emb), "pre" list of
    [T, D] (after each pre layer), "init" [T, D] (s0), "iterations" list of L [T, D] (after
    each iteration, loop_norm included), "post" list of [T, D] (after each post layer),
    "final" [T, D] (the rows the head multiplies: after final_norm when enabled).
    quant_activations: "f32" (default here: the exact math) or "q8", the engine's default
    (Model(quant_activations=...)): int8 / int4 weights with a group that is a multiple of 32
    see their input rows quantized per 32 columns as llama.cpp does.
    """
    if quant_activations not in ("f32", "q8"):
        raise ValueError(f"quant_activations: must be 'f32' or 'q8', got {quant_activations!r}")
    cfg = _prepare(cfg, tensors)
    if quant_activations == "q8":
        tensors = _Q8Tensors(tensors)
    if loops < 1:
        raise ValueError(f"loops: must be >= 1, got {loops}")
    if window < 0:
        raise ValueError(f"window: must be >= 0, got {window}")
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)  # [T]
    positions = np.arange(len(ids))  # [T]
    states = {"pre": []}
    e = embed(cfg, tensors, ids, positions)  # [T, D]
    x = pre_blocks(cfg, tensors, e, positions, window, states["pre"], ids)  # [T, D]
    s = initial_state(cfg, x, positions)  # [T, D]
    states.update(embed=e, init=s, iterations=[])
    for _ in range(loops):
        s = loop_iteration(cfg, tensors, s, x, positions, window, ids)  # [T, D]
        states["iterations"].append(s)
    logits = _readout(cfg, tensors, s, positions, window, states, ids)  # [T, V]
    return (logits, states) if return_states else logits


# ---------------------------------------------------------------------------------------
# sampling (docs/generation.md "Sampling", Hugging Face conventions)


def _check_sampling(temperature, top_k, top_p, repetition_penalty) -> bool:
    """Validate the knobs; return True when the step is greedy."""
    if not temperature >= 0:
        raise ValueError(f"temperature: must be >= 0, got {temperature}")
    if not repetition_penalty > 0:
        raise ValueError(f"repetition_penalty: must be > 0, got {repetition_penalty}")
    greedy = temperature <= 0.01
    if not greedy:
        if not (isinstance(top_k, (int, np.integer)) and top_k >= 1):
            raise ValueError(f"top_k: must be an integer >= 1 when sampling, got {top_k}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {top_p}")
    return greedy


def apply_repetition_penalty(logits, seen, penalty: float) -> np.ndarray:
    """HF RepetitionPenaltyLogitsProcessor over the distinct ids in `seen`: positive logits
    divided by the penalty, negative ones multiplied (zero stays zero).
    Returns a new [V] float64."""
    z = np.array(logits, dtype=np.float64)  # [V]
    ids = np.unique(np.asarray(list(seen), dtype=np.int64))
    if penalty != 1.0 and ids.size:
        sel = z[ids]
        z[ids] = np.where(sel < 0, sel * penalty, sel / penalty)
    return z


def _argmax_lowest(z: np.ndarray) -> int:
    return int(np.argmax(z))  # np.argmax returns the first (lowest) index among ties


def sampling_distribution(logits, temperature, top_k, top_p) -> np.ndarray:
    """The probabilities sampling draws from: temperature, then top-k, then top-p. [V].

    top-k keeps every token whose logit is >= the k-th largest (HF TopKLogitsWarper keeps
    ties). top-p is HF TopPLogitsWarper: sort ascending, drop tokens whose ascending
    cumulative probability is <= 1 - top_p, never the top token. Ties in that sort put the
    higher id first, so the lowest id counts as the larger (as in greedy). Removed tokens
    get exactly 0.
    """
    if _check_sampling(temperature, top_k, top_p, 1.0):
        raise ValueError("temperature: sampling_distribution needs temperature > 0.01")
    z = np.asarray(logits, dtype=np.float64) / temperature  # [V]
    V = z.shape[0]
    kth = np.sort(z)[::-1][min(int(top_k), V) - 1]
    z = np.where(z < kth, -np.inf, z)  # [V]
    if top_p < 1.0:
        ids = np.arange(V)
        order = np.lexsort((-ids, z))  # ascending by logit; among ties, higher id first
        cum = np.cumsum(_softmax(z[order]))  # [V] ascending cumulative probability
        remove = cum <= 1.0 - top_p
        remove[-1] = False  # keep at least the top token
        z = z.copy()
        z[order[remove]] = -np.inf
    return _softmax(z)


def _draw(probs: np.ndarray, rng) -> int:
    """Inverse CDF on one uniform in [0, 1); a zero-probability id is never returned."""
    cdf = np.cumsum(probs)  # [V]
    target = rng.random() * cdf[-1]
    idx = int(np.searchsorted(cdf, target, side="right"))
    if idx >= len(probs):  # rounding at the very top: the last id with mass
        idx = int(np.flatnonzero(probs > 0)[-1])
    return idx


def sample_next(logits, temperature, top_k, top_p, rng, repetition_penalty=1.0,
                seen=()) -> int:
    """One sampling step on logits [V]: repetition penalty over `seen`, then greedy argmax
    (temperature <= 0.01; ties to the lowest id) or a draw from sampling_distribution with
    `rng` (anything with .random() -> float in [0, 1), e.g. numpy Generator)."""
    greedy = _check_sampling(temperature, top_k, top_p, repetition_penalty)
    z = apply_repetition_penalty(logits, seen, repetition_penalty)  # [V]
    if greedy:
        return _argmax_lowest(z)
    return _draw(sampling_distribution(z, temperature, top_k, top_p), rng)


# ---------------------------------------------------------------------------------------
# generation (uncached reference loop)


def _check_stop_sequences(stop_sequences, V: int) -> list[list[int]]:
    seqs = [list(int(t) for t in s) for s in stop_sequences]
    for s in seqs:
        if not s:
            raise ValueError("stop_sequences: empty sequence")
        if any(not 0 <= t < V for t in s):
            raise ValueError(f"stop_sequences: token id outside [0, {V})")
    return seqs


def _ends_with_stop(emitted: list[int], seqs: list[list[int]]) -> bool:
    """True when the emitted tokens (never the prompt) end with one of the sequences."""
    return any(len(s) <= len(emitted) and emitted[-len(s):] == s for s in seqs)


def generate(cfg, tensors, prompt_ids, max_tokens, loops, temperature=0.0, top_k=50,
             top_p=1.0, repetition_penalty=1.0, stop_sequences=(), eos_ids=None, window=0,
             rng=None) -> list[int]:
    """The uncached reference decode loop; returns prompt + new tokens.

    Each step runs `forward` on every id so far (sliding-window mask when window > 0,
    absolute positions), samples from the last row with the penalty over prompt + output,
    and appends. Stops after max_tokens, after an EOS id (kept; eos_ids=None uses the
    config's, [] disables), or when the emitted tokens end with a stop sequence (kept).
    """
    cfg = normalize_config(cfg)
    if max_tokens < 1:
        raise ValueError(f"max_tokens: must be >= 1, got {max_tokens}")
    _check_sampling(temperature, top_k, top_p, repetition_penalty)
    eos = set(cfg["eos_ids"] if eos_ids is None else eos_ids)
    seqs = _check_stop_sequences(stop_sequences, cfg["vocab_size"])
    if rng is None:
        rng = np.random.default_rng()  # no seed: fresh entropy (docs/generation.md)
    ids = [int(t) for t in prompt_ids]
    emitted: list[int] = []
    for _ in range(max_tokens):
        logits = forward(cfg, tensors, ids, loops, window=window)  # [T, V]
        tok = sample_next(logits[-1], temperature, top_k, top_p, rng,
                          repetition_penalty=repetition_penalty, seen=ids)
        ids.append(tok)
        emitted.append(tok)
        if tok in eos or _ends_with_stop(emitted, seqs):
            break
    return ids


# ---------------------------------------------------------------------------------------
# the tutorial generation loop (docs/generation.md, "cache_window")


def window_generate(cfg, tensors, seed_ids, max_new_tokens, window, temperature, top_k, top_p,
                    rng, loops=None) -> list[int]:
    """The tutorial generation loop, literally: each step runs the model on
    the last `window` ids only, with positions restarting at 0 for the oldest id in the
    window (so a token's position changes as the window slides), samples from the last row,
    and appends. No cache, no early stop; top_k = 0 disables top-k as on that page.

    This is NOT the engine's `cache_window` (a sliding-window attention mask over absolute
    positions, docs/generation.md); it is kept as the reference of the tutorial semantics.
    """
    cfg = normalize_config(cfg)
    if window < 1:
        raise ValueError(f"window: must be >= 1, got {window}")
    loops = cfg["default_loops"] if loops is None else loops
    ids = [int(t) for t in seed_ids]
    for _ in range(max_new_tokens):
        x = ids[-window:]  # [T], T = min(len(ids), window)
        logits = forward(cfg, tensors, x, loops)  # [T, V], positions 0..T-1
        k = cfg["vocab_size"] if top_k == 0 else top_k
        ids.append(sample_next(logits[-1], temperature, k, top_p, rng))
    return ids
