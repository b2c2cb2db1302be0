"""Batched decode: tokens/s against the batch size B, B sequences decoding in one forward a step.

    python3 bench/batched_decode.py                                    # B 1..64, f16/int8/int4, 1 and 2 threads
    python3 bench/batched_decode.py -b 1,2,4,8,16,32,64 --weight-dtype f16,int8,int4 -t 1,2 -L 8 -r 3

What it measures: the serving engine (tl.Engine) on the benchmark model (tinyloop bench's,
dim 768, 1 pre + 2 loop + 1 post layers, L = 8 by default: 18 layer applications and the
head per token; int8 / int4 are its quantized copies, groups of 32 with F16 scales, run with
the Model's default quant_activations, "q8" where the CPU has VNNI). B requests of a
`--prompt-len` random prompt are submitted at once, each asking for `--steps` + 3 greedy tokens
(EOS off). Every decode step of the engine is one forward over the rows of all running
requests (runtime/batch_step.h), so each linear runs as one matmul of T = B rows.

Only steady decode steps are timed: the time from the moment every request has 2 tokens
(the prefill and the first decode step, which runs slow after a prefill, are over) to the
moment every request has `--steps` + 2 tokens, i.e. `--steps` steps in which all B
requests decode (each step gives every running request one token, so the slowest
request's count rises by one a step; the fastest is at most one token ahead, and asks for
`--steps` + 3, so none finishes inside the window). Tokens arrive through the handles'
eventfds (selectors, no busy polling). The engine's own counters check the window: the
rows per step inside it are printed (B when the window was clean).

Printed per (weights, threads): B | tokens/s | ms/step | tokens/s / (B x tokens/s at B=1)
(1 = every row as cheap as a lone decode; 1/B = step time growing linearly with B) |
tokens/s / tokens/s at B=1 | weight GB/s implied (the bytes of every weight matrix read once
per layer application and the head, once a step, / ms/step). Configurations alternate
within each round (every B of every weight type and thread count, then the next round);
each cell is the median of `-r` rounds after one warm-up round.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import selectors
import statistics
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "python"))

from tinyloop import bench  # noqa: E402

BATCHES = (1, 2, 4, 8, 16, 32, 64)


def ints(s: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; every value must be >= 1."""
    out = [int(v) for v in s.split(",") if v.strip() != ""]
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return out


def step_window(arrivals: list[tuple[float, int]], first: int, last: int) -> tuple[float, int] | None:
    """From the timeline [(time, fewest tokens any request has)], the time between the moment
    the fewest count reached `first` and the moment it reached `last`, and the steps between
    (last - first). None when the timeline never reaches `last`."""
    t_first = next((t for t, n in arrivals if n >= first), None)
    t_last = next((t for t, n in arrivals if n >= last), None)
    if t_first is None or t_last is None:
        return None
    return t_last - t_first, last - first


def table_rows(samples: dict[int, list[float]], weight_bytes: float) -> list[dict]:
    """Per B, from the ms/step of each round: the median ms/step, tokens/s (B rows a step),
    per-row efficiency against B = 1, speed-up against B = 1 and the weight bytes a second
    (one pass over the weights a step). Rows sorted by B; without B = 1 the ratios are None."""
    med = {b: statistics.median(v) for b, v in samples.items() if v}
    base = 1000.0 / med[1] if 1 in med else None  # tokens/s at B = 1
    rows = []
    for b in sorted(med):
        ms = med[b]
        tps = b * 1000.0 / ms
        rows.append(dict(B=b, tok_s=tps, ms_step=ms,
                         per_row=tps / (b * base) if base else None,
                         speedup=tps / base if base else None,
                         weight_gb_s=weight_bytes / (ms / 1000.0) / 1e9,
                         spread=(min(samples[b]), max(samples[b]))))
    return rows


