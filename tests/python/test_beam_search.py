"""Beam search (docs/beam-search.md).

Oracles written here, separately from the engine:
  * hf_beam_search: a small reimplementation of Hugging Face's BeamSearchScorer loop
    (top 2*num_beams candidates, EOS outside the top num_beams dropped, finished
    hypotheses normalised by generated_len ** length_penalty, is_done for
    early_stopping True / False / "never") plus the spec's early_stopping rule;
  * exhaustive search: every continuation of a tiny-vocabulary model scored with
    Model.score() in numpy;
and the engine is compared with them: the search core on hand-made log-probabilities
(tinyloop_py._testing.beam_search_core), then generate(beam_size=...) on a random model.
"""
import math
import os
import re
import threading

import numpy as np
import pytest

import tinyloop_py as tl
from tinyloop_py import _testing  # test and benchmark hooks
from tinyloop.random_model import write_random_model

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUNDLED = os.path.join(ROOT, "models", "tinyloop-demo.tinyloop")
EOS = 2
V = 6


# ---------------------------------------------------------------------------------------
# the independent Python beam search

def norm_score(log_prob, new_len, lp):
    return log_prob / max(1, new_len) ** lp


def hf_beam_search(log_probs, max_tokens, num_beams, lp, early_stopping, enders):
    """HF BeamSearchScorer semantics for one sequence, returning (tokens, log_prob, score).

    log_probs(seq) -> np.ndarray [V] of next-token log-probs (-inf = not allowed).
    early_stopping: True / False / "never" (HF) or "spec" (stop once the best finished
    hypothesis ranks >= every live beam, the spec's early_stopping=True)."""
    finished = []  # (score, order, tokens, log_prob); HF keeps the num_beams best

    def add(tokens, logp):
        finished.append((norm_score(logp, len(tokens), lp), -len(finished), tokens, logp))
        finished.sort(reverse=True)
        del finished[num_beams:]

    live = [((), 0.0)]
    for step in range(1, max_tokens + 1):
        cands = []
        for b, (seq, logp) in enumerate(live):
            row = log_probs(seq)
            for v in range(len(row)):
                if np.isfinite(row[v]):
                    cands.append((logp + row[v], b, v))
            if not any(np.isfinite(row)):
                add(seq, logp)
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        cands = cands[:2 * num_beams]
        nxt = []
        for rank, (s, b, v) in enumerate(cands):
            seq = live[b][0] + (v,)
            if v in enders:
                if rank < num_beams:
                    add(seq, s)
                continue
            nxt.append((seq, s))
            if len(nxt) == num_beams:
                break
        if step == max_tokens or not nxt:
            for seq, s in nxt:
                add(seq, s)
            break
        live = nxt
        if early_stopping == "spec":
            if finished and finished[0][0] >= max(norm_score(s, step, lp) for _, s in live):
                break
        elif len(finished) >= num_beams:  # HF BeamHypotheses.is_done
            best_sum = max(c[0] for c in cands)
            if early_stopping is True:
                break
            if early_stopping is False or lp <= 0:
                highest = best_sum / step ** lp
            else:  # "never": the best score any live beam could still reach
                highest = best_sum / max_tokens ** lp
            if finished[-1][0] >= highest:
                break
    score, _, tokens, logp = finished[0]
    return list(tokens), logp, score


def random_table(seed, vocab, spread=2.0):
    """log_probs(seq) of a random model: a deterministic function of the prefix."""
    memo = {}

    def log_probs(seq):
        if seq not in memo:
            g = np.random.default_rng([seed, len(seq), *seq])
            x = g.normal(0.0, spread, vocab)
            memo[seq] = x - x.max() - np.log(np.exp(x - x.max()).sum())
        return memo[seq]
    return log_probs


def core(log_probs, max_tokens, beam, lp, early, enders):
    def batch(beams):
        return np.stack([log_probs(tuple(b)) for b in beams])
    return _testing.beam_search_core(batch, len(log_probs(())), max_tokens, beam, lp, early, list(enders))


# ---------------------------------------------------------------------------------------
# the core on hand-made log-probabilities

