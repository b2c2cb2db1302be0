"""Concurrent streaming clients against an OpenAI-compatible server: TinyLoop's `tinyloop serve`
and, with --compare, llama-cpp-python's own OpenAI server on the same weights.

    python3 bench/server_load.py --base-url http://127.0.0.1:8000 --clients 32 --requests 2
    python3 bench/server_load.py --serve models/tinyloop-demo.tinyloop --clients 16,32
    python3 bench/server_load.py --compare --clients 16,32 --requests 1   # bench model vs its twin
    python3 bench/server_load.py --smoke                              # a few requests, < 30 s

The load: C clients at once (asyncio + httpx), each sending R streaming `/v1/completions`
requests one after the other (greedy, `--max-tokens` each), so C requests are in flight at
any moment and C x R are sent in all. Bounded: the count is fixed and the whole run must end
within --time-limit seconds (else it fails, naming the requests still open).

Every stream is checked, so a server that loses or garbles output fails the run:
HTTP 200 and text/event-stream; every event JSON until one `data: [DONE]`, the last event;
one completion id and object across the chunks; choice index 0 only (n = 1); one
finish_reason, with no text after it; non-empty text; when the server reports usage, its
completion_tokens match TinyLoop's per-chunk `tinyloop.loops` and equal max_tokens when the
finish reason is "length"; requests sent the same prompt (greedy) return the same text.

Reported: aggregate tokens/s (generated tokens of every request / wall time from the first
request sent to the last stream closed), TTFT p50 / p99 (request sent -> first chunk with
text) and TBT p50 / p99 (time between text chunks, split evenly over the tokens of a chunk
when it says how many). Tokens are counted from `usage` when the server sends it (TinyLoop,
asked with stream_options), else one per text chunk (llama-cpp-python streams one token a
chunk and has no stream_options).

--compare serves the benchmark model (F16, L = 8, python/tinyloop/bench.py) with
`tinyloop serve` and its unrolled twin GGUF (the same weights as 1 + 8 x 2 + 1 plain layers,
bench/llamacpp_batch.py's cached file) with `python -m llama_cpp.server` (pip install -r
bench/requirements-peer.txt), both on 127.0.0.1, both with every core; the two servers take
turns at each concurrency (the idle one does not compute). llama-cpp-python's server runs one
request at a time (a lock around its single context) and, by default, cuts the running stream
short when another request waits (`interrupt_requests`): it is started with that off, so its
streams are whole. The benchmark model has random weights and no tokenizer; the twin GGUF
carries a placeholder vocabulary (<unk> <s> </s> t3 t4 ...). TinyLoop serves a copy of the
model with the same vocabulary as its tokenizer (written once beside it), so both servers
take the same prompt strings, pieces "t3".."t9" (the only ones llama.cpp's tokenizer reaches
from characters: one token each), and stream the same kind of text. Greedy output of random
weights rarely hits EOS: the table's finish reasons say whether every request ran to
--max-tokens. Runtime of the line above on 2 idle cores: about 4 minutes, most of it
llama-cpp-python serving 16 + 32 requests one at a time (128 + 128 tokens each); its
threads spin at their barriers, so any other job on the machine slows it far more than
TinyLoop (the TBT p99 column shows it: stalls of seconds).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import httpx

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.abspath(os.path.join(_HERE, ".."))
BUNDLED_MODEL = os.path.join(_REPO, "models", "tinyloop-demo.tinyloop")

PROMPTS = [  # plain text prompts for models with a tokenizer (the bundled model has no template)
    "Once upon a time, in a small village by the sea,",
    "The old lighthouse keeper looked at the storm and said",
    "In the morning the children ran to the garden, where",
    "The recipe for a good soup begins with",
    "A long time ago, the king of a faraway land",
    "She opened the letter slowly. It said:",
    "The train left the station at midnight, and",
    "Every winter the birds of the forest",
]


# ----------------------------------------------------------------------------------------
# one stream: read it, time it, check it

@dataclass
class StreamResult:
    prompt_key: int                   # requests with the same key were sent the same prompt
    ok: bool = False
    errors: list[str] = field(default_factory=list)
    text: str = ""
    tokens: int = 0
    ttft_s: float | None = None
    tbt_s: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    loops: list[int] = field(default_factory=list)
    prompt_tokens: int | None = None  # from usage, when the server sends it


class SseParser:
    """Server-sent events from lines (without their newlines): push() returns an event's
    data ('data:' lines joined) when a blank line ends it, else None; comments (':') and
    other fields are ignored. flush() returns a last event left without its blank line (the
    checker wants to see a stream cut short)."""

    def __init__(self):
        self.data: list[str] = []

    def push(self, line: str) -> str | None:
        if line == "":
            out = "\n".join(self.data) if self.data else None
            self.data = []
            return out
        if line.startswith("data:"):
            v = line[5:]
            self.data.append(v[1:] if v.startswith(" ") else v)
        return None

    def flush(self) -> str | None:
        out = "\n".join(self.data) if self.data else None
        self.data = []
        return out


class StreamChecker:
    """Feeds on a stream's events one by one (with their arrival times) and collects the
    text, the token count, the timings and every violation of the chunk format."""

    def __init__(self, result: StreamResult, t_sent: float, max_tokens: int):
        self.r, self.t_sent, self.max_tokens = result, t_sent, max_tokens
        self.done = False
        self.ids, self.objects = set(), set()
        self.usage_tokens = None
        self.loops_seen = False
        self.chunk_tokens = 0       # text chunks (a token each when nothing says otherwise)
        self.t_last = None

    def error(self, msg: str) -> None:
        if len(self.r.errors) < 5:
            self.r.errors.append(msg)

    def feed(self, data: str, now: float) -> None:
        if self.done:
            self.error(f"event after [DONE]: {data[:80]!r}")
            return
        if data == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError as e:
            self.error(f"event is not JSON ({e}): {data[:80]!r}")
            return
        if not isinstance(chunk, dict):
            self.error(f"event is not a JSON object: {data[:80]!r}")
            return
        if "error" in chunk:
            self.error(f"error event: {json.dumps(chunk['error'])[:200]}")
            return
        self.ids.add(chunk.get("id"))
        self.objects.add(chunk.get("object"))
        usage = chunk.get("usage")
        if usage:
            self.usage_tokens = usage.get("completion_tokens")
            self.r.prompt_tokens = usage.get("prompt_tokens")
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            self.error(f"chunk without a choices list: {data[:80]!r}")
            return
        for ch in choices:
            if ch.get("index") != 0:
                self.error(f"choice index {ch.get('index')!r} in a stream of one choice")
                continue
            text = ch.get("text")
            if text is None:  # a chat chunk
                text = (ch.get("delta") or {}).get("content") or ""
            ext = ch.get("tinyloop") or {}
            loops = ext.get("loops")
            if text and self.r.finish_reason is not None:
                self.error("text after the finish_reason")
            n_tok = None
            if isinstance(loops, list):
                self.loops_seen = True
                self.r.loops.extend(loops)
                n_tok = len(loops)
            if text:
                self.r.text += text
                self.chunk_tokens += 1
                if self.r.ttft_s is None:
                    self.r.ttft_s = now - self.t_sent
                elif self.t_last is not None:
                    k = max(1, n_tok or 1)
                    self.r.tbt_s.extend([(now - self.t_last) / k] * k)
                self.t_last = now
            if ch.get("finish_reason") is not None:
                if self.r.finish_reason is not None:
                    self.error(f"a second finish_reason {ch['finish_reason']!r}")
                self.r.finish_reason = ch["finish_reason"]

    def finish(self) -> StreamResult:
        r = self.r
        if not self.done:
            self.error("the stream ended without data: [DONE]")
        if len(self.ids) > 1:
            self.error(f"{len(self.ids)} different completion ids in one stream")
        if len(self.objects) > 1:
            self.error(f"chunk objects differ: {sorted(map(str, self.objects))}")
        if r.finish_reason is None:
            self.error("no finish_reason")
        if not r.text:
            self.error("empty completion text")
        r.tokens = self.usage_tokens if self.usage_tokens is not None else self.chunk_tokens
        if self.usage_tokens is not None and self.loops_seen and len(r.loops) != self.usage_tokens:
            self.error(f"usage says {self.usage_tokens} tokens, tinyloop.loops gave {len(r.loops)}")
        if r.finish_reason == "length" and self.usage_tokens is not None \
                and self.usage_tokens != self.max_tokens:
            self.error(f"finish_reason length after {self.usage_tokens} of {self.max_tokens} tokens")
        if self.usage_tokens is not None and self.usage_tokens > self.max_tokens:
            self.error(f"{self.usage_tokens} tokens > max_tokens {self.max_tokens}")
        if self.usage_tokens is None and r.finish_reason == "length" \
                and self.chunk_tokens != self.max_tokens:
            # Without usage a text chunk stands for a token: "length" means max_tokens of them.
            self.error(f"finish_reason length after {self.chunk_tokens} text chunks, not "
                       f"max_tokens {self.max_tokens}")
        r.ok = not r.errors
        return r


async def one_stream(client: httpx.AsyncClient, url: str, body: dict, prompt_key: int,
                     headers: dict) -> StreamResult:
    result = StreamResult(prompt_key)
    t_sent = time.perf_counter()
    checker = StreamChecker(result, t_sent, body["max_tokens"])
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                result.errors.append(f"HTTP {resp.status_code}: {text[:200]}")
                return result
            ctype = resp.headers.get("content-type", "")
            if not ctype.startswith("text/event-stream"):
                checker.error(f"content-type {ctype!r}, not text/event-stream")

            parser = SseParser()
            async for line in resp.aiter_lines():
                data = parser.push(line)
                if data is not None:
                    checker.feed(data, time.perf_counter())  # timed as it arrives
            data = parser.flush()
            if data is not None:
                checker.feed(data, time.perf_counter())
    except (httpx.HTTPError, OSError) as e:
        result.errors.append(f"{type(e).__name__}: {e}")
        return result
    return checker.finish()


# ----------------------------------------------------------------------------------------
# the load: C clients x R requests

@dataclass
class Load:
    clients: int
    requests: int            # per client
    max_tokens: int
    prompts: list            # request j gets prompts[j % len]: fewer prompts than
                             # requests make the same-prompt check compare streams
    extra: dict = field(default_factory=dict)   # more body fields (e.g. loops)
    time_limit: float = 600.0


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1]); NaN for no values."""
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]


