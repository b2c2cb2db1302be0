"""The serving engine (tl.Engine) under load, against llama.cpp's own multi-sequence batching.

    python3 bench/serving.py throughput --model bench --concurrency 1,4,16,64      # + llama.cpp
    python3 bench/serving.py throughput --model smollm2 --concurrency 1,4,16,64
    python3 bench/serving.py mixed --requests 200 --rate 20                         # Poisson arrivals
    python3 bench/serving.py soak --requests 10000                                  # RSS and blocks
    python3 bench/serving.py memory --concurrency 64                                # within the budget

throughput: N requests submitted at once, each a `--prompt-len` prompt of random ids and
`--n-new` greedy tokens (EOS off), on the benchmark model (F16, L = `--loops`) or
SmolLM2-135M-Instruct (its Q4_1 file, converted). Aggregate tokens/s = generated tokens /
wall time from the first submit to the last token, prefill included, for both engines. The
peer is llama.cpp through llama-cpp-python's low-level llama_batch API, one sequence id per
request, all sequences decoding in one llama_decode per step (bench/llamacpp_batch.py), on
the same weights: the unrolled twin GGUF of the benchmark model (n_pre + L * n_loop +
n_post layers, bench/compare.py) or SmolLM2's GGUF. The engines alternate within each
repetition, so load changes on a shared machine hit both.

mixed: requests arriving as a Poisson process (bounded count), each with loops drawn from
4 / 8 / 16 and early exit on (hidden-L2 probe), prompts and lengths varied: p50 / p99 time
to first token and time between tokens, and the mean loops actually run per token.

soak: `--requests` short requests in waves, a third cancelled right after submit: RSS and
KV blocks before and after (both must return to their idle level).

memory: N concurrent long requests under a small KV budget: the pool never exceeds it
(requests wait or are preempted instead), peak blocks and RSS.
"""
from __future__ import annotations

import argparse
import glob
import os
import random
import statistics
import sys
import threading
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "python"))
sys.path.insert(0, _HERE)

import tinyloop_py as tl  # noqa: E402
from tinyloop import bench  # noqa: E402
from tinyloop.bench import cpu_name  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def model_paths(which: str, loops: int) -> tuple[str, str | None]:
    """(TinyLoop model, llama.cpp GGUF or None) for 'bench', 'smollm2' or a .tinyloop path."""
    if which == "bench":
        path = bench.bench_model_path("f16")
        if loops == 8:
            from llamacpp_batch import model_path as twin  # its cached unrolled twin
            return path, twin("bench")
        gguf = os.path.splitext(path)[0] + f"-unrolled-L{loops}-f16.gguf"  # compare.py's name
        if not os.path.exists(gguf):
            from compare import unrolled_gguf
            unrolled_gguf(path, loops, gguf)
        return path, gguf
    if which == "smollm2":
        cache = os.environ.get("TINYLOOP_CACHE") or os.path.expanduser("~/.cache/tinyloop")
        ggufs = glob.glob(os.path.join(cache, "smollm2", "*.gguf"))
        if not ggufs:
            sys.exit("SmolLM2's GGUF is not cached: run tests/python/test_smollm2.py once (it fetches it)")
        conv = sorted(glob.glob(os.path.join(cache, "smollm2", "*.tinyloop")), key=os.path.getmtime)
        if conv:
            return conv[-1], ggufs[0]
        from tinyloop.convert import convert
        out = ggufs[0][:-5] + ".tinyloop"
        convert(ggufs[0], out)
        return out, ggufs[0]
    return which, None


def prompts_for(vocab: int, n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(length)] for _ in range(n)]


def run_tinyloop(eng, prompts, n_new, loops) -> dict:
    """All prompts at once, n_new greedy tokens each. The prefill's share is measured by a
    second run with one token each (the prompts' forward and the first token), so
    decode_tok_s = the other n_new - 1 tokens of every request / the time they took, as
    llama-bench separates pp and tg."""
    def once(n):
        t0 = time.perf_counter()
        hs = [eng.submit(p, max_tokens=n, loops=loops, stop_at_eos=False) for p in prompts]
        outs = [h.result() for h in hs]
        return time.perf_counter() - t0, outs

    prefill, _ = once(1)
    total, outs = once(n_new)
    gen = sum(len(o.tokens) for o in outs)
    return dict(total_s=total, prefill_s=prefill, generated=gen, total_tok_s=gen / total,
                decode_tok_s=(gen - len(prompts)) / max(1e-9, total - prefill),
                ttft_ms=statistics.median(o.first_token_ms for o in outs))


