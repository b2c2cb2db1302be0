"""`tinyloop bench`: prompt-processing and generation speed, in the manner of llama-bench.

    tinyloop bench                                 # the benchmark model, f16, L=8: pp512, tg128
    tinyloop bench -p 512 -n 128 -L 1,8,32 -t 1,2 --weight-dtype f32,f16,bf16,int8,int4 -r 5
    tinyloop bench --kernels simd,scalar           # A/B against the scalar reference, one run
    tinyloop bench --model my.tinyloop -d 0,1024 --json
    tinyloop bench --weight-dtype f32,bf16 --fp16-body off,on   # reduced-precision loop body A/B
    tinyloop bench --weight-dtype int8,int4 --quant-activations f32,q8   # exact vs llama.cpp-style activations

ppN: tokens/s of the prefill of an N-token prompt (one forward over all N tokens, fp16 KV,
as generation does). tgN: tokens/s of N greedy decode steps (one token each, sampling
included) after a prompt of max(1, depth) tokens. Every (test, configuration) is run once
as warm-up, then --repetitions times; the runs of different configurations are interleaved
(rep 1 of each, then rep 2 of each, ...) so a load change on a shared machine hits them all
alike. Each row gives the mean and standard deviation of the per-run tokens/s, and what they
mean for the hardware: the weight bytes decode reads per second (a decode step streams every
weight matrix once per layer application: n_pre + L * n_loop + n_post layers and the head),
or the arithmetic rate of prefill (2 flops per weight per token, plus attention's QK and PV).

Without --model, a random-weights model of the benchmark shape is generated once per weight
dtype and cached (dim 768, 12 heads, SwiGLU FFN 2048, vocab 32000, 1 pre block, 2 loop
layers, 1 post block, default L=8: the looped twin of an 18-layer Llama of that width).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import struct
import sys
import tempfile

import numpy as np

# The benchmark model of the "CPU speed" issue: a Llama-style looped model.
BENCH_SHAPE = dict(dim=768, n_heads=12, n_kv_heads=12, ffn_dim=2048, vocab_size=32000,
                   n_pre_blocks=1, n_loop_layers=2, n_post_blocks=1, default_loops=8,
                   max_seq_len=4096, tie_embeddings=False, eos_ids=[2])

_DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I8": 1, "U8": 1}
WEIGHT_DTYPES = ("f32", "f16", "bf16", "int8", "int4")
# Quantized benchmark models use the GGUF Q8_0 / Q4_0 / Q4_1 layout: groups of 32, F16
# scales (and offsets), so they compare with llama.cpp's types byte for byte.
QUANT_GROUP = 32


def bench_dir(cache_dir: str | None = None) -> str:
    """Where generated benchmark models are kept: cache_dir, else $TINYLOOP_BENCH_DIR, else
    <tmp>/tinyloop-bench (created)."""
    cache_dir = cache_dir or os.environ.get("TINYLOOP_BENCH_DIR") or os.path.join(
        tempfile.gettempdir(), "tinyloop-bench")
    os.makedirs(cache_dir, exist_ok=True)
    return cache_dir


def bench_model_path(weight_dtype: str, cache_dir: str | None = None) -> str:
    """The cached benchmark model for a weight dtype, written on first use."""
    cache_dir = bench_dir(cache_dir)
    quant = weight_dtype in ("int8", "int4")
    tag = f"{weight_dtype}-g{QUANT_GROUP}" if quant else weight_dtype
    path = os.path.join(cache_dir, f"bench-h768-pre1-loop2-post1-{tag}.tinyloop")
    if not os.path.exists(path):
        from .random_model import write_random_model
        print(f"(writing the benchmark model {path})", file=sys.stderr)
        extra = dict(group=QUANT_GROUP, scale_dtype="f16") if quant else {}
        write_random_model(path, "llama", seed=0, weight_dtype=weight_dtype, **extra, **BENCH_SHAPE)
    return path


def read_header(path: str) -> dict:
    """The file's tensor table {name: {dtype, shape, ...}} without reading the weights."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
    header.pop("__metadata__", None)
    return header