async def run_load(base_url: str, model: str | None, load: Load, api_key: str | None = None) -> dict:
    """Run the load against base_url (http://host:port) and return the summary; raises
    nothing for a bad stream (it is counted and described in the summary)."""
    url = base_url.rstrip("/") + "/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    total = load.clients * load.requests
    results: list[StreamResult | None] = [None] * total
    limits = httpx.Limits(max_connections=load.clients + 4, max_keepalive_connections=load.clients + 4)
    # No read timeout of its own: a stream may wait long for its first token when
    # requests queue (llama-cpp-python runs one at a time); the run's time limit bounds it.
    timeout = httpx.Timeout(connect=10.0, read=None, write=30.0, pool=None)

    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        async def client_task(c: int):
            for r in range(load.requests):
                j = r * load.clients + c  # request number: every client's r-th come together
                key = j % len(load.prompts)
                body = {"prompt": load.prompts[key], "max_tokens": load.max_tokens,
                        "temperature": 0.0, "stream": True,
                        # usage in the last chunk (a server without stream_options ignores it)
                        "stream_options": {"include_usage": True}, **load.extra}
                if model:
                    body["model"] = model
                results[j] = await one_stream(client, url, body, key, headers)

        t0 = time.perf_counter()
        tasks = [asyncio.create_task(client_task(c)) for c in range(load.clients)]
        _, pending = await asyncio.wait(tasks, timeout=load.time_limit)
        for t in pending:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        wall = time.perf_counter() - t0
    return summarize(results, wall, load, timed_out=bool(pending))


