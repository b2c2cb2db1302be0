"""The reduced-precision loop body (Model(fp16_body=True) / TINYLOOP_EXPERIMENTAL_FP16_BODY=1)
against the default float32 body on one model (docs/benchmarks.md, "Reduced-precision loop
body"): how far the next-token distributions move, the perplexity each gives, and the memory
of the BF16 weight copies.

    PYTHONPATH=build:python python3 bench/fp16_body.py                    # bundled model
    PYTHONPATH=build:python python3 bench/fp16_body.py --loops 6 16 32 --positions 2048

Text: the held-out text of the bundled model (the last --tail-fraction of every file of
--corpus, each followed by EOS, as `tinyloop perplexity --tail-fraction` reads it), cut into
--positions / --ctx windows of --ctx tokens spread evenly over the stream. Each window is
scored in one forward (Model.score: every row's logits, float32 K/V) by both models. Per
row: KL(P_f32 || P_bf16) of the softmax distributions (in float64), whether the top-1 tokens
agree, and the log-likelihood of the true next token (the perplexity columns).
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import time

import numpy as np

import tinyloop_py as tl

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "python"))

from tinyloop.perplexity import read_slice, token_stream, window_starts  # noqa: E402
from tinyloop.text import load_tokenizer  # noqa: E402

BUNDLED = os.path.join(ROOT, "models", "tinyloop-demo.tinyloop")
CORPUS = "/work/shared/data/corpus"


def log_softmax(z):
    z = z.astype(np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=BUNDLED)
    ap.add_argument("--corpus", default=CORPUS, help="folder of .txt files (held-out tails)")
    ap.add_argument("--tail-fraction", type=float, default=0.05)
    ap.add_argument("--loops", type=int, nargs="+", default=[6, 16])
    ap.add_argument("--positions", type=int, default=2048)
    ap.add_argument("--ctx", type=int, default=256, help="window length (<= max_seq_len)")
    args = ap.parse_args(argv)

    exact, low = tl.Model(args.model, fp16_body=False), tl.Model(args.model, fp16_body=True)
    tok = load_tokenizer(exact)
    if tok is None:
        print("the model has no embedded tokenizer", file=sys.stderr)
        return 2
    cfg = exact.config()
    eos = cfg["eos_ids"]
    files = sorted(glob.glob(os.path.join(args.corpus, "*.txt")))
    stream = token_stream(tok, [read_slice(f, args.tail_fraction) for f in files], eos[0] if eos else None)
    n_win = -(-args.positions // args.ctx)
    windows = [stream[s:s + args.ctx] for s in window_starts(len(stream), args.ctx, n_win)]
    copies_mb = low.vram_usage_mb() - exact.vram_usage_mb()
    print(f"model {os.path.basename(args.model)}: dim {cfg['dim']}, {cfg['n_pre_blocks']} pre + "
          f"{cfg['n_loop_layers']} loop x L + {cfg['n_post_blocks']} post layers; weights "
          f"{exact.vram_usage_mb():.2f} MiB, BF16 loop-body copies +{copies_mb:.2f} MiB; held-out text: last "
          f"{args.tail_fraction:.0%} of {len(files)} files, {len(stream)} tokens; {len(windows)} windows x "
          f"{args.ctx - 1} scored positions")
    print("| L | mean KL(f32 ‖ bf16 body) | max KL | top-1 agreement | perplexity f32 | perplexity bf16 body "
          "| score time f32 / bf16 (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for L in args.loops:
        kls, agree, nll = [], [], {False: [], True: []}
        secs = {False: 0.0, True: 0.0}
        for ids in windows:
            lps = {}
            for flag, m in ((False, exact), (True, low)):
                t0 = time.perf_counter()
                lps[flag] = log_softmax(m.score(np.asarray(ids, np.int32), loops=L))[:-1]  # [ctx - 1, V]
                secs[flag] += time.perf_counter() - t0
                nll[flag].append(-lps[flag][np.arange(len(ids) - 1), ids[1:]])
            p, q = lps[False], lps[True]
            kls.append(np.sum(np.exp(p) * (p - q), axis=-1))
            agree.append(p.argmax(-1) == q.argmax(-1))
        kl, ag = np.concatenate(kls), np.concatenate(agree)
        ppl = {f: float(np.exp(np.mean(np.concatenate(nll[f])))) for f in nll}
        print(f"| {L} | {kl.mean():.2e} | {kl.max():.2e} | {ag.mean():.2%} | {ppl[False]:.3f} | {ppl[True]:.3f} "
              f"| {secs[False]:.2f} / {secs[True]:.2f} |")
    exact.close()
    low.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
