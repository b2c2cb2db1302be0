"""Self-speculative decoding: tokens/s of generate(loops=L) vs generate_speculative and
generate_tree_speculative (same weights drafting at fewer loops), plus accept rates.

    PYTHONPATH=build python3 bench/speculative.py                    # the bundled model
    PYTHONPATH=build python3 bench/speculative.py --model other.tinyloop
    PYTHONPATH=build python3 bench/speculative.py --random           # no trained model at hand

Defaults: verify at L=8, draft at 2 loops, draft_ahead 4; tree with K_branches=2 at
draft_ahead 4 and 2. Prompts are held-out text (the last 5% of each corpus file, which the
bundled model never trained on, docs/bundled-model.md), --prompt-len tokens from the middle
of each slice, encoded with the model's embedded tokenizer. Greedy, no EOS stop, --max-tokens
new tokens per prompt. Every mode runs in this process, interleaved prompt by prompt,
--repeats times; the table shows total new tokens / median total wall seconds (whole calls;
the prefill is the same in every mode) and the median over repeats of the per-repeat time
ratio to plain generate. Greedy outputs are
checked equal to generate's (the guarantee), and a sampled pass (--temperature) reports the
accept rate under speculative sampling.

With --random (or when the bundled model is missing) a random model with the bundled
model's shape and random prompt ids stand in: speed and mechanics only (a random model's
draft rarely agrees with its verifier).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time

import numpy as np

import tinyloop_py as tl

CORPUS = "/work/shared/data/corpus"
BUNDLED = os.path.join(os.path.dirname(__file__), "..", "models", "tinyloop-demo.tinyloop")


def held_out_prompts(model, n_tokens: int) -> list[np.ndarray]:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(model.tokenizer_json())
    out = []
    for name in sorted(os.listdir(CORPUS)):
        with open(os.path.join(CORPUS, name), encoding="utf-8") as f:
            text = f.read()
        held = text[len(text) - math.ceil(0.05 * len(text)):]
        ids = tok.encode(held).ids
        mid = len(ids) // 2
        out.append(np.array(ids[mid:mid + n_tokens], dtype=np.int32))
    return out


def random_model(tmpdir: str) -> str:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
    from tinyloop.config import preset_config
    from tinyloop.random_model import write_random_model
    cfg = preset_config("llama", dim=256, n_heads=4, n_kv_heads=4, ffn_dim=768, vocab_size=8192,
                        n_pre_blocks=1, n_loop_layers=2, n_post_blocks=1, default_loops=6,
                        max_seq_len=256, loop_norm=True, inject="linear_concat",
                        init_state="zeros", tie_embeddings=True, eos_ids=[0], bos_id=None)
    path = os.path.join(tmpdir, "random-demo-shape.tinyloop")
    write_random_model(path, cfg, seed=1, weight_dtype="f16")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=BUNDLED)
    ap.add_argument("--random", action="store_true", help="use a random model (no trained model needed)")
    ap.add_argument("--loops", type=int, default=8, help="verify_loops (and plain generate's loops)")
    ap.add_argument("--draft-loops", type=int, default=2)
    ap.add_argument("--draft-ahead", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.8, help="sampled pass (accept rate only)")
    args = ap.parse_args(argv)

    tmp = tempfile.TemporaryDirectory()
    use_random = args.random or not os.path.exists(args.model)
    path = random_model(tmp.name) if use_random else args.model
    model = tl.Model(path)
    if use_random:
        rng = np.random.default_rng(0)
        prompts = [rng.integers(1, model.config()["vocab_size"], size=args.prompt_len).astype(np.int32)
                   for _ in range(6)]
    else:
        prompts = held_out_prompts(model, args.prompt_len)

    L, d, k = args.loops, args.draft_loops, args.draft_ahead
    common = dict(max_tokens=args.max_tokens, stop_at_eos=False)
    modes = {
        f"generate(loops={L})": lambda p, **kw: {"tokens": model.generate(p, loops=L, **common, **kw)},
        f"chain d={d} ahead={k}": lambda p, **kw: model.generate_speculative(
            p, draft_loops=d, verify_loops=L, draft_ahead=k, **common, **kw),
        f"tree K=2 d={d} ahead={k}": lambda p, **kw: model.generate_tree_speculative(
            p, draft_loops=d, verify_loops=L, draft_ahead=k, K_branches=2, **common, **kw),
        f"tree K=2 d={d} ahead=2": lambda p, **kw: model.generate_tree_speculative(
            p, draft_loops=d, verify_loops=L, draft_ahead=2, K_branches=2, **common, **kw),
    }

    # Greedy: speed, accept rate, and the guarantee. Modes interleave per prompt, so load
    # drift on a shared machine hits them alike; ratios are taken per repeat.
    secs: dict[str, list[float]] = {m: [] for m in modes}
    stats: dict[str, dict] = {m: {"acc": 0, "dr": 0, "ver": 0, "new": 0} for m in modes}
    new_tokens = 0
    for rep in range(args.repeats):
        spent = {m: 0.0 for m in modes}
        for p in prompts:
            want = None
            for name, run in modes.items():
                t0 = time.perf_counter()
                r = run(p)
                spent[name] += time.perf_counter() - t0
                if want is None:
                    want = r["tokens"]
                    if rep == 0:
                        new_tokens += len(want) - len(p)
                    continue
                assert r["tokens"] == want, f"{name}: greedy output differs from generate"
                if rep == 0:
                    s = stats[name]
                    s["acc"] += r["accepted_tokens"]
                    s["dr"] += r["drafted_tokens"]
                    s["ver"] += r["verify_calls"]
                    s["new"] += len(r["tokens"]) - len(p)
        for name in modes:
            secs[name].append(spent[name])

    # Sampled pass: accept rate under speculative sampling (one run per prompt, seeded).
    sampled = {}
    for name, run in modes.items():
        if name.startswith("generate"):
            continue
        acc = dr = 0
        for i, p in enumerate(prompts):
            r = run(p, temperature=args.temperature, top_k=50, seed=100 + i)
            acc += r["accepted_tokens"]
            dr += r["drafted_tokens"]
        sampled[name] = acc / dr if dr else 0.0

    cfg = model.config()
    print(f"model: {'random (bundled shape) — speed only' if use_random else os.path.relpath(path)}; "
          f"dim {cfg['dim']}, {cfg['n_pre_blocks']}/{cfg['n_loop_layers']}/{cfg['n_post_blocks']} "
          f"pre/loop/post layers, vocab {cfg['vocab_size']}")
    print(f"{len(prompts)} prompts x {args.prompt_len} tokens, {args.max_tokens} new tokens each, greedy, "
          f"median of {args.repeats}; threads: process default")
    print(f"| mode | tokens/s | speedup vs generate | accept rate (greedy) | tokens / verify | "
          f"accept rate (T={args.temperature}) |")
    print("| --- | --- | --- | --- | --- | --- |")
    base = secs[next(iter(modes))]  # [repeats] seconds of plain generate
    for name in modes:
        tps = new_tokens / statistics.median(secs[name])
        ratio = statistics.median([b / t for b, t in zip(base, secs[name])])
        if name.startswith("generate"):
            print(f"| {name} | {tps:.1f} | 1.00 | | | |")
            continue
        s = stats[name]
        print(f"| {name} | {tps:.1f} | {ratio:.2f} | {s['acc'] / max(1, s['dr']):.3f} | "
              f"{s['new'] / max(1, s['ver']):.2f} | {sampled[name]:.3f} |")
    print("greedy outputs identical to generate: yes (asserted)")
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
