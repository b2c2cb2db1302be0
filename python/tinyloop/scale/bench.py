"""1 vs N engine replicas on Ray Serve under the same bounded load (docs/scaling.md).

    python3 -m tinyloop.scale.bench --clients 8 --requests 2 --max-tokens 32      # from a checkout

The load is bench/server_load.py's (C streaming clients x R requests each, greedy, every
stream checked whole, aggregate tokens/s = generated tokens / wall time) on the benchmark
model (python/tinyloop/bench.py: F16, L = 8) with server_load's placeholder vocabulary, so
prompts are `--prompt-tokens` tokens of "t3".."t9" text, each prompt different (no prefix
sharing: this measures raw capacity, not the cache). Configurations, each on a fresh local
Ray instance (127.0.0.1): replicas x threads per replica from --configs (default
1x1,1x2,2x1), plus `tinyloop serve` without Ray (--threads-plain threads) as the baseline of
what Ray's proxy and the ingress cost. Prints a markdown table and the CPU it ran on.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

_REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _server_load():
    bench_dir = os.path.join(_REPO, "bench")
    if not os.path.exists(os.path.join(bench_dir, "server_load.py")):
        sys.exit("tinyloop.scale.bench needs a source checkout (bench/server_load.py)")
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)
    import server_load
    return server_load


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def ray_pids(exclude=()) -> list[int]:
    """Ray's own processes on this machine (raylet, GCS, ray:: workers: proxy, controller,
    ingress), the engine replicas left out."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in exclude:
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
        except OSError:
            continue
        if cmd.startswith(b"ray::") or b"/raylet" in cmd or b"gcs_server" in cmd:
            out.append(int(d))
    return out


def stats_of(base: str) -> dict:
    """Per-replica engine counters from the ingress's /metrics."""
    import re

    import httpx

    text = httpx.get(base + "/metrics", timeout=30).text
    out: dict = {}
    for m in re.finditer(r'^tinyloop_(engine_generated_tokens_total|requests_finished_total|steps_total|'
                         r'kv_blocks_total)\{replica="([^"]+)"[^}]*\} (\S+)$', text, re.M):
        out.setdefault(m.group(2), {})[m.group(1)] = float(m.group(3))
    for m in re.finditer(r'^tinyloop_replica_info\{replica="([^"]+)",pid="(\d+)"', text, re.M):
        out.setdefault(m.group(1), {})["pid"] = int(m.group(2))
    return out


def run_ray(model: str, replicas: int, threads: int, load, port: int, sl) -> dict:
    from .serve import deploy, start_local_ray, stop

    start_local_ray(num_cpus=max(os.cpu_count() or 1, replicas * threads), port=port)
    try:
        deploy({"model": model, "replicas": replicas, "replica_threads": threads, "replica_cpus": threads})
        base = f"http://127.0.0.1:{port}"
        name = sl.served_model(base)
        asyncio.run(sl.run_load(base, name, sl.Load(replicas * 2, 1, 4, load.prompts[:replicas * 2], time_limit=120)))
        before = stats_of(base)
        engines = [r["pid"] for r in before.values()]
        others = ray_pids(exclude=engines)
        cpu0 = sum(map(cpu_seconds, engines)), sum(map(cpu_seconds, others))
        s = asyncio.run(sl.run_load(base, name, load))
        cpu1 = sum(map(cpu_seconds, engines)), sum(map(cpu_seconds, others))
        s["engine_cpu_s"], s["other_cpu_s"] = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
        after = stats_of(base)
        s["per_replica_tokens"] = sorted(int(after[r]["engine_generated_tokens_total"]
                                             - before.get(r, {}).get("engine_generated_tokens_total", 0))
                                         for r in after)
        return s
    finally:
        stop()


def run_plain(model: str, threads: int, load, sl) -> dict:
    env_before = os.environ.get("TINYLOOP_NUM_THREADS")
    os.environ["TINYLOOP_NUM_THREADS"] = str(threads)
    try:
        with sl.start_tinyloop(model) as srv:
            name = sl.served_model(srv.base_url)
            asyncio.run(sl.run_load(srv.base_url, name, sl.Load(2, 1, 4, load.prompts[:2], time_limit=120)))
            cpu0 = srv.cpu_seconds()
            s = asyncio.run(sl.run_load(srv.base_url, name, load))
            s["engine_cpu_s"], s["other_cpu_s"] = srv.cpu_seconds() - cpu0, 0.0
            s["per_replica_tokens"] = [s["tokens"]]
            return s
    finally:
        if env_before is None:
            os.environ.pop("TINYLOOP_NUM_THREADS", None)
        else:
            os.environ["TINYLOOP_NUM_THREADS"] = env_before


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="1x1,1x2,2x1", help="replicas x threads, comma-separated")
    p.add_argument("--threads-plain", type=int, default=0,
                   help="`tinyloop serve` without Ray with this many threads (0: every core; -1: skip)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--time-limit", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reps", type=int, default=1, help="run every setup this many times, in turn")
    args = p.parse_args(argv)
    sl = _server_load()
    model = sl.bench_model_with_vocab()
    n = args.clients * args.requests
    prompts = sl.bench_prompts(n + 8, args.prompt_tokens, args.seed)
    load = sl.Load(args.clients, args.requests, args.max_tokens, prompts[8:], time_limit=args.time_limit)
    print(f"CPU: {sl.cpu_name()} ({os.cpu_count()} logical CPUs); model {os.path.basename(model)} (L=8); "
          f"{args.clients} clients x {args.requests} requests, prompt {args.prompt_tokens} tokens, "
          f"{args.max_tokens} new tokens each, greedy, every prompt different", flush=True)
    print("| setup | requests ok | tokens | wall s | aggregate tok/s | req/s | TTFT p50 ms | TTFT p99 ms | "
          "TBT p50 ms | TBT p99 ms | tokens per replica | engine CPU s | tokens per engine CPU s | "
          "other Ray CPU s | load avg before |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|", flush=True)
    failed = False
    runs = []
    if args.threads_plain >= 0:
        t = args.threads_plain or os.cpu_count() or 1
        runs.append((f"tinyloop serve, no Ray, {t} threads", lambda: run_plain(model, t, load, sl)))
    for cfg in args.configs.split(","):
        r, t = (int(x) for x in cfg.lower().split("x"))
        runs.append((f"Ray Serve, {r} replica(s) x {t} thread(s)",
                     lambda r=r, t=t: run_ray(model, r, t, load, sl.free_port(), sl)))
    for name, fn in runs * args.reps:
        t0 = time.perf_counter()
        load1 = os.getloadavg()[0]  # other work on the machine shows here
        s = fn()
        print(f"| {name} | {s['ok']}/{s['requests']} | {s['tokens']} | {s['wall_s']:.1f} | {s['tok_s']:.1f} | "
              f"{s['ok'] / s['wall_s']:.2f} | {s['ttft_p50_ms']:.0f} | {s['ttft_p99_ms']:.0f} | "
              f"{s['tbt_p50_ms']:.0f} | {s['tbt_p99_ms']:.0f} | {s['per_replica_tokens']} | {s['engine_cpu_s']:.1f} | "
              f"{s['tokens'] / s['engine_cpu_s'] if s['engine_cpu_s'] else float('nan'):.1f} | "
              f"{s['other_cpu_s']:.1f} | {load1:.1f} |", flush=True)
        sl.report_problems(name, s)
        failed |= bool(s["failed"] or s["problems"])
        print(f"  ({time.perf_counter() - t0:.0f} s with start and stop)", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