@pytest.mark.parametrize("lp", [-1.0, 0.0, 0.6, 1.0, 1.5, 3.0])
@pytest.mark.parametrize("beam", [2, 3, 5])
def test_core_equals_hf_never_on_random_tables(lp, beam):
    """early_stopping=False (run to max_tokens) returns what HF's early_stopping="never"
    returns; both are also checked against the spec-mode oracle with early_stopping=True."""
    for seed in range(12):
        lpf = random_table(seed, 5)
        got = core(lpf, 5, beam, lp, False, [0])
        want = hf_beam_search(lpf, 5, beam, lp, "never", {0})
        assert got["tokens"] == want[0], (seed, got, want)
        assert got["score"] == pytest.approx(want[2], abs=1e-12)
        got = core(lpf, 5, beam, lp, True, [0])
        want = hf_beam_search(lpf, 5, beam, lp, "spec", {0})
        assert got["tokens"] == want[0], (seed, got, want)


def table(probs):
    def log_probs(seq):
        with np.errstate(divide="ignore"):
            return np.log(np.array(probs[seq], dtype=np.float64))
    return log_probs


def test_length_penalty_sweep_by_hand():
    # 0 = EOS. [EOS]: log .4 = -0.916; [1 EOS]: log .3 = -1.204; [1 1 EOS]: log .3 = -1.204.
    lpf = table({(): [.4, .6], (1,): [.5, .5], (1, 1): [1.0, 0.0]})
    expect = {0.0: [0], 0.2: [0], 0.5: [1, 1, 0], 1.0: [1, 1, 0], 2.0: [1, 1, 0], -1.0: [0]}
    for lp, tokens in expect.items():
        assert core(lpf, 3, 2, lp, False, [0])["tokens"] == tokens, lp
        assert hf_beam_search(lpf, 3, 2, lp, "never", {0})[0] == tokens, lp
    r = core(lpf, 3, 2, 1.0, False, [0])
    assert r["log_prob"] == pytest.approx(math.log(.3))
    assert r["score"] == pytest.approx(math.log(.3) / 3)


def test_early_stopping_spec_vs_hf():
    """Where the spec's early_stopping=True differs from HF's: the spec returns once the
    top-ranked hypothesis has ended; HF (True) waits for num_beams finished hypotheses."""
    # Root: EOS .5, a .3, b .2; after a or b: EOS. lp = 1.
    lpf = table({(): [.5, .3, .2], (1,): [1, 0, 0], (2,): [1, 0, 0]})
    ours = core(lpf, 4, 2, 1.0, True, [0])
    assert ours["tokens"] == [0] and ours["steps"] == 1     # [EOS] -0.693 >= live a -1.204
    assert hf_beam_search(lpf, 4, 2, 1.0, True, {0})[0] == [1, 0]   # [a EOS] -0.602 wins
    assert core(lpf, 4, 2, 1.0, False, [0])["tokens"] == [1, 0]
    # With lp = 0 the spec's rule is exact (live log-probs only fall), so they agree.
    for seed in range(10):
        lpf = random_table(100 + seed, 4)
        assert (core(lpf, 5, 3, 0.0, True, [0])["tokens"]
                == hf_beam_search(lpf, 5, 3, 0.0, "never", {0})[0])


def test_walk_stops_at_beam_size_survivors_and_no_enders_runs_full_length():
    lpf = table({(): [.2, .45, .35, 0], (1,): [0, 0, 0, 1], (2,): [0, 0, 0, 1]})
    # B=2: a and b fill the beam before EOS (rank 2) is reached; B=3: EOS is finished, wins.
    assert core(lpf, 2, 2, -3.0, False, [0])["tokens"] == [1, 3]
    assert core(lpf, 2, 3, -3.0, False, [0])["tokens"] == [0]
    r = core(random_table(7, 4), 4, 3, 1.0, True, [])
    assert len(r["tokens"]) == 4


def test_core_rejects_bad_callbacks_and_kwargs():
    with pytest.raises(ValueError, match="shape"):
        _testing.beam_search_core(lambda beams: np.zeros((1, 3)), 4, 2, 2, 1.0, True, [])
    with pytest.raises(ValueError, match="beam_size"):
        _testing.beam_search_core(lambda beams: np.zeros((1, 4)), 4, 2, -1, 1.0, True, [])


# ---------------------------------------------------------------------------------------
# generate(beam_size=...) on a tiny random model vs exhaustive search over score()

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("beam") / "tiny.tinyloop")
    write_random_model(path, "huginn", seed=3, vocab_size=V, eos_ids=[EOS], default_loops=3)
    with tl.Model(path, kv_mode="fp32") as m:
        yield m


