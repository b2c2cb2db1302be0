"""Early exit in generate / generate_stream (docs/loop-depth.md, section 1).

The oracle is early_exit_reference.decode: an independent float64 numpy decode with
per-position exit depths and the latest-iteration KV rule. Greedy tokens and the per-token
depths must match exactly, in both probe modes, on random models of several families.
"""
import os

import numpy as np
import pytest

import early_exit_reference as eer
import tinyloop_py as tl
from tinyloop_py import _testing  # test and benchmark hooks

PROMPT = np.array([5, 17, 3, 42, 8, 91], dtype=np.int32)
LOOPS = 7
MAX_TOKENS = 14

# (model, probe mode, patience, min_L, peek_every)
CASES = [
    ("huginn", "hidden", 1, 2, 1),
    ("huginn", "margin", 1, 2, 2),
    ("ouro", "hidden", 2, 1, 1),
    ("ouro", "margin", 1, 3, 1),
    ("gpt_learned", "hidden", 1, 2, 2),
    ("llama", "margin", 2, 2, 1),
]


def _safe_threshold(m, mode, patience, min_L, peek_every):
    """A threshold at which exits happen and no probe sits near it (so float32 vs float64
    rounding cannot flip a decision): candidates are quantiles of the probe values of a run
    that never stops; the first whose own run keeps every probe and every greedy choice
    clear of ties wins. Returns (kwargs, numpy run)."""
    never = dict(tau=0.0) if mode == "hidden" else dict(logit_margin=np.inf)
    base = dict(patience=patience, min_L=min_L, peek_every=peek_every)
    probe_run = eer.decode(m.cfg, m.tensors, PROMPT, MAX_TOKENS, LOOPS, **base, **never)
    values = np.array(probe_run.rhos if mode == "hidden" else probe_run.gaps)
    for q in (0.5, 0.4, 0.6, 0.3, 0.7, 0.2, 0.8):
        if mode == "hidden":
            kw = dict(base, tau=float(np.quantile(values, q)))
        else:
            kw = dict(base, logit_margin=float(np.quantile(values, 1 - q)))
        run = eer.decode(m.cfg, m.tensors, PROMPT, MAX_TOKENS, LOOPS, **kw)
        probes = np.array(run.rhos if mode == "hidden" else run.gaps)
        thr = kw["tau"] if mode == "hidden" else kw["logit_margin"]
        clear = np.min(np.abs(probes - thr)) > 1e-4 * max(1.0, thr)
        if clear and min(run.argmax_gaps) > 1e-3 and np.mean(run.depths) < LOOPS:
            return kw, run
    pytest.fail("no threshold clear of every probe value")


def _engine_kwargs(kw):
    return {f"early_exit_{k}": v for k, v in kw.items()}


@pytest.mark.parametrize("name,mode,patience,min_L,peek_every", CASES)
def test_matches_numpy_decode_with_exits(test_models, name, mode, patience, min_L, peek_every):
    m = test_models[name]
    kw, want = _safe_threshold(m, mode, patience, min_L, peek_every)
    with tl.Model(m.path, kv_mode="fp32") as model:
        got = model.generate_stream(PROMPT, lambda t: True, max_tokens=MAX_TOKENS, loops=LOOPS,
                                    stop_at_eos=False, **_engine_kwargs(kw))
        tokens = model.generate(PROMPT, max_tokens=MAX_TOKENS, loops=LOOPS, stop_at_eos=False,
                                **_engine_kwargs(kw))
    assert got["tokens"] == want.tokens
    assert got["loops_per_token"] == want.depths
    assert tokens == want.tokens
    assert got["mean_loops"] == pytest.approx(np.mean(want.depths))
    assert got["mean_loops"] < LOOPS  # exits really happen
    assert min(want.depths[1:]) >= min_L and want.depths[0] == LOOPS  # prefill never exits


def test_numpy_decode_without_exit_is_the_reference_generate(test_models):
    """The oracle itself: at full depth it is reference.generate, token for token."""
    import reference
    m = test_models["huginn"]
    run = eer.decode(m.cfg, m.tensors, PROMPT, 8, 3)
    assert run.tokens == reference.generate(m.cfg, m.tensors, PROMPT, 8, 3, eos_ids=[])
    assert run.depths == [3] * 8


@pytest.mark.parametrize("name", ["huginn", "ouro_interleaved_bf16"])
def test_patience_zero_is_plain_decoding(test_models, name):
    m = test_models[name]
    with tl.Model(m.path) as model:  # default fp16 KV
        plain = model.generate(PROMPT, max_tokens=20, loops=5, stop_at_eos=False)
        off = model.generate(PROMPT, max_tokens=20, loops=5, stop_at_eos=False, early_exit_patience=0,
                             early_exit_min_L=1, early_exit_tau=1e9, early_exit_logit_margin=1e-9)
        r = model.generate_stream(PROMPT, lambda t: True, max_tokens=20, loops=5, stop_at_eos=False,
                                  early_exit_tau=1e9)
        sampled = [model.generate(PROMPT, max_tokens=20, loops=5, temperature=0.9, seed=3, stop_at_eos=False,
                                  early_exit_patience=p, early_exit_tau=0.0) for p in (0, 1)]
    assert off == plain and r["tokens"] == plain
    assert r["loops_per_token"] == [5] * 20 and r["mean_loops"] == 5.0
    assert sampled[0] == sampled[1]  # enabled but never stable: the same computation


