"""Early exit: decode-time saving and quality cost against plain decoding at the same depth.

    TINYLOOP_NUM_THREADS=1 PYTHONPATH=build python3 bench/early_exit.py --repeats 5   # as in docs/benchmarks.md
    PYTHONPATH=build python3 bench/early_exit.py                       # the bundled model
    PYTHONPATH=build python3 bench/early_exit.py --model other.tinyloop
    PYTHONPATH=build python3 bench/early_exit.py --random              # no trained model at hand

Settings default to the documented "sweet spot" (docs/loop-depth.md, "Cost"): loops=16, logit-margin mode with
margin 3.0, min_L 4, peek_every 2, patience 1 (override with the flags below).

Prompts are held-out text: the last 5% of each file in /work/shared/data/corpus (the slice
the bundled model never trained on, docs/bundled-model.md), encoded with the model's
embedded tokenizer. Measured, both modes in the same process, interleaved, repeated:

  decode ms/token   generate_stream's decode_steady_ms / (tokens_emitted - 1), greedy,
                    no EOS stop, averaged over prompts; the fastest repeat (and the median)
  mean loops        iterations per decode step (loops_per_token without the prefill's token)
  token agreement   share of early-exit greedy tokens that equal the full-depth greedy token
                    for the same prefix (full depth = score(prompt + early-exit tokens,
                    loops) argmax, i.e. teacher-forced on the early-exit continuation)
  identical prefix  share of positions where the two free-running greedy continuations
                    are identical (drops to 0 after the first divergence)
  perplexity        teacher-forced on held-out windows through the engine's early-exit
                    decode step (_testing.early_exit_stepwise_logits), plain vs early exit

With --random (or when the bundled model is missing) a random Huginn-style model and random
prompt ids stand in: speed and mechanics only, no meaningful quality numbers.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile

import numpy as np

import tinyloop_py as tl
from tinyloop_py import _testing  # test and benchmark hooks

CORPUS = "/work/shared/data/corpus"
BUNDLED = os.path.join(os.path.dirname(__file__), "..", "models", "tinyloop-demo.tinyloop")


def held_out_texts() -> dict[str, str]:
    """The last 5% of each corpus file's characters (docs/bundled-model.md)."""
    out = {}
    for name in sorted(os.listdir(CORPUS)):
        with open(os.path.join(CORPUS, name), encoding="utf-8") as f:
            text = f.read()
        n = len(text)
        out[name] = text[n - math.ceil(0.05 * n):]
    return out


