"""Roofline: TinyLoop's speeds beside what this machine allows, so a speed target can be
checked against the hardware before anyone tunes for it.

    python3 bench/roofline.py                                  # bench model, F16, L = 8, 1 and 2 threads
    python3 bench/roofline.py --kv-mode fp16,int8 -d 128,4096 -p 512 -t 1,2 --llama
    python3 bench/roofline.py --model my.tinyloop -L 4 --weight-dtype f16

What the machine allows is measured first, per thread count, by the backend's own probes
(tinyloop_py._testing.machine_bounds: a streaming read of a 1 GiB buffer and independent FMA
chains on the kernels' SIMD target, each best of 5, all threads at once).

Prefill: the model math of a ppN (the matmuls of every layer application, and causal
attention over the prompt; the LM head once per prompt is left out) divided by the prefill
time gives the GFLOP/s run, then its share of the FMA peak.

Decode at context D: the K/V a token reads grows with D (every KV slot: n_pre + L * n_loop +
n_post, each 2 x n_kv_heads x head_dim values a position in the kv_mode's bytes). Beside the
measured rate r(D) the table gives
  - "K/V GB/s": the rate at which the K/V added beyond the first depth D0 were read, if all
    of the extra time per token went to them: (bytes(D) - bytes(D0)) / (1/r(D) - 1/r(D0));
  - "ceiling": the best r(D) possible if those bytes came at the probe's read bandwidth and
    nothing else changed: 1 / (1/r(D0) + (bytes(D) - bytes(D0)) / bandwidth);
  - "r(D)/r(D0)" measured and at the ceiling: a target such as "the 4096 rate at least 70 %
    of the 128 rate" is out of reach on this machine when the ceiling's ratio is below it.
bytes(D) counts the average context of the timed steps (D + n / 2).

--llama adds llama.cpp (llama-cpp-python) on the unrolled F16 twin of bench/compare.py (F16
K/V, flash attention off, its defaults), F16 weights only: its prefill GFLOP/s and share of
the peak, and its decode rates, in the same run (the engines alternate in every repetition).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "python"))
sys.path.insert(0, _HERE)

from peak_rss import tinyloop_slots  # noqa: E402  (KV slots: one per layer application)
from tinyloop import bench  # noqa: E402

# Bytes of one K or V value per kv_mode, and the per-row scale bytes (int8 rows carry a float32
# scale per position and kv head, for K and for V).
KV_VALUE_BYTES = {"fp32": 4, "fp16": 2, "int8": 1}
KV_SCALE_BYTES = {"fp32": 0, "fp16": 0, "int8": 4}


def kv_bytes_per_position(c: dict, loops: int, kv_mode: str) -> int:
    """K + V bytes of one position over every slot."""
    if kv_mode not in KV_VALUE_BYTES:
        raise ValueError(f"kv_mode {kv_mode!r}: roofline.py knows {sorted(KV_VALUE_BYTES)} (the K/V cache modes)")
    per_slot = 2 * c["n_kv_heads"] * (c["head_dim"] * KV_VALUE_BYTES[kv_mode] + KV_SCALE_BYTES[kv_mode])
    return tinyloop_slots(c, loops) * per_slot


def prefill_flops_per_token(c: dict, loops: int, n_prompt: int) -> float:
    """Flops (2 per multiply-add) per prompt token of an n_prompt prefill from an empty cache:
    Q, K, V, O and the MLP of every layer application, and causal attention (QK and weighted V
    over (n_prompt + 1) / 2 keys on average). The LM head (once per prompt) is left out."""
    dim, hd, nh, nkv, ffn = c["dim"], c["head_dim"], c["n_heads"], c["n_kv_heads"], c["ffn_dim"]
    proj = dim * nh * hd + 2 * dim * nkv * hd + nh * hd * dim
    mlp = (3 if c["mlp"] == "swiglu" else 2) * dim * ffn
    attn = 2 * nh * hd * (n_prompt + 1) / 2
    return 2.0 * tinyloop_slots(c, loops) * (proj + mlp + attn)


def decode_columns(r0: float, r: float, extra_bytes: float, read_gbps: float) -> tuple[float, float]:
    """(K/V GB/s implied, ceiling t/s) at a depth whose K/V exceed the first depth's by
    extra_bytes a token, r0 and r the measured rates (see the module doc)."""
    dt = 1.0 / r - 1.0 / r0
    implied = extra_bytes / dt / 1e9 if dt > 0 else float("inf")
    ceiling = 1.0 / (1.0 / r0 + extra_bytes / (read_gbps * 1e9))
    return implied, ceiling


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a .tinyloop file (default: the benchmark model per --weight-dtype)")
    ap.add_argument("--weight-dtype", default="f16", help="f32, f16, bf16, int8 or int4 (the generated model)")
    ap.add_argument("--kv-mode", type=bench._strs, default=["fp16"], help="fp32, fp16, int8 (comma-separated)")
    ap.add_argument("-L", "--loops", type=int, default=None, help="loop depth (default: the model's)")
    ap.add_argument("-t", "--threads", type=bench._ints, default=[1, 2], help="thread counts")
    ap.add_argument("-p", "--n-prompt", type=int, default=512, help="prefill length (0: no prefill row)")
    ap.add_argument("-n", "--n-gen", type=int, default=32, help="decode steps timed at each depth (0: none)")
    ap.add_argument("-d", "--depth", type=bench._ints, default=[128, 4096],
                    help="contexts before the timed steps; the first one is the reference D0")
    ap.add_argument("-r", "--repetitions", type=int, default=2)
    ap.add_argument("--read-mib", type=int, default=1024, help="the bandwidth probe's buffer (MiB)")
    ap.add_argument("--llama", action="store_true", help="add llama.cpp on the unrolled F16 twin (F16 weights)")
    args = ap.parse_args(argv)
    if args.n_prompt < 0 or args.n_gen < 0 or (args.n_prompt == 0 and args.n_gen == 0):
        ap.error(f"-p and -n must be >= 0 and not both 0, got -p {args.n_prompt} -n {args.n_gen}")
    if args.n_gen > 0 and (not args.depth or min(args.depth) < 1):
        ap.error(f"-d needs depths >= 1, got {args.depth}")
    if args.repetitions < 1:
        ap.error(f"-r must be >= 1, got {args.repetitions}")
    for kv in args.kv_mode:
        if kv not in KV_VALUE_BYTES:
            ap.error(f"--kv-mode {kv!r}: expected one of {sorted(KV_VALUE_BYTES)}")
    if args.weight_dtype not in bench.WEIGHT_DTYPES:
        ap.error(f"--weight-dtype {args.weight_dtype!r}: expected one of {list(bench.WEIGHT_DTYPES)}")

    if args.llama and args.model is None and args.weight_dtype != "f16":
        ap.error("--llama compares F16 weights only (use --weight-dtype f16)")

    import tinyloop_py as tl
    from tinyloop_py import _testing

    path = args.model or bench.bench_model_path(args.weight_dtype)
    n_ctx = max(args.n_prompt, max(args.depth) if args.n_gen else 0) + args.n_gen + 8
    models = {kv: tl.Model(path, max_seq_len=n_ctx, kv_mode=kv) for kv in args.kv_mode}
    c = next(iter(models.values())).config()
    loops = args.loops or c["default_loops"]
    vocab = c["vocab_size"]
    llm_path = peer = None
    if args.llama:
        import compare as peer  # bench/compare.py: the unrolled twin and llama.cpp's timings
        llm_path = os.path.splitext(path)[0] + f"-unrolled-L{loops}-f16.gguf"
        if not os.path.exists(llm_path):
            print(f"(writing {llm_path})", file=sys.stderr)
            peer.unrolled_gguf(path, loops, llm_path + ".tmp")
            os.replace(llm_path + ".tmp", llm_path)

    threads0 = tl.get_num_threads()
    flops_tok = prefill_flops_per_token(c, loops, args.n_prompt) if args.n_prompt else 0.0
    print(f"{os.path.basename(path)}, L = {loops}, {tl.cpu_info()['simd_target']}, "
          f"{args.repetitions} repetitions (means)")
    try:
        for th in args.threads:
            tl.set_num_threads(th)
            mb = _testing.machine_bounds(th, read_mib=args.read_mib)
            llm = None
            if llm_path:
                from llama_cpp import Llama
                batch = max(args.n_prompt, 512)
                llm = Llama(llm_path, n_ctx=n_ctx, n_batch=batch, n_ubatch=batch, n_threads=th,
                            n_threads_batch=th, verbose=False)
            print(f"\n{th} thread(s): memory read {mb['read_gbps']:.1f} GB/s, FMA peak "
                  f"{mb['fma_gflops']:.0f} GFLOP/s (float32, {mb['simd_target']})")
            engines = {f"TinyLoop KV {kv}": ("tl", m, kv) for kv, m in models.items()}
            if llm is not None:
                engines["llama.cpp KV f16"] = ("llama", llm, "fp16")
            pp = {e: [] for e in engines}
            tg = {(e, d): [] for e in engines for d in args.depth}
            for rep in range(args.repetitions + 1):  # rep 0: warm-up (short)
                for e, (kind, m, _) in engines.items():
                    if args.n_prompt:
                        v = (bench.run_pp(m, args.n_prompt, loops, vocab, rep) if kind == "tl"
                             else peer.llama_pp(m, args.n_prompt, vocab, rep))
                        if rep:
                            pp[e].append(v)
                    for d in (args.depth if rep and args.n_gen else []):
                        v = (bench.run_tg(m, args.n_gen, d, loops, vocab, rep) if kind == "tl"
                             else peer.llama_tg(m, args.n_gen, vocab, rep, depth=d))
                        tg[(e, d)].append(v)
            if args.n_prompt:
                print(f"\n| engine | pp{args.n_prompt} t/s | GFLOP/s | of the FMA peak |")
                print("|---|---:|---:|---:|")
                for e in engines:
                    r = statistics.fmean(pp[e])
                    g = r * flops_tok / 1e9
                    print(f"| {e} | {r:.1f} | {g:.0f} | {100 * g / mb['fma_gflops']:.0f} % |")
            if args.n_gen:
                d0 = args.depth[0]
                print(f"\n| engine | D | tg{args.n_gen} t/s | K/V MB a token | K/V GB/s | ceiling t/s "
                      f"| r(D)/r({d0}) | at the ceiling |")
                print("|---|---:|---:|---:|---:|---:|---:|---:|")
                for e, (_, _, kv) in engines.items():
                    bpp = kv_bytes_per_position(c, loops, kv)
                    r0 = statistics.fmean(tg[(e, d0)])
                    for d in args.depth:
                        r = statistics.fmean(tg[(e, d)])
                        kv_b = bpp * (d + args.n_gen / 2)
                        if d == d0:
                            print(f"| {e} | {d} | {r:.1f} | {kv_b / 1e6:.1f} | | | | |")
                            continue
                        implied, ceil = decode_columns(r0, r, bpp * (d - d0), mb["read_gbps"])
                        print(f"| {e} | {d} | {r:.1f} | {kv_b / 1e6:.1f} | {implied:.1f} | {ceil:.1f} | "
                              f"{100 * r / r0:.0f} % | {100 * ceil / r0:.0f} % |")
            del llm
    finally:
        for m in models.values():
            m.close()
        tl.set_num_threads(threads0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
