"""`tinyloop quantize IN OUT --weights f16|bf16|int8|int4`: rewrite a `.tinyloop` file's
weights (tensor quantization: `quantize.py`) and report what it changed against the input
(`quant_eval.py`).
"""
from __future__ import annotations

import numpy as np

from .format import read_model, write_model
from .quant_eval import compare_models, eval_windows
from .quantize import dequantize, logical_shapes, quantize_tensors

__all__ = ["QUANTIZE_WEIGHTS", "quantize_model", "main_args", "add_arguments"]

QUANTIZE_WEIGHTS = ("f16", "bf16", "int8", "int4")


def quantize_model(src, dst, weights: str, group: int | None = 32, scale_dtype: str = "f16") -> str:
    """Write `src` (any .tinyloop) to `dst` with its weights as `weights`: f16 / bf16 store
    every 2-D tensor so; int8 / int4 quantize the linears, the embedding and the head
    (round to nearest, `group` columns a scale, None: one a row; scales and offsets in
    `scale_dtype`), other 2-D tensors stay float32. A quantized input is dequantized first.
    Tokenizer and chat template are kept. Returns dst."""
    if weights not in QUANTIZE_WEIGHTS:
        raise ValueError(f"weights {weights!r}: expected one of {', '.join(QUANTIZE_WEIGHTS)}")
    if scale_dtype not in ("f16", "f32"):
        raise ValueError(f"scale_dtype {scale_dtype!r}: expected 'f16' or 'f32'")
    m = read_model(src)
    floats = {n: dequantize(n, m.tensors) for n in logical_shapes(
        {k: np.shape(v) for k, v in m.tensors.items()})}
    if weights in ("int8", "int4"):
        tensors = quantize_tensors(floats, weights, group,
                                   np.float16 if scale_dtype == "f16" else np.float32)
        wd = "f32"
    else:
        tensors, wd = floats, weights
    return write_model(dst, m.config, tensors, tokenizer_json=m.tokenizer_json,
                       chat_template=m.chat_template, weight_dtype=wd)



def _max_seq_len(path: str) -> int:
    """The config's max_seq_len, from the header alone (a file this cannot read gets 2^31:
    quantize_model then names its problem)."""
    import json
    import struct

    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(min(n, 1 << 30)).decode("utf-8"))
        return int(json.loads(header["__metadata__"]["config"]).get("max_seq_len", 2048))
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return 2**31


def main_args(args) -> int:
    """The CLI command (cli.py wires the arguments)."""
    import glob
    import os

    group = args.group or None
    if not args.no_eval:
        # Checked before anything is written: the report once failed after writing the file
        # (a model with max_seq_len < --ctx).
        if args.ctx < 2:
            raise ValueError(f"--ctx must be >= 2, got {args.ctx}")
        if args.max_windows < 1:
            raise ValueError(f"--max-windows must be >= 1, got {args.max_windows}")
        args.ctx = min(args.ctx, _max_seq_len(args.input))
    quantize_model(args.input, args.output, args.weights, group, args.scale_dtype)
    mib = lambda p: os.path.getsize(p) / 2**20  # noqa: E731
    detail = ""
    if args.weights in ("int8", "int4"):
        detail = f" (group {group or 'a row'}, {args.scale_dtype} scales)"
    print(f"wrote {args.output}: {args.weights}{detail}, {mib(args.output):.2f} MiB "
          f"(input {mib(args.input):.2f} MiB)")
    if args.no_eval:
        return 0
    files = args.eval_text
    if files is None:
        corpus = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                              "shared", "data", "corpus")
        files = sorted(glob.glob(os.path.join(corpus, "*.txt")))
    windows, what = eval_windows(args.input, files, args.ctx, args.max_windows)
    r = compare_models(args.input, args.output, windows, args.loops, progress=not args.quiet)
    print(f"against the input, {what}, L={r['loops']}:")
    print(f"  mean KL(input || output) {r['mean_kl']:.3e} nats/token, top-1 agreement "
          f"{100 * r['top1_agreement']:.2f}% over {r['positions']} positions")
    print(f"  perplexity {r['ppl_ref']:.3f} -> {r['ppl_test']:.3f}")
    return 0


def add_arguments(p) -> None:
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--weights", required=True, choices=list(QUANTIZE_WEIGHTS))
    p.add_argument("--group", type=int, default=32, help="int8/int4: columns per scale (0: one a row)")
    p.add_argument("--scale-dtype", default="f16", choices=["f16", "f32"])
    p.add_argument("--eval-text", nargs="*", default=None,
                   help="held-out text files for the KL / top-1 report (default: the shared corpus)")
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--max-windows", type=int, default=8)
    p.add_argument("--loops", type=int, default=None, help="loop depth of the report (default: the model's)")
    p.add_argument("--no-eval", action="store_true", help="write only, no report")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
