"""The numpy reference forward, random state, sampling and generation loop.

Checked against hand-written numpy (with RoPE done as complex rotations, a different
formulation from the reference), structural equivalences between configs, and
statistics. No tinyloop_py here.
"""

import math

import numpy as np
import pytest

from tinyloop import config as C
import reference as R
from tinyloop.random_model import random_tensors

KINDS = ("llama", "huginn", "ouro")
VARIANTS = [
    {},
    dict(norm_type="layernorm", norm_bias=True, mlp="gelu", attn_out_bias=True, mlp_bias=True),
    dict(pos_encoding="learned", mlp="gelu_tanh", inject="add", init_state="zeros"),
]
IDS = [5, 17, 3, 96, 0, 44, 44, 12, 71, 8]  # T = 10, includes a repeat and both ends of V


def _model(kind, seed=0, **overrides):
    cfg = C.preset_config(kind, **overrides)
    return cfg, {k: v.astype(np.float64) for k, v in random_tensors(cfg, seed).items()}


def _close(a, b, tol=1e-10):
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------
# basic properties


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_finite_and_causal(kind, variant):
    cfg, t = _model(kind, **VARIANTS[variant])
    logits = R.forward(cfg, t, IDS, loops=3)  # [T, V]
    assert logits.shape == (len(IDS), 97) and np.all(np.isfinite(logits))
    assert 0.3 < logits.std() < 10
    for cut in (1, 6):
        changed = list(IDS)
        changed[cut] = (changed[cut] + 1) % 97
        other = R.forward(cfg, t, changed, loops=3)
        _close(other[:cut], logits[:cut], 1e-12)  # earlier rows never see later tokens
        assert np.abs(other[cut:] - logits[cut:]).max() > 1e-6  # and later rows do


@pytest.mark.parametrize("kind", KINDS)
def test_random_model_stays_healthy_at_8_loops(kind):
    cfg, t = _model(kind)
    logits = R.forward(cfg, t, IDS, loops=8)
    assert np.all(np.isfinite(logits)) and 1.0 < logits.std() < 5.0
    assert np.unique(logits.argmax(axis=1)).size > 1  # not one token everywhere


@pytest.mark.parametrize("kind", KINDS)
def test_loops_equal_chained_iterations(kind):
    cfg, t = _model(kind, seed=1)
    logits, st = R.forward(cfg, t, IDS, loops=4, return_states=True)
    x = st["pre"][-1] if st["pre"] else st["embed"]
    assert len(st["pre"]) == cfg["n_pre_blocks"] and len(st["iterations"]) == 4
    s = R.initial_state(cfg, x, np.arange(len(IDS)))
    _close(s, st["init"], 0)
    for it in st["iterations"]:
        s = R.loop_iteration(cfg, t, s, x)
        _close(s, it, 0)
    _close(R.readout(cfg, t, s), logits, 1e-12)
    head = t["embed.weight"] if cfg["tie_embeddings"] else t["head.weight"]
    _close(st["final"] @ head.T, logits, 1e-12)
    # a shallower run is a prefix of a deeper one, and reading out iteration 2 = loops=2
    _, st2 = R.forward(cfg, t, IDS, loops=2, return_states=True)
    for a, b in zip(st2["iterations"], st["iterations"]):
        _close(a, b, 0)
    _close(R.readout(cfg, t, st["iterations"][1]), R.forward(cfg, t, IDS, loops=2), 1e-12)


def test_embed_state_includes_scale_and_positions():
    cfg, t = _model("huginn", pos_encoding="learned")
    _, st = R.forward(cfg, t, IDS, loops=1, return_states=True)
    want = t["embed.weight"][IDS] * 8.0 + t["pos_emb.weight"][: len(IDS)]
    _close(st["embed"], want, 1e-14)


