"""SmolLM2-135M-Instruct (Q4_1 GGUF, converted once and cached: tests/python/smollm2.py) on
the engine: the converted file loads, its embedded tokenizer gives llama.cpp's ids, a greedy
continuation and a chat answer are readable English, and grammar-constrained outputs (greedy,
sampled, beam search) fully match their patterns. The live comparison with llama.cpp, and the engine against the numpy
reference on this model, are tests/oracles (slow)."""
import os
import re

import numpy as np
import pytest

import tinyloop_py as tl
from smollm2 import LLAMA_CPP_IDS, smollm2_path  # noqa: F401  (session fixture)
from tinyloop import chat
from tinyloop.text import chat_template, get_tokenizer, grammar, token_bytes

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CORPUS = os.path.abspath(os.path.join(ROOT, "..", "shared", "data", "corpus"))


@pytest.fixture(scope="module")
def smol(smollm2_path):  # noqa: F811
    with tl.Model(smollm2_path, max_seq_len=1024) as m:
        yield m, get_tokenizer(m), token_bytes(m)


def _ids(tok, text):
    return np.asarray(tok.encode(text).ids, dtype=np.int32)


def test_converted_file_loads_with_tokenizer_and_chat_template(smol, smollm2_path):  # noqa: F811
    model, tok, vocab = smol
    c = model.config()
    assert (c["dim"], c["n_heads"], c["n_kv_heads"], c["ffn_dim"], c["vocab_size"]) == (576, 9, 3, 1536, 49152)
    # a plain 30-layer model: 29 pre layers and a one-layer loop run once
    assert c["n_pre_blocks"] + c["n_loop_layers"] * c["default_loops"] + c["n_post_blocks"] == 30
    assert c["eos_ids"] == [2] and tok.get_vocab_size() == 49152 and len(vocab) == 49152
    assert chat_template(smollm2_path).startswith("{% for message in messages %}")


@pytest.mark.parametrize("text", list(LLAMA_CPP_IDS))
def test_embedded_tokenizer_gives_llama_cpp_ids(smol, text):
    _, tok, vocab = smol
    assert tok.encode(text).ids == LLAMA_CPP_IDS[text]
    assert tok.decode(LLAMA_CPP_IDS[text], skip_special_tokens=False) == text
    if "<|im_start|>" not in text:  # special tokens have no bytes for grammars
        assert b"".join(vocab[i] for i in LLAMA_CPP_IDS[text]) == text.encode()


@pytest.mark.skipif(not os.path.isdir(CORPUS), reason="shared/data/corpus not present")
def test_embedded_tokenizer_round_trips_the_corpus(smol):
    _, tok, _ = smol
    for name in sorted(os.listdir(CORPUS)):
        with open(os.path.join(CORPUS, name), encoding="utf-8") as f:
            text = f.read()[-20000:]
        assert tok.decode(tok.encode(text).ids) == text, name


def test_greedy_continuation_is_readable(smol):
    model, tok, _ = smol
    ids = _ids(tok, "The capital of France is")
    out = model.generate(ids, max_tokens=8, temperature=0.0, repetition_penalty=1.0)
    text = tok.decode(out[len(ids):])
    assert text.startswith(" Paris"), text


def test_chat_template_answer_is_readable(smol, smollm2_path):  # noqa: F811
    model, tok, _ = smol
    conv = chat.Conversation(tok, chat_template(smollm2_path), model.config())
    conv.add_user("What color is the sky on a clear day?")
    ids = conv.prompt_ids(1024)
    assert tok.decode(ids[:3], skip_special_tokens=False) == "<|im_start|>system\n"
    out = model.generate(np.asarray(ids, dtype=np.int32), max_tokens=24, temperature=0.0,
                         repetition_penalty=1.0)
    answer = tok.decode(out[len(ids):])
    assert "blue" in answer and re.fullmatch(r"[A-Za-z ,.'\n-]+", answer), answer


def _constrained(model, tok, vocab, g, prompt, max_tokens, **kw):
    ids = _ids(tok, prompt)
    out = model.generate(ids, grammar=g, max_tokens=max_tokens, **kw)[len(ids):]
    return b"".join(vocab[t] for t in out if t not in model.config()["eos_ids"]), len(out)


@pytest.mark.parametrize("make,pattern,prompt", [
    (lambda: tl.Grammar.digits(1, 4), rb"[0-9]{1,4}", "The Eiffel Tower was completed in the year "),
    (lambda: tl.Grammar.choice(["yes", "no"]), rb"yes|no", "Is Paris the capital of France? Answer yes or no: "),
    (lambda: r'\{"name":"[a-z]+"\}', rb'\{"name":"[a-z]+"\}', 'A JSON record for a cat called Tom: '),
])
def test_grammar_constrained_outputs_fully_match(smol, make, pattern, prompt):
    model, tok, vocab = smol
    g = grammar(model, make())
    for temperature in (0.0, 0.8):
        text, n = _constrained(model, tok, vocab, g, prompt, 16, temperature=temperature, seed=3)
        _check_match(g, pattern, text, n)


def _check_match(g, pattern, text, n):
    if n == 16 and not g.matches(text):  # an unbounded [a-z]+ may still be open at max_tokens
        assert g.advance_bytes(g.initial_state(), text) != tl.Grammar.DEAD, text
        assert re.fullmatch(pattern, text + b'"}'), text
    else:
        assert re.fullmatch(pattern, text), text


def test_beam_search_with_grammar_through_the_chat_template(smol, smollm2_path):  # noqa: F811
    """Beam search (beam_size=4) composes with a grammar on the real 49k vocabulary: every
    beam's output stays inside the language, and the chat answer is the sensible one."""
    model, tok, vocab = smol
    from tinyloop.text import render_chat

    template = chat_template(smollm2_path)
    eos = model.config()["eos_ids"]
    for user, g, pattern, want in [
        ("What is the capital of France? Choose one: Paris, London, Berlin.",
         tl.Grammar.choice(["Paris", "London", "Berlin"]), rb"Paris|London|Berlin", b"Paris"),
        ("Give me a JSON object with the name of a fruit, in lowercase.",
         tl.Grammar(r'\{"name":"[a-z]+"\}'), rb'\{"name":"[a-z]+"\}', None),
    ]:
        g.set_token_vocabulary(vocab)
        text = render_chat(template, [{"role": "user", "content": user}])
        ids = np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)
        out = model.generate(ids, grammar=g, beam_size=4, max_tokens=16, repetition_penalty=1.0)[len(ids):]
        got = b"".join(vocab[t] for t in out if t not in eos)
        assert len(out) < 16 and re.fullmatch(pattern, got), got  # complete, not cut by max_tokens
        if want is not None:
            assert got == want, got
