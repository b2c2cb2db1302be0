"""Every pair of generation features (docs/serving.md, "Features compose"): each cell either
works, checked against something computed without the other feature, or raises a ValueError
whose message names both features.

- A decoding path that must not change the output (the serving engine's batching, the
  prefix cache, the prefix pool, warm-start resume, chain and tree speculative decoding in
  greedy mode, beam search with one beam) combined with a setting (grammar, early exit with
  either probe, recurrence-shared slots, a window, stop sequences, repetition penalty, a KV
  mode): equal to Model.generate with that setting alone.
- Two settings together: each one's own rule still holds, checked independently: the
  grammar by Python's `re` on the decoded text, stop sequences by where they occur, early
  exit by the depths reported (and, where the uncached reference path exists, equality with
  it: TINYLOOP_DISABLE_KV_CACHE=1 re-runs the whole sequence each step with the same
  settings).
- Beam search (3 beams) with a setting: the setting's rule holds for the returned beam.
"""
from __future__ import annotations

import itertools
import os
import re

import pytest

import tinyloop_py as tl
from tinyloop.text import get_tokenizer, grammar as make_grammar

BUNDLED = os.path.join(os.path.dirname(__file__), "..", "..", "models", "tinyloop-demo.tinyloop")
PROMPT = [10, 20, 30, 40, 50, 60, 70, 80, 90]
L = 6
PATTERN = r"[0-9]{1,3}( [0-9]{1,3})?"  # at most 7 characters: it ends within N tokens
PATTERN_PREFIX = r"([0-9]{1,3}( [0-9]{0,3})?)?"  # every prefix of a PATTERN match
N = 8  # max_tokens

SETTINGS = ["grammar", "ee_hidden", "ee_margin", "loop_slots", "window", "stops", "penalty",
            "kv_int8", "kv_h_int8"]
PATHS = ["batching", "prefix", "pool", "resume", "spec", "tree", "beam1"]

# Cells that raise, and the words their message must contain (both features named).
REFUSED = {
    ("spec", "grammar"): ("grammar", "speculative"),
    ("tree", "grammar"): ("grammar", "speculative"),
    ("spec", "ee_hidden"): ("early_exit", "speculative"),
    ("spec", "ee_margin"): ("early_exit", "speculative"),
    ("tree", "ee_hidden"): ("early_exit", "speculative"),
    ("tree", "ee_margin"): ("early_exit", "speculative"),
    ("spec", "loop_slots"): ("kv_loop_slots", "speculative"),
    ("tree", "loop_slots"): ("kv_loop_slots", "speculative"),
    ("spec", "kv_h_int8"): ("store-h", "speculative"),
    ("tree", "kv_h_int8"): ("store-h", "speculative"),
    ("prefix", "loop_slots"): ("kv_loop_slots", "prefix"),
    ("pool", "loop_slots"): ("kv_loop_slots", "prefix"),
    ("resume", "loop_slots"): ("kv_loop_slots", "resume"),
    ("resume", "window"): ("cache_window", "resume"),
}


@pytest.fixture(scope="module")
def ctx():
    models = {mode: tl.Model(BUNDLED, kv_mode=mode) for mode in ("fp16", "int8", "h_int8")}
    tok = get_tokenizer(models["fp16"])
    yield models, tok
    for m in models.values():
        m.close()


def kwargs_of(setting, model, tok):
    if setting == "grammar":
        return dict(grammar=make_grammar(model, PATTERN))
    if setting == "ee_hidden":
        return dict(early_exit_patience=1, early_exit_min_L=1, early_exit_tau=0.5)
    if setting == "ee_margin":
        return dict(early_exit_patience=1, early_exit_min_L=1, early_exit_logit_margin=1.0)
    if setting == "loop_slots":
        return dict(kv_loop_slots=2)
    if setting == "window":
        return dict(cache_window=5)
    if setting == "stops":
        # A token generate() emits early on, so the stop really fires.
        first = model.generate(PROMPT, max_tokens=3, loops=L)[len(PROMPT) + 1]
        return dict(stop_sequences=[[first]])
    if setting == "penalty":
        return dict(repetition_penalty=1.4)
    return {}


def model_for(setting, models):
    return models["int8" if setting == "kv_int8" else "h_int8" if setting == "kv_h_int8" else "fp16"]