def test_bad_arguments():
    cfg, t = _model("llama")
    with pytest.raises(ValueError, match="loops"):
        R.forward(cfg, t, IDS, loops=0)
    with pytest.raises(ValueError, match="ids"):
        R.forward(cfg, t, [97], loops=1)
    t2 = dict(t)
    del t2["head.weight"]
    with pytest.raises(ValueError, match="'head.weight'"):
        R.forward(cfg, t2, IDS, loops=1)
    cfg, t = _model("llama", pos_encoding="learned", max_seq_len=4)
    with pytest.raises(ValueError, match="max_seq_len"):
        R.forward(cfg, t, IDS, loops=1)


# ---------------------------------------------------------------------------------------
# structural equivalences: two configs that must compute the same function


def _relabel(t, mapping):
    """Rename tensor prefixes: mapping old prefix -> new prefix."""
    out = {}
    for k, v in t.items():
        for old, new in mapping.items():
            if k.startswith(old):
                k = new + k[len(old):]
                break
        out[k] = v
    return out


def test_last_pre_layer_can_be_the_loop_and_the_loop_a_post_layer():
    cfg, t = _model("llama", n_pre_blocks=3, seed=2)
    moved = _relabel(t, {"pre.2.": "loop.0.", "loop.0.": "post.0."})
    cfg2 = dict(cfg, n_pre_blocks=2, n_post_blocks=1)
    _close(R.forward(cfg2, moved, IDS, 1), R.forward(cfg, t, IDS, 1), 1e-12)


@pytest.mark.parametrize("kind", ["llama", "ouro"])
def test_loop_unrolled_into_copies(kind):
    # with no injection, s0 = x and no loop_norm, L iterations of a 1-layer loop are L
    # copies of that layer; ouro's loop_norm is folded away by making it part of the check.
    cfg, t = _model(kind, n_pre_blocks=0, n_loop_layers=1, loop_norm=False, seed=3,
                    final_norm=True)
    cfg = dict(cfg, exit_gate=False)
    t = {k: v for k, v in t.items() if not k.startswith("exit_gate")}
    t.setdefault("final_norm.weight", np.ones(64))
    unrolled = dict(t)
    for i in range(2):
        unrolled.update(_relabel({k: v for k, v in t.items() if k.startswith("loop.0.")},
                                 {"loop.0.": f"pre.{i}."}))
    cfg3 = dict(cfg, n_pre_blocks=2)
    _close(R.forward(cfg3, unrolled, IDS, 1), R.forward(cfg, t, IDS, 3), 1e-11)


def test_add_inject_from_zeros_is_plain_input_at_one_loop():
    cfg, t = _model("llama", seed=4)
    a = R.forward(dict(cfg, inject="add", init_state="zeros"), t, IDS, 1)
    _close(a, R.forward(cfg, t, IDS, 1), 1e-12)
    b = R.forward(dict(cfg, inject="add", init_state="zeros"), t, IDS, 2)
    assert np.abs(b - R.forward(cfg, t, IDS, 2)).max() > 1e-6  # but not at two


def test_linear_concat_inject_with_selector_weights():
    cfg, t = _model("huginn", init_state="zeros", seed=5)
    eye, zero = np.eye(64), np.zeros((64, 64))
    plain_cfg = dict(cfg, inject="none", init_state="input")
    plain = {k: v for k, v in t.items() if k != "inject.weight"}
    take_x = dict(t, **{"inject.weight": np.hstack([zero, eye])})  # columns: state, then x
    _close(R.forward(cfg, take_x, IDS, 1), R.forward(plain_cfg, plain, IDS, 1), 1e-11)
    keep_s = dict(t, **{"inject.weight": np.hstack([eye, zero])})
    cfg_in = dict(cfg, init_state="input")
    _close(R.forward(cfg_in, keep_s, IDS, 3), R.forward(plain_cfg, plain, IDS, 3), 1e-11)


def test_post_loop_norm_final_equals_own_copy():
    cfg, t = _model("huginn", seed=6)
    own = dict(t, **{"post_loop_norm.weight": t["final_norm.weight"].copy()})
    _close(R.forward(dict(cfg, post_loop_norm="own"), own, IDS, 2),
           R.forward(cfg, t, IDS, 2), 1e-13)
    none = R.forward(dict(cfg, post_loop_norm="none"), t, IDS, 2)
    assert np.abs(none - R.forward(cfg, t, IDS, 2)).max() > 1e-6


