"""What int8 / int4 models should run with by default: exact (f32) or 8-bit (q8) activations.

    python3 bench/activation_defaults.py                       # bundled model, 8 windows, 1 and 2 threads
    python3 bench/activation_defaults.py --model m.tinyloop --windows 16 -t 1,2,4 -r 5

Quality: the model is quantized to int8 and int4 (group 32, f16 scales: llama.cpp's Q8_0 /
Q4_1 blocks) and each quantized file is scored on held-out windows (the last 5% of every file of
the shared corpus, as `tinyloop quantize` reports) with quant_activations="f32" and "q8",
against the unquantized input: mean KL(input || test) per token, top-1 agreement and both
perplexities (tinyloop.quant_eval.compare_models). The row "q8 costs" is what 8-bit
activations add on top of the weight quantization.

Speed: prompt (pp) and generation (tg) tokens/s of each quantized file under both settings,
alternated within every repetition so machine load hits both alike (tinyloop.bench). The
table prints the q8 / f32 ratio. Name the CPU beside the numbers you record
(docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def speed(path: str, act: str, threads: int, n_prompt: int, n_gen: int, loops: int) -> tuple[float, float]:
    """(pp tokens/s, tg tokens/s) of one run: a fresh n_prompt-token prefill, then n_gen greedy
    tokens after a one-token prompt."""
    import numpy as np
    import tinyloop_py as tl

    tl.set_num_threads(threads)
    with tl.Model(path, quant_activations=act) as m:
        V = m.config()["vocab_size"]
        ids = np.random.default_rng(0).integers(0, V, size=n_prompt).astype(np.int32)
        m.score_last(ids[:8], loops=loops)  # warm the weights and the pool
        t0 = time.perf_counter()
        m.score_last(ids, loops=loops)
        pp = n_prompt / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        out = m.generate(ids[:1], max_tokens=n_gen, loops=loops, temperature=0.0, stop_at_eos=False)
        tg = (len(out) - 1) / (time.perf_counter() - t0)  # out: the prompt token, then the new ones
    return pp, tg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=os.path.join(ROOT, "models", "tinyloop-demo.tinyloop"))
    p.add_argument("--windows", type=int, default=8, help="held-out windows for the quality table")
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("-L", "--loops", type=int, default=None, help="loop depth (default: the model's)")
    p.add_argument("-t", "--threads", default="1,2")
    p.add_argument("-p", "--n-prompt", type=int, default=128)
    p.add_argument("-n", "--n-gen", type=int, default=32)
    p.add_argument("-r", "--repetitions", type=int, default=3)
    args = p.parse_args(argv)

    import tinyloop_py as tl
    from tinyloop.bench import cpu_name
    from tinyloop.quant_eval import compare_models, eval_windows
    from tinyloop.quantize_file import quantize_model

    corpus = sorted(glob.glob(os.path.join(ROOT, "..", "shared", "data", "corpus", "*.txt")))
    windows, what = eval_windows(args.model, corpus, args.ctx, args.windows)
    info = tl.cpu_info()
    print(f"# {cpu_name()}; SIMD {info['simd_target']}, q8 kernel {info['q8_kernel']}; {args.model}")
    print(f"# quality on {what}")
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for wd in ("int8", "int4"):
            files[wd] = os.path.join(tmp, f"{wd}.tinyloop")
            quantize_model(args.model, files[wd], wd, 32, "f16")

        print("\n| weights | activations | mean KL vs input | top-1 agreement | perplexity (input -> test) |")
        print("| --- | --- | --- | --- | --- |")
        loops = args.loops
        for wd, path in files.items():
            for act in ("f32", "q8"):
                r = compare_models(args.model, path, windows, loops, progress=False,
                                   test_kwargs={"quant_activations": act})
                loops = r["loops"]
                print(f"| {wd} | {act} | {r['mean_kl']:.2e} | {100 * r['top1_agreement']:.2f}% | "
                      f"{r['ppl_ref']:.3f} -> {r['ppl_test']:.3f} |")
                sys.stdout.flush()

        print(f"\n# speed, L={loops}, pp{args.n_prompt} / tg{args.n_gen}, {args.repetitions} alternated repetitions "
              f"(mean tokens/s)")
        print("| weights | threads | pp f32 | pp q8 | q8/f32 | tg f32 | tg q8 | q8/f32 |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for wd, path in files.items():
            for threads in (int(t) for t in args.threads.split(",")):
                runs = {"f32": [], "q8": []}
                for _ in range(args.repetitions):
                    for act in ("f32", "q8"):
                        runs[act].append(speed(path, act, threads, args.n_prompt, args.n_gen, loops))
                pp = {a: statistics.mean(r[0] for r in v) for a, v in runs.items()}
                tg = {a: statistics.mean(r[1] for r in v) for a, v in runs.items()}
                print(f"| {wd} | {threads} | {pp['f32']:.1f} | {pp['q8']:.1f} | {pp['q8'] / pp['f32']:.2f}x | "
                      f"{tg['f32']:.1f} | {tg['q8']:.1f} | {tg['q8'] / tg['f32']:.2f}x |")
                sys.stdout.flush()
        tl.set_num_threads(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