PROMPT = np.array([1, 4, 0, 3, 5], dtype=np.int32)


def model_log_probs(model, prompt, penalty):
    memo = {}

    def log_probs(seq):
        if seq not in memo:
            ids = np.concatenate([prompt, np.array(seq, dtype=np.int32)]).astype(np.int32)
            x = model.score(ids)[-1].astype(np.float64)
            for t in set(ids.tolist()):  # HF repetition penalty over prompt + output
                x[t] = x[t] / penalty if x[t] > 0 else x[t] * penalty
            memo[seq] = x - x.max() - np.log(np.exp(x - x.max()).sum())
        return memo[seq]
    return log_probs


def exhaustive(log_probs, max_tokens, lp, enders):
    best = (-math.inf, None)

    def walk(seq, logp):
        nonlocal best
        row = log_probs(seq)
        for v in range(len(row)):
            s, l = seq + (v,), logp + row[v]
            if v in enders or len(s) == max_tokens:
                sc = norm_score(l, len(s), lp)
                if sc > best[0]:
                    best = (sc, list(s))
            else:
                walk(s, l)
    walk((), 0.0)
    return best


def seq_score(log_probs, tokens, lp):
    logp = sum(log_probs(tuple(tokens[:i]))[t] for i, t in enumerate(tokens))
    return norm_score(logp, len(tokens), lp)


@pytest.mark.parametrize("max_tokens", [3, 4])
@pytest.mark.parametrize("penalty", [1.0, 1.4])
def test_wide_beam_equals_exhaustive_search(tiny, max_tokens, penalty):
    lpf = model_log_probs(tiny, PROMPT, penalty)
    beam = V ** (max_tokens - 1)  # every live hypothesis survives
    for lp in [0.0, 0.7, 1.0, 2.0]:
        want_score, want = exhaustive(lpf, max_tokens, lp, {EOS})
        out = tiny.generate(PROMPT, max_tokens=max_tokens, beam_size=beam, length_penalty=lp,
                            early_stopping=False, repetition_penalty=penalty)
        got = out[len(PROMPT):]
        # The engine's cached float32 logits differ from score()'s in the last bits, so a
        # near-tie may pick the other sequence: then the scores must agree.
        assert got == want or seq_score(lpf, got, lp) == pytest.approx(want_score, abs=1e-5), lp


@pytest.mark.parametrize("beam", [2, 3])
@pytest.mark.parametrize("early", [True, False])
@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_small_beams_equal_python_beam_search(tiny, beam, early, penalty):
    lpf = model_log_probs(tiny, PROMPT, penalty)
    for lp in [0.0, 1.0, 2.0]:
        want, _, want_score = hf_beam_search(lpf, 6, beam, lp, "spec" if early else "never", {EOS})
        out = tiny.generate(PROMPT, max_tokens=6, beam_size=beam, length_penalty=lp,
                            early_stopping=early, repetition_penalty=penalty)
        got = out[len(PROMPT):]
        assert got == want or seq_score(lpf, got, lp) == pytest.approx(want_score, abs=1e-5)


def test_stop_at_eos_false_and_stop_sequences_end_beams(tiny):
    lpf = model_log_probs(tiny, PROMPT, 1.0)
    want, _, _ = hf_beam_search(lpf, 4, 3, 1.0, "never", set())
    out = tiny.generate(PROMPT, max_tokens=4, beam_size=3, early_stopping=False, stop_at_eos=False)
    assert out[len(PROMPT):] == want and len(want) == 4
    stop = [[4], [5, 1]]
    out = tiny.generate(PROMPT, max_tokens=6, beam_size=3, stop_sequences=stop)[len(PROMPT):]
    ends = (out[-1] == EOS or len(out) == 6 or out[-1:] == [4] or out[-2:] == [5, 1])
    assert ends, out
    assert 4 not in out[:-1]  # a stop sequence ends its hypothesis where it completes