def run_path(path, model, kw):
    kw = dict(kw, max_tokens=N)
    if path == "batching":
        with tl.Engine(model, kv_budget_mb=16) as eng:
            return PROMPT + eng.submit(PROMPT, loops=L, **kw).result().tokens
    if path == "prefix":
        pc = model.build_prefix_cache(PROMPT[:5], loops=L, cache_window=kw.get("cache_window", 0))
        return model.generate_from_prefix_cache(pc, PROMPT[5:], **kw)
    if path == "pool":
        pool = tl.PrefixPool(max_bytes=1 << 24)
        model.register_prefix(pool, PROMPT[:5], loops=L, cache_window=kw.get("cache_window", 0))
        return model.generate_with_pool(pool, PROMPT, loops=L, **kw)
    if path == "resume":
        h = model.build_resume_handle(PROMPT, loops=2, max_loops=L, max_tokens=N)
        return model.resume_generate(h, loops=L, **kw)
    if path == "spec":
        return model.generate_speculative(PROMPT, draft_loops=2, verify_loops=L, draft_ahead=3, **kw)["tokens"]
    if path == "tree":
        return model.generate_tree_speculative(PROMPT, draft_loops=2, verify_loops=L, draft_ahead=3,
                                               K_branches=2, **kw)["tokens"]
    if path == "beam1":
        return model.generate(PROMPT, loops=L, beam_size=1, **kw)
    raise AssertionError(path)


@pytest.mark.parametrize("path,setting", list(itertools.product(PATHS, SETTINGS)))
def test_path_with_setting_equals_the_setting_alone(ctx, path, setting):
    models, tok = ctx
    model = model_for(setting, models)
    kw = kwargs_of(setting, model, tok)
    if (path, setting) in REFUSED:
        with pytest.raises(ValueError) as e:
            run_path(path, model, kw)
        for word in REFUSED[(path, setting)]:
            assert word in str(e.value), (word, str(e.value))
        return
    want = model.generate(PROMPT, loops=L, max_tokens=N, **kw)
    assert run_path(path, model, kw) == want


def check_rules(settings, model, tok, out, depths):
    new = out[len(PROMPT):]
    stopped = False
    if "stops" in settings:
        stop = kwargs_of("stops", model, tok)["stop_sequences"][0]
        hits = [i for i in range(len(new)) if new[i:i + len(stop)] == stop]
        assert hits in ([], [len(new) - len(stop)])  # only at the end, where it stopped
        stopped = bool(hits)
    if "grammar" in settings:
        # A stop sequence may end the text anywhere inside the pattern (the stop token itself
        # is allowed by the grammar): then what comes before it is a prefix of a match.
        text = tok.decode(new[:len(new) - len(stop)] if stopped else new)
        assert re.fullmatch(PATTERN_PREFIX if stopped else PATTERN, text), tok.decode(new)
    if "ee_hidden" in settings or "ee_margin" in settings:
        assert len(depths) == len(new) and depths[0] == L and all(1 <= d <= L for d in depths)
    else:
        assert depths == [L] * len(new)


def uncached(setting_kws, mode):
    os.environ["TINYLOOP_DISABLE_KV_CACHE"] = "1"
    try:
        with tl.Model(BUNDLED, kv_mode=mode) as m:
            return m.generate(PROMPT, loops=L, max_tokens=N, **setting_kws)
    finally:
        os.environ.pop("TINYLOOP_DISABLE_KV_CACHE")


@pytest.mark.parametrize("a,b", list(itertools.combinations(SETTINGS, 2)))
def test_two_settings_keep_both_rules(ctx, a, b):
    models, tok = ctx
    if a.startswith("kv_") and b.startswith("kv_"):
        pytest.skip("one KV mode per model")
    kv = next((s for s in (a, b) if s.startswith("kv_")), None)
    model = model_for(kv or a, models)
    kw = dict(kwargs_of(a, model, tok))
    kw.update(kwargs_of(b, model, tok))
    res = model.generate_stream(PROMPT, lambda t: True, loops=L, max_tokens=N, **kw)
    check_rules({a, b}, model, tok, res["tokens"], res["loops_per_token"])
    # The same settings through the serving engine: the same tokens.
    with tl.Engine(model, kv_budget_mb=16) as eng:
        assert PROMPT + eng.submit(PROMPT, loops=L, max_tokens=N, **kw).result().tokens == res["tokens"]
    # Where the uncached reference path runs these settings (early exit and shared slots
    # always keep a cache), it gives the same tokens.
    if not {"ee_hidden", "ee_margin", "loop_slots"} & {a, b}:
        mode = {"kv_int8": "int8", "kv_h_int8": "h_int8"}.get(kv, "fp16")
        assert uncached(kw, mode) == res["tokens"]


@pytest.mark.parametrize("setting", SETTINGS)
def test_beam_search_with_setting_keeps_its_rule(ctx, setting):
    models, tok = ctx
    model = model_for(setting, models)
    kw = kwargs_of(setting, model, tok)
    out = model.generate(PROMPT, loops=L, max_tokens=N, beam_size=3, **kw)
    assert len(out) > len(PROMPT)
    new = out[len(PROMPT):]
    if setting == "grammar":
        assert re.fullmatch(PATTERN, tok.decode(new)), tok.decode(new)
    if setting == "stops":
        stop = kw["stop_sequences"][0]
        hits = [i for i in range(len(new)) if new[i:i + len(stop)] == stop]
        assert hits in ([], [len(new) - len(stop)])
