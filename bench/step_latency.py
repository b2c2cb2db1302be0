"""Decode step latency after a prompt: the first step, the median and the slowest of the
steps that follow, for several prompt lengths (one TinyLoop process, no peer).

    PYTHONPATH=build:python python3 bench/step_latency.py                  # bench model, F16, L = 8
    python3 bench/step_latency.py -p 16,511,512,1024,2047,2048 -n 40 -r 3 --weight-dtype int4

Steady decode throughput (compare.py's tgN) hides a slow step now and then; a server's
inter-token latency does not. Each prompt of -p tokens is prefilled, then -n tokens are
generated (greedy, no stop), and the gap between two token callbacks is one step. The
table gives, per prompt length, over -r repetitions: the first step after the prefill, the
median of the others, the slowest one, and the slowest over the median. Prompt lengths that
end on a KV block (multiples of 32: a step opens new blocks) are where page faults showed
(docs/benchmarks.md, "Step latency").
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "python"))

from tinyloop import bench  # noqa: E402


def step_gaps(arrivals: list[float]) -> list[float]:
    """Milliseconds between consecutive token arrivals (perf_counter seconds): the first
    token comes out of the prefill, so gap i is decode step i + 1."""
    return [(b - a) * 1e3 for a, b in zip(arrivals, arrivals[1:])]


def summarize(runs: list[list[float]]) -> dict:
    """Per prompt length: runs of step gaps (ms) -> first step (median over runs), median of
    the later steps, the slowest later step, and its ratio to that median."""
    firsts = [r[0] for r in runs if r]
    later = [x for r in runs for x in r[1:]]
    if not firsts or not later:
        raise ValueError("each run needs at least two decode steps (-n >= 3)")
    med = statistics.median(later)
    worst = max(later)
    return {"first": statistics.median(firsts), "median": med, "max": worst, "max_over_median": worst / med}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a .tinyloop file (default: the benchmark model)")
    p.add_argument("--weight-dtype", default="f16", choices=bench.WEIGHT_DTYPES,
                   help="benchmark model weights (without --model)")
    p.add_argument("-L", "--loops", type=int, default=8)
    p.add_argument("-p", "--prompts", default="16,511,512,1024,2047,2048",
                   help="prompt lengths, comma-separated")
    p.add_argument("-n", "--n-gen", type=int, default=24, help="tokens generated a run (>= 3)")
    p.add_argument("-r", "--repetitions", type=int, default=2)
    p.add_argument("-t", "--threads", type=int, default=0, help="0: the engine's default")
    p.add_argument("--cache-dir", help="where the benchmark model is kept")
    args = p.parse_args(argv)
    prompts = [int(x) for x in args.prompts.split(",") if x]
    if args.n_gen < 3 or args.repetitions < 1 or not prompts or min(prompts) < 1:
        p.error("-n must be >= 3, -r >= 1, prompt lengths >= 1")

    import tinyloop_py as tl
    path = args.model or bench.bench_model_path(args.weight_dtype, args.cache_dir)
    if args.threads:
        tl.set_num_threads(args.threads)
    model = tl.Model(path, max_seq_len=max(prompts) + args.n_gen + 1)
    vocab = model.config()["vocab_size"]
    print(f"# {bench.cpu_name()}, {tl.get_num_threads()} threads, {os.path.basename(path)}, L = {args.loops}, "
          f"{args.n_gen} tokens a run, {args.repetitions} repetitions")
    print("| prompt | first step ms | median step ms | slowest step ms | slowest / median |")
    print("|---:|---:|---:|---:|---:|")
    for n in prompts:
        runs = []
        for rep in range(args.repetitions):
            arrivals: list[float] = []

            def on_token(_tok, arrivals=arrivals):
                arrivals.append(time.perf_counter())
                return True

            prompt = bench._prompt(n, vocab, rep)
            model.generate_stream(prompt, on_token, max_tokens=args.n_gen, loops=args.loops, temperature=0.0,
                                  stop_at_eos=False)
            runs.append(step_gaps(arrivals))
        s = summarize(runs)
        print(f"| {n} | {s['first']:.2f} | {s['median']:.2f} | {s['max']:.2f} | {s['max_over_median']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