def summarize(results: list, wall: float, load: Load, timed_out: bool = False) -> dict:
    done = [r for r in results if r is not None]
    failures = [r for r in done if not r.ok]
    problems = [f"request {i}: {'; '.join(r.errors)}" for i, r in enumerate(results)
                if r is not None and not r.ok]
    missing = len(results) - len(done)
    if timed_out or missing:
        problems.append(f"{missing} of {len(results)} requests unfinished after the "
                        f"{load.time_limit:.0f} s time limit")
    # Greedy: the same prompt must give the same text, whatever ran beside it.
    by_prompt: dict[int, set] = {}
    for r in done:
        if r.ok:
            by_prompt.setdefault(r.prompt_key, set()).add(r.text)
    for key, texts in sorted(by_prompt.items()):
        if len(texts) > 1:
            problems.append(f"prompt {key}: {len(texts)} different greedy completions")
    ok = [r for r in done if r.ok]
    tokens = sum(r.tokens for r in ok)
    ttft = [r.ttft_s * 1e3 for r in ok if r.ttft_s is not None]
    tbt = [t * 1e3 for r in ok for t in r.tbt_s]
    loops = [x for r in ok for x in r.loops]
    prompt_tokens = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    return {
        "clients": load.clients, "requests": len(results), "ok": len(ok),
        "failed": len(failures) + missing, "problems": problems, "tokens": tokens,
        "wall_s": wall, "tok_s": tokens / wall if wall > 0 else float("nan"),
        "ttft_p50_ms": pct(ttft, 0.5), "ttft_p99_ms": pct(ttft, 0.99),
        "tbt_p50_ms": pct(tbt, 0.5), "tbt_p99_ms": pct(tbt, 0.99),
        "mean_loops": statistics.fmean(loops) if loops else None,
        "finish_reasons": sorted({str(r.finish_reason) for r in ok}),
        "mean_prompt_tokens": statistics.fmean(prompt_tokens) if prompt_tokens else None,
    }