def format_rows(rows: list[dict]) -> list[str]:
    """The markdown lines of one (weights, threads) table."""
    def ratio(v):
        return "-" if v is None else f"{v:.2f}"
    out = ["| B | tokens/s | ms/step (min-max) | tok/s / (B x tok/s at B=1) | x B=1 | weight GB/s implied |",
           "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lo, hi = r["spread"]
        out.append(f"| {r['B']} | {r['tok_s']:.1f} | {r['ms_step']:.2f} ({lo:.2f}-{hi:.2f}) | "
                   f"{ratio(r['per_row'])} | {ratio(r['speedup'])} | {r['weight_gb_s']:.1f} |")
    return out


def load_average() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"


def run_batch(eng, prompts: list[list[int]], steps: int, loops: int) -> dict:
    """Submits every prompt at once (steps + 3 greedy tokens each) and times `steps` steps in
    which all of them decode (from 2 tokens each to steps + 2 each). Returns ms_step and the
    engine's rows per step inside the window (its counters, read when every request has 3
    and steps + 2 tokens: both reads land inside the window whether or not the engine has
    counted the step that just emitted)."""
    first, last = 2, steps + 2
    sel = selectors.DefaultSelector()
    handles = [eng.submit(p, max_tokens=last + 1, loops=loops, temperature=0.0, stop_at_eos=False)
               for p in prompts]
    counts = [0] * len(handles)
    for i, h in enumerate(handles):
        sel.register(h.fileno(), selectors.EVENT_READ, i)
    arrivals: list[tuple[float, int]] = []
    stats_at: dict[int, dict] = {}
    low = 0
    try:
        while low < last:
            for key, _ in sel.select():
                counts[key.data] += len(handles[key.data].poll())
            now = time.perf_counter()
            m = min(counts)
            if m > low:
                low = m
                arrivals.append((now, m))
                if m in (first + 1, last) and m not in stats_at:
                    stats_at[m] = eng.stats()
            if low < last and all(h.done for h in handles):
                raise RuntimeError(f"requests ended early: {counts}")
    finally:
        sel.close()
    for h in handles:
        h.result()
    dt, n = step_window(arrivals, first, last)
    s0, s1 = stats_at.get(first + 1), stats_at.get(last)
    eng_steps = s1["steps"] - s0["steps"] if s0 and s1 else 0
    rows = s1["step_rows"] - s0["step_rows"] if s0 and s1 else 0
    return dict(ms_step=dt * 1000.0 / n, rows_per_step=rows / eng_steps if eng_steps > 0 else float("nan"),
                preemptions=s1["preemptions"] if s1 else 0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-b", "--batch", type=ints, default=list(BATCHES), help="batch sizes B (comma-separated)")
    ap.add_argument("--weight-dtype", type=bench._strs, default=["f16", "int8", "int4"],
                    help="benchmark model weight types: f32,f16,bf16,int8,int4")
    ap.add_argument("-t", "--threads", type=ints, default=[1, 2], help="thread counts")
    ap.add_argument("-L", "--loops", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed per run")
    ap.add_argument("-r", "--repetitions", type=int, default=3, help="rounds counted (after one warm-up round)")
    ap.add_argument("--quant-activations", default=None,
                    help="f32 or q8 for int8/int4 weights (default: the Model's default)")
    ap.add_argument("--kv-budget-mb", type=float, default=0,
                    help="KV pool per engine (0: sized for max(B) requests)")
    ap.add_argument("--cache-dir", default=None, help="where the generated benchmark models are kept")
    ap.add_argument("--json", default=None, metavar="PATH",
                    help="also write every round's ms/step per (weights, threads, B) to PATH")
    args = ap.parse_args(argv)
    if args.steps < 2 or args.prompt_len < 1 or args.repetitions < 1:
        ap.error("--steps must be >= 2, --prompt-len and -r >= 1")

    import tinyloop_py as tl

    max_b = max(args.batch)
    seq = args.prompt_len + args.steps + 8
    models, engines, works = {}, {}, {}
    for d in args.weight_dtype:
        path = bench.bench_model_path(d, args.cache_dir)
        qa = args.quant_activations if d in ("int8", "int4") else None
        models[d] = tl.Model(path, max_seq_len=seq, quant_activations=qa)
        cfg = models[d].config()
        works[d] = bench.Work(bench.read_header(path), cfg, args.loops)
        # KV: 2 bytes (fp16) x (K + V) x kv width x slots x positions, rounded up to blocks of 32.
        kv_width = cfg["n_kv_heads"] * cfg["head_dim"]
        per_seq = 2 * 2 * kv_width * works[d].attn_layers * ((seq + 31) // 32 * 32)
        budget = args.kv_budget_mb or max(64.0, 1.5 * max_b * per_seq / 2**20)
        engines[d] = tl.Engine(models[d], kv_budget_mb=budget, max_num_seqs=max_b,
                               max_batch_tokens=max(512, max_b * args.prompt_len), prefix_caching=False)
    vocab = next(iter(models.values())).config()["vocab_size"]
    configs = [(d, t, b) for d in args.weight_dtype for t in args.threads for b in args.batch]
    samples: dict[tuple, list[float]] = {c: [] for c in configs}
    checks: dict[tuple, list[float]] = {c: [] for c in configs}
    threads0 = tl.get_num_threads()
    info = tl.cpu_info()
    print(f"CPU: {bench.cpu_name()}; SIMD {info['simd_target']}, q8 kernel {info.get('q8_kernel', '?')}; "
          f"load average at start {load_average()}")
    print(f"benchmark model L={args.loops}, prompt {args.prompt_len}, {args.steps} decode steps timed "
          f"per run, {args.repetitions} rounds (+1 warm-up), configurations alternating")
    t_start = time.time()
    try:
        for rep in range(args.repetitions + 1):
            rng = random.Random(rep)
            for c in configs:
                d, t, b = c
                tl.set_num_threads(t)
                prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt_len)] for _ in range(b)]
                r = run_batch(engines[d], prompts, args.steps, args.loops)
                if r["preemptions"] > 0:
                    print(f"warning: {r['preemptions']} preemptions (KV budget too small)", file=sys.stderr)
                if rep > 0:
                    samples[c].append(r["ms_step"])
                    checks[c].append(r["rows_per_step"])
            print(f"(round {rep} done, {time.time() - t_start:.0f} s, load average {load_average()})",
                  file=sys.stderr)
    finally:
        acts = {d: m.config().get("quant_activations") for d, m in models.items()}
        tl.set_num_threads(threads0)
        for e in engines.values():
            e.close()
        for m in models.values():
            m.close()
    print(f"load average at end {load_average()}; {time.time() - t_start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(cpu=bench.cpu_name(), loops=args.loops, prompt_len=args.prompt_len, steps=args.steps,
                           weight_bytes={d: works[d].weight_bytes for d in args.weight_dtype},
                           runs=[dict(weights=d, threads=t, B=b, ms_step=samples[d, t, b],
                                      rows_per_step=checks[d, t, b]) for d, t, b in configs]), f, indent=1)
    for d in args.weight_dtype:
        act = acts[d] if d in ("int8", "int4") else None
        for t in args.threads:
            per_b = {b: samples[d, t, b] for b in args.batch}
            rows_ok = [f"{statistics.median(checks[d, t, b]):.2f}" for b in args.batch]
            print(f"\n{d}{f' ({act} activations)' if act else ''}, {t} thread(s), "
                  f"{works[d].weight_bytes / 1e6:.0f} MB of weights a step; engine rows/step per B: "
                  f"{', '.join(rows_ok)}")
            for line in format_rows(table_rows(per_b, works[d].weight_bytes)):
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