def throughput(args) -> None:
    path, gguf = model_paths(args.model, args.loops)
    conc = [int(x) for x in args.concurrency.split(",")]
    tl.set_num_threads(args.threads)
    model = tl.Model(path, max_seq_len=args.prompt_len + args.n_new + 8, fp16_body=args.fp16_body == "on")
    loops = args.loops if args.model != "smollm2" else None
    # No prefix caching: the same prompts run twice (prefill-only, then whole), and a cache
    # hit would hide the second prefill.
    eng = tl.Engine(model, kv_budget_mb=args.kv_budget_mb, max_num_seqs=max(conc),
                    max_batch_tokens=args.max_batch_tokens, prefix_caching=False)
    # --fp16-body both: the bf16 loop body (AMX tiles where the CPU has them) as a second
    # engine, alternating with the exact one in every repetition (the "peer" columns).
    body = None
    if args.fp16_body == "both":
        body_model = tl.Model(path, max_seq_len=args.prompt_len + args.n_new + 8, fp16_body=True)
        body = tl.Engine(body_model, kv_budget_mb=args.kv_budget_mb, max_num_seqs=max(conc),
                         max_batch_tokens=args.max_batch_tokens, prefix_caching=False)
        print(f"peer columns: the same engine with fp16_body=True (bf16 kernel: {tl.cpu_info()['bf16_kernel']})")
    peer = None
    if gguf and not args.no_peer:
        try:
            from llamacpp_batch import LlamaBatchPeer
            peer = LlamaBatchPeer(gguf, n_seq_max=max(conc), n_threads=args.threads,
                                  n_ctx_per_seq=args.prompt_len + args.n_new + 8)
        except ImportError as e:
            print(f"(llama.cpp peer skipped: {e})", file=sys.stderr)
    vocab = model.config()["vocab_size"]
    print(f"CPU: {cpu_name()}, {args.threads} threads; model {os.path.basename(path)}"
          f"{f' L={args.loops}' if loops else ''}; prompt {args.prompt_len}, {args.n_new} new tokens "
          f"per request; {args.reps} repetition(s), engines alternating")
    print("| concurrent | TinyLoop decode tok/s | x single | llama.cpp decode tok/s | ratio | "
          "TinyLoop total tok/s | x single | llama.cpp total tok/s | ratio | median TTFT ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    single = single_total = None
    for n in conc:
        prompts = prompts_for(vocab, n, args.prompt_len, seed=n)
        ours, theirs = [], []
        for _ in range(args.reps):
            ours.append(run_tinyloop(eng, prompts, args.n_new, loops))
            if body is not None:
                r = run_tinyloop(body, prompts, args.n_new, loops)
                theirs.append(dict(r, decode_step_tok_s=r["decode_tok_s"]))
            elif peer:
                theirs.append(peer.run(prompts, args.n_new))
        dec = statistics.mean(r["decode_tok_s"] for r in ours)
        tot = statistics.mean(r["total_tok_s"] for r in ours)
        if single is None:
            single, single_total = dec, tot
        ttft = statistics.mean(r["ttft_ms"] for r in ours)
        nan = float("nan")
        # Both sides count the n_new - 1 tokens after each request's first one.
        p_dec = statistics.mean(r["decode_step_tok_s"] for r in theirs) if theirs else nan
        p_tot = statistics.mean(r["total_tok_s"] for r in theirs) if theirs else nan
        print(f"| {n} | {dec:.1f} | {dec / single:.2f}x | {p_dec:.1f} | {dec / p_dec:.2f}x | "
              f"{tot:.1f} | {tot / single_total:.2f}x | {p_tot:.1f} | {tot / p_tot:.2f}x | {ttft:.0f} |",
              flush=True)
    eng.close()
    if body is not None:
        body.close()


def mixed(args) -> None:
    path, _ = model_paths(args.model, args.loops)
    tl.set_num_threads(args.threads)
    model = tl.Model(path)
    vocab = model.config()["vocab_size"]
    max_seq = model.config()["max_seq_len"]
    rng = random.Random(args.seed)
    eng = tl.Engine(model, kv_budget_mb=args.kv_budget_mb, max_num_seqs=64,
                    max_batch_tokens=args.max_batch_tokens)
    ttft, tbt, loops_run, lock = [], [], [], threading.Lock()

    def consume(h, t_submit):
        last = None
        for _ in h:
            now = time.perf_counter()
            with lock:
                if last is None:
                    ttft.append((now - t_submit) * 1e3)
                else:
                    tbt.append((now - last) * 1e3)
            last = now
        out = h.result()
        with lock:
            loops_run.extend(out.loops_per_token)

    threads = []
    t_start = time.perf_counter()
    for i in range(args.requests):
        time.sleep(rng.expovariate(args.rate))
        L = rng.choice([4, 8, 16])
        plen = rng.randrange(8, 128)
        n_new = min(rng.randrange(16, 128), max_seq - plen)
        h = eng.submit([rng.randrange(10, vocab) for _ in range(plen)], max_tokens=n_new, loops=L,
                       stop_at_eos=False, early_exit_patience=1, early_exit_min_L=2,
                       early_exit_tau=args.tau)
        t = threading.Thread(target=consume, args=(h, time.perf_counter()))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    wall = time.perf_counter() - t_start
    st = eng.stats()
    eng.close()

    def pct(v, q):
        v = sorted(v)
        return v[min(len(v) - 1, int(q * len(v)))]

    print(f"CPU: {cpu_name()}, {args.threads} threads; model {os.path.basename(path)}; {args.requests} "
          f"requests, Poisson arrivals at {args.rate}/s, loops in {{4, 8, 16}}, early exit tau {args.tau}")
    print("| TTFT p50 ms | TTFT p99 ms | TBT p50 ms | TBT p99 ms | mean loops run | requested mean | "
          "generated tok/s | mean batch rows |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {pct(ttft, .5):.1f} | {pct(ttft, .99):.1f} | {pct(tbt, .5):.1f} | {pct(tbt, .99):.1f} | "
          f"{statistics.mean(loops_run):.2f} | {28 / 3:.2f} | {st['generated_tokens'] / wall:.1f} | "
          f"{st['mean_batch_rows']:.1f} |")


def soak(args) -> None:
    path, _ = model_paths(args.model, args.loops)
    model = tl.Model(path)
    vocab = model.config()["vocab_size"]
    rng = random.Random(args.seed)
    eng = tl.Engine(model, kv_budget_mb=args.kv_budget_mb)
    wave = 500

    def run(n):
        hs = [eng.submit([rng.randrange(10, vocab) for _ in range(rng.randrange(1, 64))],
                         max_tokens=rng.randrange(1, 32), stop_at_eos=False) for _ in range(n)]
        for h in hs:
            if rng.random() < 1 / 3:
                h.cancel()
        for h in hs:
            h.result()

    run(wave)
    base = rss_mb()
    t0 = time.perf_counter()
    done = 0
    print(f"CPU: {cpu_name()}; model {os.path.basename(path)}; {args.requests} requests in waves of {wave}, "
          f"a third cancelled")
    print("| requests | RSS MB | KV blocks used | of them cached prefixes | cancelled |")
    print("|---:|---:|---:|---:|---:|")
    while done < args.requests:
        run(min(wave, args.requests - done))
        done += min(wave, args.requests - done)
        if done % 2000 == 0 or done == args.requests:
            st = eng.stats()
            print(f"| {done} | {rss_mb():.1f} | {st['kv_blocks_used']} | {st['kv_blocks_cached']} | "
                  f"{st['requests_cancelled']} |", flush=True)
    st = eng.stats()
    print(f"RSS after the warm-up wave {base:.1f} MB, at the end {rss_mb():.1f} MB; "
          f"{time.perf_counter() - t0:.0f} s; KV blocks used at the end: {st['kv_blocks_used']} "
          f"({st['kv_blocks_cached']} of them the prefix cache's)")
    eng.clear_prefix_cache()
    time.sleep(0.2)
    print(f"after clear_prefix_cache(): KV blocks used {eng.stats()['kv_blocks_used']}")
    eng.close()


def memory(args) -> None:
    path, _ = model_paths(args.model, args.loops)
    model = tl.Model(path)
    vocab = model.config()["vocab_size"]
    n = int(args.concurrency.split(",")[-1])
    eng = tl.Engine(model, kv_budget_mb=args.kv_budget_mb, max_num_seqs=n)
    total = eng.stats()["kv_blocks_total"]
    prompts = prompts_for(vocab, n, args.prompt_len)
    peak = 0
    before = rss_mb()
    hs = [eng.submit(p, max_tokens=args.n_new, loops=args.loops if args.model == "bench" else None,
                     stop_at_eos=False) for p in prompts]
    while not all(h.done for h in hs):
        peak = max(peak, eng.stats()["kv_blocks_used"])
        time.sleep(0.005)
    outs = [h.result() for h in hs]
    st = eng.stats()
    print(f"CPU: {cpu_name()}; model {os.path.basename(path)}; {n} concurrent requests of "
          f"{args.prompt_len} + {args.n_new} tokens, kv_budget_mb {args.kv_budget_mb}")
    print(f"pool {total} blocks x {st['kv_block_bytes']} bytes; peak used {peak} ({100 * peak / total:.0f}%); "
          f"preemptions {st['preemptions']}; all {len(outs)} finished with {args.n_new} tokens: "
          f"{all(len(o.tokens) == args.n_new for o in outs)}; RSS {before:.0f} -> {rss_mb():.0f} MB")
    eng.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["throughput", "mixed", "soak", "memory"])
    p.add_argument("--model", default="bench", help="bench | smollm2 | a .tinyloop path")
    p.add_argument("--loops", type=int, default=8)
    p.add_argument("--concurrency", default="1,4,16,64")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--n-new", type=int, default=128)
    p.add_argument("--threads", type=int, default=tl.get_num_threads())
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--kv-budget-mb", type=float, default=2048)
    p.add_argument("--max-batch-tokens", type=int, default=512)
    p.add_argument("--no-peer", action="store_true", help="TinyLoop only")
    p.add_argument("--fp16-body", choices=["off", "on", "both"], default="off",
                   help="throughput: the bf16 loop body (Model(fp16_body=True); AMX on CPUs with it); "
                        "'both' puts it in the peer columns instead of llama.cpp")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--rate", type=float, default=10.0, help="mixed: arrivals per second")
    p.add_argument("--tau", type=float, default=0.05, help="mixed: early-exit threshold")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    dict(throughput=throughput, mixed=mixed, soak=soak, memory=memory)[args.what](args)


if __name__ == "__main__":
    main()