# ----------------------------------------------------------------------------------------
# the servers, as subprocesses on 127.0.0.1

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server subprocess listening on 127.0.0.1:port; its output goes to a log file
    (shown when it fails to start). wait_ready polls `ready_path` until it answers 200."""

    def __init__(self, name: str, argv: list[str], port: int, ready_path: str, env=None):
        self.name, self.port, self.ready_path = name, port, ready_path
        self.base_url = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"{name}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def log_tail(self, n: int = 3000) -> str:
        self.log.flush()
        with open(self.log.name, errors="replace") as f:
            return f.read()[-n:]

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before it was "
                                   f"ready; its log:\n{self.log_tail()}")
            try:
                if httpx.get(self.base_url + self.ready_path, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} not ready on {self.base_url}{self.ready_path} after "
                           f"{timeout:.0f} s; its log:\n{self.log_tail()}")

    def cpu_seconds(self) -> float:
        """User + system CPU time of the process so far (to see that an idle one is idle)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: TinyLoop drains (nothing is in flight here)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _pythonpath_env() -> dict:
    """The environment for a server subprocess: the source tree's python/ first, so the
    tinyloop package (and its static page) of this checkout is served."""
    env = dict(os.environ)
    src = os.path.join(_REPO, "python")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def start_tinyloop(model_path: str, extra_args: list[str] = (), port: int | None = None,
                   timeout: float = 120.0) -> ServerProcess:
    port = port or free_port()
    argv = [sys.executable, "-m", "tinyloop.cli", "serve", model_path, "--host", "127.0.0.1",
            "--port", str(port), *extra_args]
    srv = ServerProcess("tinyloop-serve", argv, port, "/health", env=_pythonpath_env())
    srv.wait_ready(timeout)
    return srv


def start_llamacpp(gguf_path: str, threads: int, n_ctx: int, port: int | None = None,
                   timeout: float = 180.0) -> ServerProcess:
    port = port or free_port()
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", gguf_path, "--host", "127.0.0.1",
            "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", str(threads),
            "--n_threads_batch", str(threads), "--interrupt_requests", "False",
            "--model_alias", os.path.basename(gguf_path)]
    srv = ServerProcess("llama-cpp-server", argv, port, "/v1/models")
    srv.wait_ready(timeout)
    return srv


