"""Warm-start resume vs a fresh generate at the deeper depth, on a long prompt.

    TINYLOOP_NUM_THREADS=1 PYTHONPATH=build python3 bench/resume.py --prompt-tokens 224 --repeats 7
    PYTHONPATH=build python3 bench/resume.py                    # bundled model if present
    PYTHONPATH=build python3 bench/resume.py --random            # random Huginn-style model

A handle is built at L1 (build_resume_handle, timed on every repeat); interleaved with it,
resume_generate(handle, loops=L2) and generate(prompt, loops=L2) decode the same greedy
tokens (asserted). The saving is what the resume skips: the prelude and iterations
0 .. L1-1 over the prompt. Reported: median wall-clock of each call, the saving, and the
break-even N (build + N resumes <= N fresh generates; about 1 when the build costs
what each resume saves).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

import tinyloop_py as tl

BUNDLED = os.path.join(os.path.dirname(__file__), "..", "models", "tinyloop-demo.tinyloop")


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t0) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=BUNDLED)
    ap.add_argument("--random", action="store_true")
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--l1", type=int, default=8)
    ap.add_argument("--l2", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)

    path = os.path.abspath(args.model)
    if args.random or not os.path.exists(path):
        from tinyloop.random_model import write_random_model
        path = os.path.join(tempfile.mkdtemp(), "random.tinyloop")
        write_random_model(path, "huginn", dim=256, vocab_size=2048, max_seq_len=1024, seed=0)
        label = "random huginn (dim 256, V 2048, 1 pre / 2 loop / 1 post layers)"
    else:
        label = args.model
    with tl.Model(path) as model:
        V = model.config()["vocab_size"]
        prompt = np.random.default_rng(0).integers(1, V, size=args.prompt_tokens).astype(np.int32)
        gen = dict(max_tokens=args.new_tokens, stop_at_eos=False)
        build = lambda: model.build_resume_handle(prompt, loops=args.l1, max_loops=args.l2,  # noqa: E731
                                                  max_tokens=args.new_tokens)
        model.generate(prompt, loops=args.l2, **gen)  # warm-up (page in the weights)
        handle = build()
        fresh, resumed, built = [], [], []
        for rep in range(args.repeats):
            order = ("fresh", "resume", "build") if rep % 2 == 0 else ("build", "resume", "fresh")
            for what in order:
                if what == "build":
                    handle, ms = timed(build)
                    built.append(ms)
                elif what == "fresh":
                    a, ms = timed(lambda: model.generate(prompt, loops=args.l2, **gen))
                    fresh.append(ms)
                else:
                    b, ms = timed(lambda: model.resume_generate(handle, loops=args.l2, **gen))
                    resumed.append(ms)
            assert a == b, "resume_generate must equal generate"
    f, r, build_ms = statistics.median(fresh), statistics.median(resumed), statistics.median(built)
    print(f"model: {label}")
    print(f"prompt {args.prompt_tokens} tokens, L1={args.l1} -> L2={args.l2}, {args.new_tokens} new tokens, "
          f"{args.repeats} repeats (median)")
    print(f"build_resume_handle(loops={args.l1}): {build_ms:.1f} ms")
    print(f"generate(loops={args.l2}): {f:.1f} ms   resume_generate: {r:.1f} ms   "
          f"saving {100 * (1 - r / f):.1f} %")
    # Break-even: N resumes plus the one-off build cost no more than N fresh generates.
    n = f"{build_ms / (f - r):.2f}" if f > r else "never"
    print(f"break-even: build + N resumes <= N fresh generates from N = {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
