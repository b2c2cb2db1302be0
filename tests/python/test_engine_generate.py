"""generate / generate_stream: sampling, determinism, stopping, streaming, cache_window."""
import numpy as np
import pytest

import tinyloop_py as tl
from tinyloop_py import _testing  # test and benchmark hooks
import reference

PROMPT = np.array([5, 17, 3, 42, 8, 91], dtype=np.int32)


@pytest.fixture(scope="module")
def huginn(test_models):
    return test_models["huginn"]


def test_same_seed_same_tokens(huginn):
    with tl.Model(huginn.path) as model:
        kw = dict(max_tokens=40, loops=3, temperature=1.0, top_k=20, top_p=0.9, seed=123, stop_at_eos=False)
        a = model.generate(PROMPT, **kw)
        b = model.generate(PROMPT, **kw)
        c = model.generate(PROMPT, **{**kw, "seed": 124})
    with tl.Model(huginn.path) as model:  # a fresh Model too
        d = model.generate(PROMPT, **kw)
    assert a == b == d
    assert a != c


def test_no_seed_draws_fresh_entropy(huginn):
    with tl.Model(huginn.path) as model:
        runs = {tuple(model.generate(PROMPT, max_tokens=30, loops=2, temperature=1.5, top_k=90,
                                     stop_at_eos=False)) for _ in range(4)}
    assert len(runs) > 1


def test_low_temperature_is_greedy(huginn):
    with tl.Model(huginn.path) as model:
        greedy = model.generate(PROMPT, max_tokens=20, loops=3, temperature=0.0)
        for t in (0.005, 0.01):
            assert model.generate(PROMPT, max_tokens=20, loops=3, temperature=t, seed=9) == greedy
        assert model.generate(PROMPT, max_tokens=20, loops=3, temperature=0.0, top_k=1) == greedy


def test_top_k_1_sampling_is_greedy(huginn):
    with tl.Model(huginn.path) as model:
        greedy = model.generate(PROMPT, max_tokens=20, loops=3)
        assert model.generate(PROMPT, max_tokens=20, loops=3, temperature=2.0, top_k=1, seed=5) == greedy


def test_repetition_penalty_matches_reference(test_models):
    m = test_models["llama"]
    with tl.Model(m.path, kv_mode="fp32") as model:
        got = model.generate(PROMPT, max_tokens=16, loops=1, repetition_penalty=1.8)
        plain = model.generate(PROMPT, max_tokens=16, loops=1)
    want = reference.generate(m.cfg, m.tensors, PROMPT, 16, 1, repetition_penalty=1.8)
    assert got == want
    assert got != plain


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 50, 1.0), (1.0, 3, 1.0), (1.3, 50, 0.6),
                                                      (1.0, 1000, 0.05), (0.5, 4, 0.9)])
def test_cpp_sampling_distribution_matches_reference(temperature, top_k, top_p):
    rng = np.random.default_rng(3)
    logits = rng.normal(size=37).astype(np.float32) * 3
    logits[[4, 9, 20]] = logits.max()  # ties at the top
    got = _testing.sampling_distribution(logits, temperature, top_k, top_p)
    want = reference.sampling_distribution(logits.astype(np.float64), temperature, top_k, top_p)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert np.array_equal(got > 0, want > 0)


def test_cpp_sampler_frequencies_follow_distribution():
    logits = np.array([2.0, 1.5, 1.0, 0.2, -1.0, -3.0, 0.0], dtype=np.float32)
    probs = reference.sampling_distribution(logits, 0.9, 5, 0.95)
    draws = np.array(_testing.sample_next(logits, 0.9, 5, 0.95, n_draws=20000, seed=11))
    counts = np.bincount(draws, minlength=len(logits))
    assert np.all(counts[probs == 0] == 0)
    keep = probs > 0
    expected = probs[keep] * len(draws)
    chi2 = float(np.sum((counts[keep] - expected) ** 2 / expected))
    assert chi2 < 25.0  # 0.9999 quantile of chi-square with <= 4 degrees of freedom is ~23.5


def test_stop_sequences_end_generation_and_are_kept(huginn):
    with tl.Model(huginn.path) as model:
        free = model.generate(PROMPT, max_tokens=30, loops=3, stop_at_eos=False)
        new = free[len(PROMPT):]
        stop = new[4:6]
        out = model.generate(PROMPT, max_tokens=30, loops=3, stop_sequences=[stop], stop_at_eos=False)
    first = next(i for i in range(1, len(new)) if new[i - 1:i + 1] == stop)
    assert out == free[:len(PROMPT) + first + 1]
    assert out[-2:] == stop


def test_stop_sequence_does_not_match_inside_prompt(huginn):
    with tl.Model(huginn.path) as model:
        free = model.generate(PROMPT, max_tokens=10, loops=3, stop_at_eos=False)
        out = model.generate(PROMPT, max_tokens=10, loops=3, stop_at_eos=False,
                             stop_sequences=[[int(PROMPT[-2]), int(PROMPT[-1])]])
    assert out == free or len(out) > len(PROMPT) + 1