def test_every_stable_probe_stops_at_min_L(test_models):
    m = test_models["huginn"]
    with tl.Model(m.path) as model:
        for kw, depth in ((dict(early_exit_tau=1e9), 3), (dict(early_exit_logit_margin=1e-30), 3),
                          (dict(early_exit_tau=1e9, early_exit_patience=2, early_exit_peek_every=2), 5)):
            kw = dict(dict(early_exit_patience=1, early_exit_min_L=3), **kw)
            r = model.generate_stream(PROMPT, lambda t: True, max_tokens=6, loops=8, stop_at_eos=False, **kw)
            assert r["loops_per_token"] == [8] + [depth] * 5, kw


def test_seeded_sampling_with_exit_is_reproducible(test_models):
    m = test_models["ouro"]
    kw = dict(max_tokens=25, loops=6, temperature=0.9, top_k=20, seed=11, stop_at_eos=False,
              early_exit_patience=1, early_exit_min_L=2, early_exit_logit_margin=0.5)
    with tl.Model(m.path) as model:
        a = model.generate(PROMPT, **kw)
        b = model.generate(PROMPT, **kw)
        s = model.generate_stream(PROMPT, lambda t: True, **kw)
    assert a == b == s["tokens"]
    assert s["mean_loops"] < 6


def test_uncached_setting_does_not_change_early_exit(test_models):
    """Early exit always decodes with the cache (its KV rule is defined on cache slots)."""
    m = test_models["huginn"]
    kw = dict(max_tokens=12, loops=6, stop_at_eos=False, early_exit_patience=1, early_exit_min_L=2,
              early_exit_logit_margin=1.0)
    with tl.Model(m.path) as model:
        cached = model.generate_stream(PROMPT, lambda t: True, **kw)
    os.environ["TINYLOOP_DISABLE_KV_CACHE"] = "1"
    try:
        with tl.Model(m.path) as model:
            uncached = model.generate_stream(PROMPT, lambda t: True, **kw)
    finally:
        os.environ.pop("TINYLOOP_DISABLE_KV_CACHE")
    assert cached["tokens"] == uncached["tokens"]
    assert cached["loops_per_token"] == uncached["loops_per_token"]


def test_early_exit_with_cache_window(test_models):
    m = test_models["huginn"]
    with tl.Model(m.path, max_seq_len=128) as model:
        r = model.generate_stream(PROMPT, lambda t: True, max_tokens=100, loops=6, cache_window=5,
                                  stop_at_eos=False, early_exit_patience=1, early_exit_min_L=2,
                                  early_exit_logit_margin=1.0)
    assert r["tokens_emitted"] == 100 and len(r["loops_per_token"]) == 100
    assert 2 <= min(r["loops_per_token"]) and r["mean_loops"] < 6


@pytest.mark.parametrize("kwarg,value", [("early_exit_patience", -1), ("early_exit_min_L", 0),
                                         ("early_exit_peek_every", 0), ("early_exit_tau", -1e-3),
                                         ("early_exit_tau", float("nan")),
                                         ("early_exit_logit_margin", -0.1)])
def test_bad_kwargs_raise_value_error_naming_them(test_models, kwarg, value):
    m = test_models["huginn"]
    kw = {"early_exit_patience": 1, kwarg: value}
    with tl.Model(m.path) as model:
        with pytest.raises(ValueError, match=kwarg):
            model.generate(PROMPT, max_tokens=3, **kw)
        with pytest.raises(ValueError, match=kwarg):
            model.generate_stream(PROMPT, lambda t: True, max_tokens=3, **kw)


def test_teacher_forced_hook_agrees_with_generation(test_models):
    """_testing.early_exit_stepwise_logits (used by bench/early_exit.py for perplexity): fed the
    tokens early-exit generation produced, it reports the same depths and the same greedy
    choices; with patience 0 it is the plain cached decode."""
    m = test_models["huginn"]
    ee = dict(early_exit_patience=1, early_exit_min_L=2, early_exit_logit_margin=1.0)
    with tl.Model(m.path) as model:
        r = model.generate_stream(PROMPT, lambda t: True, max_tokens=15, loops=6, stop_at_eos=False, **ee)
        ids = np.array(r["tokens"], np.int32)
        hook = _testing.early_exit_stepwise_logits(model, ids, len(PROMPT), loops=6, **ee)
        plain = _testing.early_exit_stepwise_logits(model, ids, len(PROMPT), loops=6)
        stepwise = _testing.stepwise_logits(model, ids, len(PROMPT), loops=6)
    assert list(hook["depths"][:-1]) == r["loops_per_token"]
    assert list(hook["logits"][:-1].argmax(-1)) == r["tokens"][len(PROMPT):]
    np.testing.assert_array_equal(plain["logits"], stepwise)
    assert np.all(plain["depths"] == 6)