def test_tied_equals_untied_copy():
    cfg, t = _model("huginn", seed=7)
    untied = dict(t, **{"head.weight": t["embed.weight"].copy()})
    _close(R.forward(dict(cfg, tie_embeddings=False), untied, IDS, 2),
           R.forward(cfg, t, IDS, 2), 1e-13)


def test_fused_qkv_equals_split():
    cfg, t = _model("huginn", seed=8)
    split = {}
    hd, H = cfg["head_dim"], cfg["n_heads"]
    for k, v in t.items():
        if ".attn.wqkv." in k:
            for part, rows in (("wq", slice(0, H * hd)), ("wk", slice(H * hd, 2 * H * hd)),
                               ("wv", slice(2 * H * hd, 3 * H * hd))):
                split[k.replace("wqkv", part)] = v[rows]
        else:
            split[k] = v
    _close(R.forward(dict(cfg, qkv_fused=False), split, IDS, 2),
           R.forward(cfg, t, IDS, 2), 1e-12)


def test_gqa_equals_mha_with_repeated_kv_heads():
    cfg, t = _model("llama", seed=9)  # n_kv_heads 2, n_heads 4: heads (0,1)->0, (2,3)->1
    hd = cfg["head_dim"]
    mha = dict(t)
    for k, v in t.items():
        if ".attn.wk." in k or ".attn.wv." in k:
            mha[k] = np.concatenate([v[g * hd:(g + 1) * hd] for g in (0, 0, 1, 1)], axis=0)
    _close(R.forward(dict(cfg, n_kv_heads=4), mha, IDS, 1), R.forward(cfg, t, IDS, 1), 1e-12)


