"""The PyTorch side of bench/compare.py --torch: the looped model unrolled into a Hugging Face
`transformers.LlamaForCausalLM` (the same weights), timed eagerly on the CPU.

The unrolled model has n_pre + L * n_loop + n_post layers, layer i a distinct copy of the
looped layer it applies (as in the llama.cpp GGUF), so PyTorch streams L times more distinct
weight bytes, the same as any non-looped engine would. Timing follows bench/compare.py:
ppN is one N-token forward with a fresh KV cache (logits of the last row only, as TinyLoop's
prefill and llama.cpp's eval compute them); tgN is N greedy one-token steps with the KV cache
(DynamicCache) after a one-token prompt, argmax included. Everything runs under
torch.inference_mode() with torch.set_num_threads(threads): plain eager PyTorch, no
torch.compile.

"int8" is PyTorch's own eager int8 path: the F32 model through
torch.ao.quantization.quantize_dynamic on every nn.Linear (the head included) with
per-channel int8 weights, activations quantized per call (fbgemm, VNNI on x86). TinyLoop's
same-weights row then runs its int8 benchmark model (groups of 32) with
quant_activations="q8": int8 weights and int8 activations on both sides.

With compare.py --fp16-body, each float dtype's TinyLoop model also runs with
fp16_body=True (every layer's matmuls in bf16, AMX tiles where the CPU has them) in a row of
its own, the arithmetic closest to PyTorch's BF16 (which runs everything in bf16 on oneDNN).
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.join(_HERE, "..", "python") not in sys.path:
    sys.path.insert(0, os.path.join(_HERE, "..", "python"))

from tinyloop import bench  # noqa: E402
from tinyloop.format import read_model  # noqa: E402

TORCH_DTYPES = ("f32", "bf16", "f16", "int8")


def _torch_dtype(name: str):
    import torch

    try:
        return {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[name]
    except KeyError:
        raise ValueError(f"torch dtype {name!r}: expected one of {list(TORCH_DTYPES)}") from None


def tinyloop_kwargs(dtype: str) -> dict:
    """How TinyLoop runs its same-weights model for a PyTorch dtype: int8 with int8
    activations (PyTorch's dynamic quantization quantizes them too), the rest exact."""
    return {"quant_activations": "q8"} if dtype == "int8" else {}


def unrolled_llama(tinyloop_path: str, loops: int, dtype: str = "f32"):
    """The looped model at `loops` as an eval-mode LlamaForCausalLM with weights in `dtype`."""
    import torch
    import transformers

    m = read_model(tinyloop_path)
    c, t = m.config, m.tensors
    if c["norm_placement"] != "pre" or c["mlp"] != "swiglu" or c["inject"] != "none" \
            or c["qkv_fused"] or c["norm_type"] != "rmsnorm" or c["pos_encoding"] != "rope_half" \
            or c["attn_qkv_bias"] != c["attn_out_bias"] or not c.get("final_norm", True):
        raise ValueError("torch_peer unrolls plain Llama-style looped models only (pre-norm RMSNorm, "
                         "SwiGLU, split qkv, no injection, rope_half, one attention bias flag)")
    if any(k.endswith(".scales") for k in t):
        raise ValueError("torch_peer needs float weights (f32 / f16 / bf16), not int8 / int4")
    order = ([f"pre.{i}." for i in range(c["n_pre_blocks"])]
             + [f"loop.{j}." for _ in range(loops) for j in range(c["n_loop_layers"])]
             + [f"post.{k}." for k in range(c["n_post_blocks"])])
    cfg = transformers.LlamaConfig(
        hidden_size=int(c["dim"]), intermediate_size=int(c["ffn_dim"]),
        num_attention_heads=int(c["n_heads"]), num_key_value_heads=int(c["n_kv_heads"]),
        head_dim=int(c["head_dim"]), num_hidden_layers=len(order), vocab_size=int(c["vocab_size"]),
        max_position_embeddings=int(c["max_seq_len"]), rms_norm_eps=float(c["norm_eps"]),
        rope_theta=float(c["rope_theta"]), attention_bias=bool(c["attn_qkv_bias"]),
        mlp_bias=bool(c["mlp_bias"]), tie_word_embeddings=bool(c["tie_embeddings"]),
        bos_token_id=1, eos_token_id=2)
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"torch dtype {dtype!r}: expected one of {list(TORCH_DTYPES)}")
    # Skip the library's random init (seconds for 18 layers): every weight is loaded below.
    with transformers.modeling_utils.no_init_weights():
        model = transformers.LlamaForCausalLM(cfg)
    names = {"attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj",
             "attn.wv": "self_attn.v_proj", "attn.wo": "self_attn.o_proj",
             "mlp.w_gate": "mlp.gate_proj", "mlp.w_up": "mlp.up_proj", "mlp.w_down": "mlp.down_proj"}

    def ten(a):
        return torch.from_numpy(np.asarray(a, dtype=np.float32))

    sd = {"model.embed_tokens.weight": ten(t["embed.weight"]),
          "model.norm.weight": ten(t["final_norm.weight"])}
    if not c["tie_embeddings"]:
        sd["lm_head.weight"] = ten(t["head.weight"])
    for i, p in enumerate(order):
        hf = f"model.layers.{i}."
        sd[hf + "input_layernorm.weight"] = ten(t[p + "attn_norm.weight"])
        sd[hf + "post_attention_layernorm.weight"] = ten(t[p + "mlp_norm.weight"])
        for ours, theirs in names.items():
            sd[hf + theirs + ".weight"] = ten(t[p + ours + ".weight"])  # [out, in] both sides
            if p + ours + ".bias" in t:
                sd[hf + theirs + ".bias"] = ten(t[p + ours + ".bias"])
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (c["tie_embeddings"] and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"torch_peer: state dict mismatch: missing {missing}, unexpected {unexpected}")
    if c["tie_embeddings"]:
        model.tie_weights()
    if dtype == "int8":
        qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
        return torch.ao.quantization.quantize_dynamic(model.eval(), {torch.nn.Linear: qconfig},
                                                      dtype=torch.qint8)
    return model.to(_torch_dtype(dtype)).eval()