def served_model(base_url: str, api_key: str | None = None) -> str | None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    resp = httpx.get(base_url.rstrip("/") + "/v1/models", headers=headers, timeout=10.0)
    resp.raise_for_status()
    data = resp.json().get("data") or []
    return data[0]["id"] if data else None


# ----------------------------------------------------------------------------------------
# reporting

def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


HEADER = ("| server | clients | requests | ok | tokens | wall s | aggregate tok/s | TTFT p50 ms | "
          "TTFT p99 ms | TBT p50 ms | TBT p99 ms | mean loops |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def row(name: str, s: dict) -> str:
    ml = f"{s['mean_loops']:.2f}" if s["mean_loops"] is not None else "-"
    return (f"| {name} | {s['clients']} | {s['requests']} | {s['ok']} | {s['tokens']} | "
            f"{s['wall_s']:.1f} | {s['tok_s']:.1f} | {s['ttft_p50_ms']:.0f} | {s['ttft_p99_ms']:.0f} | "
            f"{s['tbt_p50_ms']:.1f} | {s['tbt_p99_ms']:.1f} | {ml} |")


def report_problems(name: str, s: dict) -> None:
    for p in s["problems"][:10]:
        print(f"  {name}: {p}", file=sys.stderr)
    if len(s["problems"]) > 10:
        print(f"  {name}: ... {len(s['problems']) - 10} more", file=sys.stderr)


# ----------------------------------------------------------------------------------------
# the benchmark model and its twin

PLACEHOLDER_DIGITS = "3456789"  # "t3".."t9": the twin's only pieces its tokenizer can reach


def placeholder_tokenizer_json(vocab: int) -> str:
    """A tokenizer for the benchmark model with the unrolled twin's placeholder vocabulary
    (bench/compare.py: <unk> <s> </s> t3 t4 ... t{vocab-1}): "t<digits>" pieces in, the same
    pieces out, concatenated as llama.cpp prints them. Both servers then stream the same
    kind of text and take the same prompt strings."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    names = ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, vocab)]
    tok = Tokenizer(models.WordLevel({n: i for i, n in enumerate(names)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"t[0-9]+"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(names[:3])  # kept out of decoded text, as llama.cpp does
    return tok.to_str()


def bench_model_with_vocab() -> str:
    """The F16 benchmark model plus the placeholder tokenizer, written once next to it (the
    same tensors, re-encoded F16 -> float64 -> F16 exactly)."""
    from tinyloop import bench
    from tinyloop.format import read_model, write_model

    src = bench.bench_model_path("f16")
    path = os.path.splitext(src)[0] + "-vocab.tinyloop"
    if not os.path.exists(path):
        print(f"(writing {path})", file=sys.stderr)
        m = read_model(src)
        write_model(path, m.config, m.tensors, weight_dtype="f16",
                    tokenizer_json=placeholder_tokenizer_json(m.config["vocab_size"]))
    return path


def twin_without_space_prefix(src: str) -> str:
    """The unrolled twin GGUF with `tokenizer.ggml.add_space_prefix = false` (written once
    beside it, tensors and other keys copied as they are). llama.cpp's SentencePiece-style
    tokenizer would otherwise put a "\u2581" before the text, which the placeholder vocabulary
    lacks, and its byte fallback (no <0xNN> tokens either) throws std::out_of_range and ends
    the server: bench/llamacpp_batch.py feeds ids and never meets it."""
    import gguf

    dst = os.path.splitext(src)[0] + "-nospace.gguf"
    if os.path.exists(dst):
        return dst
    print(f"(writing {dst})", file=sys.stderr)
    r = gguf.GGUFReader(src)
    arch = r.fields[gguf.Keys.General.ARCHITECTURE].contents()
    w = gguf.GGUFWriter(dst + ".tmp", arch=arch, endianess=r.endianess)
    for f in r.fields.values():
        if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    w.add_bool(gguf.Keys.Tokenizer.ADD_PREFIX, False)
    for t in r.tensors:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in r.tensors:
        w.write_tensor_data(t.data, tensor_endianess=r.endianess)
    w.close()
    os.replace(dst + ".tmp", dst)
    return dst


def bench_prompts(n: int, length: int, seed: int = 0) -> list[str]:
    """n prompt strings of `length` placeholder pieces ("t3".."t9", random): one token
    each for both servers (llama.cpp adds its BOS)."""
    rng = random.Random(seed)
    return ["".join(f"t{rng.choice(PLACEHOLDER_DIGITS)}" for _ in range(length)) for _ in range(n)]


def llamacpp_prompt_tokens(base_url: str, text: str) -> int:
    resp = httpx.post(base_url + "/extras/tokenize", json={"input": text}, timeout=30.0)
    resp.raise_for_status()
    return len(resp.json()["tokens"])


def compare(args) -> int:
    sys.path.insert(0, os.path.join(_REPO, "python"))
    sys.path.insert(0, _HERE)
    try:
        import llama_cpp  # only to say clearly when the peer is missing
    except ImportError:
        print("--compare needs llama-cpp-python's server: pip install -r bench/requirements-peer.txt "
              "(it compiles llama.cpp, ~10-17 minutes on 2 cores)", file=sys.stderr)
        return 2
    from llamacpp_batch import model_path as twin_path

    model = bench_model_with_vocab()
    gguf = twin_without_space_prefix(twin_path("bench"))  # the unrolled twin (L = 8)
    threads = args.threads or os.cpu_count()
    clients = [int(c) for c in args.clients.split(",")]
    prompts = bench_prompts(max(clients) * args.requests, args.prompt_tokens, args.seed)
    n_ctx = args.prompt_tokens + args.max_tokens + 16
    print(f"CPU: {cpu_name()} ({os.cpu_count()} cores), {threads} threads each; "
          f"{args.requests} request(s) per client, prompt {args.prompt_tokens} tokens, "
          f"{args.max_tokens} new tokens each, greedy; the servers take turns\n"
          f"TinyLoop: {os.path.basename(model)}; llama-cpp-python {llama_cpp.__version__}: "
          f"{os.path.basename(gguf)}", flush=True)
    rows = []
    with start_tinyloop(model, args.serve_arg) as tl_srv, \
            start_llamacpp(gguf, threads, n_ctx) as ll_srv:
        print(f"llama.cpp's tokens for a prompt: {llamacpp_prompt_tokens(ll_srv.base_url, prompts[0])} "
              f"(its BOS included)", flush=True)
        tl_model, ll_model = served_model(tl_srv.base_url), served_model(ll_srv.base_url)
        # A short warm-up of each (first-request costs: weights paged in, buffers sized).
        for srv, mdl in ((tl_srv, tl_model), (ll_srv, ll_model)):
            asyncio.run(run_load(srv.base_url, mdl, Load(2, 1, 8, prompts[:2], time_limit=120)))
        print(HEADER, flush=True)
        failed = False
        for c in clients:
            pair = {}
            for name, srv, mdl in (("TinyLoop", tl_srv, tl_model),
                                   ("llama-cpp-python", ll_srv, ll_model)):
                idle = (ll_srv if srv is tl_srv else tl_srv)
                cpu0 = idle.cpu_seconds()
                load = Load(c, args.requests, args.max_tokens, prompts[:c * args.requests],
                            time_limit=args.time_limit)
                s = asyncio.run(run_load(srv.base_url, mdl, load))
                idle_cpu = idle.cpu_seconds() - cpu0
                print(row(name, s), flush=True)
                report_problems(name, s)
                if idle_cpu > 0.05 * s["wall_s"]:
                    print(f"  (the idle {idle.name} used {idle_cpu:.1f} s CPU meanwhile)", file=sys.stderr)
                failed |= s["failed"] > 0 or bool(s["problems"])
                pair[name] = s
            rows.append((c, pair))
    print()
    for c, pair in rows:
        a, b = pair["TinyLoop"], pair["llama-cpp-python"]
        print(f"{c} clients: TinyLoop / llama-cpp-python aggregate tok/s {a['tok_s'] / b['tok_s']:.2f}x; "
              f"TTFT p50 {a['ttft_p50_ms']:.0f} vs {b['ttft_p50_ms']:.0f} ms, "
              f"p99 {a['ttft_p99_ms']:.0f} vs {b['ttft_p99_ms']:.0f} ms; finish reasons "
              f"{a['finish_reasons']} / {b['finish_reasons']}; TinyLoop's prompt tokens "
              f"(usage) {a['mean_prompt_tokens']}")
    return 1 if failed else 0


# ----------------------------------------------------------------------------------------
# plain load and the smoke run

def plain(args) -> int:
    srv = None
    if args.serve:
        srv = start_tinyloop(args.serve, args.serve_arg)
        base = srv.base_url
    else:
        base = args.base_url
    try:
        model = served_model(base, args.api_key)
        print(f"CPU: {cpu_name()} ({os.cpu_count()} cores); {base}, model {model}; "
              f"{args.requests} request(s) per client, {args.max_tokens} tokens each, greedy", flush=True)
        print(HEADER, flush=True)
        failed = False
        for c in (int(x) for x in args.clients.split(",")):
            n = c * args.requests
            prompts = [f"{j}. {PROMPTS[j % len(PROMPTS)]}" for j in range(n)]
            load = Load(c, args.requests, args.max_tokens, prompts, time_limit=args.time_limit)
            s = asyncio.run(run_load(base, model, load, args.api_key))
            print(row("server", s), flush=True)
            report_problems("server", s)
            failed |= s["failed"] > 0 or bool(s["problems"])
        return 1 if failed else 0
    finally:
        if srv:
            srv.stop()


def smoke(model_path: str = BUNDLED_MODEL, clients: int = 4, requests: int = 2,
          max_tokens: int = 16, serve_args: list[str] = (), time_limit: float = 25.0) -> dict:
    """A few streams against `tinyloop serve` on the bundled model: two prompts shared by
    all requests (so the same-prompt check compares streams that ran side by side)."""
    with start_tinyloop(model_path, serve_args) as srv:
        model = served_model(srv.base_url)
        load = Load(clients, requests, max_tokens, PROMPTS[:2], time_limit=time_limit)
        return asyncio.run(run_load(srv.base_url, model, load))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--base-url", help="a running OpenAI-compatible server (http://127.0.0.1:PORT)")
    mode.add_argument("--serve", metavar="MODEL", help="start `tinyloop serve MODEL` and load it")
    mode.add_argument("--compare", action="store_true",
                      help="TinyLoop's server vs llama-cpp-python's on the benchmark model and its twin")
    mode.add_argument("--smoke", action="store_true", help="a few requests on the bundled model (< 30 s)")
    p.add_argument("--clients", default="32", help="concurrent clients, comma-separated (default 32)")
    p.add_argument("--requests", type=int, default=2, help="requests per client, one after another")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt-tokens", type=int, default=128, help="--compare: prompt length")
    p.add_argument("--threads", type=int, default=0, help="--compare: llama.cpp threads (default: all)")
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds per load run")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="an extra argument for `tinyloop serve` (repeatable)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.requests < 1 or args.max_tokens < 1:
        p.error("--requests and --max-tokens must be at least 1")
    if args.smoke:
        t0 = time.perf_counter()
        s = smoke(serve_args=args.serve_arg)
        print(HEADER)
        print(row("TinyLoop (smoke)", s))
        report_problems("smoke", s)
        print(f"smoke: {s['ok']}/{s['requests']} streams whole, {time.perf_counter() - t0:.1f} s")
        return 1 if s["failed"] or s["problems"] else 0
    if args.compare:
        return compare(args)
    if not (args.base_url or args.serve):
        p.error("pass --base-url, --serve MODEL, --compare or --smoke")
    return plain(args)


if __name__ == "__main__":
    sys.exit(main())
