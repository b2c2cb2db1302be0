"""tl.Engine, the serving engine, from Python: many requests at once give exactly what
Model.generate gives each alone (which the numpy reference checks elsewhere), across
depths, sampling, early exit, windows, shared slot groups, grammars and KV modes; cancel,
timeouts, the queue bound, closing and bad arguments behave as documented; text and
asyncio fronts; KV blocks and RSS return to their idle level after many requests."""
from __future__ import annotations

import asyncio
import os
import random
import threading
import time

import numpy as np
import pytest

import tinyloop_py as tl
from tinyloop.engine import AsyncEngine, TextDecoder, TextEngine

BUNDLED = os.path.join(os.path.dirname(__file__), "..", "..", "models", "tinyloop-demo.tinyloop")


def _requests(vocab, n, seed=0):
    """(prompt, kwargs) pairs covering the per-request settings a batch mixes."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(vocab) for _ in range(1 + (i * 5) % 23)]
        kw = dict(max_tokens=3 + (i * 3) % 17, loops=1 + i % 5, stop_at_eos=i % 3 != 0)
        if i % 2:
            kw.update(temperature=0.8, top_k=20, top_p=0.9, seed=1000 + i)
        if i % 4 == 1:
            kw.update(early_exit_patience=1, early_exit_min_L=1, early_exit_tau=0.3 if i % 8 == 1 else 1e9)
        if i % 8 == 3:
            kw.update(early_exit_patience=1, early_exit_min_L=1, early_exit_logit_margin=0.5)
        if i % 7 == 2:
            kw.update(cache_window=4)
        if i % 9 == 4:
            kw.update(kv_loop_slots=1)
        if i % 6 == 5:
            kw.update(stop_sequences=[[rng.randrange(vocab)]])
        if i % 5 == 0:
            kw.update(repetition_penalty=1.3)
        out.append((prompt, kw))
    return out


@pytest.mark.parametrize("kv_mode", ["fp16", "int8", "h_int4"])
def test_batched_requests_equal_generate_alone(test_models, kv_mode):
    m = test_models["huginn_gqa_f16"]
    with tl.Model(m.path, kv_mode=kv_mode) as model:
        vocab = model.config()["vocab_size"]
        reqs = _requests(vocab, 20)
        with tl.Engine(model, kv_budget_mb=8, kv_block_size=8, max_batch_tokens=48,
                       prefill_chunk=8) as eng:
            handles = [eng.submit(p, **kw) for p, kw in reqs]
            outs = [h.result(timeout=60) for h in handles]
            stats = eng.stats()
        for (p, kw), out in zip(reqs, outs):
            want = model.generate_stream(p, lambda t: True, **kw)
            assert out.tokens == want["tokens"][len(p):], kw
            assert out.loops_per_token == want["loops_per_token"], kw
        assert stats["requests_finished"] == len(reqs)
        assert stats["kv_blocks_used"] == stats["kv_blocks_cached"]
        assert stats["mean_batch_rows"] > 1.5  # requests shared steps
        assert 1 <= stats["mean_loops"] <= 5


@pytest.mark.parametrize("kv_mode", ["fp16", "int8"])
def test_long_prompt_private_blocks_equal_engine_blocks(test_models, kv_mode):
    """A prompt of 2048 tokens or more gets 512-row blocks in Model.generate's private cache
    (model/kv_pool.h private_block_rows: decode attention reads longer runs faster); the
    bits do not depend on the block size, so it gives exactly what the serving engine gives
    with 8-row blocks, greedy, sampled, with early exit and with shared slot groups, at the
    boundary and past it. (That the long blocks are taken: test_long_prompt_blocks.py.)"""
    m = test_models["huginn_gqa_f16"]
    with tl.Model(m.path, kv_mode=kv_mode, max_seq_len=2304) as model:
        vocab = model.config()["vocab_size"]
        rng = random.Random(5)
        cases = [(2047, dict(max_tokens=5)), (2048, dict(max_tokens=5)),
                 (2101, dict(max_tokens=6, temperature=0.9, top_k=30, seed=7)),
                 (2200, dict(max_tokens=4, loops=3, early_exit_patience=1, early_exit_min_L=1,
                             early_exit_tau=0.3)),
                 (2150, dict(max_tokens=4, loops=3, kv_loop_slots=1))]
        with tl.Engine(model, kv_budget_mb=64, kv_block_size=8, max_batch_tokens=512,
                       prefill_chunk=256, prefix_caching=False) as eng:
            for n, kw in cases:
                prompt = [rng.randrange(vocab) for _ in range(n)]
                want = model.generate_stream(prompt, lambda t: True, **kw)
                out = eng.submit(prompt, **kw).result(timeout=120)
                assert out.tokens == want["tokens"][n:], (n, kw)
                assert out.loops_per_token == want["loops_per_token"], (n, kw)


def test_preemption_under_a_small_budget_changes_no_output(test_models):
    m = test_models["llama"]
    with tl.Model(m.path) as model:
        vocab = model.config()["vocab_size"]
        cfg = model.config()
        reqs = [(p, dict(kw, cache_window=0, max_tokens=kw["max_tokens"] + 10))
                for p, kw in _requests(vocab, 12, seed=3)]
        with tl.Engine(model, kv_budget_mb=1, kv_block_size=4) as probe:
            block_bytes = probe.stats()["kv_block_bytes"]

        def blocks(p, kw):  # the most a request holds: every slot, its whole length
            slots = cfg["n_pre_blocks"] + kw["loops"] * cfg["n_loop_layers"] + cfg["n_post_blocks"]
            return slots * -(-(len(p) + kw["max_tokens"]) // 4)

        # Room for the largest request and a half: the rest wait, running ones get preempted.
        budget = 1.5 * max(blocks(p, kw) for p, kw in reqs) * block_bytes / 2**20
        with tl.Engine(model, kv_budget_mb=budget, kv_block_size=4, max_batch_tokens=32) as eng:
            handles = [eng.submit(p, **kw) for p, kw in reqs]
            outs = [h.result(timeout=60) for h in handles]
            assert eng.stats()["preemptions"] > 0
        for (p, kw), out in zip(reqs, outs):
            assert out.tokens == model.generate(p, **kw)[len(p):]


def test_grammar_requests_in_one_batch():
    with tl.Model(BUNDLED) as model:
        from tinyloop.text import grammar
        digits = grammar(model, r"[0-9]{2,5}")
        yesno = grammar(model, r"(yes|no)")
        prompts = [[1, 2, 3], [4, 5], [6]]
        with tl.Engine(model, kv_budget_mb=32) as eng:
            hs = [eng.submit(prompts[0], max_tokens=8, grammar=digits),
                  eng.submit(prompts[1], max_tokens=8, grammar=yesno, temperature=1.0, seed=4),
                  eng.submit(prompts[2], max_tokens=8)]
            outs = [h.result(timeout=30) for h in hs]
        assert outs[0].tokens == model.generate(prompts[0], max_tokens=8, grammar=digits)[3:]
        assert outs[1].tokens == model.generate(prompts[1], max_tokens=8, grammar=yesno,
                                                temperature=1.0, seed=4)[2:]
        assert outs[0].finish_reason == "stop" and outs[1].finish_reason == "stop"


def test_handle_iterates_tokens_and_reports():
    with tl.Model(BUNDLED) as model, tl.Engine(model, kv_budget_mb=32) as eng:
        h = eng.submit(np.array([10, 20, 30], dtype=np.int32), max_tokens=12)
        streamed = list(h)
        out = h.result()
        assert streamed == out.tokens == model.generate([10, 20, 30], max_tokens=12)[3:]
        assert out.finish_reason == "length" and out.stop_detail == "length"
        assert out.prompt_tokens == 3 and out.mean_loops == model.config()["default_loops"]
        assert 0 <= out.queue_ms <= out.first_token_ms <= out.total_ms
        assert h.done and h.poll() == []
        # poll_detail: each token with the depth it ran (early exit makes them differ)
        h = eng.submit([10, 20, 30], max_tokens=12, loops=8, early_exit_patience=1, early_exit_min_L=1,
                       early_exit_tau=0.5)
        detail = []
        while not h.done:
            detail += h.poll_detail()
            time.sleep(0.001)
        detail += h.poll_detail()
        out = h.result()
        assert [d[0] for d in detail] == out.tokens and [d[1] for d in detail] == out.loops_per_token
        assert min(out.loops_per_token) < 8 and all(np.isnan(d[2]) and d[3] == [] for d in detail)


def test_cancel_timeout_queue_and_close():
    with tl.Model(BUNDLED) as model:
        eng = tl.Engine(model, kv_budget_mb=32, max_num_seqs=1, max_queue=2)
        # The only seat, held for long enough (32 loops a token: ~0.5 s) that nothing below
        # races its end.
        long = eng.submit([1, 2, 3], max_tokens=250, loops=32, stop_at_eos=False)
        next(iter(long))  # running
        # Expires in the queue behind it. Waited for here, before the queue is filled: the
        # scheduler drops it at any step after its deadline, so a full-queue check that
        # counted it raced that step (it failed once on a loaded machine).
        waiting = eng.submit([4, 5], max_tokens=5, timeout=0.001)
        assert waiting.result(timeout=30).finish_reason == "timeout"
        queued = eng.submit([6], max_tokens=5)
        queued2 = eng.submit([7], max_tokens=5)
        with pytest.raises(tl.QueueFull, match="queue is full"):
            eng.submit([9], max_tokens=5)
        long.cancel()
        out = long.result(timeout=30)
        assert out.finish_reason == "cancelled" and len(out.tokens) < 250
        assert queued.result(timeout=30).finish_reason == "length"
        assert queued2.result(timeout=30).finish_reason == "length"
        with pytest.raises(TimeoutError):
            eng.submit([8], max_tokens=240, stop_at_eos=False).result(timeout=0.0)
        eng.close()
        with pytest.raises(RuntimeError, match="closed"):
            eng.submit([1], max_tokens=2)
        with pytest.raises(RuntimeError, match="closed"):
            eng.stats()


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0, temperature=1.0), "top_p"),
    (dict(loops=0), "loops"),
    (dict(early_exit_tau=float("nan")), "early_exit_tau"),
    (dict(cache_window=-1), "cache_window"),
    (dict(kv_loop_slots=-2), "kv_loop_slots"),
    (dict(stop_sequences=[[]]), "stop_sequences"),
    (dict(timeout=-1.0), "timeout"),
    (dict(grammar="[0-9]"), "grammar"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=float("nan")), "frequency_penalty"),
    (dict(logprobs=21), "logprobs"),
    (dict(logprobs=-1), "logprobs"),
])
def test_bad_params_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tl.SamplingParams(**kwargs)


def test_bad_submissions_name_the_problem():
    with tl.Model(BUNDLED) as model, tl.Engine(model, kv_budget_mb=1) as eng:
        with pytest.raises(ValueError, match="prompt"):
            eng.submit([], max_tokens=2)
        with pytest.raises(ValueError, match="prompt"):
            eng.submit([10**6], max_tokens=2)
        with pytest.raises(ValueError, match="kv_budget_mb"):
            eng.submit([1], max_tokens=250, loops=64)  # more KV than the whole pool
        with pytest.raises(RuntimeError, match="max_seq_len"):
            eng.submit([1], max_tokens=10**6)
        with pytest.raises(ValueError, match="either"):
            eng.submit([1], tl.SamplingParams(), max_tokens=2)
        with pytest.raises(TypeError):
            eng.submit([1], max_tokenz=2)
    for kw, match in [(dict(kv_budget_mb=0), "kv_budget_mb"), (dict(kv_block_size=0), "kv_block_size"),
                      (dict(max_num_seqs=0), "max_num_seqs"), (dict(max_batch_tokens=0), "max_batch_tokens"),
                      (dict(prefill_chunk=0), "prefill_chunk"), (dict(max_queue=0), "max_queue"),
                      (dict(kv_budget_mb=float("inf")), "kv_budget_mb")]:
        with pytest.raises(ValueError, match=match):
            tl.Engine(BUNDLED, **kw)
    with pytest.raises(ValueError, match="model"):
        tl.Engine(3)


def test_sampling_params_is_a_typed_object():
    p = tl.SamplingParams(max_tokens=7, loops=3, temperature=0.5, seed=9, stop_sequences=[[1, 2]])
    assert (p.max_tokens, p.loops, p.temperature, p.seed, p.stop_sequences) == (7, 3, 0.5, 9, [[1, 2]])
    p.max_tokens = 11
    p.loops = None
    assert p.max_tokens == 11 and p.loops is None
    with tl.Model(BUNDLED) as model, tl.Engine(model, kv_budget_mb=16) as eng:
        assert eng.submit([5, 6], p).result().tokens == model.generate([5, 6], max_tokens=11, temperature=0.5,
                                                                       seed=9, stop_sequences=[[1, 2]])[2:]


def _log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


@pytest.mark.parametrize("presence,frequency", [(0.0, 0.0), (1.5, 0.0), (0.3, 0.9), (-0.5, -0.4)])
def test_penalties_and_logprobs_match_a_numpy_oracle(presence, frequency):
    # Greedy decoding re-done in numpy from Model.score's logits at every step: OpenAI's
    # penalties over the generated tokens (logit -= presence * [n > 0] + frequency * n),
    # then log-softmax in float64. Each token must be the oracle's argmax, its logprob and
    # the top-5 alternatives the oracle's.
    with tl.Model(BUNDLED) as model, tl.Engine(model, kv_budget_mb=16) as eng:
        prompt = [3, 17, 42, 9, 100]
        loops = 3
        h = eng.submit(prompt, max_tokens=12, loops=loops, stop_at_eos=False, presence_penalty=presence,
                       frequency_penalty=frequency, logprobs=5)
        streamed = []  # (token, logprob, top) of each poll_detail entry
        while not h.done:
            streamed += [(t, lp, top) for t, _, lp, top in h.poll_detail()]
            time.sleep(0.001)
        streamed += [(t, lp, top) for t, _, lp, top in h.poll_detail()]
        out = h.result()
        assert [t for t, _, _ in streamed] == out.tokens and len(out.logprobs) == len(out.tokens) == 12
        counts = {}
        seq = list(prompt)
        for i, tok in enumerate(out.tokens):
            logits = model.score(seq, loops=loops)[-1].astype(np.float64)
            for t, n in counts.items():
                logits[t] -= presence + frequency * n
            lp = _log_softmax(logits)
            assert tok == int(np.argmax(lp)), i
            got_lp, got_top = out.logprobs[i]
            assert got_lp == pytest.approx(lp[tok], abs=1e-3)
            assert streamed[i][1] == got_lp and streamed[i][2] == got_top
            want_top = np.argsort(-lp, kind="stable")[:5]
            assert [t for t, _ in got_top] == [int(t) for t in want_top]
            assert [v for _, v in got_top] == pytest.approx(lp[want_top].tolist(), abs=1e-3)
            counts[tok] = counts.get(tok, 0) + 1
            seq.append(tok)
        if presence > 0:  # the penalties changed the output (this prompt repeats tokens)
            plain = eng.submit(prompt, max_tokens=12, loops=loops, stop_at_eos=False).result().tokens
            assert plain != out.tokens
        # Without logprobs asked: none, and poll_detail gives NaN placeholders.
        h = eng.submit(prompt, max_tokens=3, loops=loops)
        assert h.result().logprobs == []
        rest = h.poll_detail()
        assert all(np.isnan(lp) and top == [] for _, _, lp, top in rest)


def test_threads_submit_at_once():
    with tl.Model(BUNDLED) as model, tl.Engine(model, kv_budget_mb=32) as eng:
        results = {}

        def worker(i):
            results[i] = eng.submit([i + 1, i + 2], max_tokens=6, temperature=0.7, seed=i).result().tokens

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i in range(8):
            assert results[i] == model.generate([i + 1, i + 2], max_tokens=6, temperature=0.7, seed=i)[2:]


def test_text_engine_and_decoder():
    with tl.Model(BUNDLED) as model:
        eng = TextEngine(model, kv_budget_mb=16)
        tok = eng.tokenizer
        deltas = list(eng.stream("It is a truth universally", max_tokens=20))
        ids = tok.encode("It is a truth universally").ids
        want = model.generate(ids, max_tokens=20)[len(ids):]
        full = tok.decode(ids + want)
        assert full.startswith(tok.decode(ids)) and "".join(deltas) == full[len(tok.decode(ids)):]
        assert eng.generate(["Once upon", "The sea"], max_tokens=5) == [
            tok.decode(model.generate(tok.encode(t).ids, max_tokens=5)[len(tok.encode(t).ids):])
            for t in ["Once upon", "The sea"]]
        eng.close()
    # A character split across tokens is held back until complete.
    class Bytes:
        def decode(self, ids):
            return bytes(ids).decode("utf-8", errors="replace")
    dec = TextDecoder(Bytes())
    e_acute = "é".encode()
    assert dec.push([e_acute[0]]) == ""
    assert dec.push([e_acute[1]]) == "é"


def test_async_engine_streams_without_blocking_the_loop():
    with tl.Model(BUNDLED) as model:
        text = TextEngine(model, kv_budget_mb=32)
        aeng = AsyncEngine(text)
        prompts = [[3, 4, 5], [6, 7], [8]]

        async def main():
            ticks = 0
            stop = asyncio.Event()

            async def ticker():
                nonlocal ticks
                while not stop.is_set():
                    ticks += 1
                    await asyncio.sleep(0)

            t = asyncio.create_task(ticker())
            outs = await asyncio.gather(*[aeng.generate(p, max_tokens=30) for p in prompts])
            deltas = [d async for d in aeng.stream("The sea", max_tokens=10)]
            # A consumer that stops early cancels its request.
            async for _ in aeng.tokens([9, 9], max_tokens=250, stop_at_eos=False):
                break
            stop.set()
            await t
            return outs, deltas, ticks

        outs, deltas, ticks = asyncio.run(main())
        for p, o in zip(prompts, outs):
            assert o == model.generate(p, max_tokens=30)[len(p):]
        assert "".join(deltas)
        assert ticks > 10  # the loop kept running while the engine worked
        deadline = time.time() + 10
        while text.engine.stats()["running"] and time.time() < deadline:
            time.sleep(0.01)
        stats = text.engine.stats()
        assert stats["requests_cancelled"] == 1
        assert stats["kv_blocks_used"] == stats["kv_blocks_cached"]
        text.close()


def test_prefix_caching_reuses_prompt_blocks_exactly():
    with tl.Model(BUNDLED) as model:
        system = list(range(100, 170))  # 70 shared tokens: two whole 32-position blocks
        prompts = [system + [200 + i, 300 + i] for i in range(6)]
        with tl.Engine(model, kv_budget_mb=32) as eng:
            outs = [eng.submit(p, max_tokens=8).result() for p in prompts]
            st = eng.stats()
            assert st["prefix_hits"] == 5 and st["prefix_hit_tokens"] == 5 * 64
            assert st["kv_blocks_cached"] > 0 and st["kv_blocks_used"] == st["kv_blocks_cached"]
            eng.clear_prefix_cache()
            deadline = time.time() + 10
            while eng.stats()["kv_blocks_used"] and time.time() < deadline:
                time.sleep(0.01)
            assert eng.stats()["kv_blocks_used"] == 0
        for p, o in zip(prompts, outs):
            assert o.tokens == model.generate(p, max_tokens=8)[len(p):]
        with tl.Engine(model, kv_budget_mb=32, prefix_caching=False) as eng:
            for p in prompts:
                eng.submit(p, max_tokens=2).result()
            assert eng.stats()["prefix_hits"] == 0 and eng.stats()["kv_blocks_used"] == 0


def _rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_many_requests_leave_kv_and_rss_flat():
    # The short version of the soak in bench/serving.py (10,000 requests there). Without
    # prefix caching, which would fill more of the pool (touching new pages) as it caches.
    with tl.Model(BUNDLED) as model, tl.Engine(model, kv_budget_mb=64, prefix_caching=False) as eng:
        rng = random.Random(1)

        def wave(n):
            hs = [eng.submit([rng.randrange(1, 8000) for _ in range(rng.randrange(1, 20))],
                             max_tokens=rng.randrange(1, 12), stop_at_eos=False) for _ in range(n)]
            for h in hs[::3]:
                h.cancel()
            for h in hs:
                h.result(timeout=60)

        wave(300)  # warm up: pool pages touched, allocator settled
        before = _rss_mb()
        for _ in range(4):
            wave(300)
        after = _rss_mb()
        stats = eng.stats()
        assert stats["kv_blocks_used"] == 0 and stats["kv_blocks_cached"] == 0
        assert stats["running"] == 0 and stats["waiting"] == 0
        assert stats["requests_finished"] == 1500 and stats["requests_cancelled"] > 0
        assert after - before < 8, (before, after)
