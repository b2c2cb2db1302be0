"""Peak resident memory of TinyLoop against llama.cpp (llama-cpp-python) on the same weights
and context: after load, and after a prefill that fills the context plus a few decode steps.

    PYTHONPATH=build/h-mem:python python3 bench/peak_rss.py                 # all four, 4096, 1 thread
    python3 bench/peak_rss.py --models smollm2,f16,int8,int4 -c 4096 -n 16 -t 1
    python3 bench/peak_rss.py --quant-activations default,f32 --release-file-pages --cache-window 4096

Models: SmolLM2-135M-Instruct (TinyLoop's converted file against llama.cpp on its own Q4_1
GGUF, both from the tests' cache: tests/python/smollm2.py), and the benchmark model of
bench/compare.py at its default L = 8 in F16 (llama.cpp: the 18-layer unrolled twin, F16),
int8 (against Q8_0) and int4 (against Q4_0), the same blocks on both sides
(compare.quantized_pair).

Every measurement runs in a fresh Python process (this script with --child), so one engine's
peak never mixes with another's. In it: the engine's module is imported, the model loaded
(TinyLoop: tl.Model(path, max_seq_len=C) with its defaults; llama.cpp: Llama(gguf, n_ctx=C)
with its defaults: mmap, n_batch 512, F16 KV), then a prompt of C - N random tokens is
evaluated and N - 1 one-token decode steps follow (the first generated token comes out of the
prefill), so the context ends full. /proc/self/status is read before load, after load and
after the run: VmRSS (resident now) and VmHWM (the process's peak resident set), with their
RssAnon (heap: copies, KV, workspaces) and RssFile (pages of the mapped model file, and
of the shared libraries: ~15 MiB before load here) parts.
TinyLoop also reports Model.vram_usage_mb() after load and its largest value seen at a token
callback (what it says it holds). "KV at C" is the F16 K/V bytes either engine needs: 2 x 2
bytes x n_kv_heads x head_dim per position in every KV slot (TinyLoop: n_pre + L * n_loop +
n_post slots; llama.cpp: its n_layer layers).

--release-file-pages (an audit experiment, TinyLoop only) drops the process's resident pages
of the model file mapping with madvise(MADV_DONTNEED) right after load: pages the run still
reads fault back in from the page cache, so the RSS after the run shows what TinyLoop would
hold if it released the originals of the weights it copied at load (docs: the audit in
docs/benchmarks.md, "Peak memory"). --cache-window W (W >= the context: the same attention,
bit for bit) adds a TinyLoop row whose forward runs in KvCache::kWindowSlack-row chunks, so
the prefill's workspace is that of 64 rows, not of the whole prompt (another audit
experiment); with both flags, a row with both.

Skips (exit 0, saying why) when llama_cpp is not installed (unless --tinyloop-only), and
SmolLM2 when its GGUF can not be fetched.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.join(_HERE, "..")
# tests/python goes first: its smollm2.py (the tests' cache) shadows bench/smollm2.py.
for _p in (_HERE, os.path.join(_REPO, "python"), os.path.join(_REPO, "tests", "python")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

MODELS = ("smollm2", "f16", "int8", "int4")
STATUS_KEYS = ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem")


# ---- pure helpers (tests/python/test_bench_peak_rss.py) ----

def parse_status(text: str) -> dict[str, int]:
    """The kB fields of /proc/<pid>/status ("VmHWM:\\t  1234 kB") as {name: kB}."""
    out = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        parts = rest.split()
        if sep and len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            out[name.strip()] = int(parts[0])
    return out


def read_status() -> dict[str, int]:
    with open("/proc/self/status") as f:
        return {k: v for k, v in parse_status(f.read()).items() if k in STATUS_KEYS}


def kv_bytes(slots: int, n_ctx: int, n_kv_heads: int, head_dim: int, elem_bytes: int = 2) -> int:
    """K and V of n_ctx positions in `slots` KV slots (layers), elem_bytes per value."""
    return 2 * slots * n_ctx * n_kv_heads * head_dim * elem_bytes


def tinyloop_slots(cfg: dict, loops: int) -> int:
    """KV slots of a TinyLoop model at `loops` iterations: one per layer application."""
    return int(cfg["n_pre_blocks"]) + loops * int(cfg["n_loop_layers"]) + int(cfg["n_post_blocks"])


def llama_kv_shape(meta: dict) -> tuple[int, int, int]:
    """(n_layer, n_kv_heads, head_dim) from llama.cpp's GGUF metadata (llm.metadata: strings)."""
    arch = meta.get("general.architecture", "llama")
    n_head = int(meta[f"{arch}.attention.head_count"])
    n_kv = int(meta.get(f"{arch}.attention.head_count_kv", n_head))
    head_dim = int(meta.get(f"{arch}.attention.key_length",
                            int(meta[f"{arch}.embedding_length"]) // n_head))
    return int(meta[f"{arch}.block_count"]), n_kv, head_dim


def mib(kb: float) -> float:
    return kb / 1024.0


def _fmt(v, nd=1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def format_table(results: list[dict], n_ctx: int, n_gen: int) -> str:
    """The markdown table of child results: one row per (model, weights, engine); TinyLoop
    rows get the ratio of their peak to the llama.cpp row of the same model and weights."""
    peak_llama = {(r["model"], r["weights"]): r["run"]["VmHWM"] for r in results
                  if r["engine"] == "llama.cpp"}
    lines = [f"| model | weights | engine | RSS after load MiB | peak after {n_ctx} context "
             f"({n_ctx - n_gen} prefill + {n_gen - 1} decode) MiB | vram_usage_mb load / max "
             f"| KV at {n_ctx} MiB | ratio TinyLoop/llama.cpp (peak) |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        ll = peak_llama.get((r["model"], r["weights"]))
        ratio = r["run"]["VmHWM"] / ll if r["engine"] != "llama.cpp" and ll else None
        vram = (f"{r['vram_load']:.1f} / {r['vram_max']:.1f}"
                if r.get("vram_load") is not None else "-")
        lines.append(f"| {r['model']} | {r['weights']} | {r['engine']} | {mib(r['load']['VmRSS']):.1f} | "
                     f"{mib(r['run']['VmHWM']):.1f} | {vram} | {r['kv_bytes'] / 2**20:.1f} | "
                     f"{_fmt(ratio, 2)} |")
    return "\n".join(lines)


def format_breakdown(results: list[dict]) -> str:
    """Where the resident pages are: anonymous (heap) against file-backed (the mapped model)."""
    lines = ["| model | weights | engine | RSS before load | after load: anon / file | "
             "after run: anon / file | peak (VmHWM) |",
             "|---|---|---|---:|---:|---:|---:|"]
    for r in results:
        b, a, z = r["before"], r["load"], r["run"]
        lines.append(f"| {r['model']} | {r['weights']} | {r['engine']} | {mib(b['VmRSS']):.1f} | "
                     f"{mib(a.get('RssAnon', 0)):.1f} / {mib(a.get('RssFile', 0)):.1f} | "
                     f"{mib(z.get('RssAnon', 0)):.1f} / {mib(z.get('RssFile', 0)):.1f} | "
                     f"{mib(z['VmHWM']):.1f} |")
    return "\n".join(lines)


# ---- the child: one engine, one model, one fresh process ----

def _prompt(n: int, vocab: int) -> list[int]:
    """n random token ids, the benchmarks' rule (bench._prompt, seed 0); n = 0 gives none."""
    from tinyloop import bench  # numpy only: no engine module in llama.cpp's process

    return [int(v) for v in bench._prompt(n, vocab, 0)][:n]


def release_file_pages(path: str) -> int:
    """madvise(MADV_DONTNEED) over this process's mappings of `path`; returns the bytes
    advised. Safe for a private read-only file mapping: pages read later fault back in from
    the page cache."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    real = os.path.realpath(path)
    done = 0
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == real:
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                if libc.madvise(lo, hi - lo, mmap.MADV_DONTNEED) != 0:
                    raise OSError(ctypes.get_errno(), f"madvise on {real}")
                done += hi - lo
    return done


def child_tinyloop(spec: dict) -> dict:
    import numpy as np
    import tinyloop_py as tl

    tl.set_num_threads(spec["threads"])
    kw = {} if spec["qa"] == "default" else {"quant_activations": spec["qa"]}
    before = read_status()
    model = tl.Model(spec["path"], max_seq_len=spec["n_ctx"], **kw)
    released = release_file_pages(spec["path"]) if spec["release"] else 0
    load = read_status()
    cfg = model.config()
    loops = int(cfg["default_loops"])
    vram_load = model.vram_usage_mb()
    seen = [vram_load]
    prompt = np.array(_prompt(spec["n_ctx"] - spec["n_gen"], int(cfg["vocab_size"])), dtype=np.int32)
    r = model.generate_stream(prompt, lambda t: seen.append(model.vram_usage_mb()) or True,
                              max_tokens=spec["n_gen"], loops=loops, temperature=0.0, stop_at_eos=False,
                              cache_window=spec.get("window", 0))
    run = read_status()
    slots = tinyloop_slots(cfg, loops)
    return dict(before=before, load=load, run=run, vram_load=vram_load, vram_max=max(seen),
                kv_bytes=kv_bytes(slots, spec["n_ctx"], int(cfg["n_kv_heads"]), int(cfg["head_dim"])),
                slots=slots, loops=loops, tokens=int(r["tokens_emitted"]), released=released,
                quant_activations=cfg.get("quant_activations"),
                prefill_ms=float(r["prefill_ms"]))


def child_llama(spec: dict) -> dict:
    from llama_cpp import Llama

    before = read_status()
    llm = Llama(spec["path"], n_ctx=spec["n_ctx"], n_threads=spec["threads"],
                n_threads_batch=spec["threads"], verbose=False)
    load = read_status()
    n_layer, n_kv, head_dim = llama_kv_shape(llm.metadata)
    toks = _prompt(spec["n_ctx"] - spec["n_gen"], llm.n_vocab())
    llm.eval(toks)
    for t in _prompt(spec["n_gen"] - 1, llm.n_vocab()):
        llm.eval([t])
    run = read_status()
    return dict(before=before, load=load, run=run, vram_load=None, vram_max=None,
                kv_bytes=kv_bytes(n_layer, spec["n_ctx"], n_kv, head_dim), slots=n_layer,
                tokens=llm.n_tokens)


# ---- the parent: which files, then one child per measurement ----

def model_pairs(name: str, cache_dir: str | None) -> tuple[str, str, str]:
    """(weights label, TinyLoop file, llama.cpp GGUF) for one of MODELS. The bench model's
    files come from bench/compare.py's helpers (written on first use, cached)."""
    from tinyloop import bench

    if name == "smollm2":
        import smollm2  # tests/python/smollm2.py: the tests' cache

        return "Q4_1", smollm2.converted_path(), smollm2.gguf_path()
    import compare  # bench/compare.py

    if name == "f16":
        path = bench.bench_model_path("f16", cache_dir)
        loops = bench.BENCH_SHAPE["default_loops"]
        gguf_path = os.path.splitext(path)[0] + f"-unrolled-L{loops}-f16.gguf"  # compare.main's name
        if not os.path.exists(gguf_path):
            print(f"(writing {gguf_path})", file=sys.stderr)
            compare.unrolled_gguf(path, loops, gguf_path + ".tmp")
            os.replace(gguf_path + ".tmp", gguf_path)
        return "F16 / F16", path, gguf_path
    tl_path, gguf_path = compare.quantized_pair(bench.bench_model_path("f32", cache_dir), name,
                                                bench.BENCH_SHAPE["default_loops"], bench.bench_dir(cache_dir))
    return f"{name} / {compare.GGML_FOR[name]}", tl_path, gguf_path


def run_child(spec: dict) -> dict:
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"child {spec['engine']} {spec['path']} failed ({p.returncode}):\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("-c", "--n-ctx", type=int, default=4096, help="context: TinyLoop max_seq_len, llama.cpp n_ctx")
    ap.add_argument("-n", "--n-gen", type=int, default=16,
                    help="generated tokens: the prompt is n_ctx - n_gen, then n_gen - 1 decode steps")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--quant-activations", default="default",
                    help="TinyLoop rows for int8 / int4 / SmolLM2, comma-separated: default (no kwarg), q8, f32")
    ap.add_argument("--release-file-pages", action="store_true",
                    help="also a TinyLoop row per model with the file's pages dropped after load (audit)")
    ap.add_argument("--cache-window", type=int, default=0,
                    help="also a TinyLoop row per model with this cache_window (>= n_ctx: the same "
                         "attention, but the forward runs in KvCache::kWindowSlack-row chunks; audit)")
    ap.add_argument("--tinyloop-only", action="store_true", help="no llama.cpp rows")
    ap.add_argument("--cache-dir", default=None, help="where the benchmark model files are kept")
    ap.add_argument("--json", default=None, help="also write every child's result to this file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        res = child_tinyloop(spec) if spec["engine"] == "tinyloop" else child_llama(spec)
        print(json.dumps(res))
        return 0
    if not 1 <= args.n_gen < args.n_ctx:
        ap.error("need 1 <= --n-gen < --n-ctx")
    names = [m for m in args.models.split(",") if m]
    for m in names:
        if m not in MODELS:
            ap.error(f"--models: {m!r} is not one of {', '.join(MODELS)}")
    qas = [q for q in args.quant_activations.split(",") if q]
    with_llama = not args.tinyloop_only
    if with_llama:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print("skipped: llama_cpp (llama-cpp-python) is not installed; --tinyloop-only runs without it")
            return 0

    from tinyloop import bench

    load0 = os.getloadavg()[0]
    results = []
    for name in names:
        try:
            label, tl_path, gguf_path = model_pairs(name, args.cache_dir)
        except Exception as e:  # smollm2.Unavailable: no network for the GGUF
            if type(e).__name__ != "Unavailable":
                raise
            print(f"skipped {name}: {e}")
            continue
        base = dict(n_ctx=args.n_ctx, n_gen=args.n_gen, threads=args.threads)
        model = "SmolLM2-135M-Instruct" if name == "smollm2" else "bench L=8"
        runs = [("tinyloop", f"TinyLoop ({q})" if name != "f16" and q != "default" else "TinyLoop",
                 tl_path, q, False) for q in (qas if name != "f16" else ["default"])]
        if args.release_file_pages:
            runs.append(("tinyloop", "TinyLoop, file pages released", tl_path, "default", True))
        if args.cache_window:
            runs.append(("tinyloop", f"TinyLoop, cache_window={args.cache_window}", tl_path, "default", False))
            if args.release_file_pages:
                runs.append(("tinyloop", f"TinyLoop, file pages released + cache_window={args.cache_window}",
                             tl_path, "default", True))
        if with_llama:
            runs.append(("llama.cpp", "llama.cpp", gguf_path, "default", False))
        for engine, label_engine, path, qa, release in runs:
            window = args.cache_window if "cache_window" in label_engine else 0
            res = run_child(dict(base, engine=engine, path=path, qa=qa, release=release, window=window))
            res.update(model=model, weights=label, engine=label_engine, file=os.path.basename(path),
                       file_mib=os.path.getsize(path) / 2**20)
            results.append(res)
            print(f"({model} {label} {label_engine}: peak {mib(res['run']['VmHWM']):.1f} MiB)", file=sys.stderr)

    print(f"CPU: {bench.cpu_name()}; load average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
          f"threads {args.threads}; "
          f"context {args.n_ctx} ({args.n_ctx - args.n_gen}-token prompt + {args.n_gen - 1} decode steps); "
          "each row a fresh process")
    print(format_table(results, args.n_ctx, args.n_gen))
    print()
    print(format_breakdown(results))
    print()
    for r in results:
        print(f"- {r['model']} {r['weights']} {r['engine']}: file {r['file']} {r['file_mib']:.1f} MiB, "
              f"KV slots {r['slots']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
