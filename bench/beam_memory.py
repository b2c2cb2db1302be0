"""Beam search KV memory and time: beam 4 vs beam 1 (greedy) vs the spec's naive scheme.

    PYTHONPATH=build python3 bench/beam_memory.py                  # bundled model
    PYTHONPATH=build python3 bench/beam_memory.py --beams 2 4 8 --prompt-tokens 256

A --prompt-tokens (256) prompt of in-vocabulary ids (the tokenized model card text, repeated),
--new-tokens (64) new tokens, stop_at_eos off so every beam runs the whole length. For each
beam size: peak KV bytes of the call (one shared prompt prefix + the live beams' tails,
docs/beam-search.md), what generate() (beam 1) allocates for the same call, the spec's naive
scheme (beam_size full caches of prompt + new tokens), KV rows (one position, one slot)
copied by reorders, and the wall time against greedy generate().
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

import tinyloop_py as tl
from tinyloop_py import _testing  # test and benchmark hooks

ROOT = os.path.join(os.path.dirname(__file__), "..")
BUNDLED = os.path.join(ROOT, "models", "tinyloop-demo.tinyloop")


def prompt_ids(model, n):
    try:
        import sys
        sys.path.insert(0, os.path.join(ROOT, "python"))
        from tinyloop.text import load_tokenizer
        tok = load_tokenizer(model)
        text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
        ids = tok.encode(text).ids
    except Exception:  # no tokenizer: any in-vocabulary ids will do for memory figures
        ids = list(np.random.default_rng(0).integers(0, model.config()["vocab_size"], n))
    while len(ids) < n:
        ids = ids + ids
    return np.array(ids[:n], dtype=np.int32)


def mib(n):
    return n / 2**20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=BUNDLED)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--beams", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--loops", type=int, default=None)
    args = ap.parse_args(argv)

    total = args.prompt_tokens + args.new_tokens
    with tl.Model(args.model, max_seq_len=total) as m:
        ids = prompt_ids(m, args.prompt_tokens)
        L = args.loops or m.config()["default_loops"]
        t0 = time.perf_counter()
        m.generate(ids, max_tokens=args.new_tokens, loops=L, stop_at_eos=False)
        greedy_s = time.perf_counter() - t0
    print(f"model {os.path.basename(args.model)}  prompt {args.prompt_tokens}  new {args.new_tokens}  "
          f"loops {L}  kv fp16")
    print(f"{'beam':>4} {'prefix MiB':>10} {'tail MiB':>9} {'tails':>5} {'peak MiB':>9} "
          f"{'beam1 MiB':>9} {'peak/beam1':>10} {'naive MiB':>9} {'naive/peak':>10} "
          f"{'rows copied':>11} {'time/greedy':>11}")
    for beam in args.beams:
        with tl.Model(args.model, max_seq_len=total) as m:
            t0 = time.perf_counter()
            r = _testing.beam_search_memory(m, ids, max_tokens=args.new_tokens, beam_size=beam, loops=L,
                                      stop_at_eos=False)
            dt = time.perf_counter() - t0
        print(f"{beam:>4} {mib(r['prefix_bytes']):>10.2f} {mib(r['tail_bytes']):>9.3f} {r['peak_tails']:>5} "
              f"{mib(r['peak_bytes']):>9.2f} {mib(r['greedy_cache_bytes']):>9.2f} "
              f"{r['peak_bytes'] / r['greedy_cache_bytes']:>10.2f} {mib(r['naive_bytes']):>9.2f} "
              f"{r['naive_bytes'] / r['peak_bytes']:>10.2f} {r['tail_rows_copied']:>11} "
              f"{dt / greedy_s:>11.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