def token_streams(model, random_vocab: int | None, seed: int) -> dict[str, np.ndarray]:
    if random_vocab is not None:
        rng = np.random.default_rng(seed)
        return {f"random{i}": rng.integers(1, random_vocab, size=2000).astype(np.int32) for i in range(4)}
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(model.tokenizer_json())
    return {name: np.array(tok.encode(text).ids, dtype=np.int32) for name, text in held_out_texts().items()}


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=BUNDLED)
    ap.add_argument("--random", action="store_true", help="use a random model (no trained model needed)")
    ap.add_argument("--loops", type=int, default=16)
    ap.add_argument("--margin", type=float, default=3.0, help="early_exit_logit_margin (0 = hidden-L2 mode)")
    ap.add_argument("--tau", type=float, default=1e-3, help="early_exit_tau (hidden-L2 mode)")
    ap.add_argument("--min-L", type=int, default=4)
    ap.add_argument("--peek-every", type=int, default=2)
    ap.add_argument("--patience", type=int, default=1)
    ap.add_argument("--prompts-per-file", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ppl-window", type=int, default=192, help="tokens per perplexity window (one per file)")
    ap.add_argument("--ppl-prefill", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    path, random_vocab = os.path.abspath(args.model), None
    if args.random or not os.path.exists(path):
        if not args.random:
            print(f"(no model at {path}: using a random Huginn-style model)", file=sys.stderr)
        from tinyloop.random_model import write_random_model
        path = os.path.join(tempfile.mkdtemp(), "random.tinyloop")
        write_random_model(path, "huginn", dim=128, vocab_size=512, max_seq_len=512, seed=args.seed)
        random_vocab = 512

    ee = dict(early_exit_patience=args.patience, early_exit_min_L=args.min_L, early_exit_tau=args.tau,
              early_exit_peek_every=args.peek_every, early_exit_logit_margin=args.margin)
    with tl.Model(path) as model:
        streams = token_streams(model, random_vocab, args.seed)
        rng = np.random.default_rng(args.seed)
        prompts = []
        for name, ids in streams.items():
            hi = len(ids) - args.prompt_tokens - 1
            for start in sorted(rng.integers(0, hi, size=args.prompts_per_file)):
                prompts.append(ids[start:start + args.prompt_tokens])

        gen = dict(max_tokens=args.new_tokens, loops=args.loops, temperature=0.0, stop_at_eos=False)
        plain_ms, ee_ms = [], []
        runs = {}
        for rep in range(args.repeats):
            tot = {"plain": 0.0, "ee": 0.0}
            for i, p in enumerate(prompts):
                for mode in (("plain", "ee") if (rep + i) % 2 == 0 else ("ee", "plain")):
                    kw = dict(gen, **ee) if mode == "ee" else gen
                    r = model.generate_stream(p, lambda t: True, **kw)
                    tot[mode] += r["decode_steady_ms"] / max(1, r["tokens_emitted"] - 1)
                    runs[(mode, i)] = r
            plain_ms.append(tot["plain"] / len(prompts))
            ee_ms.append(tot["ee"] / len(prompts))

        agree = same_prefix = total = 0
        depths = []
        for i, p in enumerate(prompts):
            a = runs[("plain", i)]["tokens"][len(p):]
            b = runs[("ee", i)]["tokens"][len(p):]
            depths += runs[("ee", i)]["loops_per_token"][1:]
            full = model.score(np.array(runs[("ee", i)]["tokens"][:-1], np.int32), loops=args.loops)
            full_choice = full[len(p) - 1:].argmax(-1)  # full-depth greedy token per prefix
            agree += int(np.sum(full_choice == np.array(b)))
            k = next((j for j in range(len(a)) if a[j] != b[j]), len(a))
            same_prefix += k
            total += len(a)

        nll = {"plain": [], "ee": []}
        ppl_depths = []
        for name, ids in streams.items():
            window = ids[: args.ppl_window]
            targets = window[args.ppl_prefill:]
            for mode in ("plain", "ee"):
                kw = ee if mode == "ee" else {}
                r = _testing.early_exit_stepwise_logits(model, window, args.ppl_prefill, loops=args.loops, **kw)
                lp = log_softmax(r["logits"][:-1])  # row r predicts window[prefill + r]
                nll[mode] += list(-lp[np.arange(len(targets)), targets])
                if mode == "ee":
                    ppl_depths += list(r["depths"][1:])

    # The cores are shared: the fastest repeat is the least disturbed one; the median is shown too.
    p_ms, e_ms = min(plain_ms), min(ee_ms)
    p_med, e_med = statistics.median(plain_ms), statistics.median(ee_ms)
    ppl_plain, ppl_ee = math.exp(np.mean(nll["plain"])), math.exp(np.mean(nll["ee"]))
    print(f"model: {'random huginn (dim 128, V 512)' if random_vocab else args.model}")
    print(f"settings: loops={args.loops} " + " ".join(f"{k}={v}" for k, v in ee.items()))
    source = "random ids" if random_vocab else "held-out text"
    print(f"prompts: {len(prompts)} x {args.prompt_tokens} tokens of {source}, {args.new_tokens} greedy "
          f"tokens each, {args.repeats} repeats")
    print(f"decode ms/token (fastest repeat): plain {p_ms:.2f}  early exit {e_ms:.2f}  "
          f"saving {100 * (1 - e_ms / p_ms):+.1f} %   (median: {p_med:.2f} / {e_med:.2f}, "
          f"{100 * (1 - e_med / p_med):+.1f} %)")
    print(f"mean loops per decode step: {np.mean(depths):.2f} of {args.loops} "
          f"({100 * (1 - np.mean(depths) / args.loops):.1f} % fewer iterations)")
    print(f"token agreement with full depth (same prefix): {100 * agree / total:.1f} %")
    print(f"free-running greedy outputs identical for: {100 * same_prefix / total:.1f} % of positions")
    print(f"perplexity ({len(nll['plain'])} held-out tokens, teacher-forced): plain {ppl_plain:.3f}  "
          f"early exit {ppl_ee:.3f}  change {100 * (ppl_ee / ppl_plain - 1):+.4f} %  "
          f"(mean loops {np.mean(ppl_depths):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
