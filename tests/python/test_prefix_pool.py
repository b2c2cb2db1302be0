"""Prefix pool (docs/prefix-cache.md): generate_with_pool(pool, prompt) returns exactly
generate(prompt) (greedy and seeded sampling) whether the longest registered prefix is long,
short (the prompt diverges inside a longer one), all of the prompt, or missing; LRU eviction
under a tight capacity (entries and bytes); statistics; keys on loops and on the Model;
several Python threads sharing one pool while it evicts; errors."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import tinyloop_py as tl

SYSTEM = np.array([5, 17, 3, 42, 8, 91, 23, 60, 11, 2, 7, 19, 33, 4], dtype=np.int32)  # [14]
SHORT = SYSTEM[:6]


def gen_kw(**over):
    kw = dict(max_tokens=10, loops=3, stop_at_eos=False)
    kw.update(over)
    return kw


@pytest.mark.parametrize("name", ["llama", "huginn_gqa_f16", "ouro_interleaved_bf16"])
@pytest.mark.parametrize("sampling", [{}, dict(temperature=0.9, top_k=30, top_p=0.95,
                                                 repetition_penalty=1.2, seed=7)],
                         ids=["greedy", "seeded"])
def test_equals_generate_hit_shorter_match_and_miss(test_models, name, sampling):
    with tl.Model(test_models[name].path) as model:
        pool = tl.PrefixPool()
        model.register_prefix(pool, SHORT, loops=3)
        model.register_prefix(pool, model.build_prefix_cache(SYSTEM, loops=3))
        diverged = SYSTEM.copy()
        diverged[9] = (diverged[9] + 1) % 50  # leaves the 14-token prefix inside it
        prompts = [
            np.concatenate([SYSTEM, [4, 9, 1]]),    # longest match: 14
            SYSTEM,                                 # the whole prompt is the prefix
            np.concatenate([diverged, [3]]),        # diverges inside SYSTEM: the 6-token one
            np.array([1, 2, 3], dtype=np.int32),    # miss
        ]
        for prompt in prompts:
            want = model.generate(prompt, **gen_kw(**sampling))
            assert model.generate_with_pool(pool, prompt, **gen_kw(**sampling)) == want
        assert (pool.hits, pool.misses) == (3, 1)
        assert pool.stats() == dict(hits=3, misses=1, evictions=0, bytes=pool.bytes, entries=2)


def test_keys_on_loops_and_model(test_models):
    with tl.Model(test_models["huginn"].path) as model, tl.Model(test_models["huginn"].path) as other:
        pool = tl.PrefixPool()
        model.register_prefix(pool, SYSTEM, loops=2)
        prompt = np.concatenate([SYSTEM, [1, 2]])
        # Another depth, or another Model: no entry fits, a miss that still equals generate().
        assert model.generate_with_pool(pool, prompt, **gen_kw(loops=4)) == model.generate(
            prompt, **gen_kw(loops=4))
        assert other.generate_with_pool(pool, prompt, **gen_kw(loops=2)) == other.generate(
            prompt, **gen_kw(loops=2))
        assert (pool.hits, pool.misses) == (0, 2)
        assert model.generate_with_pool(pool, prompt, **gen_kw(loops=2)) == model.generate(
            prompt, **gen_kw(loops=2))
        assert pool.hits == 1
        # The default loops is the config's, as in generate().
        default = model.config()["default_loops"]
        model.register_prefix(pool, SYSTEM)
        assert model.generate_with_pool(pool, prompt, max_tokens=5) == model.generate(prompt, max_tokens=5)
        assert pool.hits == 2 and len(pool) == (1 if default == 2 else 2)
        # The window is part of the key too.
        wpool = tl.PrefixPool()
        model.register_prefix(wpool, SYSTEM, loops=2, cache_window=8)
        for window, hit in [(0, 0), (8, 1)]:
            kw = gen_kw(loops=2, cache_window=window, max_tokens=80)  # a tail of 82 wraps 72 rows
            assert model.generate_with_pool(wpool, prompt, **kw) == model.generate(prompt, **kw)
            assert wpool.hits == hit


def test_lru_eviction_tight_capacity(test_models):
    with tl.Model(test_models["ouro"].path) as model:
        prefixes = [np.array([i + 1, 7, 9, 11, 13, 2], dtype=np.int32) for i in range(4)]
        by_entries = tl.PrefixPool(max_entries=2)
        for p in prefixes[:2]:
            model.register_prefix(by_entries, p, loops=3)
        prompt0 = np.concatenate([prefixes[0], [5]])
        model.generate_with_pool(by_entries, prompt0, **gen_kw())  # prefix 0 is now the most recent
        model.register_prefix(by_entries, prefixes[2], loops=3)   # evicts prefix 1
        assert (len(by_entries), by_entries.evictions) == (2, 1)
        for i, hit in [(1, False), (0, True), (2, True)]:
            before = by_entries.hits
            prompt = np.concatenate([prefixes[i], [5]])
            assert model.generate_with_pool(by_entries, prompt, **gen_kw()) == model.generate(prompt, **gen_kw())
            assert by_entries.hits - before == int(hit), i

        one = model.build_prefix_cache(prefixes[0], loops=3).bytes
        by_bytes = tl.PrefixPool(max_bytes=2 * one + one // 2)
        for p in prefixes:
            model.register_prefix(by_bytes, p, loops=3)
        assert (len(by_bytes), by_bytes.bytes, by_bytes.evictions) == (2, 2 * one, 2)
        assert by_bytes.max_bytes == 2 * one + one // 2 and by_bytes.max_entries == 0
        # An evicted cache still serves whoever holds it.
        held = model.register_prefix(by_bytes, prefixes[0], loops=3)
        model.register_prefix(by_bytes, prefixes[1], loops=3)
        model.register_prefix(by_bytes, prefixes[2], loops=3)
        assert model.generate_from_prefix_cache(held, [5], **gen_kw()) == model.generate(prompt0, **gen_kw())
        by_bytes.clear()
        assert (len(by_bytes), by_bytes.bytes) == (0, 0)
        assert "PrefixPool" in repr(by_bytes)


def test_threads_share_one_pool_while_evicting(test_models):
    rng = np.random.default_rng(11)
    with tl.Model(test_models["huginn_gqa_f16"].path) as model:
        vocab = model.config()["vocab_size"]
        heads = [rng.integers(0, vocab, size=8, dtype=np.int32) for _ in range(3)]
        prompts = [np.concatenate([heads[i % 3], rng.integers(0, vocab, size=1 + i % 4, dtype=np.int32)])
                   for i in range(18)]
        want = [model.generate(p, **gen_kw(loops=2)) for p in prompts]
        pool = tl.PrefixPool(max_entries=2)  # three heads, two places: constant eviction

        def work(i):
            model.register_prefix(pool, heads[i % 3], loops=2)
            return model.generate_with_pool(pool, prompts[i], **gen_kw(loops=2))

        with ThreadPoolExecutor(max_workers=6) as ex:
            got = list(ex.map(work, range(len(prompts))))
        assert got == want
        s = pool.stats()
        assert s["hits"] + s["misses"] == len(prompts) and s["entries"] == 2
        assert s["evictions"] >= 1


def test_errors(test_models):
    with tl.Model(test_models["huginn"].path) as model, tl.Model(test_models["huginn"].path) as other:
        with pytest.raises(ValueError, match="max_bytes"):
            tl.PrefixPool(max_bytes=-1)
        with pytest.raises(ValueError, match="max_entries"):
            tl.PrefixPool(max_entries=-3)
        pool = tl.PrefixPool(max_bytes=100)
        with pytest.raises(ValueError, match="max_bytes"):  # one cache larger than the pool
            model.register_prefix(pool, SYSTEM, loops=2)
        pool = tl.PrefixPool()
        cache = model.build_prefix_cache(SYSTEM, loops=2)
        with pytest.raises(ValueError, match="different Model"):
            other.register_prefix(pool, cache)
        with pytest.raises(ValueError, match="loops"):
            model.register_prefix(pool, cache, loops=3)
        with pytest.raises(ValueError):
            model.register_prefix(pool, np.array([], dtype=np.int32))
        model.register_prefix(pool, cache)
        with pytest.raises(ValueError):
            model.generate_with_pool(pool, SYSTEM, max_tokens=0, loops=2)
        with pytest.raises(ValueError):
            model.generate_with_pool(pool, [10**6], loops=2)
        with pytest.raises(RuntimeError):  # prompt + max_tokens > max_seq_len (128)
            model.generate_with_pool(pool, SYSTEM, max_tokens=200, loops=2)
        assert (pool.hits, pool.misses) == (0, 0)  # bad requests never reach the lookup