def torch_pp(model, n: int, vocab: int, rep: int) -> float:
    """Tokens/s of one n-token prefill with a fresh KV cache."""
    import torch
    from transformers import DynamicCache

    ids = torch.from_numpy(bench._prompt(n, vocab, rep).astype(np.int64))[None]  # [1, n]
    with torch.inference_mode():
        t0 = time.perf_counter()
        model(ids, past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
        return n / (time.perf_counter() - t0)


def torch_tg(model, n: int, vocab: int, rep: int) -> float:
    """Tokens/s of n greedy one-token steps with the KV cache after a one-token prompt."""
    import torch
    from transformers import DynamicCache

    rng = np.random.default_rng(rep)
    with torch.inference_mode():
        cache = DynamicCache()
        out = model(torch.tensor([[int(rng.integers(3, vocab))]]), past_key_values=cache,
                    use_cache=True, logits_to_keep=1)
        tok = out.logits[:, -1].argmax(-1, keepdim=True)  # [1, 1]
        t0 = time.perf_counter()
        for _ in range(n):
            out = model(tok, past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
        return n / (time.perf_counter() - t0)


def torch_logits(model, ids) -> np.ndarray:
    """float32 logits [T, V] of one prompt (the check that both sides run the same model)."""
    import torch

    with torch.inference_mode():
        x = torch.tensor(np.asarray(ids, dtype=np.int64)[None])
        return model(x).logits[0].float().numpy()


class TorchPeer:
    """What bench/compare.py --torch adds to each repetition: PyTorch eager in every requested
    dtype and TinyLoop on the same model stored in that dtype, so every PyTorch row has a
    same-precision TinyLoop row (besides compare.py's main TinyLoop model).

    tl: the tinyloop_py module; torch_src: the .tinyloop model PyTorch gets its weights from;
    same: {dtype: TinyLoop model of that dtype} ({}: only the main model); main_dtype: the
    main model's dtype ("f16"), whose samples compare.py already takes; fp16_body: also run
    each float dtype's TinyLoop model with fp16_body=True."""

    def __init__(self, tl, torch_src: str, same: dict, main_dtype: str, loops: int, n_ctx: int,
                 dtypes: list[str], fp16_body: bool = False):
        import torch
        import transformers

        self.torch, self.dtypes = torch, list(dtypes)
        self.versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
        print(f"(building the unrolled LlamaForCausalLM from {os.path.basename(torch_src)}, "
              f"L={loops}: {', '.join(self.dtypes)})", file=sys.stderr)
        self.models = {d: unrolled_llama(torch_src, loops, d) for d in self.dtypes}
        self.main_dtype = main_dtype
        self.same = {d: tl.Model(p, max_seq_len=n_ctx, **tinyloop_kwargs(d))
                     for d, p in same.items() if d != main_dtype}
        self.body = {d: tl.Model(p, max_seq_len=n_ctx, fp16_body=True)
                     for d, p in same.items() if fp16_body and d in ("f32", "bf16", "f16")}
        self.rows = []  # (threads, test, {label: samples})
        # Both sides run the same function: logits of a short prompt, PyTorch in its first
        # dtype against TinyLoop on the model the weights came from.
        ids = bench._prompt(16, int(self.models[self.dtypes[0]].config.vocab_size), 123)
        with tl.Model(torch_src) as m:
            ours = m.score(ids, loops=loops)  # [16, V]
        theirs = torch_logits(self.models[self.dtypes[0]], ids)
        self.check = (float(np.max(np.abs(ours - theirs))), float(np.max(np.abs(theirs))),
                      float(np.mean(ours.argmax(-1) == theirs.argmax(-1))))

    def set_threads(self, threads: int) -> None:
        self.torch.set_num_threads(threads)

    def pp(self, n: int, loops: int, vocab: int, rep: int) -> dict:
        got = {}
        if n <= 0:
            return got  # -p 0: no pp rows
        for d, m in self.same.items():
            got[f"tl_{d}_pp"] = bench.run_pp(m, n, loops, vocab, rep)
        for d, m in self.body.items():
            got[f"tlb_{d}_pp"] = bench.run_pp(m, n, loops, vocab, rep)
        for d, m in self.models.items():
            got[f"pt_{d}_pp"] = torch_pp(m, n, vocab, rep)
        return got

    def tg(self, n: int, loops: int, vocab: int, rep: int) -> dict:
        got = {}
        if n <= 0:
            return got  # -n 0: no tg rows
        for d, m in self.same.items():
            got[f"tl_{d}_tg"] = bench.run_tg(m, n, 0, loops, vocab, rep)
        for d, m in self.body.items():
            got[f"tlb_{d}_tg"] = bench.run_tg(m, n, 0, loops, vocab, rep)
        for d, m in self.models.items():
            got[f"pt_{d}_tg"] = torch_tg(m, n, vocab, rep)
        return got

    def collect(self, threads: int, args, s: dict) -> None:
        for test, k, n in ((f"pp{args.n_prompt}", "pp", args.n_prompt), (f"tg{args.n_gen}", "tg", args.n_gen)):
            if n > 0:
                self.rows.append((threads, test, {key[:-3]: v for key, v in s.items()
                                                  if key.endswith("_" + k)}))

    def report(self, tl, path: str, loops: int, args) -> None:
        import statistics

        def ms(a):
            return statistics.fmean(a), (statistics.stdev(a) if len(a) > 1 else 0.0)

        main = self.main_dtype.upper()
        err, scale, top1 = self.check
        print(f"\nPyTorch eager ({self.versions}, transformers LlamaForCausalLM unrolled to "
              f"L={loops}, torch threads = TinyLoop threads), {args.repetitions} repetitions; "
              f"logit check on 16 tokens, PyTorch {self.dtypes[0].upper()} vs TinyLoop: max |diff| "
              f"{err:.2e} (max |logit| {scale:.2f}), argmax agreement {top1:.0%}")
        head = "| threads | test | weights | PyTorch t/s |"
        if self.same or self.main_dtype in self.dtypes:
            head += " TinyLoop same weights t/s | ratio |"
        head += f" TinyLoop {main} t/s | {main} / PyTorch |"
        print(head)
        print("|---:|---|---|" + "---:|" * (head.count("|") - 4))
        for th, test, s in self.rows:
            tl_m, tl_s = ms(s["tl"])
            for d in self.dtypes:
                pm, psd = ms(s[f"pt_{d}"])
                line = f"| {th} | {test} | {d.upper()} | {pm:.2f} ± {psd:.2f} |"
                if self.same or self.main_dtype in self.dtypes:
                    key = "tl" if d == self.main_dtype else f"tl_{d}"
                    if key in s:
                        m2, s2 = ms(s[key])
                        line += f" {m2:.2f} ± {s2:.2f} | {m2 / pm:.2f} |"
                    else:
                        line += " | |"
                line += f" {tl_m:.2f} ± {tl_s:.2f} | {tl_m / pm:.2f} |"
                print(line)
                if f"tlb_{d}" in s:  # the same weights with fp16_body=True
                    m2, s2 = ms(s[f"tlb_{d}"])
                    print(f"| {th} | {test} | {d.upper()}, TinyLoop bf16 body | {pm:.2f} ± {psd:.2f} |"
                          f" {m2:.2f} ± {s2:.2f} | {m2 / pm:.2f} | {tl_m:.2f} ± {tl_s:.2f} | {tl_m / pm:.2f} |")
