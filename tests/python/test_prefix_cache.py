"""Prefix cache (docs/prefix-cache.md): generate_from_prefix_cache(cache, suffix) returns
exactly generate(prefix + suffix), greedy and seeded sampling, on several model families; one
cache serves many suffixes and threads without being modified; errors; memory accounting.

The two-segment attention is the same routine as the one-slot attention (SIMD or scalar), so
the logits are bit-identical with either kernel set (checked in C++, prefix_cache_test); here
the tokens are compared under both (the `kernels` fixture). cache_window: a cache built with
a window equals generate() with that window, through a wrapping tail ring."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import tinyloop_py as tl

PREFIX = np.array([5, 17, 3, 42, 8, 91, 23, 60, 11, 2, 7], dtype=np.int32)
SUFFIXES = [np.array(s, dtype=np.int32) for s in ([4], [9, 33, 1], [12, 13, 14, 15, 16, 17, 18])]


@pytest.fixture(params=[False, True], ids=["simd", "scalar"])
def kernels(request):
    tl.set_force_scalar(request.param)
    yield request.param
    tl.set_force_scalar(False)


@pytest.mark.parametrize("name", ["llama", "huginn", "ouro", "gpt_learned", "huginn_gqa_f16",
                                  "ouro_interleaved_bf16"])
@pytest.mark.parametrize("kv_mode", [None, "fp32"])
def test_equals_generate_of_concatenation_greedy(test_models, name, kv_mode, kernels):
    with tl.Model(test_models[name].path, kv_mode=kv_mode) as model:
        cache = model.build_prefix_cache(PREFIX, loops=3)
        assert (cache.seq_len, cache.loops) == (len(PREFIX), 3)
        for suffix in SUFFIXES:
            want = model.generate(np.concatenate([PREFIX, suffix]), max_tokens=12, loops=3,
                                  stop_at_eos=False)
            got = model.generate_from_prefix_cache(cache, suffix, max_tokens=12, stop_at_eos=False)
            assert got == want, f"suffix={suffix.tolist()}"


@pytest.mark.parametrize("name", ["huginn", "ouro_interleaved_bf16"])
def test_equals_generate_seeded_sampling(test_models, name, kernels):
    kw = dict(max_tokens=16, temperature=0.9, top_k=30, top_p=0.95, repetition_penalty=1.2,
              seed=5, stop_at_eos=False)
    with tl.Model(test_models[name].path) as model:
        cache = model.build_prefix_cache(PREFIX, loops=2)
        for suffix in SUFFIXES:
            want = model.generate(np.concatenate([PREFIX, suffix]), loops=2, **kw)
            assert model.generate_from_prefix_cache(cache, suffix, loops=2, **kw) == want


def test_empty_suffix_decodes_right_after_prefix(test_models):
    with tl.Model(test_models["ouro"].path) as model:
        cache = model.build_prefix_cache(PREFIX)
        want = model.generate(PREFIX, max_tokens=10, stop_at_eos=False)
        got = model.generate_from_prefix_cache(cache, np.array([], dtype=np.int32), max_tokens=10,
                                               stop_at_eos=False)
        assert got == want
        assert model.generate_from_prefix_cache(cache, [], max_tokens=10, stop_at_eos=False) == want


def test_early_exit_and_stop_sequences_compose(test_models):
    kw = dict(max_tokens=16, loops=4, stop_at_eos=False, early_exit_patience=1, early_exit_min_L=2,
              early_exit_logit_margin=0.5)
    with tl.Model(test_models["ouro"].path) as model:
        cache = model.build_prefix_cache(PREFIX, loops=4)
        suffix = SUFFIXES[1]
        full = np.concatenate([PREFIX, suffix])
        assert model.generate_from_prefix_cache(cache, suffix, **kw) == model.generate(full, **kw)
        greedy = model.generate(full, max_tokens=8, loops=4, stop_at_eos=False)
        stop = [greedy[len(full) + 2]]
        assert (model.generate_from_prefix_cache(cache, suffix, max_tokens=8, stop_sequences=[stop],
                                                 stop_at_eos=False)
                == model.generate(full, max_tokens=8, loops=4, stop_sequences=[stop], stop_at_eos=False))


def test_threads_share_one_cache(test_models):
    rng = np.random.default_rng(3)
    with tl.Model(test_models["huginn_gqa_f16"].path) as model:
        vocab = model.config()["vocab_size"]
        suffixes = [rng.integers(0, vocab, size=int(n), dtype=np.int32) for n in rng.integers(1, 9, 16)]
        cache = model.build_prefix_cache(PREFIX, loops=2)
        want = [model.generate(np.concatenate([PREFIX, s]), max_tokens=10, loops=2, stop_at_eos=False)
                for s in suffixes]
        with ThreadPoolExecutor(max_workers=8) as pool:
            got = list(pool.map(lambda s: model.generate_from_prefix_cache(
                cache, s, max_tokens=10, stop_at_eos=False), suffixes))
        assert got == want
        # Unchanged after use: a repeat gives the same answer.
        assert model.generate_from_prefix_cache(cache, suffixes[0], max_tokens=10,
                                                stop_at_eos=False) == want[0]


def test_errors(test_models, tmp_path):
    with tl.Model(test_models["huginn"].path) as model, tl.Model(test_models["huginn"].path) as other:
        cache = model.build_prefix_cache(PREFIX, loops=3)
        with pytest.raises(RuntimeError, match="loops mismatch"):
            model.generate_from_prefix_cache(cache, [1, 2], loops=4)
        with pytest.raises(ValueError, match="different Model"):
            other.generate_from_prefix_cache(cache, [1, 2])
        with pytest.raises(ValueError, match="cache_window mismatch"):
            model.generate_from_prefix_cache(cache, [1, 2], cache_window=8)
        with pytest.raises(ValueError, match="cache_window"):
            model.build_prefix_cache(PREFIX, cache_window=-1)
        with pytest.raises(ValueError):
            model.build_prefix_cache(np.array([], dtype=np.int32))
        with pytest.raises(ValueError):
            model.generate_from_prefix_cache(cache, [10**6])
        with pytest.raises(ValueError):
            model.generate_from_prefix_cache(cache, [1], max_tokens=-1)
        with pytest.raises(RuntimeError):  # prefix + suffix + max_tokens > max_seq_len (128)
            model.generate_from_prefix_cache(cache, [1], max_tokens=200)


def test_bytes_counted_in_vram_usage_while_alive(test_models):
    with tl.Model(test_models["llama"].path) as model:
        base = model.vram_usage_mb()
        cache = model.build_prefix_cache(np.arange(100, dtype=np.int32) % 50, loops=4)
        assert cache.bytes > 0
        assert "PrefixCache" in repr(cache)
        assert model.vram_usage_mb() - base == pytest.approx(cache.bytes / 2**20, rel=0.05, abs=1e-3)
        del cache
        assert model.vram_usage_mb() == pytest.approx(base, abs=1e-3)


@pytest.mark.parametrize("name", ["huginn", "llama"])
def test_sliding_window_equals_generate_with_that_window(test_models, name, kernels):
    prefix = np.tile(PREFIX, 4)[:40]  # longer than the window: its K/V depend on it
    with tl.Model(test_models[name].path) as model:
        cache = model.build_prefix_cache(prefix, loops=2, cache_window=8)
        assert cache.cache_window == 8 and "cache_window=8" in repr(cache)
        for suffix, sampling in [(SUFFIXES[1], {}), (SUFFIXES[0], dict(temperature=0.8, seed=3))]:
            # 80 new tokens: the tail (83 positions) wraps its ring of 8 + 64 rows.
            kw = dict(max_tokens=80, stop_at_eos=False, **sampling)
            want = model.generate(np.concatenate([prefix, suffix]), loops=2, cache_window=8, **kw)
            assert model.generate_from_prefix_cache(cache, suffix, **kw) == want
            assert model.generate_from_prefix_cache(cache, suffix, cache_window=8, **kw) == want
        with pytest.raises(ValueError, match="cache_window mismatch"):
            model.generate_from_prefix_cache(cache, SUFFIXES[0], cache_window=0)
        # The unwindowed cache of the same prefix is a different one (and refuses the window).
        plain = model.build_prefix_cache(prefix, loops=2)
        with pytest.raises(ValueError, match="cache_window mismatch"):
            model.generate_from_prefix_cache(plain, SUFFIXES[0], cache_window=8)