def test_eos_stops_and_is_kept(test_models):
    m = test_models["llama"]
    with tl.Model(m.path) as model:
        free = model.generate(PROMPT, max_tokens=40, loops=1, stop_at_eos=False)
    eos = free[len(PROMPT) + 3]
    # Make that token an EOS of a copy of the model.
    from tinyloop.format import read_model, write_model
    import os
    import tempfile
    c = read_model(m.path)
    cfg = dict(c.config, eos_ids=[int(eos)])
    path = os.path.join(tempfile.mkdtemp(), "eos.tinyloop")
    write_model(path, cfg, {k: v.astype(np.float32) for k, v in c.tensors.items()})
    with tl.Model(path) as model:
        out = model.generate(PROMPT, max_tokens=40, loops=1)
        assert out[-1] == eos and len(out) <= len(PROMPT) + 4
        assert model.generate(PROMPT, max_tokens=40, loops=1, stop_at_eos=False) == free


def test_generate_stream_equals_generate(huginn):
    with tl.Model(huginn.path) as model:
        kw = dict(max_tokens=25, loops=3, temperature=0.8, top_k=30, seed=4, stop_at_eos=False)
        want = model.generate(PROMPT, **kw)
        seen = []
        r = model.generate_stream(PROMPT, lambda t: seen.append(t) or True, **kw)
    assert r["tokens"] == want
    assert seen == want[len(PROMPT):]
    assert r["tokens_emitted"] == 25
    for key in ("prefill_ms", "first_token_ms", "decode_steady_ms"):
        assert isinstance(r[key], float) and r[key] >= 0
    assert r["first_token_ms"] >= r["prefill_ms"]


def test_generate_stream_stops_when_callback_returns_false(huginn):
    with tl.Model(huginn.path) as model:
        full = model.generate(PROMPT, max_tokens=20, loops=2, stop_at_eos=False)
        seen = []
        r = model.generate_stream(PROMPT, lambda t: seen.append(t) or len(seen) < 5, max_tokens=20,
                                  loops=2, stop_at_eos=False)
    assert len(seen) == 5 and r["tokens_emitted"] == 5
    assert r["tokens"] == full[:len(PROMPT) + 5]


def test_generate_stream_callback_exception_propagates(huginn):
    def boom(tok):
        raise KeyError("from the callback")
    with tl.Model(huginn.path) as model:
        with pytest.raises(KeyError, match="from the callback"):
            model.generate_stream(PROMPT, boom, max_tokens=5, loops=2)
        assert len(model.generate(PROMPT, max_tokens=3, loops=2)) >= len(PROMPT) + 1  # still usable


@pytest.mark.parametrize("name", ["huginn", "gpt_learned", "ouro_interleaved_bf16"])
@pytest.mark.parametrize("window", [4, 9])
def test_cache_window_matches_reference_semantics(test_models, name, window):
    """Ring-buffer decode equals the reference's sliding-window attention (absolute positions)."""
    m = test_models[name]
    with tl.Model(m.path, kv_mode="fp32") as model:
        got = model.generate(PROMPT, max_tokens=30, loops=2, cache_window=window, stop_at_eos=False)
    want = reference.generate(m.cfg, m.tensors, PROMPT, 30, 2, window=window, eos_ids=[])
    assert got == want


def test_cache_window_logits_match_uncached(test_models):
    m = test_models["huginn"]
    ids = np.random.default_rng(5).integers(0, 97, size=50).astype(np.int32)
    import os
    with tl.Model(m.path) as model:
        cached = _testing.stepwise_logits(model, ids, 3, loops=3, cache_window=6)
    os.environ["TINYLOOP_DISABLE_KV_CACHE"] = "1"
    try:
        with tl.Model(m.path) as model:
            uncached = _testing.stepwise_logits(model, ids, 3, loops=3, cache_window=6)
    finally:
        os.environ.pop("TINYLOOP_DISABLE_KV_CACHE")
    np.testing.assert_allclose(cached, uncached, rtol=0, atol=1e-4 * np.abs(uncached).max())


def test_cache_window_bounds_memory(tmp_path):
    """With a window, cache memory during a long generation does not grow with its length."""
    from tinyloop.random_model import write_random_model
    path = str(tmp_path / "long.tinyloop")
    write_random_model(path, "huginn", max_seq_len=4096, dim=64)

    def peak_mb(max_tokens, window):
        with tl.Model(path) as model:
            samples = []
            model.generate_stream(np.arange(1, 20, dtype=np.int32),
                                  lambda t: samples.append(model.vram_usage_mb()) or True,
                                  max_tokens=max_tokens, loops=4, cache_window=window, stop_at_eos=False)
            return max(samples)

    short, long = peak_mb(300, 32), peak_mb(1500, 32)
    full = peak_mb(1500, 0)
    assert long == pytest.approx(short, abs=0.01)
    assert full > long + 1.0  # the full cache of 1519 positions x 10 slots is MiBs bigger
