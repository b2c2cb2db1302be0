"""generate(grammar=...): every constrained output fully matches its pattern (checked with
Python's `re`), EOS only where the output is a full match, composition with sampling,
repetition penalty, early exit and stop sequences, and clear errors."""
import json
import os
import re

import numpy as np
import pytest

import tinyloop_py as tl
from tinyloop.grammar_vocab import token_bytes
from tinyloop.text import load_tokenizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUNDLED = os.path.join(ROOT, "models", "tinyloop-demo.tinyloop")


@pytest.fixture(scope="module")
def bundled():
    with tl.Model(BUNDLED) as m:
        tok = load_tokenizer(m)
        yield m, tok, token_bytes(tok)


def _decode_bytes(vocab, ids):
    return b"".join(vocab[i] for i in ids)


def _grammar(g, vocab):
    g.set_token_vocabulary(vocab)
    return g


@pytest.mark.parametrize("make,prompt", [
    (lambda: tl.Grammar.digits(1, 6), "The year was "),
    (lambda: tl.Grammar.choice(["yes", "no", "perhaps"]), "Is it true? Answer:"),
    (lambda: tl.Grammar(r'\{"name":"[a-z]{1,8}"\}'), "The record: "),
    (lambda: tl.Grammar(r'\{"name":"[A-Z][a-z]{0,6}", "age":[1-9][0-9]?\}'), "JSON: "),
])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_bundled_model_outputs_match_their_pattern(bundled, make, prompt, temperature):
    model, tok, vocab = bundled
    g = _grammar(make(), vocab)
    ids = np.array(tok.encode(prompt).ids, dtype=np.int32)
    out = model.generate(ids, grammar=g, max_tokens=40, temperature=temperature, seed=5,
                         repetition_penalty=1.1)
    new = out[len(ids):]
    text = _decode_bytes(vocab, [t for t in new if t not in model.config()["eos_ids"]])
    assert re.fullmatch(g.pattern.encode() if isinstance(g.pattern, str) else g.pattern, text, re.S), text
    assert g.matches(text)


def test_json_helper_output_parses_or_is_a_live_prefix(bundled):
    """json_object's strings are unbounded, so a small model may still be inside one at
    max_tokens: then the output is a prefix the grammar can still complete; when it ends,
    it parses as JSON of that shape."""
    model, tok, vocab = bundled
    g = _grammar(tl.Grammar.json_object({"name": "string", "age": "integer"}), vocab)
    ids = np.array(tok.encode("Record: ").ids, dtype=np.int32)
    for seed in range(4):
        out = model.generate(ids, grammar=g, max_tokens=40, temperature=0.7, seed=seed)
        new = out[len(ids):]
        text = _decode_bytes(vocab, [t for t in new if t != 0])
        if len(new) == 40 and not g.matches(text):
            assert g.advance_bytes(g.initial_state(), text) != tl.Grammar.DEAD
            continue
        obj = json.loads(text.decode())
        assert set(obj) == {"name", "age"} and isinstance(obj["age"], int)


def test_generation_ends_when_the_grammar_admits_no_more_bytes(bundled):
    model, tok, vocab = bundled
    g = _grammar(tl.Grammar.choice(["Elizabeth"]), vocab)
    ids = np.array(tok.encode("Her name was").ids, dtype=np.int32)
    out = model.generate(ids, grammar=g, max_tokens=30, stop_at_eos=False)
    assert _decode_bytes(vocab, out[len(ids):]) == b"Elizabeth"


def test_composes_with_early_exit_and_stream(bundled):
    model, tok, vocab = bundled
    g = _grammar(tl.Grammar.digits(2, 8), vocab)
    ids = np.array(tok.encode("Chapter ").ids, dtype=np.int32)
    seen = []
    r = model.generate_stream(ids, lambda t: seen.append(t) or True, grammar=g, max_tokens=10,
                              loops=8, early_exit_patience=1, early_exit_tau=1e-2, temperature=0.0)
    text = _decode_bytes(vocab, [t for t in r["tokens"][len(ids):] if t != 0])
    assert re.fullmatch(rb"[0-9]{2,8}", text)
    assert seen == r["tokens"][len(ids):]


def test_greedy_grammar_picks_the_best_allowed_token(test_models):
    """On a random model with a one-byte-per-token vocabulary, the first constrained token is
    the argmax of the logits over the allowed tokens."""
    m = test_models["huginn"]
    vocab = [bytes([ord("a") + (i % 26)]) if i >= 3 else b"" for i in range(97)]
    g = _grammar(tl.Grammar("[a-f]+"), vocab)
    with tl.Model(m.path) as model:
        prompt = np.array([5, 6, 7], dtype=np.int32)
        out = model.generate(prompt, grammar=g, max_tokens=12, stop_at_eos=False)
        logits = model.score_last(prompt)
    allowed = [i for i in range(97) if vocab[i] and vocab[i] in b"abcdef"]
    assert out[3] == max(allowed, key=lambda i: (logits[i], -i))
    assert re.fullmatch(rb"[a-f]+", _decode_bytes(vocab, out[3:]))


def test_grammar_errors(test_models, bundled):
    m = test_models["huginn"]
    with tl.Model(m.path) as model:
        with pytest.raises(ValueError, match="set_token_vocabulary"):
            model.generate([1, 2], grammar=tl.Grammar("[a-z]+"))
        g = tl.Grammar("[a-z]+")
        g.set_token_vocabulary([b"a"] * 50)
        with pytest.raises(ValueError, match="vocabulary has 50 tokens"):
            model.generate([1, 2], grammar=g)
        with pytest.raises(ValueError, match="grammar must be"):
            model.generate([1, 2], grammar="[a-z]+")
        # A vocabulary that cannot spell the grammar's next byte and no full match yet.
        g = tl.Grammar("xyz")
        g.set_token_vocabulary([b"a"] * 97)
        with pytest.raises(RuntimeError, match="grammar"):
            model.generate([1, 2], grammar=g, max_tokens=3)
