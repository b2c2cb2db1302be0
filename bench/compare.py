"""TinyLoop against llama.cpp (llama-cpp-python) on the same model, side by side, one process.

    PYTHONPATH=build-cpu:python python3 bench/compare.py                 # bench model, L=8, F16
    python3 bench/compare.py --model my.tinyloop -L 4 -t 1,2 -p 512 -n 128 -r 5
    python3 bench/compare.py --weight-dtype f16,int8,int4 --quant-activations q8,f32

llama.cpp has no weight sharing across depth, so the looped model is unrolled into a plain
Llama GGUF: n_pre + L * n_loop + n_post layers, layer i holding a copy of the looped layer
it applies (the same weights, stored F16), the same embedding, head and norms. The compute
per token is then the same for both engines; llama.cpp reads L times more distinct weight
bytes, which is the point of a looped model (its loop weights may stay in cache).

--weight-dtype int8 / int4 compare against llama.cpp's Q8_0 / Q4_0 on the same weights: the F32
model's matrices are quantized once by gguf-py's reference quantizer, the blocks go into the
unrolled GGUF as they are and into TinyLoop's int8 / int4 (lossless repack, as `tinyloop
convert` does). TinyLoop runs them with --quant-activations q8 (llama.cpp's 8-bit activations,
the same arithmetic) and/or f32 (exact activations).

ppN: tokens/s of one N-token prompt evaluation (fresh context). tgN: tokens/s of N one-token
evaluations after a one-token prompt (greedy argmax for TinyLoop, which includes its sampler;
llama.cpp is timed on eval alone). -d D1,D2 (context depth) adds "tgN @ dD" rows: the N
evaluations after a D-token prompt whose prefill is not timed, so each step attends over D
and more positions in every layer application (long-context decode: K/V reads grow with D
and with L). The warm-up round runs depth 0 only. The two engines alternate within every repetition, so a
load change on a shared machine hits both; the table gives means and the TinyLoop/llama.cpp
ratio (> 1: TinyLoop faster).

--torch adds Hugging Face transformers on PyTorch CPU (bench/torch_peer.py): the same unrolled
model as a LlamaForCausalLM, eager, torch.set_num_threads(threads), in --torch-dtype weights
(f32 by default; bf16, f16). Without --model TinyLoop also runs the benchmark model stored in
each of those dtypes, so every PyTorch row has a same-precision TinyLoop column beside the
main (F16) one; all engines alternate within every repetition. llama.cpp is then optional (skipped when
llama_cpp is missing).

Needs `pip install gguf llama-cpp-python` (and `torch transformers` for --torch). On GCC 12 build
llama-cpp-python with AMX off
(docs/benchmarks.md, "How to reproduce", explains why):
    CMAKE_ARGS="-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' \\
                -DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'" \\
      pip install --no-build-isolation llama-cpp-python
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "python"))

from tinyloop import bench  # noqa: E402
from tinyloop.format import read_model  # noqa: E402


def unrolled_gguf(tinyloop_path: str, loops: int, out_path: str, quant=None) -> str:
    """Write the looped model unrolled to `loops` as a llama-architecture GGUF: weight matrices
    F16, or in `quant` ({name: (GGML type, block bytes [N, K/32 * block size])}, from
    quantized_pair) for the matrices it lists; norms F32."""
    import gguf

    m = read_model(tinyloop_path)
    c, t = m.config, m.tensors
    quant = quant or {}
    if c["norm_placement"] != "pre" or c["mlp"] != "swiglu" or c["inject"] != "none" \
            or c["qkv_fused"] or c["norm_type"] != "rmsnorm" or c["pos_encoding"] != "rope_half":
        raise ValueError("compare.py unrolls plain Llama-style looped models only (pre-norm RMSNorm, "
                         "SwiGLU, split qkv, no injection, rope_half)")
    order = ([f"pre.{i}." for i in range(c["n_pre_blocks"])]
             + [f"loop.{j}." for _ in range(loops) for j in range(c["n_loop_layers"])]
             + [f"post.{k}." for k in range(c["n_post_blocks"])])
    w = gguf.GGUFWriter(out_path, "llama")
    w.add_name(f"{os.path.basename(tinyloop_path)} unrolled L={loops}")
    w.add_context_length(int(c["max_seq_len"]))
    w.add_embedding_length(int(c["dim"]))
    w.add_block_count(len(order))
    w.add_feed_forward_length(int(c["ffn_dim"]))
    w.add_head_count(int(c["n_heads"]))
    w.add_head_count_kv(int(c["n_kv_heads"]))
    w.add_rope_dimension_count(int(c["head_dim"]))
    w.add_rope_freq_base(float(c["rope_theta"]))
    w.add_layer_norm_rms_eps(float(c["norm_eps"]))
    qtypes = {q for q, _ in quant.values()}
    w.add_file_type({gguf.GGMLQuantizationType.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
                     gguf.GGMLQuantizationType.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0}.get(
                         next(iter(qtypes), None), gguf.LlamaFileType.MOSTLY_F16))
    # A placeholder SentencePiece vocabulary: llama.cpp needs one; ids are all we feed it.
    V = int(c["vocab_size"])
    w.add_tokenizer_model("llama")
    w.add_token_list([b"<unk>", b"<s>", b"</s>"] + [f"t{i}".encode() for i in range(3, V)])
    w.add_token_scores([0.0] * V)
    w.add_token_types([2, 3, 3] + [1] * (V - 3))  # unknown, control, control, normal...
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def matrix(name):
        if name in quant:  # the same quantized blocks TinyLoop's file was repacked from
            qtype, blocks = quant[name]
            return dict(tensor=blocks, raw_dtype=qtype)
        return dict(tensor=np.asarray(t[name], dtype=np.float16))

    def f32(a):
        return np.asarray(a, dtype=np.float32)

    w.add_tensor("token_embd.weight", **matrix("embed.weight"))
    names = {"attn.wq": "attn_q", "attn.wk": "attn_k", "attn.wv": "attn_v", "attn.wo": "attn_output",
             "mlp.w_gate": "ffn_gate", "mlp.w_up": "ffn_up", "mlp.w_down": "ffn_down"}
    for i, p in enumerate(order):
        w.add_tensor(f"blk.{i}.attn_norm.weight", f32(t[p + "attn_norm.weight"]))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", f32(t[p + "mlp_norm.weight"]))
        for ours, theirs in names.items():
            w.add_tensor(f"blk.{i}.{theirs}.weight", **matrix(p + ours + ".weight"))
    w.add_tensor("output_norm.weight", f32(t["final_norm.weight"]))
    w.add_tensor("output.weight", **matrix("head.weight" if "head.weight" in t else "embed.weight"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path


def llama_pp(llm, n: int, vocab: int, rep: int) -> float:
    toks = [int(v) for v in bench._prompt(n, vocab, rep)]
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(toks)
    return n / (time.perf_counter() - t0)


def llama_tg(llm, n: int, vocab: int, rep: int, depth: int = 0) -> float:
    """Tokens/s of n one-token evaluations after a max(1, depth)-token prompt (untimed), the
    prompt the same as TinyLoop's (bench.run_tg)."""
    rng = np.random.default_rng(rep)
    llm.reset()
    llm.eval([int(t) for t in bench._prompt(depth, vocab, rep)] if depth > 0 else [int(rng.integers(3, vocab))])
    t0 = time.perf_counter()
    for _ in range(n):
        llm.eval([int(rng.integers(3, vocab))])
    return n / (time.perf_counter() - t0)


