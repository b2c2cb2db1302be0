"""Ouro's learned exit gate (docs/loop-depth.md, "Exit gate") against an independent numpy
implementation of OuroForCausalLM.forward's rule (docs/convert.md, "Ouro").

Tiny random checkpoints in Ouro's exact config.json keys and tensor names go through the
converter. The gate's weights are scaled so that lambda_t varies widely between tokens and
steps: tokens really exit at different steps. For `score`, the reference rule is built from
`score(loops=t, exit_gate="off")` for t = 1..L (the reference runs every step over the whole
sequence) and the gate formula applied in float64 to the per-step states. For decoding,
tokens and depths are compared with a float64 numpy decode that applies the rule per token
and the latest KV rule to the steps a token skipped (tests/python/early_exit_reference.py's
store-h decoder).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

tl = pytest.importorskip("tinyloop_py")

from convert_oracle import rel_err, write_hf_folder  # noqa: E402
from early_exit_reference import _Decoder  # noqa: E402
import reference  # noqa: E402
from tinyloop.convert import convert  # noqa: E402
from tinyloop.format import read_model  # noqa: E402

L = 4
IDS = [3, 17, 5, 40, 8, 61, 23, 2, 11, 70, 9, 33, 50, 4]

# Ouro-1.4B's config.json keys, at test size.
OURO = dict(architectures=["OuroForCausalLM"], model_type="ouro", hidden_size=64,
            intermediate_size=96, num_attention_heads=4, num_key_value_heads=4,
            num_hidden_layers=2, rms_norm_eps=1e-6, rope_theta=1000000.0,
            max_position_embeddings=128, vocab_size=101, tie_word_embeddings=False,
            total_ut_steps=L, early_exit_threshold=1.0, hidden_act="silu",
            use_sliding_window=False, sliding_window=None, max_window_layers=2,
            rope_scaling=None, layer_types=["full_attention", "full_attention"],
            initializer_range=0.02, attention_dropout=0.0, use_cache=True,
            torch_dtype="float32", transformers_version="4.57.1", bos_token_id=1,
            eos_token_id=2)


def _tensors(seed=5):
    rng = np.random.default_rng(seed)
    c = OURO
    D, H, KVH = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd, F, V = D // H, c["intermediate_size"], c["vocab_size"]

    def rand(shape, scale):
        a = rng.standard_normal(shape) * scale
        return (1.0 + a if len(shape) == 1 else a).astype(np.float32)

    t = {"model.embed_tokens.weight": rand((V, D), 0.5), "model.norm.weight": rand((D,), 0.1),
         # The normed state has entries of size ~1, so the gate logit has std ~0.35 sqrt(D)
         # = 2.8: lambda_t spreads over (0.05, 0.95) across tokens and steps.
         "model.early_exit_gate.weight": (rng.standard_normal((1, D)) * 0.35).astype(np.float32),
         "model.early_exit_gate.bias": np.array([-0.3], np.float32),
         "lm_head.weight": rand((V, D), 0.25)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, shape in {"self_attn.q_proj": (H * hd, D), "self_attn.k_proj": (KVH * hd, D),
                            "self_attn.v_proj": (KVH * hd, D), "self_attn.o_proj": (D, H * hd),
                            "mlp.gate_proj": (F, D), "mlp.up_proj": (F, D),
                            "mlp.down_proj": (D, F)}.items():
            t[p + name + ".weight"] = rand(shape, 0.2)
        for n in ("input_layernorm", "input_layernorm_2", "post_attention_layernorm",
                  "post_attention_layernorm_2"):
            t[p + n + ".weight"] = rand((D,), 0.1)
    return t


def _convert(tmp_path, name="m", **config_over):
    c = {**OURO, **config_over}
    c = {k: v for k, v in c.items() if v is not _DROP}
    hf = write_hf_folder(str(tmp_path / f"hf_{name}"), c, _tensors())
    dst = str(tmp_path / f"{name}.tinyloop")
    convert(hf, dst, progress=False)
    return dst


_DROP = object()  # a config_over value that removes the key


@pytest.fixture(scope="module")
def ouro_file(tmp_path_factory):
    return _convert(tmp_path_factory.mktemp("ouro"))


# ---------------------------------------------------------------------------------------
# the reference rule, in float64 numpy (OuroForCausalLM.forward)


def _exit_pdf(gate_logits):
    """gate_logits [L, T] -> p [L, T]: p_t = lambda_t prod_{j<t} (1 - lambda_j), the last
    step takes what is left."""
    lam = 1.0 / (1.0 + np.exp(-gate_logits))
    p = np.zeros_like(lam)
    remaining = np.ones(lam.shape[1])
    for t in range(lam.shape[0]):
        if t < lam.shape[0] - 1:
            p[t] = lam[t] * remaining
            remaining = remaining * (1.0 - lam[t])
        else:
            p[t] = remaining
    return p


def _gate(tensors, states):
    """states [..., D] (the loop state after a step, norm applied) -> gate logits [...]."""
    w = np.asarray(tensors["exit_gate.weight"], np.float64)[0]
    b = float(np.asarray(tensors["exit_gate.bias"], np.float64)[0])
    return np.asarray(states, np.float64) @ w + b


def _threshold_steps(cdf, q):
    """First step (0-based) whose cumulative probability is >= q, else the last."""
    hit = cdf >= q
    steps = np.argmax(hit, axis=0)
    steps[~hit.any(axis=0)] = cdf.shape[0] - 1
    return steps


def _per_step(model, ids):
    """(logits [L, T, V] from score(loops=t), gate logits [L, T])."""
    logits = np.stack([model.score(ids, loops=t, exit_gate="off") for t in range(1, L + 1)])
    states = model.score_trajectory(ids, loops=L)["iterations"]  # [L, T, D]
    return logits.astype(np.float64), states


def _reference_scores(logits, pdf, mode, q=None, step=None):
    T = logits.shape[1]
    if mode == "weighted":
        return np.einsum("lt,ltv->tv", pdf, logits), None
    if mode == "step":
        steps = np.full(T, min(step, L) - 1)
    else:
        steps = _threshold_steps(np.cumsum(pdf, axis=0), q)
    return logits[steps, np.arange(T)], steps


def _clear_threshold(cdf, q, margin=1e-4):
    """q moved off every cumulative probability by `margin` (float32 vs float64 rounding
    must not decide a comparison)."""
    while np.min(np.abs(cdf[:-1] - q)) < margin:
        q = q + 0.0137 if q < 0.95 else q - 0.0137
    return q


# ---------------------------------------------------------------------------------------
# score


@pytest.mark.parametrize("mode,arg", [("threshold", 0.2), ("threshold", 0.45), ("threshold", 0.7),
                                      ("threshold", 0.9), ("threshold", 1.0), ("step", 1),
                                      ("step", 2), ("step", 3), ("step", 4), ("step", 9),
                                      ("weighted", None)])
def test_score_follows_the_reference_rule(ouro_file, mode, arg):
    tensors = read_model(ouro_file).tensors
    with tl.Model(ouro_file) as model:
        logits, states = _per_step(model, IDS)
        pdf = _exit_pdf(_gate(tensors, states))
        kw = {}
        if mode == "threshold":
            q = arg if arg == 1.0 else _clear_threshold(np.cumsum(pdf, axis=0), arg)
            kw = dict(exit_gate_threshold=q)
            want, steps = _reference_scores(logits, pdf, mode, q=q)
        else:
            if mode == "step":
                kw = dict(exit_gate_step=arg)
            want, steps = _reference_scores(logits, pdf, mode, step=arg)
        got = model.score(IDS, exit_gate=mode, **kw)
        assert rel_err(got, want) < 1e-5, f"{mode} {arg}: {rel_err(got, want):.2e}"
        if mode == "threshold" and 0.2 < arg < 1.0:
            assert len(set(steps.tolist())) >= 2, steps  # tokens exit at different steps
        last = model.score_last(IDS, exit_gate=mode, **kw)
        np.testing.assert_array_equal(last, got[-1])


def test_exits_spread_over_steps(ouro_file):
    tensors = read_model(ouro_file).tensors
    with tl.Model(ouro_file) as model:
        _, states = _per_step(model, IDS)
    cdf = np.cumsum(_exit_pdf(_gate(tensors, states)), axis=0)
    steps = _threshold_steps(cdf, _clear_threshold(cdf, 0.6))
    assert len(set(steps.tolist())) >= 3, steps


# ---------------------------------------------------------------------------------------
# decoding: a float64 numpy decode with the rule per token and the latest KV rule


class _GateDecoder(_Decoder):
    cdfs: list  # every cumulative probability a decode step compared with the threshold

    def token_by_gate(self, tok, p, mode, q, step, stop):
        """Position p through up to L steps; the rule picks or mixes the logits. stop: the
        loop ends at the chosen step (decode) instead of running on (prompt)."""
        x = self.prelude(tok, p)
        s = reference.initial_state(self.cfg, x[None], [p])[0]
        states, n = [], 0
        while n < self.L:
            s = self.iteration(n, s, x, p)
            n += 1
            states.append(s)
            if stop and mode in ("threshold", "step") and n < self.L:
                lam = 1.0 / (1.0 + np.exp(-_gate(self.t, np.array(states))))  # [n]
                cdf = float(np.sum(lam * np.concatenate([[1.0], np.cumprod(1.0 - lam)[:-1]])))
                self.cdfs.append(cdf)
                if (mode == "threshold" and cdf >= q) or (mode == "step" and n >= step):
                    break
        for i in range(n, self.L):  # the latest rule
            for j in range(len(self.loop)):
                self.h[("loop", i, j)][p] = self.h[("loop", n - 1, j)][p]
        if n < self.L or mode == "off":
            return self.readout(s, p, commit=True), n
        pdf = _exit_pdf(_gate(self.t, np.array(states))[:, None])[:, 0]  # [L]
        if mode == "weighted":
            return sum(w * self.readout(st, p, commit=False) for w, st in zip(pdf, states)), n
        e = (_threshold_steps(np.cumsum(pdf)[:, None], q)[0] if mode == "threshold"
             else min(step, self.L) - 1)
        return self.readout(states[e], p, commit=True), n


def _reference_decode(path, prompt, max_tokens, mode, q=None, step=None, stop=True):
    m = read_model(path)
    dec = _GateDecoder(m.config, m.tensors, L, len(prompt) + max_tokens)
    dec.cdfs = []
    for p, tok in enumerate(prompt):  # the prompt runs every step
        logits, _ = dec.token_by_gate(tok, p, mode, q, step, stop=False)
    tokens, depths, gaps, depth = list(prompt), [], [], L
    while True:
        top = np.sort(logits)[::-1]
        gaps.append(top[0] - top[1])
        tokens.append(int(np.argmax(logits)))
        depths.append(depth)
        if len(depths) == max_tokens:
            margin = min(abs(c - q) for c in dec.cdfs) if q is not None and dec.cdfs else 1.0
            return tokens, depths, min(gaps), margin
        logits, depth = dec.token_by_gate(tokens[-1], len(tokens) - 1, mode, q, step, stop=stop)


PROMPT = [3, 17, 5, 40, 8]


@pytest.mark.parametrize("mode,arg", [("threshold", 0.45), ("threshold", 0.7), ("step", 2),
                                      ("weighted", None)])
def test_decode_follows_the_reference_rule(ouro_file, mode, arg):
    q = arg if mode == "threshold" else None
    step = arg if mode == "step" else None
    tokens, depths, gap, margin = _reference_decode(ouro_file, PROMPT, 12, mode, q=q, step=step)
    assert gap > 1e-3  # float32 vs float64 cannot flip an argmax
    assert margin > 1e-5  # nor an exit decision
    kw = dict(exit_gate=mode)
    if q is not None:
        kw["exit_gate_threshold"] = q
    if step is not None:
        kw["exit_gate_step"] = step
    with tl.Model(ouro_file, kv_mode="fp32") as model:
        got = model.generate_stream(PROMPT, lambda t: True, max_tokens=12, stop_at_eos=False, **kw)
        assert got["tokens"] == tokens
        assert got["loops_per_token"] == depths
        if mode in ("threshold", "step"):
            decode_mean = float(np.mean(got["loops_per_token"][1:]))
            assert decode_mean < L  # the loop really stopped early
            assert got["mean_loops"] < L
        assert model.generate(PROMPT, max_tokens=12, stop_at_eos=False, **kw) == tokens
        # The serving engine runs the same rule per row.
        with tl.Engine(model, kv_budget_mb=4, kv_block_size=8) as eng:
            out = eng.submit(PROMPT, max_tokens=12, stop_at_eos=False, **kw).result(timeout=60)
        assert out.tokens == tokens[len(PROMPT):]
        assert out.loops_per_token == depths


def test_a_one_row_prompt_still_runs_every_loop(ouro_file):
    # The prompt's rows (a one-token prompt, a last prompt chunk of one row) never stop
    # early: only decode rows do.
    q = 0.45
    kw = dict(exit_gate="threshold", exit_gate_threshold=q)
    tokens, depths, gap, margin = _reference_decode(ouro_file, [40], 8, "threshold", q=q)
    assert gap > 1e-3 and margin > 1e-5
    with tl.Model(ouro_file, kv_mode="fp32") as model:
        got = model.generate_stream([40], lambda t: True, max_tokens=8, stop_at_eos=False, **kw)
        assert got["tokens"] == tokens and got["loops_per_token"] == depths
        want = model.generate_stream(PROMPT, lambda t: True, max_tokens=8, stop_at_eos=False, **kw)
        # prefill_chunk 4: the 5-token prompt's last chunk is one row.
        with tl.Engine(model, kv_budget_mb=4, kv_block_size=8, prefill_chunk=4) as eng:
            out = eng.submit(PROMPT, max_tokens=8, stop_at_eos=False, **kw).result(timeout=60)
        assert out.tokens == want["tokens"][len(PROMPT):]
        assert out.loops_per_token == want["loops_per_token"]


def test_full_kv_decodes_exactly_the_reference(ouro_file):
    # exit_gate_kv="full": every loop of every token runs (the reference's K/V), the rule only
    # picks the logits; the tokens are the teacher-forced reference's, with no saving.
    q = 0.45
    tokens, depths, gap, _ = _reference_decode(ouro_file, PROMPT, 12, "threshold", q=q, stop=False)
    assert gap > 1e-3 and depths == [L] * 12
    kw = dict(exit_gate="threshold", exit_gate_threshold=q, exit_gate_kv="full")
    with tl.Model(ouro_file, kv_mode="fp32") as model:
        got = model.generate_stream(PROMPT, lambda t: True, max_tokens=12, stop_at_eos=False, **kw)
        assert got["tokens"] == tokens and got["mean_loops"] == L
        # score runs the reference's computation over the whole sequence.
        want = model.score(tokens[:-1], exit_gate="threshold", exit_gate_threshold=q)
        assert want[len(PROMPT) - 1:].argmax(axis=1).tolist() == tokens[len(PROMPT):]
        with tl.Engine(model, kv_budget_mb=4, kv_block_size=8) as eng:
            out = eng.submit(PROMPT, max_tokens=12, stop_at_eos=False, **kw).result(timeout=60)
        assert out.tokens == tokens[len(PROMPT):]
        with pytest.raises(ValueError, match="^exit_gate_kv"):
            model.generate(PROMPT, max_tokens=2, exit_gate_kv="sometimes")


# ---------------------------------------------------------------------------------------
# config.json honoured by default; refusals


def test_config_json_rule_is_the_default(tmp_path):
    path = _convert(tmp_path, "q", early_exit_threshold=0.55)
    with tl.Model(path) as model:
        c = model.config()
        assert (c["exit_gate_mode"], c["exit_gate_threshold"]) == ("threshold", 0.55)
        np.testing.assert_array_equal(model.score(IDS),
                                      model.score(IDS, exit_gate="threshold", exit_gate_threshold=0.55))
        assert model.generate(PROMPT, max_tokens=6) == model.generate(
            PROMPT, max_tokens=6, exit_gate="threshold", exit_gate_threshold=0.55)
    # early_exit_step (0-based) wins over the threshold, as in the reference.
    path = _convert(tmp_path, "s", early_exit_threshold=0.55, early_exit_step=1)
    with tl.Model(path) as model:
        c = model.config()
        assert (c["exit_gate_mode"], c["exit_gate_step"]) == ("step", 2)
        np.testing.assert_array_equal(model.score(IDS), model.score(IDS, loops=2, exit_gate="off"))
    # An out-of-range step is ignored by the reference: the threshold applies.
    path = _convert(tmp_path, "s9", early_exit_threshold=0.55, early_exit_step=7)
    with tl.Model(path) as model:
        assert model.config()["exit_gate_mode"] == "threshold"
    # No key: OuroConfig's default threshold 1.0. null: the last step.
    path = _convert(tmp_path, "d", early_exit_threshold=_DROP)
    with tl.Model(path) as model:
        assert (model.config()["exit_gate_mode"], model.config()["exit_gate_threshold"]) == ("threshold", 1.0)
    path = _convert(tmp_path, "n", early_exit_threshold=None)
    with tl.Model(path) as model:
        assert model.config()["exit_gate_mode"] == "off"
        np.testing.assert_array_equal(model.score(IDS), model.score(IDS, loops=L, exit_gate="off"))


def test_unknown_config_key_is_refused(tmp_path):
    with pytest.raises(ValueError, match="'use_weighted_exit_everywhere'"):
        _convert(tmp_path, "u", use_weighted_exit_everywhere=True)
    with pytest.raises(ValueError, match="early_exit_step"):
        _convert(tmp_path, "b", early_exit_step="2")


def test_bad_kwargs_are_refused(ouro_file, test_models):
    with tl.Model(ouro_file) as model:
        with pytest.raises(ValueError, match="^exit_gate must be one of"):
            model.generate(PROMPT, max_tokens=2, exit_gate="sometimes")
        for bad in (1.5, -0.1, math.nan):
            with pytest.raises(ValueError, match="^exit_gate_threshold"):
                model.score(IDS, exit_gate="threshold", exit_gate_threshold=bad)
        with pytest.raises(ValueError, match="^exit_gate_step"):
            model.generate(PROMPT, max_tokens=2, exit_gate="step", exit_gate_step=0)
        with pytest.raises(ValueError, match="early_exit_patience"):
            model.generate(PROMPT, max_tokens=2, exit_gate="threshold", early_exit_patience=1)
        # The file's default gate yields to an explicit early exit.
        model.generate(PROMPT, max_tokens=2, early_exit_patience=1)
        with pytest.raises(ValueError, match="exit_gate"):
            tl.SamplingParams(exit_gate_threshold=2.0)
    with tl.Model(test_models["llama"].path) as plain:
        with pytest.raises(ValueError, match="no exit gate"):
            plain.generate([1, 2], max_tokens=2, exit_gate="threshold")
        with pytest.raises(ValueError, match="no exit gate"):
            plain.score([1, 2], exit_gate_step=2)
        plain.generate([1, 2], max_tokens=2, exit_gate="off")


def test_paths_without_the_gate_refuse_a_rule_they_would_ignore(tmp_path):
    # Beam search, resume and speculative decoding run every loop: a file whose rule would
    # change the logits is refused there by name instead of being silently ignored.
    path = _convert(tmp_path, "q", early_exit_threshold=0.55)
    with tl.Model(path) as model:
        with pytest.raises(ValueError, match="exit_gate_mode.*beam search"):
            model.generate(PROMPT, max_tokens=3, beam_size=2)
        handle = model.build_resume_handle(PROMPT, max_tokens=4)
        with pytest.raises(ValueError, match="exit_gate_mode.*resume_generate"):
            model.resume_generate(handle, max_tokens=3)
    # The released configs' threshold 1.0 is the last loop (unless the gate saturates).
    path = _convert(tmp_path, "one")
    with tl.Model(path) as model:
        assert len(model.generate(PROMPT, max_tokens=3, beam_size=2, stop_at_eos=False)) == len(PROMPT) + 3


def test_server_passes_the_gate_through(ouro_file):
    pytest.importorskip("uvicorn")
    import json
    import urllib.error
    import urllib.request

    from server_helpers import server_in_thread

    def post(srv, body):
        req = urllib.request.Request(srv.url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
            "exit_gate": {"mode": "threshold", "threshold": 0.45}}
    with tl.Model(ouro_file) as model:
        want = model.generate_stream(PROMPT, lambda t: True, max_tokens=8, stop_at_eos=False,
                                     exit_gate="threshold", exit_gate_threshold=0.45)["loops_per_token"]
    with server_in_thread(model=ouro_file) as srv:
        status, r = post(srv, body)
        assert status == 200, r
        loops = r["choices"][0]["tinyloop"]["loops_per_token"]
        assert loops == want[:len(loops)] and min(loops) < L
        status, r = post(srv, dict(body, exit_gate={"mode": "step"}))
        assert status == 400 and r["error"]["param"] == "exit_gate.step", r


def test_python_config_schema_checks_the_rule_fields():
    from tinyloop.config import normalize_config, preset_config

    c = preset_config("ouro")
    assert (c["exit_gate_mode"], c["exit_gate_threshold"], c["exit_gate_step"]) == ("off", 1.0, 0)
    with pytest.raises(ValueError, match="'exit_gate_mode'"):
        normalize_config(dict(c, exit_gate=False, exit_gate_mode="threshold"))
    with pytest.raises(ValueError, match="'exit_gate_threshold'"):
        normalize_config(dict(c, exit_gate_threshold=1.5))
    with pytest.raises(ValueError, match="'exit_gate_step'"):
        normalize_config(dict(c, exit_gate_mode="step"))
