"""The reduced-precision loop body (Model(fp16_body=True) / TINYLOOP_EXPERIMENTAL_FP16_BODY=1)
against the default float32 body on one model (docs/benchmarks.md, "Reduced-precision loop
body"): how far the next-token distributions move, the perplexity each gives, and the memory
of the BF16 weight copies.

    PYTHONPATH=build:python python3 bench/fp16_body.py                    # bundled model
    PYTHONPATH=build:python python3 bench/fp16_body.py --loops 6 16 32 --positions 2048

Text: the held-out text of the bundled model (the last --tail-fraction of every file of
--corpus), cut into --positions / --ctx windows of --ctx tokens spread evenly over the stream
(tinyloop.quant_eval.eval_windows, as `tinyloop quantize` reports). Each window is scored in
one forward (Model.score: every row's logits, float32 K/V) by both settings of the same file
(tinyloop.quant_eval.compare_models): per row KL(P_f32 || P_bf16) of the softmax distributions
(in float64), whether the top-1 tokens agree, and the log-likelihood of the true next token
(the perplexity columns).
"""
from __future__ import annotations

import argparse
import glob
import os
import sys

import tinyloop_py as tl

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "python"))

from tinyloop.quant_eval import compare_models, eval_windows  # noqa: E402

BUNDLED = os.path.join(ROOT, "models", "tinyloop-demo.tinyloop")
CORPUS = "/work/shared/data/corpus"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=BUNDLED)
    ap.add_argument("--corpus", default=CORPUS, help="folder of .txt files (held-out tails)")
    ap.add_argument("--tail-fraction", type=float, default=0.05)
    ap.add_argument("--loops", type=int, nargs="+", default=[6, 16])
    ap.add_argument("--positions", type=int, default=2048)
    ap.add_argument("--ctx", type=int, default=256, help="window length (<= max_seq_len)")
    args = ap.parse_args(argv)

    files = sorted(glob.glob(os.path.join(args.corpus, "*.txt")))
    windows, what = eval_windows(args.model, files, args.ctx, -(-args.positions // args.ctx),
                                 args.tail_fraction)
    with tl.Model(args.model, fp16_body=False) as exact, tl.Model(args.model, fp16_body=True) as low:
        cfg = exact.config()
        weights_mb, copies_mb = exact.vram_usage_mb(), low.vram_usage_mb() - exact.vram_usage_mb()
    print(f"model {os.path.basename(args.model)}: dim {cfg['dim']}, {cfg['n_pre_blocks']} pre + "
          f"{cfg['n_loop_layers']} loop x L + {cfg['n_post_blocks']} post layers; weights "
          f"{weights_mb:.2f} MiB, BF16 loop-body copies +{copies_mb:.2f} MiB; held-out text: {what}")
    print("| L | mean KL(f32 ‖ bf16 body) | max KL | top-1 agreement | perplexity f32 | perplexity bf16 body "
          "| score time f32 / bf16 (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for L in args.loops:
        r = compare_models(args.model, args.model, windows, L, progress=False,
                           ref_kwargs=dict(fp16_body=False), test_kwargs=dict(fp16_body=True))
        print(f"| {L} | {r['mean_kl']:.2e} | {r['max_kl']:.2e} | {r['top1_agreement']:.2%} | "
              f"{r['ppl_ref']:.3f} | {r['ppl_test']:.3f} | {r['seconds_ref']:.2f} / {r['seconds_test']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