def test_beam_one_is_greedy_and_calls_are_deterministic(tiny):
    greedy = tiny.generate(PROMPT, max_tokens=8)
    assert tiny.generate(PROMPT, max_tokens=8, beam_size=1, length_penalty=float("nan")) == greedy
    assert tiny.generate(PROMPT, max_tokens=8, beam_size=0) == greedy
    a = tiny.generate(PROMPT, max_tokens=8, beam_size=4, temperature=0.9, top_k=0, seed=1)
    b = tiny.generate(PROMPT, max_tokens=8, beam_size=4, temperature=0.3, seed=2)
    assert a == b  # sampling kwargs are ignored: beam search is deterministic


def test_one_token_is_the_greedy_token_and_uncached_path_agrees(tiny, tmp_path, monkeypatch):
    for lp in (0.0, 1.0, -2.0):
        assert (tiny.generate(PROMPT, max_tokens=1, beam_size=3, length_penalty=lp)
                == tiny.generate(PROMPT, max_tokens=1))
    path = str(tmp_path / "m.tinyloop")
    write_random_model(path, "huginn", seed=3, vocab_size=V, eos_ids=[EOS], default_loops=3)
    monkeypatch.setenv("TINYLOOP_DISABLE_KV_CACHE", "1")
    with tl.Model(path, kv_mode="fp32") as m:
        assert m.config()["kv_cache_disabled"]
        for beam in (2, 4):  # every beam's whole sequence re-run each step
            assert (m.generate(PROMPT, max_tokens=6, beam_size=beam, repetition_penalty=1.2)
                    == tiny.generate(PROMPT, max_tokens=6, beam_size=beam, repetition_penalty=1.2))


def test_threads_give_the_same_beams(tiny):
    want = [tiny.generate(PROMPT[: 2 + i], max_tokens=6, beam_size=3) for i in range(4)]
    got = [None] * 4

    def run(i):
        got[i] = tiny.generate(PROMPT[: 2 + i], max_tokens=6, beam_size=3)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert got == want


def test_generate_stream_streams_the_final_beam(tiny):
    want = tiny.generate(PROMPT, max_tokens=6, beam_size=3, stop_at_eos=False)
    seen = []
    res = tiny.generate_stream(PROMPT, lambda t: seen.append(t) or True, max_tokens=6, beam_size=3,
                               stop_at_eos=False)
    assert res["tokens"] == want and seen == want[len(PROMPT):]
    assert res["tokens_emitted"] == 6 and len(res["loops_per_token"]) == 6
    seen.clear()
    res = tiny.generate_stream(PROMPT, lambda t: seen.append(t) or len(seen) < 2, max_tokens=6,
                               beam_size=3, stop_at_eos=False)
    assert res["tokens"] == want[: len(PROMPT) + 2]


def test_early_exit_runs_per_beam(tiny):
    res = tiny.generate_stream(PROMPT, lambda t: True, max_tokens=5, beam_size=3, stop_at_eos=False,
                               early_exit_patience=1, early_exit_min_L=1, early_exit_tau=10.0)
    assert res["loops_per_token"] == [3, 1, 1, 1, 1]
    # Without exits it is plain beam search.
    res = tiny.generate_stream(PROMPT, lambda t: True, max_tokens=5, beam_size=3, stop_at_eos=False,
                               early_exit_patience=1, early_exit_tau=0.0)
    assert res["tokens"] == tiny.generate(PROMPT, max_tokens=5, beam_size=3, stop_at_eos=False)


def test_cache_window_with_beams(tiny):
    out = tiny.generate(PROMPT, max_tokens=6, beam_size=3, cache_window=3)
    assert 1 <= len(out) - len(PROMPT) <= 6
    # A window wider than the whole sequence changes nothing.
    assert (tiny.generate(PROMPT, max_tokens=6, beam_size=3, cache_window=64)
            == tiny.generate(PROMPT, max_tokens=6, beam_size=3))


def test_recurrence_shared_slots_per_beam(tmp_path):
    # Every beam decodes token by token from the prompt's blocks, as generate() does, so
    # kv_loop_slots works with beams: beam 1 is generate() with the same slot groups.
    path = str(tmp_path / "m.tinyloop")
    write_random_model(path, "huginn", seed=5, vocab_size=V, eos_ids=[EOS], default_loops=4)
    with tl.Model(path) as m:
        for slots in (1, 2):
            greedy = m.generate(PROMPT, max_tokens=6, kv_loop_slots=slots, stop_at_eos=False)
            assert m.generate(PROMPT, max_tokens=6, beam_size=1, kv_loop_slots=slots,
                              stop_at_eos=False) == greedy
            out = m.generate(PROMPT, max_tokens=6, beam_size=3, kv_loop_slots=slots, stop_at_eos=False)
            assert len(out) == len(PROMPT) + 6


