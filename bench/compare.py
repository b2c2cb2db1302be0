"""TinyLoop against llama.cpp (llama-cpp-python) on the same model, side by side, one process.

    PYTHONPATH=build-cpu:python python3 bench/compare.py                 # bench model, L=8, F16
    python3 bench/compare.py --model my.tinyloop -L 4 -t 1,2 -p 512 -n 128 -r 5

llama.cpp has no weight sharing across depth, so the looped model is unrolled into a plain
Llama GGUF: n_pre + L * n_loop + n_post layers, layer i holding a copy of the looped layer
it applies (the same weights, stored F16), the same embedding, head and norms. The compute
per token is then the same for both engines; llama.cpp reads L times more distinct weight
bytes, which is the point of a looped model (its loop weights may stay in cache).

ppN: tokens/s of one N-token prompt evaluation (fresh context). tgN: tokens/s of N one-token
evaluations after a one-token prompt (greedy argmax for TinyLoop, which includes its sampler;
llama.cpp is timed on eval alone). The two engines alternate within every repetition, so a
load change on a shared machine hits both; the table gives means and the TinyLoop/llama.cpp
ratio (> 1: TinyLoop faster).

--torch adds Hugging Face transformers on PyTorch CPU (bench/torch_peer.py): the same unrolled
model as a LlamaForCausalLM, eager, torch.set_num_threads(threads), in --torch-dtype weights
(f32 by default; bf16, f16). Without --model TinyLoop also runs the benchmark model stored in
each of those dtypes, so every PyTorch row has a same-precision TinyLoop column beside the
main (F16) one; all engines alternate within every repetition. llama.cpp is then optional (skipped when llama_cpp is missing).

Needs `pip install gguf llama-cpp-python` (and `torch transformers` for --torch). On GCC 12 build llama-cpp-python with AMX off
(docs/benchmarks.md and research/llamacpp_baseline.md explain why):
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


def unrolled_gguf(tinyloop_path: str, loops: int, out_path: str) -> str:
    """Write the looped model unrolled to `loops` as a llama-architecture F16 GGUF."""
    import gguf

    m = read_model(tinyloop_path)
    c, t = m.config, m.tensors
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
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    # A placeholder SentencePiece vocabulary: llama.cpp needs one; ids are all we feed it.
    V = int(c["vocab_size"])
    w.add_tokenizer_model("llama")
    w.add_token_list([b"<unk>", b"<s>", b"</s>"] + [f"t{i}".encode() for i in range(3, V)])
    w.add_token_scores([0.0] * V)
    w.add_token_types([2, 3, 3] + [1] * (V - 3))  # unknown, control, control, normal...
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def f16(a):
        return np.asarray(a, dtype=np.float16)

    def f32(a):
        return np.asarray(a, dtype=np.float32)

    w.add_tensor("token_embd.weight", f16(t["embed.weight"]))
    names = {"attn.wq": "attn_q", "attn.wk": "attn_k", "attn.wv": "attn_v", "attn.wo": "attn_output",
             "mlp.w_gate": "ffn_gate", "mlp.w_up": "ffn_up", "mlp.w_down": "ffn_down"}
    for i, p in enumerate(order):
        w.add_tensor(f"blk.{i}.attn_norm.weight", f32(t[p + "attn_norm.weight"]))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", f32(t[p + "mlp_norm.weight"]))
        for ours, theirs in names.items():
            w.add_tensor(f"blk.{i}.{theirs}.weight", f16(t[p + ours + ".weight"]))
    w.add_tensor("output_norm.weight", f32(t["final_norm.weight"]))
    w.add_tensor("output.weight", f16(t["head.weight" if "head.weight" in t else "embed.weight"]))
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


def llama_tg(llm, n: int, vocab: int, rep: int) -> float:
    rng = np.random.default_rng(rep)
    llm.reset()
    llm.eval([int(rng.integers(3, vocab))])
    t0 = time.perf_counter()
    for _ in range(n):
        llm.eval([int(rng.integers(3, vocab))])
    return n / (time.perf_counter() - t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help=".tinyloop model (default: the f16 benchmark model)")
    ap.add_argument("-L", "--loops", type=int, default=None, help="loop depth (default: the model's)")
    ap.add_argument("-t", "--threads", type=bench._ints, default=[2])
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--torch", action="store_true",
                    help="also run transformers on PyTorch CPU, eager (bench/torch_peer.py)")
    ap.add_argument("--torch-dtype", type=bench._strs, default=["f32"],
                    help="PyTorch weight dtypes, comma-separated: f32, bf16, f16 (default f32)")
    args = ap.parse_args(argv)

    import tinyloop_py as tl
    try:
        from llama_cpp import Llama
    except ImportError:
        if not args.torch:
            raise
        Llama = None  # --torch alone: TinyLoop against PyTorch
        print("(llama_cpp not installed: llama.cpp rows skipped)", file=sys.stderr)

    path = args.model or bench.bench_model_path("f16", args.cache_dir)
    loops = args.loops or read_header_loops(path)
    gguf_path = os.path.splitext(path)[0] + f"-unrolled-L{loops}-f16.gguf"
    if Llama is not None and not os.path.exists(gguf_path):
        print(f"(writing {gguf_path})", file=sys.stderr)
        unrolled_gguf(path, loops, gguf_path + ".tmp")
        os.replace(gguf_path + ".tmp", gguf_path)

    n_ctx = args.n_prompt + args.n_gen + 8
    results = []  # (threads, test, tinyloop samples, llama samples)
    peer = torch_setup(args, tl, path, loops, n_ctx) if args.torch else None
    threads0 = tl.get_num_threads()
    with tl.Model(path, max_seq_len=n_ctx) as model:
        vocab = model.config()["vocab_size"]
        for th in args.threads:
            tl.set_num_threads(th)
            llm = None if Llama is None else Llama(
                gguf_path, n_ctx=n_ctx, n_batch=args.n_prompt, n_ubatch=args.n_prompt,
                n_threads=th, n_threads_batch=th, verbose=False)
            if peer:
                peer.set_threads(th)
            s = {k: [] for k in ("tl_pp", "ll_pp", "tl_tg", "ll_tg")}
            for rep in range(args.repetitions + 1):  # rep 0: warm-up
                got = dict(tl_pp=bench.run_pp(model, args.n_prompt, loops, vocab, rep))
                if llm:
                    got["ll_pp"] = llama_pp(llm, args.n_prompt, vocab, rep)
                if peer:
                    got.update(peer.pp(args.n_prompt, loops, vocab, rep))
                got["tl_tg"] = bench.run_tg(model, args.n_gen, 0, loops, vocab, rep)
                if llm:
                    got["ll_tg"] = llama_tg(llm, args.n_gen, vocab, rep)
                if peer:
                    got.update(peer.tg(args.n_gen, loops, vocab, rep))
                if rep > 0:
                    for k, v in got.items():
                        s.setdefault(k, []).append(v)
            del llm
            if Llama is not None:
                results.append((th, f"pp{args.n_prompt}", s["tl_pp"], s["ll_pp"]))
                results.append((th, f"tg{args.n_gen}", s["tl_tg"], s["ll_tg"]))
            if peer:
                peer.collect(th, args, s)
    tl.set_num_threads(threads0)

    if results:
        print(f"model: {os.path.basename(path)} at L={loops} (llama.cpp: {os.path.basename(gguf_path)}), "
              f"F16 weights, {args.repetitions} repetitions, SIMD target {tl.cpu_info()['simd_target']}")
        print("| threads | test | TinyLoop t/s | llama.cpp t/s | ratio |")
        print("|---:|---|---:|---:|---:|")
    for th, test, a, b in results:
        ma, mb = statistics.fmean(a), statistics.fmean(b)
        sa = statistics.stdev(a) if len(a) > 1 else 0.0
        sb = statistics.stdev(b) if len(b) > 1 else 0.0
        print(f"| {th} | {test} | {ma:.2f} ± {sa:.2f} | {mb:.2f} ± {sb:.2f} | {ma / mb:.2f} |")
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
                     args.torch_dtype)


def read_header_loops(path: str) -> int:
    import tinyloop_py as tl

    with tl.Model(path) as m:
        return int(m.config()["default_loops"])


if __name__ == "__main__":
    sys.exit(main())