class Work:
    """Per-token costs of a model at L loops, from its tensor table and config."""

    def __init__(self, header: dict, cfg: dict, loops: int):
        self.cfg, self.loops = cfg, loops
        per = {"pre.": 1, "loop.": loops, "post.": 1, "inject.": loops}
        head = "head.weight" if "head.weight" in header else "embed.weight"
        self.weight_bytes = 0  # bytes of weight matrices read by one decode step
        self.macs = 0          # weight multiply-adds per token
        for name, e in header.items():
            if len(e["shape"]) != 2 or not name.endswith(".weight"):
                continue
            times = next((v for k, v in per.items() if name.startswith(k)), 1 if name == head else 0)
            stored = e["shape"][0] * e["shape"][1]
            elems = stored * (2 if e["dtype"] == "U8" else 1)  # int4: two a byte
            nbytes = stored * _DTYPE_BYTES[e["dtype"]]
            for c in (".scales", ".offsets"):  # a quantized weight's companions are read too
                if name + c in header:
                    ce = header[name + c]
                    nbytes += ce["shape"][0] * ce["shape"][1] * _DTYPE_BYTES[ce["dtype"]]
            self.weight_bytes += times * nbytes
            if name != head:  # the head runs on the last prompt row only
                self.macs += times * elems
        hs = header[head]["shape"]
        self.head_macs = hs[0] * hs[1] * (2 if header[head]["dtype"] == "U8" else 1)
        self.dtype = {"I8": "int8", "U8": "int4"}.get(header[head]["dtype"], header[head]["dtype"])
        self.attn_layers = cfg["n_pre_blocks"] + loops * cfg["n_loop_layers"] + cfg["n_post_blocks"]

    def prefill_flops(self, n_prompt: int, depth: int = 0) -> float:
        """Matmul flops of the prompt rows + the head on the last row + attention (QK^T and
        PV over each row's causal window: 4 * (n_heads * head_dim) flops per key)."""
        c = self.cfg
        width = c["n_heads"] * c["head_dim"]
        keys = sum(depth + t + 1 for t in range(n_prompt))
        return 2.0 * (n_prompt * self.macs + self.head_macs) + 4.0 * width * keys * self.attn_layers


def cpu_name() -> str:
    """The CPU's model name (every recorded number names its CPU)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _prompt(n: int, vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, vocab, size=max(1, n), dtype=np.int32)


def run_pp(model, n_prompt: int, loops: int, vocab: int, rep: int) -> float:
    """Tokens/s of one n_prompt-token prefill (the engine's own timing of the forward)."""
    r = model.generate_stream(_prompt(n_prompt, vocab, rep), lambda t: True, max_tokens=1,
                              loops=loops, temperature=0.0, stop_at_eos=False)
    return n_prompt / (r["prefill_ms"] / 1e3)


def run_tg(model, n_gen: int, depth: int, loops: int, vocab: int, rep: int) -> float:
    """Tokens/s of n_gen decode steps after a max(1, depth)-token prompt: the first token
    comes out of the prefill, the other n_gen - 1 are timed (steady state)."""
    r = model.generate_stream(_prompt(depth, vocab, rep), lambda t: True, max_tokens=n_gen + 1,
                              loops=loops, temperature=0.0, stop_at_eos=False)
    steps = r["tokens_emitted"] - 1
    return steps / (r["decode_steady_ms"] / 1e3)


def _ints(s: str) -> list[int]:
    return [int(v) for v in s.split(",") if v != ""]


def _strs(s: str) -> list[str]:
    return [v for v in s.split(",") if v != ""]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default=None,
                   help="a .tinyloop file (default: the generated benchmark model per --weight-dtype)")
    p.add_argument("-p", "--n-prompt", type=_ints, default=[512], help="prompt lengths, comma-separated (0: none)")
    p.add_argument("-n", "--n-gen", type=_ints, default=[128], help="generation lengths, comma-separated (0: none)")
    p.add_argument("-d", "--depth", type=_ints, default=[0], help="context already in the cache before tg/pp")
    p.add_argument("-L", "--loops", type=_ints, default=None, help="loop depths (default: the model's)")
    p.add_argument("-t", "--threads", type=_ints, default=None, help="thread counts (default: the pool's)")
    p.add_argument("--weight-dtype", type=_strs, default=["f16"],
                   help="f32,f16,bf16,int8,int4 for the generated model (int8/int4: groups of 32, "
                        "F16 scales; ignored with --model)")
    p.add_argument("--kernels", type=_strs, default=["simd"],
                   help="simd,scalar: kernel sets to compare (scalar runs at the lowest --threads only: "
                        "it is single-threaded)")
    p.add_argument("--quant-activations", type=_strs, default=None,
                   help="f32,q8: Model(quant_activations=...) settings to compare for int8/int4 weights, "
                        "interleaved like the rest (default: the model's / TINYLOOP_QUANT_ACTIVATIONS)")
    p.add_argument("--fp16-body", type=_strs, default=None,
                   help="off,on: Model(fp16_body=...) settings to compare, interleaved like the rest "
                        "(on: the loop body's float matmuls in bf16, docs/benchmarks.md; default: "
                        "the Model's default, TINYLOOP_EXPERIMENTAL_FP16_BODY)")
    p.add_argument("-r", "--repetitions", type=int, default=3)
    p.add_argument("--json", action="store_true", help="print one JSON array instead of the table")
    p.add_argument("--cache-dir", default=None, help="where generated benchmark models are kept")