@pytest.mark.parametrize("kv_mode", ["int8", "h_fp16", "h_int4"])
def test_every_kv_mode_shares_the_prompt_blocks(tmp_path, kv_mode):
    # Beams share the prompt's paged KV blocks in every mode (copy-on-write), so beam search
    # runs with int8 and store-h KV too; beam 1 is greedy decoding in the same mode.
    path = str(tmp_path / "m.tinyloop")
    write_random_model(path, "huginn", seed=3, vocab_size=V, eos_ids=[EOS], default_loops=3)
    with tl.Model(path, kv_mode=kv_mode) as m:
        greedy = m.generate(PROMPT, max_tokens=6, stop_at_eos=False)
        assert m.generate(PROMPT, max_tokens=6, beam_size=1, stop_at_eos=False) == greedy
        out = m.generate(PROMPT, max_tokens=6, beam_size=3, stop_at_eos=False)
        assert list(out[:len(PROMPT)]) == list(PROMPT) and len(out) == len(PROMPT) + 6


@pytest.mark.parametrize("kwargs,match", [
    (dict(beam_size=-1), "beam_size"),
    (dict(beam_size=100000), "beam_size"),
    (dict(beam_size=2, length_penalty=float("nan")), "length_penalty"),
    (dict(beam_size=2, length_penalty=float("inf")), "length_penalty"),
    (dict(beam_size=2, max_tokens=0), "max_tokens"),
    (dict(beam_size=2, repetition_penalty=0.0), "repetition_penalty"),
    (dict(beam_size=2, stop_sequences=[[]]), "stop_sequences"),
])
def test_errors_name_the_kwarg(tiny, kwargs, match):
    kwargs = {"max_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        tiny.generate(PROMPT, **kwargs)
    with pytest.raises(ValueError, match=match):
        tiny.generate_stream(PROMPT, lambda t: True, **kwargs)


def test_memory_is_one_prefix_plus_small_tails(tiny):
    m = _testing.beam_search_memory(tiny, PROMPT, max_tokens=8, beam_size=4, stop_at_eos=False)
    assert m["peak_tails"] <= 4
    assert m["peak_bytes"] == m["prefix_bytes"] + m["peak_tails"] * m["tail_bytes"]
    assert m["tail_bytes"] * len(PROMPT) == m["prefix_bytes"] * 7  # 7 = max_tokens - 1 rows
    # generate()'s one cache holds whole blocks: a little more than the exact row count.
    assert m["naive_bytes"] <= 4 * m["greedy_cache_bytes"] < 2 * m["naive_bytes"]
    assert m["peak_bytes"] < m["naive_bytes"]


# ---------------------------------------------------------------------------------------
# grammar per beam on the bundled model

@pytest.fixture(scope="module")
def bundled():
    from tinyloop.grammar_vocab import token_bytes
    from tinyloop.text import load_tokenizer
    with tl.Model(BUNDLED) as m:
        tok = load_tokenizer(m)
        yield m, tok, token_bytes(tok)


@pytest.mark.parametrize("make,prompt", [
    (lambda: tl.Grammar.digits(1, 6), "The year was "),
    (lambda: tl.Grammar.choice(["yes", "no", "perhaps"]), "Is it true? Answer:"),
    (lambda: tl.Grammar(r'\{"name":"[a-z]{1,8}"\}'), "The record: "),
])
def test_grammar_beams_fully_match(bundled, make, prompt):
    model, tok, vocab = bundled
    g = make()
    g.set_token_vocabulary(vocab)
    ids = np.array(tok.encode(prompt).ids, dtype=np.int32)
    eos = set(model.config()["eos_ids"])
    for beam in (2, 4):
        out = model.generate(ids, grammar=g, max_tokens=24, beam_size=beam, length_penalty=0.8)
        new = out[len(ids):]
        text = b"".join(vocab[t] for t in new if t not in eos)
        pattern = g.pattern.encode() if isinstance(g.pattern, str) else g.pattern
        assert re.fullmatch(pattern, text, re.S), (beam, text)
