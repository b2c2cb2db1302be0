"""Warm-start resume (docs/loop-depth.md): build_resume_handle at L1, resume_generate at
L2 >= L1 gives exactly generate(prompt, loops=L2), greedy and seeded sampling; one handle
serves many resumes, from several threads."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import tinyloop_py as tl

PROMPT = np.array([5, 17, 3, 42, 8, 91, 23, 60, 11], dtype=np.int32)


@pytest.mark.parametrize("name", ["huginn", "ouro", "gpt_learned", "ouro_interleaved_bf16"])
@pytest.mark.parametrize("kv_mode", [None, "fp32"])
def test_resume_equals_fresh_generate_greedy(test_models, name, kv_mode):
    m = test_models[name]
    with tl.Model(m.path, kv_mode=kv_mode) as model:
        h = model.build_resume_handle(PROMPT, loops=2, max_loops=6, max_tokens=16)
        for L2 in (2, 3, 6):
            want = model.generate(PROMPT, max_tokens=16, loops=L2, stop_at_eos=False)
            assert model.resume_generate(h, loops=L2, stop_at_eos=False) == want, f"L2={L2}"


def test_resume_equals_fresh_generate_seeded_sampling(test_models):
    m = test_models["huginn"]
    kw = dict(max_tokens=20, temperature=0.9, top_k=30, top_p=0.95, repetition_penalty=1.2, seed=5,
              stop_at_eos=False)
    with tl.Model(m.path) as model:
        h = model.build_resume_handle(PROMPT, loops=3, max_tokens=20)
        for L2 in (3, 5):
            assert model.resume_generate(h, loops=L2, **kw) == model.generate(PROMPT, loops=L2, **kw)


def test_resume_with_early_exit_and_stop_sequences(test_models):
    m = test_models["ouro"]
    kw = dict(max_tokens=16, stop_at_eos=False, early_exit_patience=1, early_exit_min_L=2,
              early_exit_logit_margin=0.5)
    with tl.Model(m.path) as model:
        h = model.build_resume_handle(PROMPT, loops=2, max_loops=8, max_tokens=16)
        want = model.generate(PROMPT, loops=7, **kw)
        assert model.resume_generate(h, loops=7, **kw) == want
        stop = want[len(PROMPT) + 3: len(PROMPT) + 5]
        assert model.resume_generate(h, loops=7, stop_sequences=[stop], **kw) == \
            model.generate(PROMPT, loops=7, stop_sequences=[stop], **kw)


def test_handle_properties_and_defaults(test_models):
    m = test_models["huginn"]  # default_loops 4
    with tl.Model(m.path) as model:
        h = model.build_resume_handle(PROMPT, loops=3)
        assert (h.seq_len, h.loops_used, h.max_loops, h.max_tokens) == (len(PROMPT), 3, 6, 64)
        assert model.build_resume_handle(PROMPT, loops=1).max_loops == 4  # max(2 * 1, default_loops)
        d = model.build_resume_handle(PROMPT)
        assert d.loops_used == 4 and d.max_loops == 8
        assert "ResumeHandle" in repr(h)
        # resume defaults: loops = loops_used, max_tokens = the handle's
        out = model.resume_generate(h, stop_at_eos=False)
        assert out == model.generate(PROMPT, loops=3, max_tokens=64, stop_at_eos=False)


def test_one_handle_many_threads(test_models):
    m = test_models["huginn"]
    with tl.Model(m.path) as model:
        h = model.build_resume_handle(PROMPT, loops=1, max_loops=5, max_tokens=12)
        jobs = [(L2, seed) for L2 in (1, 2, 3, 4, 5) for seed in (1, 2)]
        want = [model.generate(PROMPT, loops=L2, max_tokens=12, temperature=1.0, seed=seed, stop_at_eos=False)
                for L2, seed in jobs]
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda j: model.resume_generate(h, loops=j[0], temperature=1.0, seed=j[1],
                                                                 stop_at_eos=False), jobs * 2))
    assert got == want * 2


def test_resume_arguments_validated(test_models):
    m = test_models["huginn"]
    with tl.Model(m.path) as model, tl.Model(m.path) as other:
        h = model.build_resume_handle(PROMPT, loops=3, max_loops=5, max_tokens=8)
        for kw, arg in [(dict(loops=2), "loops"), (dict(loops=6), "loops"), (dict(max_tokens=9), "max_tokens"),
                        (dict(max_tokens=0), "max_tokens"), (dict(cache_window=4), "cache_window"),
                        (dict(temperature=-1.0), "temperature"),
                        (dict(early_exit_patience=1, early_exit_min_L=0), "early_exit_min_L")]:
            with pytest.raises(ValueError, match=arg):
                model.resume_generate(h, **kw)
        with pytest.raises(ValueError, match="handle"):
            other.resume_generate(h)
        for kw, arg in [(dict(loops=0), "loops"), (dict(loops=3, max_loops=2), "max_loops"),
                        (dict(max_tokens=0), "max_tokens")]:
            with pytest.raises(ValueError, match=arg):
                model.build_resume_handle(PROMPT, **kw)
        with pytest.raises(ValueError, match="prompt"):
            model.build_resume_handle([1, 2, 5000])
        with pytest.raises(RuntimeError, match="max_seq_len"):
            model.build_resume_handle(PROMPT, max_tokens=1000)
    with pytest.raises(RuntimeError, match="closed"):
        model.resume_generate(h)


def test_handle_memory_is_reported_and_released(test_models):
    m = test_models["huginn"]
    with tl.Model(m.path) as model:
        before = model.vram_usage_mb()
        h = model.build_resume_handle(PROMPT, loops=2, max_loops=8, max_tokens=32)
        held = model.vram_usage_mb() - before
        assert held == pytest.approx(h.nbytes / 2**20, rel=1e-6)
        del h
        assert model.vram_usage_mb() == pytest.approx(before)