def _check_counts(args) -> None:
    """Every count flag in range, named when it is not (bench -p -5 was accepted)."""
    for flag, name, lo in (("-p", "n_prompt", 0), ("-n", "n_gen", 0), ("-d", "depth", 0),
                           ("-L", "loops", 1), ("-t", "threads", 1)):
        values = getattr(args, name)
        for v in values or []:
            if v < lo:
                raise ValueError(f"{flag}: every value must be >= {lo}, got {v}")
    if args.repetitions < 1:
        raise ValueError(f"-r must be >= 1, got {args.repetitions}")


def run(args) -> int:
    import tinyloop_py as tl

    _check_counts(args)
    for k in args.kernels:
        if k not in ("simd", "scalar"):
            raise ValueError(f"--kernels: {k!r} is not simd or scalar")
    if args.model:
        paths = {"file": args.model}
    else:
        for d in args.weight_dtype:
            if d not in WEIGHT_DTYPES:
                raise ValueError(f"--weight-dtype: {d!r} is not one of {', '.join(WEIGHT_DTYPES)}")
        paths = {d: bench_model_path(d, args.cache_dir) for d in args.weight_dtype}
    for b in args.fp16_body or []:
        if b not in ("off", "on"):
            raise ValueError(f"--fp16-body: {b!r} is not off or on")
    bodies = [b == "on" for b in args.fp16_body] if args.fp16_body else [None]
    for q in args.quant_activations or []:
        if q not in ("f32", "q8"):
            raise ValueError(f"--quant-activations: {q!r} is not f32 or q8")
    acts = args.quant_activations or [None]
    threads0 = tl.get_num_threads()
    thread_list = args.threads or [threads0]

    models = {}
    try:
        for path_key, path in paths.items():
            need = max(args.depth) + max(args.n_prompt + [0]) + max(args.n_gen + [0]) + 2
            for body in bodies:
                for act in acts:
                    models[path_key, body, act] = tl.Model(path, max_seq_len=need, fp16_body=body,
                                                           quant_activations=act)
        # Every configuration, and every test of it.
        configs = []
        for key, model in models.items():
            cfg = model.config()
            header = read_header(paths[key[0]])
            for L in args.loops or [cfg["default_loops"]]:
                work = Work(header, cfg, L)
                for t in thread_list:
                    for kern in args.kernels:
                        if kern == "scalar" and t != min(thread_list):
                            continue  # the scalar reference is single-threaded: run it once
                        for d in args.depth:
                            for n in args.n_prompt:
                                if n > 0:
                                    configs.append(dict(key=key, L=L, threads=t, kernels=kern, depth=d,
                                                        test=f"pp{n}", n=n, work=work, samples=[]))
                            for n in args.n_gen:
                                if n > 0:
                                    configs.append(dict(key=key, L=L, threads=t, kernels=kern, depth=d,
                                                        test=f"tg{n}", n=n, work=work, samples=[]))
        for rep in range(args.repetitions + 1):  # rep 0: warm-up, not counted
            for c in configs:
                tl.set_num_threads(c["threads"])
                tl.set_force_scalar(c["kernels"] == "scalar")
                model, vocab = models[c["key"]], c["work"].cfg["vocab_size"]
                if c["test"].startswith("pp"):
                    ts = run_pp_at_depth(model, c["n"], c["depth"], c["L"], vocab, rep)
                else:
                    ts = run_tg(model, c["n"], c["depth"], c["L"], vocab, rep)
                if rep > 0:
                    c["samples"].append(ts)
    finally:
        for m in models.values():
            m.close()
        tl.set_force_scalar(False)
        tl.set_num_threads(threads0)

    info = tl.cpu_info()
    rows = []
    for c in configs:
        w, s = c["work"], c["samples"]
        mean = statistics.fmean(s)
        row = dict(model=os.path.basename(paths[c["key"][0]]), weight_dtype=w.dtype,
                   fp16_body=c["work"].cfg["fp16_body"],
                   quant_activations=activation_mode(c["key"]), loops=c["L"],
                   threads=c["threads"], kernels=c["kernels"],
                   simd_target=info["simd_target"] if c["kernels"] == "simd" else "scalar",
                   q8_kernel=(info.get("q8_kernel") if c["kernels"] == "simd" else "scalar")
                   if activation_mode(c["key"]) == "q8" else None,
                   test=c["test"], depth=c["depth"], avg_ts=mean,
                   stddev_ts=statistics.stdev(s) if len(s) > 1 else 0.0, max_ts=max(s), samples_ts=s)
        if c["test"].startswith("tg"):
            row["weight_gb_s"] = w.weight_bytes * mean / 1e9
            row["weight_bytes_per_token"] = w.weight_bytes
        else:
            row["gflop_s"] = w.prefill_flops(c["n"], c["depth"]) / (c["n"] / mean) / 1e9
        rows.append(row)

    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"cpu: {cpu_name()}; SIMD target {info['simd_target']} (compiled: "
          f"{', '.join(info['compiled_targets'])}); q8 kernel {info.get('q8_kernel', '?')}; "
          f"{args.repetitions} repetitions")
    print("| model | wtype | L | threads | kernels | test | t/s | hardware |")
    print("|---|---|---:|---:|---|---|---:|---:|")
    for r in rows:
        test = r["test"] + (f" @ d{r['depth']}" if r["depth"] else "")
        hw = (f"{r['weight_gb_s']:.1f} GB/s weights" if "weight_gb_s" in r
              else f"{r['gflop_s']:.1f} GFLOP/s")
        wtype = r["weight_dtype"] + (" (bf16 body)" if r["fp16_body"] else "")
        if r["quant_activations"] == "q8" and r["weight_dtype"] in ("int8", "int4"):
            wtype += " (q8 act)"
        print(f"| {r['model']} | {wtype} | {r['loops']} | {r['threads']} | "
              f"{r['simd_target'] if r['kernels'] == 'simd' else 'scalar'} | {test} | "
              f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} | {hw} |")
    return 0


def activation_mode(key) -> str:
    """The activation mode a bench model ran with: the --quant-activations setting, else the
    process default (TINYLOOP_QUANT_ACTIVATIONS, f32 when unset)."""
    return key[2] or os.environ.get("TINYLOOP_QUANT_ACTIVATIONS", "f32")


def run_pp_at_depth(model, n_prompt: int, depth: int, loops: int, vocab: int, rep: int) -> float:
    """ppN at depth 0 is one prefill; at depth d the d-token context is prefilled first (a
    prompt of d + N tokens, timed whole) and the d-token prefill is subtracted."""
    if depth == 0:
        return run_pp(model, n_prompt, loops, vocab, rep)
    t_all = n_prompt + depth
    r_all = model.generate_stream(_prompt(t_all, vocab, rep), lambda t: True, max_tokens=1,
                                  loops=loops, temperature=0.0, stop_at_eos=False)
    r_ctx = model.generate_stream(_prompt(depth, vocab, rep), lambda t: True, max_tokens=1,
                                  loops=loops, temperature=0.0, stop_at_eos=False)
    return n_prompt / (max(1e-6, r_all["prefill_ms"] - r_ctx["prefill_ms"]) / 1e3)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tinyloop bench", description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
