"""Soak `tinyloop serve`: thousands of requests with random client disconnects, then check
that the server's memory and KV pool are back at their idle level.

    python3 bench/server_soak.py                     # 5,000 requests on the bundled model
    python3 bench/server_soak.py --requests 300      # the short version tests/python runs

The load: C concurrent clients (default 16) send N requests in all (bounded in count and in
time: --time-limit), a mix of streamed and whole completions and chats with random prompts,
lengths, depths and early exit; a third of the streams are dropped by the client after a
random number of chunks (the server must cancel the request and free its KV at once).
Between waves of N/10 requests, with nothing in flight, the server process's RSS
(/proc/PID/status VmRSS) and the engine's KV blocks (GET /metrics) are sampled.

Passes when: every request that was not dropped got a whole answer; after the load, nothing
runs or waits, the KV blocks in use are exactly the prefix cache's (those stay, reused by
later prompts: a prefix cache is not a leak; they are bounded by the pool), and RSS grew by
less than --rss-slack-mb from the first wave's sample (the first waves fill allocator
arenas and page the model in; growth after that would be a leak). Prints the samples.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUNDLED = os.path.join(ROOT, "models", "tinyloop-demo.tinyloop")
WORDS = ("the sea ship whale captain night light water land king house mother father day old man "
         "god heart great little said came went upon into never ever again time long").split()


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS")


def metric(text: str, name: str) -> float:
    m = re.search(rf"^tinyloop_{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    if not m:
        raise RuntimeError(f"/metrics has no tinyloop_{name}")
    return float(m.group(1))


async def one_request(client, rng: random.Random, stats: dict) -> None:
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))
    body = {"model": "soak", "max_tokens": rng.randint(1, 40), "temperature": rng.choice([0.0, 0.8]),
            "seed": rng.randrange(1 << 30), "loops": rng.randint(1, 12)}
    if rng.random() < 0.3:
        body["early_exit"] = {"patience": 1, "tau": rng.choice([0.05, 0.5])}
    chat = rng.random() < 0.5
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    stream = rng.random() < 0.7
    drop_after = rng.randint(0, 6) if stream and rng.random() < 1 / 3 else None
    if not stream:
        r = await client.post(path, json=body)
        if r.status_code != 200 or not r.json()["choices"]:
            raise RuntimeError(f"{path}: {r.status_code} {r.text[:200]}")
        stats["whole"] += 1
        return
    body["stream"] = True
    async with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{path} stream: {r.status_code} {(await r.aread())[:200]!r}")
        events = 0
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                stats["streamed"] += 1
                return
            events += 1
            if drop_after is not None and events > drop_after:
                stats["dropped"] += 1
                return  # leaving the block closes the connection mid-stream
    raise RuntimeError(f"{path}: the stream ended without [DONE]")


async def wave(base: str, n: int, clients: int, rng: random.Random, stats: dict, deadline: float) -> None:
    import httpx

    todo = list(range(n))
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        async def worker(wid: int):
            wrng = random.Random(rng.randrange(1 << 62))
            while todo:
                todo.pop()
                if time.monotonic() > deadline:
                    raise RuntimeError("the soak ran past --time-limit")
                await one_request(client, wrng, stats)
        await asyncio.gather(*(worker(i) for i in range(clients)))


def wait_idle(base: str, timeout: float = 30.0) -> str:
    import httpx

    end = time.monotonic() + timeout
    while True:
        text = httpx.get(base + "/metrics", timeout=10).text
        if metric(text, "running_requests") == 0 and metric(text, "queue_length") == 0 \
                and metric(text, "http_requests_in_flight") == 0:
            return text
        if time.monotonic() > end:
            raise RuntimeError("the server did not go idle after the wave")
        time.sleep(0.05)


def run(args) -> dict:
    import httpx

    port = args.port
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "tinyloop.cli", "serve", args.model, "--host", "127.0.0.1",
                             "--port", str(port), "--model-name", "soak", "--kv-budget-mb", str(args.kv_budget_mb)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > end:
                err = proc.stderr.read() if proc.poll() is not None else ""
                raise RuntimeError("tinyloop serve did not start: " + err)
            time.sleep(0.1)
        rng = random.Random(args.seed)
        stats = {"whole": 0, "streamed": 0, "dropped": 0}
        deadline = time.monotonic() + args.time_limit
        waves = 10
        samples = []
        t0 = time.monotonic()
        for w in range(waves):
            n = args.requests // waves + (1 if w < args.requests % waves else 0)
            asyncio.run(wave(base, n, args.clients, rng, stats, deadline))
            text = wait_idle(base)
            samples.append({"after": sum(stats.values()), "rss_mb": rss_mb(proc.pid),
                            "kv_used": metric(text, "kv_blocks_used"), "kv_cached": metric(text, "kv_blocks_cached"),
                            "cancelled": metric(text, "requests_cancelled_total")})
            print(f"after {samples[-1]['after']:5d} requests: RSS {samples[-1]['rss_mb']:7.1f} MB, KV blocks "
                  f"{samples[-1]['kv_used']:.0f} used ({samples[-1]['kv_cached']:.0f} prefix cache), "
                  f"{samples[-1]['cancelled']:.0f} cancelled", flush=True)
        wall = time.monotonic() - t0
        last = samples[-1]
        growth = last["rss_mb"] - samples[0]["rss_mb"]
        result = dict(stats, wall_s=wall, rss_growth_mb=growth, samples=samples)
        problems = []
        if sum(stats.values()) != args.requests:
            problems.append(f"{args.requests - sum(stats.values())} requests unaccounted for")
        if last["kv_used"] != last["kv_cached"]:
            problems.append(f"{last['kv_used'] - last['kv_cached']:.0f} KV blocks held by no request and no cache")
        if stats["dropped"] and last["cancelled"] < 1:
            problems.append("dropped streams cancelled nothing")
        if growth >= args.rss_slack_mb:
            problems.append(f"RSS grew {growth:.1f} MB after the first wave (slack {args.rss_slack_mb} MB)")
        print(f"{args.requests} requests in {wall:.0f} s ({stats['whole']} whole, {stats['streamed']} streamed, "
              f"{stats['dropped']} dropped by the client); RSS {samples[0]['rss_mb']:.1f} -> {last['rss_mb']:.1f} MB")
        result["problems"] = problems
        return result
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=BUNDLED)
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--clients", type=int, default=16)
    # Small enough that the first wave touches the whole pool (the prefix cache fills it), so
    # RSS growth after that wave is not the pool's pages being touched for the first time.
    p.add_argument("--kv-budget-mb", type=float, default=8)
    p.add_argument("--rss-slack-mb", type=float, default=16)
    p.add_argument("--time-limit", type=float, default=3600)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    if args.port == 0:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args.port = s.getsockname()[1]
    res = run(args)
    for msg in res["problems"]:
        print("FAIL:", msg)
    return 1 if res["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
