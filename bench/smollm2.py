"""SmolLM2-135M-Instruct: TinyLoop on the converted file against llama.cpp (llama-cpp-python)
on its own Q4_1 GGUF, pp and tg, one process, the engines alternating in every repetition.

    PYTHONPATH=build-q8-py:python python3 bench/smollm2.py              # 1 thread, pp512 tg128
    python3 bench/smollm2.py -t 1,2 -p 512 -n 128 -r 5

SmolLM2 has no loop (a plain 30-layer model: no weight reuse to exploit), so this measures
the kernels alone: int4 (Q4_1) linears and an int8 (Q8_0) tied head on both sides. TinyLoop
runs with quant_activations="q8" (what llama.cpp does: int8 activations, integer dot
products) and "f32" (its default: exact activations, dequantize-then-FMA). The GGUF and the
converted file come from the tests' cache (tests/python/smollm2.py). ppN / tgN as in
bench/compare.py. Skips (exit 0, saying why) when llama_cpp or the GGUF is missing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (os.path.join(_HERE, "..", "python"), os.path.join(_HERE, "..", "tests", "python")):
    sys.path.insert(0, _p)

from tinyloop import bench  # noqa: E402
import compare  # noqa: E402  (bench/compare.py: llama.cpp's pp / tg timers)

MODES = ("q8", "f32")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-t", "--threads", type=bench._ints, default=[1])
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    args = ap.parse_args(argv)
    try:
        from llama_cpp import Llama
    except ImportError:
        print("skipped: llama_cpp (llama-cpp-python) is not installed (scripts/test-oracles.sh)")
        return 0
    import smollm2
    import tinyloop_py as tl

    try:
        gguf, ours = smollm2.gguf_path(), smollm2.converted_path()
    except smollm2.Unavailable as e:
        print(f"skipped: SmolLM2 GGUF unavailable: {e}")
        return 0

    n_ctx = args.n_prompt + args.n_gen + 8
    results = []  # (threads, test, {engine: samples})
    threads0 = tl.get_num_threads()
    models = {m: tl.Model(ours, max_seq_len=n_ctx, quant_activations=m) for m in MODES}
    vocab = models["q8"].config()["vocab_size"]
    try:
        for th in args.threads:
            tl.set_num_threads(th)
            llm = Llama(gguf, n_ctx=n_ctx, n_batch=args.n_prompt, n_ubatch=args.n_prompt,
                        n_threads=th, n_threads_batch=th, verbose=False)
            pp = {k: [] for k in (*MODES, "llama.cpp")}
            tg = {k: [] for k in (*MODES, "llama.cpp")}
            for rep in range(args.repetitions + 1):  # rep 0: warm-up
                got_pp = {m: bench.run_pp(models[m], args.n_prompt, 1, vocab, rep) for m in MODES}
                got_pp["llama.cpp"] = compare.llama_pp(llm, args.n_prompt, vocab, rep)
                got_tg = {m: bench.run_tg(models[m], args.n_gen, 0, 1, vocab, rep) for m in MODES}
                got_tg["llama.cpp"] = compare.llama_tg(llm, args.n_gen, vocab, rep)
                if rep > 0:
                    for k in pp:
                        pp[k].append(got_pp[k])
                        tg[k].append(got_tg[k])
            del llm
            results.append((th, f"pp{args.n_prompt}", pp))
            results.append((th, f"tg{args.n_gen}", tg))
    finally:
        for m in models.values():
            m.close()
        tl.set_num_threads(threads0)

    print(f"SmolLM2-135M-Instruct Q4_1: TinyLoop ({os.path.basename(ours)}) vs llama.cpp "
          f"({os.path.basename(gguf)}), {args.repetitions} repetitions, SIMD target "
          f"{tl.cpu_info()['simd_target']}")
    print("| threads | test | TinyLoop q8 t/s | TinyLoop f32 t/s | llama.cpp t/s | q8 / llama.cpp | f32 / llama.cpp |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for th, test, s in results:
        m = {k: statistics.fmean(v) for k, v in s.items()}
        sd = {k: statistics.stdev(v) if len(v) > 1 else 0.0 for k, v in s.items()}
        print(f"| {th} | {test} | {m['q8']:.1f} ± {sd['q8']:.1f} | {m['f32']:.1f} ± {sd['f32']:.1f} | "
              f"{m['llama.cpp']:.1f} ± {sd['llama.cpp']:.1f} | {m['q8'] / m['llama.cpp']:.2f} | "
              f"{m['f32'] / m['llama.cpp']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
