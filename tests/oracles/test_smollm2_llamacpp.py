"""SmolLM2-135M-Instruct (Q4_1 GGUF) through llama.cpp (llama-cpp-python) against the same
file converted to .tinyloop and run by TinyLoop (issue 3's must-shows):

- next-token top-1 agreement >= 99 % over 512 positions of real text (the shared corpus),
  with the largest absolute logit difference printed;
- greedy 64-token continuations of 5 prompts identical;
- our tokenizer (built from the GGUF vocabulary) gives llama.cpp's ids on corpus snippets,
  unicode, digits and whitespace runs.

Run with `bash scripts/test-oracles.sh` (installs llama-cpp-python, ~17 min the first time).
Numbers are printed (pytest -s) and recorded in docs/text.md ("SmolLM2 parity").
"""
import os

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed (scripts/test-oracles.sh)")

import tinyloop_py as tl  # noqa: E402
from smollm2 import require_converted, require_gguf  # noqa: E402
from tinyloop.text import get_tokenizer  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CORPUS = os.path.abspath(os.path.join(ROOT, "..", "shared", "data", "corpus"))
N_CTX = 1024

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):\n",
    "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
    "It is a truth universally acknowledged, that",
]


def _corpus(name: str) -> str:
    path = os.path.join(CORPUS, name)
    if not os.path.exists(path):
        pytest.skip(f"corpus file {path} not present")
    with open(path, encoding="utf-8") as f:
        return f.read()


@pytest.fixture(scope="module")
def llama():
    llm = llama_cpp.Llama(require_gguf(), n_ctx=N_CTX, n_threads=2, logits_all=True, verbose=False,
                          n_batch=512, seed=0)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def ours():
    with tl.Model(require_converted(), max_seq_len=N_CTX) as m:
        yield m, get_tokenizer(m)


def _llama_logits(llm, ids) -> np.ndarray:
    llm.reset()
    llm.eval(list(ids))
    return np.array(llm.scores[:len(ids)], dtype=np.float32)  # [T, V]


def _llama_greedy(llm, ids, n) -> list[int]:
    """Greedy decoding by hand (argmax of llama.cpp's logits, lowest id on ties, EOS not
    special), so no sampler setting of llama-cpp-python can differ from ours."""
    llm.reset()
    llm.eval(list(ids))
    out = []
    for _ in range(n):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(tok)
        llm.eval([tok])
    return out


def test_next_token_top1_agreement_over_512_positions(llama, ours):
    model, tok = ours
    agree = total = 0
    max_diff = 0.0
    for name, start in (("austen.txt", 0.3), ("mobydick.txt", 0.6)):
        text = _corpus(name)
        i = text.index("\n\n", int(len(text) * start)) + 2  # start at a paragraph
        ids = tok.encode(text[i:i + 4000]).ids[:256]
        assert len(ids) == 256
        ref = _llama_logits(llama, ids)  # [256, V]
        got = model.score(np.asarray(ids, dtype=np.int32))  # [256, V]
        agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
        total += len(ids)
        max_diff = max(max_diff, float(np.abs(ref - got).max()))
    rate = agree / total
    print(f"\nSmolLM2 top-1 agreement with llama.cpp: {agree}/{total} = {rate:.2%}, "
          f"largest |logit difference| = {max_diff:.4f}")
    assert total == 512 and rate >= 0.99


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_64_tokens_identical(llama, ours, prompt):
    model, tok = ours
    ids = tok.encode(prompt).ids
    want = _llama_greedy(llama, ids, 64)
    got = model.generate(np.asarray(ids, dtype=np.int32), max_tokens=64, temperature=0.0,
                         repetition_penalty=1.0, stop_at_eos=False)[len(ids):]
    print(f"\n{prompt!r} -> {tok.decode(got)!r}")
    assert got == want, f"first difference at token {next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)}"


def _tokenizer_texts() -> list[str]:
    texts = ["Café déjà vu — naïve façade, 日本語, Ελληνικά, emoji 🙂🙂!",
             "In 1851, 3.14159 x 2048 = 6433.98; 0007 and 1,000,000.",
             "tabs\tand  runs   of    spaces\n\n\nnewlines  \n   \t \u00a0x\u2003y  ",
             "don't DON'T we'll I'M it's",
             "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"]
    for name in ("austen.txt", "mobydick.txt", "opticks.txt", "jargon.txt", "web_bible.txt", "devil.txt"):
        text = _corpus(name)
        for frac in (0.1, 0.5, 0.9):
            i = int(len(text) * frac)
            texts.append(text[i:i + 2000])
    return texts


def test_tokenizer_ids_equal_llama_cpp(llama, ours):
    _, tok = ours
    texts = _tokenizer_texts()
    n_ids = 0
    for text in texts:
        want = llama.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        got = tok.encode(text).ids
        assert got == want, f"ids differ on {text[:60]!r}"
        assert tok.decode(got, skip_special_tokens=False) == text
        n_ids += len(got)
    print(f"\ntokenizer: {len(texts)} texts, {n_ids} ids, all equal to llama.cpp's")
