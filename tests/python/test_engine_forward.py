"""The C++ forward against the independent numpy float64 reference, and the cached decode
path against the uncached one."""
import os

import numpy as np
import pytest

import tinyloop_py as tl
from tinyloop_py import _testing  # test and benchmark hooks
import reference

from engine_models import VARIANTS, rel_err

PROMPT = np.array([5, 17, 3, 42, 8, 91, 23, 60, 11, 2, 77, 30, 9], dtype=np.int32)


def tolerance(m) -> float:
    # 1e-4 of the logit scale for float32 compute; f16/bf16 weights are decoded exactly by
    # both sides, so the same bound holds for them.
    return 1e-4


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("loops", [1, 3, 8])
def test_score_matches_reference(test_models, name, loops):
    m = test_models[name]
    with tl.Model(m.path) as model:
        got = model.score(PROMPT, loops=loops)  # [T, V] float32
        last = model.score_last(PROMPT, loops=loops)  # [V]
    want = reference.forward(m.cfg, m.tensors, PROMPT, loops)  # [T, V] float64
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.all(np.isfinite(got))
    assert rel_err(got, want) < tolerance(m), f"{name} L={loops}: {rel_err(got, want):.2e}"
    np.testing.assert_array_equal(last, got[-1])


def test_score_default_loops_is_config_default(test_models):
    m = test_models["huginn"]
    with tl.Model(m.path) as model:
        L = model.config()["default_loops"]
        np.testing.assert_array_equal(model.score(PROMPT), model.score(PROMPT, loops=L))
        assert not np.allclose(model.score(PROMPT, loops=L), model.score(PROMPT, loops=L + 1))


def _stepwise(path, ids, prefill, loops, window=0, uncached=False, kv_mode=None):
    if uncached:
        os.environ["TINYLOOP_DISABLE_KV_CACHE"] = "1"
    try:
        with tl.Model(path, kv_mode=kv_mode) as model:
            assert model.config()["kv_cache_disabled"] == uncached
            return _testing.stepwise_logits(model, ids, prefill, loops=loops, cache_window=window)
    finally:
        os.environ.pop("TINYLOOP_DISABLE_KV_CACHE", None)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_cached_decode_logits_match_uncached(test_models, name):
    m = test_models[name]
    ids = np.random.default_rng(1).integers(0, m.cfg["vocab_size"], size=40).astype(np.int32)
    cached = _stepwise(m.path, ids, 7, loops=3)
    uncached = _stepwise(m.path, ids, 7, loops=3, uncached=True)
    assert cached.shape == (40 - 7 + 1, m.cfg["vocab_size"])
    assert rel_err(cached, uncached) < 1e-4


@pytest.mark.parametrize("name", ["llama", "huginn", "ouro", "gpt_learned"])
def test_decode_logits_match_reference(test_models, name):
    """Decode through the cache (fp32 KV) reproduces the reference forward's rows."""
    m = test_models[name]
    ids = np.random.default_rng(2).integers(0, m.cfg["vocab_size"], size=24).astype(np.int32)
    got = _stepwise(m.path, ids, 5, loops=4, kv_mode="fp32")
    want = reference.forward(m.cfg, m.tensors, ids, 4)[4:]
    assert rel_err(got, want) < 1e-4


@pytest.mark.parametrize("name", list(VARIANTS))
def test_greedy_64_tokens_cached_equals_uncached(test_models, name):
    m = test_models[name]
    prompt = PROMPT[:6]
    with tl.Model(m.path, max_seq_len=80) as model:
        cached = model.generate(prompt, max_tokens=64, loops=3, stop_at_eos=False)
    os.environ["TINYLOOP_DISABLE_KV_CACHE"] = "1"
    try:
        with tl.Model(m.path, max_seq_len=80) as model:
            uncached = model.generate(prompt, max_tokens=64, loops=3, stop_at_eos=False)
    finally:
        os.environ.pop("TINYLOOP_DISABLE_KV_CACHE")
    assert len(cached) == 6 + 64
    assert cached == uncached


@pytest.mark.parametrize("name", ["llama", "huginn", "ouro"])
def test_greedy_matches_reference_generate(test_models, name):
    m = test_models[name]
    prompt = PROMPT[:5]
    with tl.Model(m.path, kv_mode="fp32") as model:
        got = model.generate(prompt, max_tokens=20, loops=2)
    want = reference.generate(m.cfg, m.tensors, prompt, 20, 2)
    assert got == want


def test_fp16_kv_close_to_fp32(test_models):
    m = test_models["huginn"]
    ids = PROMPT
    fp16 = _stepwise(m.path, ids, 4, loops=4)
    fp32 = _stepwise(m.path, ids, 4, loops=4, kv_mode="fp32")
    err = rel_err(fp16, fp32)
    assert 0 < err < 1e-2  # fp16 storage rounds K/V (so not 0) but only slightly
