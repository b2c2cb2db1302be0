"""KV storage modes on one model: cache bytes per token, and how far each mode's next-token
distributions move from the default FP16 cache (docs/kv-cache.md).

    PYTHONPATH=build:python python3 bench/kv_modes.py                 # bundled model
    PYTHONPATH=build:python python3 bench/kv_modes.py --loops 4 16 --positions 512
    PYTHONPATH=build python3 bench/kv_modes.py --model SmolLM2.tinyloop --loops 1 --groups \
        --quant-activations f32     # a plain (non-looped) model: L = 1, no shared-mode rows

Modes: fp32, fp16 (the reference), int8, the store-h modes h_fp16 / h_int8 / h_int4 (the
attention input h is kept, K/V rebuilt when attending), and the recurrence-shared mode
(kv_loop_slots = B) with fp16 storage for B in --groups.

Bytes per token: the growth of the model's live memory (vram_usage_mb, which counts live
caches) between two generations of different lengths, measured inside on_token (between
decode steps, when only the cache is live), divided by the difference in positions. It is
the whole cache of one position: every slot (pre, loop iterations or groups, post) x (K + V
+ int8 scales).

Quality: the held-out text of the bundled model (the last --tail-fraction of every file of
--corpus, each followed by EOS, as `tinyloop perplexity --tail-fraction` reads it) is cut
into --positions / --ctx windows of --ctx tokens, spread evenly over the stream. Each window
is prefilled with its first token only and then decoded one token at a time through the
cache (tinyloop_py._testing.stepwise_logits), so every one of the --positions rows comes from
a decode step reading the mode's cache. Per row: KL(P_fp16 || P_mode) of the softmax distributions (in
float64) and whether the top-1 tokens agree; the table reports the means.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import time

import numpy as np

import tinyloop_py as tl
from tinyloop_py import _testing  # test and benchmark hooks

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "python"))

from tinyloop.perplexity import read_slice, token_stream, window_starts  # noqa: E402
from tinyloop.quant_eval import log_softmax  # noqa: E402
from tinyloop.text import load_tokenizer  # noqa: E402

BUNDLED = os.path.join(ROOT, "models", "tinyloop-demo.tinyloop")
CORPUS = "/work/shared/data/corpus"


def modes(groups):
    """(label, kv_mode, kv_loop_slots)."""
    out = [("fp32", "fp32", 0), ("fp16", "fp16", 0), ("int8", "int8", 0),
           ("h_fp16 (store-h)", "h_fp16", 0), ("h_int8 (store-h)", "h_int8", 0),
           ("h_int4 (store-h)", "h_int4", 0)]
    out += [(f"shared B={b} (fp16)", "fp16", b) for b in groups]
    return out


MODEL_KW: dict = {}  # extra tl.Model kwargs (--quant-activations)


def bytes_per_token(path, kv_mode, loops, slots, prompt):
    """Cache bytes one more position costs, measured from live memory at two lengths."""
    with tl.Model(path, kv_mode=kv_mode, **MODEL_KW) as model:
        def live(n_new):
            base = model.vram_usage_mb()
            seen = []
            model.generate_stream(prompt, lambda t: seen.append(model.vram_usage_mb()),
                                  max_tokens=n_new, loops=loops, kv_loop_slots=slots,
                                  stop_at_eos=False)
            return (max(seen) - base) * 1024 * 1024
        n1, n2 = 8, 72
        return (live(n2) - live(n1)) / (n2 - n1)


def decode_logits(path, kv_mode, loops, slots, windows):
    """Logits [positions, V]: each window prefilled with 1 token, the rest decoded."""
    rows = []
    with tl.Model(path, kv_mode=kv_mode, **MODEL_KW) as model:
        for ids in windows:
            out = _testing.stepwise_logits(model, ids, 1, loops=loops, kv_loop_slots=slots)  # [ctx, V]
            rows.append(out)
    return np.concatenate(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=BUNDLED)
    ap.add_argument("--corpus", default=CORPUS, help="folder of .txt files (held-out tails)")
    ap.add_argument("--tail-fraction", type=float, default=0.05)
    ap.add_argument("--loops", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--groups", type=int, nargs="*", default=[1, 2, 4],
                    help="kv_loop_slots values B to measure (none: `--groups` alone; moot at L = 1)")
    ap.add_argument("--positions", type=int, default=512)
    ap.add_argument("--ctx", type=int, default=256, help="window length (<= max_seq_len)")
    ap.add_argument("--quant-activations", choices=["q8", "f32"], default=None,
                    help="Model(quant_activations=...) for int8/int4 weights (default: the Model's "
                         "default). q8 rounding flips amplify any tiny K/V difference (SmolLM2: "
                         "docs/kv-cache.md); f32 isolates the storage mode's own error")
    args = ap.parse_args(argv)
    if args.quant_activations:
        MODEL_KW["quant_activations"] = args.quant_activations

    with tl.Model(args.model, **MODEL_KW) as model:
        tok = load_tokenizer(model)
        eos = model.config()["eos_ids"]
        cfg = model.config()
    if tok is None:
        print("the model has no embedded tokenizer", file=sys.stderr)
        return 2
    files = sorted(glob.glob(os.path.join(args.corpus, "*.txt")))
    stream = token_stream(tok, [read_slice(f, args.tail_fraction) for f in files],
                          eos[0] if eos else None)
    n_win = -(-args.positions // args.ctx)
    starts = window_starts(len(stream), args.ctx, n_win)
    windows = [stream[s:s + args.ctx] for s in starts]
    print(f"model {os.path.basename(args.model)}: {cfg['n_pre_blocks']} pre + {cfg['n_loop_layers']} "
          f"loop x L + {cfg['n_post_blocks']} post layers, {cfg['n_kv_heads']} kv heads x "
          f"{cfg['head_dim']}; held-out text: last {args.tail_fraction:.0%} of {len(files)} files, "
          f"{len(stream)} tokens; {len(windows)} windows x {args.ctx} = "
          f"{len(windows) * args.ctx} decoded positions; quant_activations "
          f"{cfg.get('quant_activations', args.quant_activations or 'default')}")
    prompt = stream[:4]

    results = {}
    for L in args.loops:
        ref_lp = log_softmax(decode_logits(args.model, "fp16", L, 0, windows))
        for label, kv_mode, slots in modes(args.groups):
            t0 = time.perf_counter()
            bpt = bytes_per_token(args.model, kv_mode, L, slots, prompt)
            lp = ref_lp if (kv_mode, slots) == ("fp16", 0) else \
                log_softmax(decode_logits(args.model, kv_mode, L, slots, windows))
            kl = float(np.mean(np.sum(np.exp(ref_lp) * (ref_lp - lp), axis=-1)))
            top1 = float(np.mean(ref_lp.argmax(-1) == lp.argmax(-1)))
            results[label, L] = (bpt, kl, top1)
            print(f"  L={L:2d} {label:20s} {bpt:9.0f} B/token  KL {kl:.3e}  top-1 {top1:.4f}"
                  f"  ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)

    Ls = args.loops
    head = "| mode | " + " | ".join(f"bytes/token L={L}" for L in Ls) + " | " + \
        " | ".join(f"mean KL vs fp16, L={L} | top-1 agree, L={L}" for L in Ls) + " |"
    print(head)
    print("| --- |" + " ---: |" * (3 * len(Ls)))
    for label, _, _ in modes(args.groups):
        cells = [f"{results[label, L][0]:,.0f}" for L in Ls]
        for L in Ls:
            _, kl, top1 = results[label, L]
            cells += ["0 (reference)" if label == "fp16" else f"{kl:.2e}", f"{top1:.2%}"]
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
