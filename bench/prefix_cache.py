"""Same-prefix workload: plain generate vs generate_from_prefix_cache vs generate_with_pool.

    PYTHONPATH=build python3 bench/prefix_cache.py                  # bundled model
    TINYLOOP_NUM_THREADS=1 PYTHONPATH=build python3 bench/prefix_cache.py --threads 1
    PYTHONPATH=build python3 bench/prefix_cache.py --random          # random Huginn-style model

The same-prefix workload of docs/prefix-cache.md ("Throughput"; 2.4-3.0x measured on a GPU): one shared
prefix of --prefix-tokens (512) tokens, --requests (50) requests each appending its own
--suffix-tokens (32) tokens, --new-tokens (32) greedy tokens each. Three ways in one run:

  plain   generate(prefix + suffix) per request: every request prefills 544 tokens
  cache   build_prefix_cache(prefix) once (its time counted), then
          generate_from_prefix_cache(cache, suffix) per request: prefills 32 tokens each
  pool    a PrefixPool with the prefix and --decoys other 512-token prefixes registered (their
          time counted), then generate_with_pool(pool, prefix + suffix) per request: each call
          finds the longest registered prefix of its prompt first

Every request's output is asserted identical across the three. The three ways run interleaved
in rounds of --round requests (rotating order, so load changes hit all alike); within a round
the requests run one after another, or on --threads Python threads (GIL released, sharing one
cache / pool). Reported: wall time (the one-time build / registration included), requests/s
and new tokens/s of each way, and the throughput ratios against plain.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import tinyloop_py as tl

BUNDLED = os.path.join(os.path.dirname(__file__), "..", "models", "tinyloop-demo.tinyloop")


def run(fn, items, threads):
    t0 = time.perf_counter()
    if threads <= 1:
        out = [fn(x) for x in items]
    else:
        with ThreadPoolExecutor(max_workers=threads) as ex:
            out = list(ex.map(fn, items))
    return out, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=BUNDLED)
    ap.add_argument("--random", action="store_true")
    ap.add_argument("--prefix-tokens", type=int, default=512)
    ap.add_argument("--suffix-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--loops", type=int, default=None, help="default: the model's default_loops")
    ap.add_argument("--decoys", type=int, default=3, help="other prefixes registered in the pool")
    ap.add_argument("--threads", type=int, default=1, help="Python threads issuing requests")
    ap.add_argument("--round", type=int, default=5, help="requests per interleaved round")
    args = ap.parse_args(argv)

    path = os.path.abspath(args.model)
    if args.random or not os.path.exists(path):
        from tinyloop.random_model import write_random_model
        path = os.path.join(tempfile.mkdtemp(), "random.tinyloop")
        write_random_model(path, "huginn", dim=256, vocab_size=2048, max_seq_len=1024, seed=0)
        label = "random huginn (dim 256, V 2048)"
    else:
        label = os.path.relpath(path)
    need = args.prefix_tokens + args.suffix_tokens + args.new_tokens
    with tl.Model(path, max_seq_len=need) as model:
        cfg = model.config()
        V, L = cfg["vocab_size"], args.loops or cfg["default_loops"]
        rng = np.random.default_rng(0)
        prefix = rng.integers(1, V, size=args.prefix_tokens).astype(np.int32)
        suffixes = [rng.integers(1, V, size=args.suffix_tokens).astype(np.int32) for _ in range(args.requests)]
        decoys = [rng.integers(1, V, size=args.prefix_tokens).astype(np.int32) for _ in range(args.decoys)]
        for d in decoys:
            d[: args.prefix_tokens // 2] = prefix[: args.prefix_tokens // 2]  # share half the path
        gen = dict(max_tokens=args.new_tokens, loops=L, stop_at_eos=False)
        model.generate(np.concatenate([prefix, suffixes[0]]), **gen)  # warm-up (page in the weights)

        t0 = time.perf_counter()
        cache = model.build_prefix_cache(prefix, loops=L)
        t_build = time.perf_counter() - t0
        t0 = time.perf_counter()
        pool = tl.PrefixPool()
        for p in [*decoys, prefix]:
            model.register_prefix(pool, p, loops=L)
        t_register = time.perf_counter() - t0

        ways = {
            "plain": lambda s: model.generate(np.concatenate([prefix, s]), **gen),
            "cache": lambda s: model.generate_from_prefix_cache(cache, s, **gen),
            "pool": lambda s: model.generate_with_pool(pool, np.concatenate([prefix, s]), **gen),
        }
        # Interleaved in rounds of --round requests, the order rotating, so a change in machine
        # load (shared CI runners) falls on all three alike.
        outs = {k: [] for k in ways}
        secs = {"plain": 0.0, "cache": t_build, "pool": t_register}
        names = list(ways)
        for r, i in enumerate(range(0, args.requests, args.round)):
            chunk = suffixes[i:i + args.round]
            for k in names[r % 3:] + names[:r % 3]:
                out, t = run(ways[k], chunk, args.threads)
                outs[k] += out
                secs[k] += t
        plain, cached, pooled = outs["plain"], outs["cache"], outs["pool"]
        t_plain, t_cached, t_pool = secs["plain"], secs["cache"], secs["pool"]
        assert cached == plain, "generate_from_prefix_cache must equal generate"
        assert pooled == plain, "generate_with_pool must equal generate"
        assert (pool.hits, pool.misses) == (args.requests, 0), pool.stats()

    n_new = args.requests * args.new_tokens
    print(f"model: {label}, loops {L}, SIMD target {tl.cpu_info()['simd_target']}, "
          f"{tl.get_num_threads()} kernel thread(s)")
    print(f"{args.requests} requests: {args.prefix_tokens}-token shared prefix + {args.suffix_tokens}-token "
          f"suffix, {args.new_tokens} new tokens each (greedy), {args.threads} Python thread(s); "
          f"outputs identical in all three")
    print(f"{'way':<8}{'wall s':>9}{'req/s':>9}{'new tok/s':>11}{'vs plain':>10}")
    for name, t in (("plain", t_plain), ("cache", t_cached), ("pool", t_pool)):
        print(f"{name:<8}{t:>9.2f}{args.requests / t:>9.2f}{n_new / t:>11.1f}{t_plain / t:>9.2f}x")
    print(f"(cache includes build_prefix_cache {t_build * 1e3:.0f} ms; pool includes registering "
          f"{args.decoys + 1} prefixes {t_register * 1e3:.0f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