def test_rope_layouts_are_a_channel_permutation():
    # rope_interleaved pair (2i, 2i+1) is rope_half pair (i, i+hd/2) after permuting q and k
    # channels within each head; q.k is invariant under a shared permutation.
    cfg, t = _model("llama", seed=10, pos_encoding="rope_interleaved")
    hd, nq, nk = cfg["head_dim"], cfg["n_heads"], cfg["n_kv_heads"]
    perm = np.empty(hd, dtype=int)
    perm[: hd // 2], perm[hd // 2:] = np.arange(0, hd, 2), np.arange(1, hd, 2)
    half = dict(t)
    for k, v in t.items():
        heads = nq if ".attn.wq." in k else nk if ".attn.wk." in k else 0
        if heads:
            half[k] = np.concatenate([v[h * hd:(h + 1) * hd][perm] for h in range(heads)])
    out_half = R.forward(dict(cfg, pos_encoding="rope_half"), half, IDS, 1)
    _close(out_half, R.forward(cfg, t, IDS, 1), 1e-11)
    assert np.abs(R.forward(dict(cfg, pos_encoding="rope_half"), t, IDS, 1)
                  - out_half).max() > 1e-6


# ---------------------------------------------------------------------------------------
# sliding window


@pytest.mark.parametrize("kind", KINDS)
def test_window_at_least_t_is_full_attention(kind):
    cfg, t = _model(kind, seed=11)
    full = R.forward(cfg, t, IDS, 2)
    for w in (len(IDS), len(IDS) + 5):
        _close(R.forward(cfg, t, IDS, 2, window=w), full, 0)
    assert np.abs(R.forward(cfg, t, IDS, 2, window=3) - full).max() > 1e-6
    _close(R.forward(cfg, t, IDS, 2, window=3)[:3], full[:3], 1e-12)  # p < W: no change


def test_window_one_layer_sees_exactly_w_keys():
    # one layer, RoPE (relative), s0 = x: row p with window W equals a full-attention run
    # on the W tokens ending at p, whatever their absolute positions.
    cfg, t = _model("llama", seed=12, n_pre_blocks=0)
    W = 3
    win = R.forward(cfg, t, IDS, 1, window=W)
    for p in range(W - 1, len(IDS)):
        alone = R.forward(cfg, t, IDS[p - W + 1:p + 1], 1)
        _close(win[p], alone[-1], 1e-10)


def test_window_one_attends_to_self_only():
    cfg, t = _model("llama", seed=13)
    win = R.forward(cfg, t, IDS, 2, window=1)
    for p in (0, 4, 9):
        _close(win[p], R.forward(cfg, t, [IDS[p]], 2)[0], 1e-10)


# ---------------------------------------------------------------------------------------
# hand-written numpy for one tiny sandwich layer


def _rms(x, w, eps):
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w


def _rope_complex(x, theta, interleaved):
    """x [T, hd] rotated by position as complex numbers (pairs by layout)."""
    T, hd = x.shape
    re, im = (x[:, 0::2], x[:, 1::2]) if interleaved else (x[:, : hd // 2], x[:, hd // 2:])
    ang = np.arange(T)[:, None] * theta ** (-np.arange(hd // 2) * 2.0 / hd)
    c = (re + 1j * im) * np.exp(1j * ang)
    out = np.empty_like(x)
    if interleaved:
        out[:, 0::2], out[:, 1::2] = c.real, c.imag
    else:
        out[:, : hd // 2], out[:, hd // 2:] = c.real, c.imag
    return out


def _hand_attention(q, k, v, H, hd, theta, interleaved):
    T = q.shape[0]
    outs = []
    for h in range(H):
        sl = slice(h * hd, (h + 1) * hd)
        qh = _rope_complex(q[:, sl], theta, interleaved)
        kh = _rope_complex(k[:, sl], theta, interleaved)
        a = qh @ kh.T / np.sqrt(hd) + np.triu(np.full((T, T), -1e300), 1)
        a = np.exp(a - a.max(1, keepdims=True))
        outs.append(a / a.sum(1, keepdims=True) @ v[:, sl])
    return np.concatenate(outs, 1)


def _hand_swiglu(t, p, h):
    g = h @ t[p + "mlp.w_gate.weight"].T
    return (g / (1 + np.exp(-g)) * (h @ t[p + "mlp.w_up.weight"].T)) @ t[p + "mlp.w_down.weight"].T


TINY = dict(dim=8, n_heads=2, ffn_dim=12, vocab_size=11, n_pre_blocks=0, n_loop_layers=1,
            n_post_blocks=0, max_seq_len=16, n_kv_heads=None)


def test_huginn_sandwich_by_hand():
    cfg, t = _model("huginn", seed=14, **TINY)
    ids, eps, D, hd = [3, 1, 4, 1, 5], 1e-6, 8, 4
    n = lambda name, x: _rms(x, t[name + ".weight"], eps)  # noqa: E731
    p = "loop.0."

    def layer(h):
        a_in = n(p + "attn_norm", h)
        qkv = a_in @ t[p + "attn.wqkv.weight"].T + t[p + "attn.wqkv.bias"]
        q, k, v = qkv[:, :8], qkv[:, 8:16], qkv[:, 16:]
        h = n(p + "attn_post_norm", h + _hand_attention(q, k, v, 2, hd, 10000.0, True)
              @ t[p + "attn.wo.weight"].T)
        return n(p + "mlp_post_norm", h + _hand_swiglu(t, p, n(p + "mlp_norm", h)))

    x = t["embed.weight"][ids] * 8.0
    s = 0.5 * np.array([[R._state_element(1234, pos, i) for i in range(D)]
                        for pos in range(len(ids))])
    for _ in range(2):
        s = layer(np.concatenate([s, x], 1) @ t["inject.weight"].T)
    y = n("final_norm", n("final_norm", s))  # ln_f after the loop and before the head
    _close(R.forward(cfg, t, ids, 2), y @ t["embed.weight"].T, 1e-10)


def test_ouro_sandwich_by_hand():
    cfg, t = _model("ouro", seed=15, **TINY)
    ids, eps, hd = [2, 7, 1, 8, 2, 8], 1e-6, 4
    n = lambda name, x: _rms(x, t[name + ".weight"], eps)  # noqa: E731
    p = "loop.0."

    def layer(h):
        a_in = n(p + "attn_norm", h)
        q, k, v = (a_in @ t[p + f"attn.{w}.weight"].T for w in ("wq", "wk", "wv"))
        h = h + n(p + "attn_post_norm",
                  _hand_attention(q, k, v, 2, hd, 10000.0, False) @ t[p + "attn.wo.weight"].T)
        return h + n(p + "mlp_post_norm", _hand_swiglu(t, p, n(p + "mlp_norm", h)))

    s = t["embed.weight"][ids]
    for _ in range(3):
        s = n("loop_norm", layer(s))
    _close(R.forward(cfg, t, ids, 3), s @ t["head.weight"].T, 1e-10)


_GELU = {
    "gelu": lambda u: 0.5 * u * (1 + math.erf(u / math.sqrt(2))),
    "gelu_tanh": lambda u: 0.5 * u * (
        1 + math.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3))),
}


@pytest.mark.parametrize("mlp", ["gelu", "gelu_tanh"])
def test_pre_layernorm_gelu_learned_by_hand(mlp):
    cfg, t = _model("llama", seed=16, pos_encoding="learned", norm_type="layernorm",
                    norm_bias=True, mlp=mlp, mlp_bias=True, attn_out_bias=True, **TINY)
    ids, eps = [9, 9, 0, 10], 1e-5

    def ln(name, x):
        mu = x.mean(-1, keepdims=True)
        sd = np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
        return (x - mu) / sd * t[name + ".weight"] + t[name + ".bias"]

    p = "loop.0."
    h = t["embed.weight"][ids] + t["pos_emb.weight"][:4]
    a = ln(p + "attn_norm", h)
    q, k, v = (a @ t[p + f"attn.{w}.weight"].T for w in ("wq", "wk", "wv"))
    T, outs = 4, []
    for head in range(2):  # no RoPE: plain causal softmax
        sl = slice(head * 4, head * 4 + 4)
        sc = q[:, sl] @ k[:, sl].T / 2.0
        sc[np.triu_indices(T, 1)] = -np.inf
        w = np.exp(sc - sc.max(1, keepdims=True))
        outs.append(w / w.sum(1, keepdims=True) @ v[:, sl])
    h = h + np.concatenate(outs, 1) @ t[p + "attn.wo.weight"].T + t[p + "attn.wo.bias"]
    m = ln(p + "mlp_norm", h)
    up = m @ t[p + "mlp.w_up.weight"].T + t[p + "mlp.w_up.bias"]
    gelu = np.array([_GELU[mlp](u) for u in up.ravel()]).reshape(up.shape)
    h = h + gelu @ t[p + "mlp.w_down.weight"].T + t[p + "mlp.w_down.bias"]
    want = ln("final_norm", h) @ t["head.weight"].T
    _close(R.forward(cfg, t, ids, 1), want, 1e-10)


# ---------------------------------------------------------------------------------------
# the random initial state

_M = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix_np(x):
    """Vectorized splitmix64 on numpy uint64 (wraps mod 2^64), a second implementation."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def test_splitmix64_known_value():
    assert R.splitmix64(0) == 0xE220A8397B1DCDAF  # first output of splitmix64 seeded with 0
    xs = np.array([0, 1, 2**63, 2**64 - 1], dtype=np.uint64)
    assert [int(v) for v in _splitmix_np(xs)] == [R.splitmix64(int(v)) for v in xs]


def test_random_state_matches_vectorized_generator():
    seed, P, D = 77, 40, 16
    p = np.repeat(np.arange(P, dtype=np.uint64), D)
    i = np.tile(np.arange(D, dtype=np.uint64), P)
    key = _splitmix_np(_splitmix_np(_splitmix_np(np.uint64(seed)) ^ p) ^ i)
    z = np.full(P * D, np.nan)
    with np.errstate(over="ignore"):
        for c in range(8):  # redraw rounds; P(|z| > 3) is 0.27%, so 8 rounds are plenty
            u1 = (_splitmix_np(key + np.uint64(2 * c)) >> np.uint64(11)) * 2.0 ** -53
            u2 = (_splitmix_np(key + np.uint64(2 * c + 1)) >> np.uint64(11)) * 2.0 ** -53
            draw = np.sqrt(-2 * np.log(1 - u1)) * np.cos(2 * np.pi * u2)
            z = np.where(np.isnan(z) & (np.abs(draw) <= 3), draw, z)
    np.testing.assert_allclose(R.random_state(seed, range(P), D, 1.0).ravel(), z,
                               rtol=1e-15, atol=0)


def test_random_state_statistics_and_keying():
    s = R.random_state(5, range(300), 64, 0.5)  # [300, 64]
    assert abs(s.mean()) < 0.02
    assert abs(s.std() / 0.5 - 0.98658) < 0.02  # std of N(0,1) truncated at +-3
    assert np.abs(s).max() <= 1.5
    assert np.abs(s).max() > 1.2  # the tails are really drawn
    _close(R.random_state(5, range(300), 64, 0.5), s, 0)  # deterministic
    _close(R.random_state(5, [7, 250, 3], 64, 0.5), s[[7, 250, 3]], 0)  # only (seed, p, i)
    _close(R.random_state(5, range(300), 16, 0.5), s[:, :16], 0)  # not on dim
    _close(R.random_state(5, range(300), 64, 2.0), s * 4, 1e-15)
    assert np.abs(R.random_state(6, range(3), 64, 0.5) - s[:3]).min() > 0
    c = np.corrcoef(s[:, :-1].ravel(), s[:, 1:].ravel())[0, 1]
    assert abs(c) < 0.03  # neighbouring channels are independent


def test_random_state_is_the_same_prefilled_or_token_by_token():
    cfg, t = _model("huginn", seed=17)
    full = R.forward(cfg, t, IDS, 2)
    _, st = R.forward(cfg, t, IDS, 2, return_states=True)
    _close(st["init"], R.random_state(1234, range(len(IDS)), 64, 0.5), 0)
    for n in (1, 5):
        _close(R.forward(cfg, t, IDS[:n], 2), full[:n], 1e-12)


# ---------------------------------------------------------------------------------------
# sampling


def test_greedy_ties_go_to_lowest_id():
    rng = np.random.default_rng(0)
    for temp in (0.0, 0.01):
        assert R.sample_next([1.0, 3.0, 3.0, 2.0], temp, 50, 1.0, rng) == 1
    assert R.sample_next([-np.inf, -np.inf], 0.0, 50, 1.0, rng) == 0


def test_repetition_penalty_hf_rule():
    z = R.apply_repetition_penalty([2.0, -2.0, 0.5, 0.0, -1.0], [0, 1, 1, 3], 2.0)
    assert z.tolist() == [1.0, -4.0, 0.5, 0.0, -1.0]  # repeats count once; 0 stays 0
    rng = np.random.default_rng(0)
    assert R.sample_next([3.0, 2.0], 0.0, 1, 1.0, rng, repetition_penalty=2.0, seen=[0]) == 1
    assert R.sample_next([-1.0, -1.5], 0.0, 1, 1.0, rng, repetition_penalty=2.0,
                         seen=[0]) == 1  # negative: multiplied, so -2 < -1.5


def test_top_k_keeps_every_tie_with_the_kth():
    p = R.sampling_distribution([5.0, 3.0, 3.0, 3.0, 1.0], 1.0, 2, 1.0)
    assert (p > 0).tolist() == [True, True, True, True, False]
    z = np.array([5.0, 3.0, 3.0, 3.0])
    _close(p[:4], np.exp(z) / np.exp(z).sum(), 1e-15)
    assert R.sampling_distribution([1.0, 2.0], 1.0, 10, 1.0).tolist() == pytest.approx(
        [1 / (1 + math.e), math.e / (1 + math.e)])  # k > V keeps all


def test_top_p_rules():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    z = np.log(probs)
    keep = lambda top_p: (R.sampling_distribution(z, 1.0, 50, top_p) > 0).tolist()  # noqa
    assert keep(1e-9) == [True, False, False, False]  # always the top token, only it
    assert keep(0.5) == [True, False, False, False]  # the top alone reaches 0.5
    assert keep(0.7) == [True, True, False, False]
    assert keep(0.81) == [True, True, True, False]
    assert keep(1.0) == [True, True, True, True]
    p = R.sampling_distribution(z, 1.0, 50, 0.7)
    _close(p, np.array([0.625, 0.375, 0, 0]), 1e-12)  # renormalized over the kept
    # a tie for the top with a tiny top_p keeps exactly one: the lowest id
    assert (R.sampling_distribution([1.0, 4.0, 4.0, 0.0], 1.0, 50, 1e-6) > 0).tolist() == [
        False, True, False, False]
    # top_k first, then top_p on what is left
    assert (R.sampling_distribution(z, 1.0, 2, 0.9) > 0).tolist() == [True, True, False, False]


def test_temperature_scales_logits():
    z = np.array([0.3, -1.0, 2.0, 0.0])
    p = R.sampling_distribution(z, 0.5, 50, 1.0)
    _close(p, np.exp(2 * z) / np.exp(2 * z).sum(), 1e-14)


def test_sampling_argument_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="top_k"):
        R.sample_next([0.0, 1.0], 0.8, 0, 1.0, rng)
    with pytest.raises(ValueError, match="top_p"):
        R.sample_next([0.0, 1.0], 0.8, 5, 0.0, rng)
    with pytest.raises(ValueError, match="temperature"):
        R.sample_next([0.0, 1.0], -1.0, 5, 1.0, rng)
    with pytest.raises(ValueError, match="repetition_penalty"):
        R.sample_next([0.0, 1.0], 0.0, 5, 1.0, rng, repetition_penalty=0.0)
    assert R.sample_next([0.0, 1.0], 0.0, 0, 1.0, rng) == 1  # top_k ignored when greedy


def _chi2_critical(df, z=3.719):
    """Wilson-Hilferty upper quantile of chi-square(df); z = 3.719 is p = 1e-4."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("temp, top_k, top_p, penalty", [
    (0.7, 6, 0.9, 1.0), (1.3, 50, 1.0, 1.0), (1.0, 4, 0.95, 1.5)])
def test_sample_next_frequencies_match_distribution(temp, top_k, top_p, penalty):
    logits = np.random.default_rng(1).normal(0, 1.5, 12)
    seen = [0, 3, 3, 7]
    probs = R.sampling_distribution(R.apply_repetition_penalty(logits, seen, penalty), temp,
                                    top_k, top_p)
    rng = np.random.default_rng(2)
    N = 20000
    draws = [R.sample_next(logits, temp, top_k, top_p, rng, penalty, seen) for _ in range(N)]
    counts = np.bincount(draws, minlength=12)
    assert np.all(counts[probs == 0] == 0)  # removed tokens are never drawn
    kept = probs > 0
    expected = N * probs[kept]
    chi2 = ((counts[kept] - expected) ** 2 / expected).sum()
    assert kept.sum() >= 3 and chi2 < _chi2_critical(kept.sum() - 1)


# ---------------------------------------------------------------------------------------
# generation


def _manual_greedy(cfg, t, ids, n, loops, window=0):
    ids = list(ids)
    for _ in range(n):
        ids.append(int(np.argmax(R.forward(cfg, t, ids, loops, window=window)[-1])))
    return ids


def test_generate_greedy_equals_manual_loop():
    cfg, t = _model("huginn", seed=20)
    prompt = [4, 8, 15]
    want = _manual_greedy(cfg, t, prompt, 6, 2)
    assert R.generate(cfg, t, prompt, 6, 2, eos_ids=[]) == want
    want_w = _manual_greedy(cfg, t, prompt, 6, 2, window=4)
    assert R.generate(cfg, t, prompt, 6, 2, eos_ids=[], window=4) == want_w


def test_generate_stops_on_eos_and_keeps_it():
    cfg, t = _model("llama", seed=21)
    prompt = [10, 20, 30]
    free = R.generate(cfg, t, prompt, 5, 1, eos_ids=[])
    assert len(free) == 8
    eos = free[5]  # the third new token
    first = free[3:].index(eos)
    assert R.generate(cfg, t, prompt, 5, 1, eos_ids=[eos]) == free[:3 + first + 1]
    cfg_eos = dict(cfg, eos_ids=[eos])
    assert R.generate(cfg_eos, t, prompt, 5, 1) == free[:3 + first + 1]  # None: the config's
    assert R.generate(cfg_eos, t, prompt, 5, 1, eos_ids=[]) == free  # [] turns it off


def test_generate_stop_sequences_match_emitted_tokens_only():
    cfg, t = _model("ouro", seed=22)
    prompt = [1, 2, 3]
    free = R.generate(cfg, t, prompt, 6, 2, eos_ids=[])
    new = free[3:]
    stop = new[2:4]
    first = next(j for j in range(2, 6) if new[j - 1:j + 1] == stop)
    assert R.generate(cfg, t, prompt, 6, 2, stop_sequences=[[96], stop], eos_ids=[]) == \
        free[:3 + first + 1]
    # a sequence that only matches across the prompt boundary does not stop
    across = [prompt[-1], new[0]]
    got = R.generate(cfg, t, prompt, 6, 2, stop_sequences=[across], eos_ids=[])
    hits = [j for j in range(1, 6) if new[j - 1:j + 1] == across]
    assert got == (free[:3 + hits[0] + 1] if hits else free)
    with pytest.raises(ValueError, match="stop_sequences"):
        R.generate(cfg, t, prompt, 6, 2, stop_sequences=[[]])


def test_generate_sampling_is_reproducible_and_uses_the_penalty():
    cfg, t = _model("llama", seed=23)
    prompt = [5, 6, 7, 5]
    kw = dict(temperature=0.9, top_k=20, top_p=0.95, repetition_penalty=1.3, eos_ids=[])
    a = R.generate(cfg, t, prompt, 6, 1, rng=np.random.default_rng(4), **kw)
    assert a == R.generate(cfg, t, prompt, 6, 1, rng=np.random.default_rng(4), **kw)
    rng, ids = np.random.default_rng(4), list(prompt)
    for _ in range(6):
        ids.append(R.sample_next(R.forward(cfg, t, ids, 1)[-1], 0.9, 20, 0.95, rng, 1.3, ids))
    assert a == ids
    # a huge penalty makes greedy avoid everything seen so far
    g = R.generate(cfg, t, prompt, 5, 1, repetition_penalty=1e6, eos_ids=[])
    assert len(set(g[4:])) == 5 and not set(g[4:]) & set(prompt)


def test_window_generate_follows_the_tutorial_semantics():
    """The tutorial loop (docs/generation.md, "cache_window"): the model sees the last `window` ids with
    positions restarting at 0; top_k = 0 is off; the list keeps every id."""
    from tinyloop.config import preset_config
    from tinyloop.random_model import random_tensors

    cfg = preset_config("llama", pos_encoding="learned", max_seq_len=4)
    t = {k: v.astype(np.float64) for k, v in random_tensors(cfg, seed=3).items()}
    rng = np.random.default_rng(42)
    out = R.window_generate(cfg, t, [1, 2, 3], 10, 4, 0.0, 0, 1.0, rng)
    assert len(out) == 13 and out[:3] == [1, 2, 3]  # never longer than the position table allows
    # Each appended id is the greedy choice over the last 4 ids at positions 0..3.
    for i in range(3, 13):
        x = out[max(0, i - 4):i]
        assert out[i] == int(np.argmax(R.forward(cfg, t, x, cfg["default_loops"])[-1]))
    # Sampling with top_k = 0 (off) and a seed is reproducible and stays in the vocabulary.
    a = R.window_generate(cfg, t, [1], 20, 4, 0.8, 0, 0.9, np.random.default_rng(1))
    b = R.window_generate(cfg, t, [1], 20, 4, 0.8, 0, 0.9, np.random.default_rng(1))
    assert a == b and all(0 <= i < cfg["vocab_size"] for i in a)
