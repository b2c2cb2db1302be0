"""Long prompts (2048 tokens or more, no window) get 512-row KV blocks in the private caches
of generate, prefix caches, resume handles and speculative decoding (model/kv_pool.h
private_block_rows: decode attention reads a kv head's longer runs faster). The bits never
depend on the block size, so each feature still gives exactly what generate gives, on both
sides of the 2048-token boundary; the caches' byte counts show the long blocks are taken.
(generate against the serving engine's 8-row blocks: test_serving_engine.py.)"""
import random

import numpy as np
import pytest

import tinyloop_py as tl

LONG = 2048  # model/kv_pool.h kLongPromptRows
ROWS = 512  # kLongBlockRows


def _prompt(vocab, n, seed):
    rng = random.Random(seed)
    return np.array([rng.randrange(3, vocab) for _ in range(n)], dtype=np.int32)


def _kv_row_bytes(model, L):
    """F16 K and V bytes of one position over every slot at depth L."""
    c = model.config()
    slots = c["n_pre_blocks"] + L * c["n_loop_layers"] + c["n_post_blocks"]
    return slots * 2 * c["n_kv_heads"] * (c["dim"] // c["n_heads"]) * 2


def test_generate_takes_long_blocks(test_models):
    """generate's own cache (its outputs against the serving engine: test_serving_engine.py):
    with 5 new tokens a 2048-token prompt holds 512-row blocks (2560 rows a slot for 2053
    positions), a 2047-token one 32-row blocks (2080 rows for 2052)."""
    m = test_models["huginn_gqa_f16"]
    with tl.Model(m.path, kv_mode="fp16", max_seq_len=2304) as model:
        vocab = model.config()["vocab_size"]
        mib = {}
        for n in (LONG - 1, LONG):
            seen = []
            model.generate_stream(_prompt(vocab, n, 4), lambda t: seen.append(model.vram_usage_mb()) or True,
                                  max_tokens=5)
            mib[n] = seen[-1]  # while the cache is alive
        L = model.config()["default_loops"]
        assert mib[LONG] - mib[LONG - 1] == pytest.approx((2560 - 2080) * _kv_row_bytes(model, L) / 2**20, abs=0.01)


@pytest.mark.parametrize("n", [LONG - 1, LONG + 37])
def test_prefix_cache_equals_generate(test_models, n):
    m = test_models["huginn_gqa_f16"]
    with tl.Model(m.path, max_seq_len=2304) as model:
        prefix = _prompt(model.config()["vocab_size"], n, 1)
        cache = model.build_prefix_cache(prefix, loops=3)
        for suffix in ([], [7, 9, 11]):
            want = model.generate(np.concatenate([prefix, np.array(suffix, dtype=np.int32)]), loops=3,
                                  max_tokens=6, stop_at_eos=False)
            got = model.generate_from_prefix_cache(cache, np.array(suffix, dtype=np.int32), loops=3, max_tokens=6,
                                                   stop_at_eos=False)
            assert got == want, (n, suffix)
        # The cache holds whole blocks: 512-row ones past the boundary, 32-row ones before it.
        block = ROWS if n >= LONG else 32
        rows = -(-n // block) * block
        assert cache.bytes == pytest.approx(rows * _kv_row_bytes(model, 3) + 4 * model.config()["vocab_size"], abs=64)


@pytest.mark.parametrize("n", [LONG - 1, LONG + 37])
def test_resume_equals_generate(test_models, n):
    m = test_models["huginn"]
    with tl.Model(m.path, max_seq_len=2304) as model:
        prompt = _prompt(model.config()["vocab_size"], n, 2)
        h = model.build_resume_handle(prompt, loops=2, max_loops=4, max_tokens=5)
        for L2 in (2, 4):
            want = model.generate(prompt, max_tokens=5, loops=L2, stop_at_eos=False)
            assert model.resume_generate(h, loops=L2, stop_at_eos=False) == want, (n, L2)


@pytest.mark.parametrize("tree", [False, True])
def test_speculative_equals_generate(test_models, tree):
    m = test_models["huginn_gqa_f16"]
    with tl.Model(m.path, max_seq_len=2304) as model:
        prompt = _prompt(model.config()["vocab_size"], LONG + 11, 3)
        want = model.generate(prompt, max_tokens=12, loops=4)
        kw = dict(max_tokens=12, draft_loops=1, verify_loops=4, draft_ahead=3)
        r = (model.generate_tree_speculative(prompt, K_branches=2, **kw) if tree
             else model.generate_speculative(prompt, **kw))
        assert r["tokens"] == want
