"""Grammar masks: compile time and the grammar's per-step cost in decoding.

    PYTHONPATH=build python3 bench/grammar_mask.py               # BPE vocabulary trained here
    PYTHONPATH=build python3 bench/grammar_mask.py --synthetic   # random byte strings instead
    PYTHONPATH=build python3 bench/grammar_mask.py --model PATH  # a .tinyloop model's own tokenizer

Vocabulary: 49152 tokens. By default a byte-level BPE (Hugging Face `tokenizers`,
ByteLevelBPETokenizer, the GPT-2 byte alphabet, "<|endoftext|>" as a special token) is
trained on /work/shared/data/corpus to exactly 49152 tokens (about 7 s), and each token's
bytes come from tinyloop.grammar_vocab.token_bytes (undoing the GPT-2 byte-to-unicode map). --synthetic uses
256 single bytes
plus random byte strings with a BPE-like length distribution instead. --model PATH takes
the vocabulary of a .tinyloop model's embedded tokenizer instead (tinyloop.text.token_bytes,
exactly what generate(grammar=...) sees: special tokens are b"", so never allowed), and the
sample outputs are tokenized by that tokenizer (e.g. SmolLM2-135M-Instruct, 49,152 tokens).

Per pattern (the spec's shapes: digits, choice, {"name":"[a-z]+"}, a JSON object, and
free prose as the permissive worst case), a real token walk: sample outputs that match
the pattern, tokenized by the BPE (greedy longest match with --synthetic). Measured:

  compile ms       tl.Grammar(pattern): parse, NFA, DFA (median of 10)
  vocab ms         set_token_vocabulary: building the vocabulary trie (median of 3)
  first use us     mask of a state the first time it is needed (one trie scan), median
                   and max over the walk's distinct states, on a fresh vocabulary
  all masks ms     precompute_masks() for every state
  step us          after first use: mask lookup + applying it to a float32 logits row of
                   49152 + advancing by the token; median over 20 passes of the walk
  lookup / apply   the two parts of a step, medians
  py call us       Grammar.allowed_tokens from Python (numpy bool copy), for reference

The step parts are timed in C++ (tinyloop_py._testing.time_mask_steps) so that Python call overhead
does not hide them. Target (issue "Search and constraints"): median step <= 50 us.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import random
import statistics
import sys
import time

import numpy as np

import tinyloop_py as tl
from tinyloop_py import _testing  # test and benchmark hooks

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from tinyloop.grammar_vocab import token_bytes  # noqa: E402

VOCAB_SIZE = 49152
CORPUS = "/work/shared/data/corpus"


def bpe_vocabulary():
    from tokenizers import ByteLevelBPETokenizer

    t0 = time.perf_counter()
    tok = ByteLevelBPETokenizer()
    files = sorted(glob.glob(os.path.join(CORPUS, "*.txt")))
    tok.train(files, vocab_size=VOCAB_SIZE, min_frequency=1, special_tokens=["<|endoftext|>"], show_progress=False)
    train_s = time.perf_counter() - t0
    # the special token gets its text, as a worst case for the masks (docs/grammar.md)
    vocab = token_bytes(tok._tokenizer, special_as_text=True)
    encode = lambda text: tok.encode(text).ids  # noqa: E731
    return vocab, encode, f"byte-level BPE trained on the corpus in {train_s:.1f} s"


def model_vocabulary(path):
    from tinyloop.text import get_tokenizer, token_bytes as model_token_bytes

    tok = get_tokenizer(path)
    vocab = model_token_bytes(path)  # vocab_size entries, specials b"" (as generate uses it)
    encode = lambda text: tok.encode(text).ids  # noqa: E731
    return vocab, encode, f"embedded tokenizer of {os.path.basename(path)}"


def synthetic_vocabulary(seed=0):
    rng = random.Random(seed)
    vocab = [bytes([b]) for b in range(256)]
    seen = set(vocab)
    printable = bytes(range(0x20, 0x7F))
    while len(vocab) < VOCAB_SIZE:
        n = min(16, max(2, int(rng.lognormvariate(1.6, 0.5))))  # mode ~4-5 bytes, like English BPE
        t = bytes(rng.choice(printable) if rng.random() < 0.95 else rng.randrange(256) for _ in range(n))
        if t not in seen:
            seen.add(t)
            vocab.append(t)
    by_bytes = {t: i for i, t in enumerate(vocab)}
    maxlen = max(map(len, vocab))

    def encode(text):  # greedy longest match
        data, ids, i = text.encode(), [], 0
        while i < len(data):
            for n in range(min(maxlen, len(data) - i), 0, -1):
                if data[i:i + n] in by_bytes:
                    ids.append(by_bytes[data[i:i + n]])
                    i += n
                    break
        return ids

    return vocab, encode, "synthetic: 256 single bytes + random strings, lognormal lengths 2-16"


def prose_sample():
    with open(os.path.join(CORPUS, "austen.txt"), encoding="utf-8") as f:
        text = f.read()
    tail = text[int(len(text) * 0.95):]  # held-out slice
    start = tail.index(". ") + 2
    return tail[start:start + 600].replace("\n", " ")


def cases():
    person = {"name": "string", "age": "integer", "email": "string", "tags": ["string"], "score": "number",
              "active": "boolean"}
    people = [{"name": "Elizabeth Bennet", "age": 20, "email": "lizzy@longbourn.example", "tags": ["reader", "walker"],
               "score": 9.5, "active": True},
              {"name": "Fitzwilliam Darcy", "age": 28, "email": "darcy@pemberley.example", "tags": [], "score": -1.25e3,
               "active": False}]
    return [
        ("digits{1,12}", tl.Grammar.digits(1, 12), ["42", "2024", "31415926535"]),
        ("choice(3)", tl.Grammar.choice(["positive", "negative", "neutral"]), ["positive", "negative", "neutral"]),
        ('{"name":"[a-z]+"}', tl.Grammar(r'\{"name":"[a-z]+"\}'), ['{"name":"alice"}', '{"name":"elizabeth"}']),
        ("json_object(6 fields)", tl.Grammar.json_object(person),
         [json.dumps(p) for p in people] + [json.dumps(people[0], separators=(",", ":"))]),
        ("prose [^<>{}]+", tl.Grammar(r"[^<>{}\x00-\x09\x0b-\x1f]+"), [prose_sample()]),
    ]


def median_us(xs):
    return statistics.median(xs) / 1000.0


def walk_states(g, ids):
    s, states = g.initial_state(), []
    for t in ids:
        states.append(s)
        s = g.advance(s, t)
        assert s != tl.Grammar.DEAD, "sample text does not match its grammar"
    assert g.is_accepting(s), "sample text is not a complete match"
    return states


def bench_case(name, g, texts, token_bytes, encode):
    pattern = g.pattern
    compile_ms = statistics.median(_timed(lambda: tl.Grammar(pattern)) for _ in range(10)) * 1e3
    vocab_ms = statistics.median(_timed(lambda: g.set_token_vocabulary(token_bytes)) for _ in range(3)) * 1e3
    walks = [encode(t) for t in texts]
    ids = [t for w in walks for t in w]  # several walks back to back: restart at each
    # first use: fresh vocabulary, one pass per walk; the first visit of each state computes it
    g.set_token_vocabulary(token_bytes)
    first, seen = [], set()
    for w in walks:
        states = walk_states(g, w)
        lookups = _testing.time_mask_steps(g, w, 1)["lookup"][0]
        for s, ns in zip(states, lookups):
            if s not in seen:
                seen.add(s)
                first.append(ns)
    g.set_token_vocabulary(token_bytes)
    all_ms = _timed(g.precompute_masks) * 1e3
    # after first use
    step, lookup, apply = [], [], []
    for w in walks:
        r = _testing.time_mask_steps(g, w, 21)
        for p in range(1, 21):  # pass 0 may still hold a page-cold cache; skip it
            lookup += r["lookup"][p]
            apply += r["apply"][p]
            step += [a + b + c for a, b, c in zip(r["lookup"][p], r["apply"][p], r["advance"][p])]
    s0 = g.initial_state()
    py_call = [_timed(lambda: g.allowed_tokens(s0)) * 1e9 for _ in range(200)]
    return dict(name=name, states=g.num_states, steps=len(ids), compile_ms=compile_ms, vocab_ms=vocab_ms,
                first_med_us=median_us(first), first_max_us=max(first) / 1000.0, all_ms=all_ms,
                step_us=median_us(step), step_p99_us=float(np.percentile(step, 99)) / 1000.0,
                lookup_us=median_us(lookup), apply_us=median_us(apply), py_us=median_us(py_call))


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--synthetic", action="store_true", help="random byte-string vocabulary instead of a BPE")
    src.add_argument("--model", metavar="PATH", help="vocabulary and tokenization of this .tinyloop model's "
                     "embedded tokenizer")
    args = ap.parse_args()
    if args.model:
        token_bytes, encode, how = model_vocabulary(args.model)
    else:
        token_bytes, encode, how = synthetic_vocabulary() if args.synthetic else bpe_vocabulary()
        assert len(token_bytes) == VOCAB_SIZE
    lengths = [len(t) for t in token_bytes]
    print(f"# vocabulary: {len(token_bytes)} tokens, {how}; mean length {statistics.mean(lengths):.2f} bytes, "
          f"max {max(lengths)}, {sum(1 for t in token_bytes if not t)} empty (special)")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    print("| pattern | DFA states | walk steps | compile ms | vocab ms | first use us (median / max) | all masks ms "
          "| step us (median / p99) | lookup us | apply us | py call us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, g, texts in cases():
        r = bench_case(name, g, texts, token_bytes, encode)
        print(f"| `{r['name']}` | {r['states']} | {r['steps']} | {r['compile_ms']:.3f} | {r['vocab_ms']:.1f} "
              f"| {r['first_med_us']:.0f} / {r['first_max_us']:.0f} | {r['all_ms']:.1f} "
              f"| {r['step_us']:.2f} / {r['step_p99_us']:.2f} | {r['lookup_us']:.3f} | {r['apply_us']:.2f} "
              f"| {r['py_us']:.1f} |")


if __name__ == "__main__":
    main()