GGML_FOR = {"int8": "Q8_0", "int4": "Q4_0"}  # the llama.cpp type each TinyLoop weight type is compared with
KV_FOR = {"fp16": "f16", "int8": "q8_0"}  # the llama.cpp K/V cache type each TinyLoop kv_mode is compared with


def quantized_pair(src_path: str, weight_dtype: str, loops: int, cache_dir: str) -> tuple[str, str]:
    """The same quantized weights for both engines: every weight matrix of the (float) model at
    src_path quantized once by gguf-py's reference quantizer (Q8_0 or Q4_0, blocks of 32), then
    stored as-is in the unrolled GGUF and repacked losslessly into TinyLoop's int8 / int4
    (python/tinyloop/convert/gguf_repack.py: W = s * q (+ o), the values llama.cpp decodes).
    Returns (.tinyloop path, .gguf path), cached."""
    import gguf
    from tinyloop.convert.gguf_repack import repack
    from tinyloop.format import write_model
    from tinyloop.quantize import is_quantizable

    qname = GGML_FOR[weight_dtype]
    base = os.path.join(cache_dir, os.path.splitext(os.path.basename(src_path))[0] + f"-{qname.lower()}")
    tl_path, gguf_path = base + ".tinyloop", base + f"-unrolled-L{loops}.gguf"
    if os.path.exists(tl_path) and os.path.exists(gguf_path):
        return tl_path, gguf_path
    print(f"(quantizing {os.path.basename(src_path)} to {qname} for both engines)", file=sys.stderr)
    qtype = getattr(gguf.GGMLQuantizationType, qname)
    m = read_model(src_path)
    tensors, quant = {}, {}
    for name, a in m.tensors.items():
        a = np.asarray(a, dtype=np.float32)
        if a.ndim == 2 and is_quantizable(name) and a.shape[1] % 32 == 0:
            blocks = gguf.quants.quantize(a, qtype)  # [N, K / 32 * block bytes] uint8
            quant[name] = (qtype, blocks)
            tensors.update(repack(name, qtype, blocks, a.shape[0], a.shape[1]))
        else:
            tensors[name] = a
    write_model(tl_path + ".tmp", m.config, tensors)
    os.replace(tl_path + ".tmp", tl_path)
    unrolled_gguf(src_path, loops, gguf_path + ".tmp", quant)
    os.replace(gguf_path + ".tmp", gguf_path)
    return tl_path, gguf_path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help=".tinyloop model (default: the benchmark model)")
    ap.add_argument("-L", "--loops", type=int, default=None, help="loop depth (default: the model's)")
    ap.add_argument("-t", "--threads", type=bench._ints, default=[2])
    ap.add_argument("-p", "--n-prompt", type=int, default=512, help="prompt length of ppN (0: no pp rows)")
    ap.add_argument("-n", "--n-gen", type=int, default=128, help="tokens of tgN (0: no tg rows)")
    ap.add_argument("-d", "--depth", type=bench._ints, default=[0],
                    help="context depths for tg, comma-separated (0: after a one-token prompt)")
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--weight-dtype", type=bench._strs, default=["f16"],
                    help="comma-separated: f16 (llama.cpp F16), int8 (vs Q8_0), int4 (vs Q4_0); "
                         "the quantized ones use the same blocks on both sides (default f16)")
    ap.add_argument("--quant-activations", type=bench._strs, default=["q8"],
                    help="TinyLoop activation modes for int8 / int4 rows, comma-separated: q8 "
                         "(llama.cpp's arithmetic), f32 (default q8)")
    ap.add_argument("--fp16-body", action="store_true",
                    help="also run the F16 model with the reduced-precision loop body (fp16_body=True: "
                         "bf16 dot products) against the same llama.cpp F16 GGUF")
    ap.add_argument("--kv-mode", type=bench._strs, default=["fp16"],
                    help="TinyLoop K/V storage (kv_mode), comma-separated: fp16 (against llama.cpp's F16 "
                         "cache), int8 (against its q8_0 cache, which needs flash attention: on for "
                         "those rows) (default fp16)")
    ap.add_argument("--llama-flash-attn", choices=("off", "on"), default="off",
                    help="llama.cpp flash attention (off: llama-cpp-python's default; llama-cli and "
                         "llama-server default to auto, which is on for the CPU backend)")
    ap.add_argument("--torch", action="store_true",
                    help="also run transformers on PyTorch CPU, eager (bench/torch_peer.py)")
    ap.add_argument("--torch-dtype", type=bench._strs, default=["f32"],
                    help="PyTorch weight dtypes, comma-separated: f32, bf16, f16, int8 (dynamic "
                         "quantization; TinyLoop's int8 model in q8 mode alongside) (default f32)")
    args = ap.parse_args(argv)
    for wd in args.weight_dtype:
        if wd not in ("f16", *GGML_FOR):
            ap.error(f"--weight-dtype {wd!r}: expected f16, int8 or int4")
    for qa in args.quant_activations:
        if qa not in ("q8", "f32"):
            ap.error(f"--quant-activations {qa!r}: expected q8 or f32")
    for kv in args.kv_mode:
        if kv not in KV_FOR:
            ap.error(f"--kv-mode {kv!r}: expected fp16 or int8")
    if args.n_prompt < 0 or args.n_gen < 0 or (args.n_prompt == 0 and args.n_gen == 0):
        ap.error(f"-p and -n must be >= 0 and not both 0, got -p {args.n_prompt} -n {args.n_gen}")

    import tinyloop_py as tl
    try:
        import llama_cpp
        from llama_cpp import Llama
    except ImportError:
        if not args.torch:
            raise
        Llama = None  # --torch alone: TinyLoop against PyTorch
        print("(llama_cpp not installed: llama.cpp rows skipped)", file=sys.stderr)

    cache_dir = bench.bench_dir(args.cache_dir)
    path = args.model or bench.bench_model_path("f16", args.cache_dir)
    loops = args.loops or read_header_loops(path)
    # configs: (label, TinyLoop file, Model kwargs, llama.cpp peer); a peer is (GGUF file, K/V
    # type, flash attention), one llama.cpp context each.
    base = []  # (label, TinyLoop file, Model kwargs, GGUF file) per weight type
    for wd in args.weight_dtype:
        if wd == "f16":
            gguf_path = os.path.splitext(path)[0] + f"-unrolled-L{loops}-f16.gguf"
            if Llama is not None and not os.path.exists(gguf_path):
                print(f"(writing {gguf_path})", file=sys.stderr)
                unrolled_gguf(path, loops, gguf_path + ".tmp")
                os.replace(gguf_path + ".tmp", gguf_path)
            base.append(("F16 / F16", path, {}, gguf_path))
            if args.fp16_body:
                base.append(("F16 bf16 body / F16", path, {"fp16_body": True}, gguf_path))
            continue
        src = args.model or bench.bench_model_path("f32", args.cache_dir)
        tl_path, gguf_path = quantized_pair(src, wd, loops, cache_dir)
        for qa in args.quant_activations:
            base.append((f"{wd} {qa} / {GGML_FOR[wd]}", tl_path, {"quant_activations": qa}, gguf_path))
    configs = []
    for kv in args.kv_mode:
        # llama.cpp stores a q8_0 V cache only with flash attention on.
        fa = args.llama_flash_attn == "on" or kv == "int8"
        suffix = "" if kv == "fp16" and len(args.kv_mode) == 1 else f", KV {kv} / {KV_FOR[kv]}"
        suffix += " (llama.cpp FA)" if fa and args.llama_flash_attn == "off" else ""
        for label, p, kw, g in base:
            configs.append((label + suffix, p, {**kw, "kv_mode": kv}, (g, KV_FOR[kv], fa)))

    n_ctx = max(args.n_prompt, max(args.depth)) + args.n_gen + 8
    results = []  # (threads, config label, test, tinyloop samples, llama samples)
    peer = torch_setup(args, tl, path, loops, n_ctx) if args.torch else None
    threads0 = tl.get_num_threads()
    models = [tl.Model(p, max_seq_len=n_ctx, **kw) for _, p, kw, _ in configs]
    try:
        vocab = models[0].config()["vocab_size"]
        for th in args.threads:
            tl.set_num_threads(th)
            llms = {}
            if Llama is not None:
                for *_, g in configs:
                    if g not in llms:
                        batch = max(args.n_prompt, 512)  # one batch for the pp prompt
                        gguf_path, kv_type, fa = g
                        t = getattr(llama_cpp, f"GGML_TYPE_{kv_type.upper()}")
                        llms[g] = Llama(gguf_path, n_ctx=n_ctx, n_batch=batch, n_ubatch=batch,
                                        n_threads=th, n_threads_batch=th, type_k=t, type_v=t,
                                        flash_attn=fa, verbose=False)
            if peer:
                peer.set_threads(th)
            s = {}

            def depths(rep):
                if args.n_gen == 0:
                    return []  # -n 0: prefill only
                return args.depth if rep > 0 else [0]  # the warm-up round: no long prefills

            for rep in range(args.repetitions + 1):  # rep 0: warm-up
                got = {}
                for (label, _, _, g), model in zip(configs, models):
                    if args.n_prompt > 0:
                        got[(label, "tl_pp")] = bench.run_pp(model, args.n_prompt, loops, vocab, rep)
                    for d in depths(rep):
                        got[(label, f"tl_tg{d}")] = bench.run_tg(model, args.n_gen, d, loops, vocab, rep)
                for g, llm in llms.items():  # each GGUF once, whatever the TinyLoop modes
                    if args.n_prompt > 0:
                        got[(g, "ll_pp")] = llama_pp(llm, args.n_prompt, vocab, rep)
                    for d in depths(rep):
                        got[(g, f"ll_tg{d}")] = llama_tg(llm, args.n_gen, vocab, rep, d)
                if peer:
                    got.update(peer.pp(args.n_prompt, loops, vocab, rep))
                    got.update(peer.tg(args.n_gen, loops, vocab, rep))
                if rep > 0:
                    for k, v in got.items():
                        s.setdefault(k, []).append(v)
            llms.clear()
            if Llama is not None:
                for label, _, _, g in configs:
                    if args.n_prompt > 0:
                        results.append((th, label, f"pp{args.n_prompt}", s[(label, "tl_pp")], s[(g, "ll_pp")]))
                    for d in depths(1):
                        test = f"tg{args.n_gen}" + (f" @ d{d}" if d else "")
                        results.append((th, label, test, s[(label, f"tl_tg{d}")], s[(g, f"ll_tg{d}")]))
            if peer:
                # The peer's table: its own samples, and the first TinyLoop config as "tl".
                main = {("tl_tg" if k[1] == "tl_tg0" else k[1]): v for k, v in s.items()
                        if isinstance(k, tuple) and k[0] == configs[0][0] and k[1] in ("tl_pp", "tl_tg0")}
                peer.collect(th, args, {k: v for k, v in s.items() if isinstance(k, str)} | main)
    finally:
        for m in models:
            m.close()
    tl.set_num_threads(threads0)

    if results:
        print(f"model: {os.path.basename(path)} at L={loops}, unrolled for llama.cpp; weights TinyLoop / "
              f"llama.cpp; {args.repetitions} repetitions, SIMD target {tl.cpu_info()['simd_target']}, "
              f"load average {os.getloadavg()[0]:.1f}")
        print("| threads | weights | test | TinyLoop t/s | llama.cpp t/s | ratio |")
        print("|---:|---|---|---:|---:|---:|")
    for th, label, test, a, b in results:
        ma, mb = statistics.fmean(a), statistics.fmean(b)
        sa = statistics.stdev(a) if len(a) > 1 else 0.0
        sb = statistics.stdev(b) if len(b) > 1 else 0.0
        print(f"| {th} | {label} | {test} | {ma:.2f} ± {sa:.2f} | {mb:.2f} ± {sb:.2f} | {ma / mb:.2f} |")
    if peer:
        peer.report(tl, path, loops, args)
    return 0


def torch_setup(args, tl, path: str, loops: int, n_ctx: int):
    """The PyTorch peer of --torch (bench/torch_peer.py), built once for every thread count."""
    from torch_peer import TorchPeer

    # PyTorch gets the F32 benchmark model's weights (the F16 / BF16 ones hold the same values
    # rounded), and TinyLoop runs the benchmark model in each PyTorch dtype too; with --model,
    # that model's own weights and only that model.
    if args.model:
        hdr = bench.read_header(path)
        dtype = hdr["head.weight" if "head.weight" in hdr else "embed.weight"]["dtype"].lower()
        return TorchPeer(tl, path, {}, dtype, loops, n_ctx, args.torch_dtype)
    same = {d: bench.bench_model_path(d, args.cache_dir) for d in args.torch_dtype}
    return TorchPeer(tl, bench.bench_model_path("f32", args.cache_dir), same, "f16", loops, n_ctx,
                     args.torch_dtype, fp16_body=args.fp16_body)


def read_header_loops(path: str) -> int:
    import tinyloop_py as tl

    with tl.Model(path) as m:
        return int(m.config()["default_loops"])


if __name__ == "__main__":
    sys.exit(main())
