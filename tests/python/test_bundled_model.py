"""The bundled looped model (models/tinyloop-demo.tinyloop, docs/bundled-model.md)."""
import os

import numpy as np
import pytest

import tinyloop_py as tl
from tinyloop import cli
from tinyloop.perplexity import perplexities, read_slice, token_stream
from tinyloop.text import load_tokenizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(ROOT, "models", "tinyloop-demo.tinyloop")
CORPUS = os.path.abspath(os.path.join(ROOT, "..", "shared", "data", "corpus"))


@pytest.fixture(scope="module")
def model():
    with tl.Model(MODEL) as m:
        yield m


def test_size_and_config(model):
    assert os.path.getsize(MODEL) <= 30 * 2**20
    c = model.config()
    assert (c["dim"], c["vocab_size"], c["n_pre_blocks"], c["n_loop_layers"], c["n_post_blocks"]) == \
        (256, 8192, 0, 2, 0)  # every layer in the loop: docs/depth-experiments.md says why
    assert c["default_loops"] == 6 and c["eos_ids"] == [0]


def test_embedded_tokenizer_round_trips(model):
    tok = load_tokenizer(model)
    text = "It is a truth universally acknowledged, that a single man"
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text and tok.get_vocab_size() == 8192


@pytest.mark.skipif(not os.path.isdir(CORPUS), reason="shared/data/corpus not present")
def test_depth_helps_on_held_out_text(model):
    """Perplexity falls from L = 1 to the trained depth and does not blow up past it."""
    tok = load_tokenizer(model)
    texts = [read_slice(os.path.join(CORPUS, f), 0.05) for f in ("austen.txt", "mobydick.txt")]
    stream = token_stream(tok, texts, 0)
    ppl = perplexities(model, stream, [1, 2, 6, 16], ctx=128, max_windows=6, progress=False)
    assert ppl[2] < ppl[1] and ppl[6] < ppl[1]
    assert ppl[16] < ppl[1] * 1.01
    assert ppl[6] < 400  # a trained model, far from the uniform 8192


def test_default_model_is_the_bundled_one(monkeypatch):
    monkeypatch.delenv("TINYLOOP_MODEL", raising=False)
    assert os.path.samefile(cli._default_model(), MODEL) or \
        os.path.basename(cli._default_model()) == "tinyloop-demo.tinyloop"


def test_generates_english_like_text(model):
    tok = load_tokenizer(model)
    prompt = np.array(tok.encode("It is a truth universally acknowledged, that").ids, dtype=np.int32)
    out = model.generate(prompt, max_tokens=40, temperature=0.0)
    text = tok.decode(out[len(prompt):])
    words = text.split()
    assert len(words) >= 10
    assert sum(w.strip(",.;:!?'\"").isalpha() for w in words) >= 0.7 * len(words)
