"""int8 / int4 weight quantization in the `.tinyloop` format version 2 layout
(docs/model-format.md, "Quantized weights"), numpy only.

A weight W is logically [N, K] (N = out, K = in), split along K into groups of G columns
(K % G == 0, G = K / scales.shape[1]):

    int8  NAME [N, K] int8,        NAME.scales [N, K/G]
          W[n, k] = scales[n, k/G] * q[n, k]
    int4  NAME [N, K/2] uint8,     NAME.scales, NAME.offsets [N, K/G]  (G even)
          byte b of row n: column 2b in the low nibble, column 2b+1 in the high nibble
          W[n, k] = scales[n, g] * q[n, k] + offsets[n, g],  g = k/G, in float32

Scales and offsets are float16 (F16) or float32 (F32) arrays; the writer stores them in
the numpy dtype it is given.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "QUANTIZABLE_SUFFIXES",
    "is_quantizable",
    "quantize_int8",
    "quantize_int4",
    "pack_int4",
    "unpack_int4",
    "dequantize",
    "is_quantized",
    "logical_shapes",
    "quantize_tensors",
    "log_softmax",
    "compare_models",
    "eval_windows",
    "group_size",
]

# The weights that may be stored quantized: every linear, the embedding and the head.
# Norms, biases, pos_emb and the exit gate stay float (they are small, and the gate's
# single row is a sum the engine does not run through matmul).
QUANTIZABLE_SUFFIXES = (
    ".attn.wq.weight", ".attn.wk.weight", ".attn.wv.weight", ".attn.wqkv.weight",
    ".attn.wo.weight", ".mlp.w_gate.weight", ".mlp.w_up.weight", ".mlp.w_down.weight",
)
_QUANTIZABLE_NAMES = ("inject.weight", "embed.weight", "head.weight")


def is_quantizable(name: str) -> bool:
    """True for tensor names the format lets be I8/U8."""
    return name in _QUANTIZABLE_NAMES or name.endswith(QUANTIZABLE_SUFFIXES)


def _groups(w: np.ndarray, group: int | None) -> tuple[np.ndarray, int]:
    """w [N, K] float -> ([N, K/G, G] float64 view, G). group None or 0: one group a row."""
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(f"quantize: expected a 2-D weight [N, K], got shape {list(w.shape)}")
    N, K = w.shape
    G = K if not group else int(group)
    if G <= 0 or K % G != 0:
        raise ValueError(f"quantize: group size {G} does not divide K = {K}")
    return w.reshape(N, K // G, G), G


def _scale_dtype(scale_dtype) -> np.dtype:
    dt = np.dtype(scale_dtype)
    if dt not in (np.dtype(np.float16), np.dtype(np.float32)):
        raise ValueError(f"quantize: scale_dtype must be float16 or float32, got {dt}")
    return dt


def quantize_int8(w, group: int | None = None, scale_dtype=np.float32):
    """Symmetric round-to-nearest int8: (q int8 [N, K], scales [N, K/G] scale_dtype).

    scale = max|w| / 127 per group (stored rounding applied first, so q uses the scale the
    file holds); q = round(w / scale) in [-127, 127]; an all-zero group gets scale 0, q 0.
    """
    g, G = _groups(w, group)  # [N, K/G, G]
    dt = _scale_dtype(scale_dtype)
    scales = (np.max(np.abs(g), axis=2) / 127.0).astype(dt)  # [N, K/G]
    s = scales.astype(np.float64)[:, :, None]  # [N, K/G, 1]
    q = np.where(s > 0, np.rint(g / np.where(s > 0, s, 1.0)), 0.0)  # [N, K/G, G]
    q = np.clip(q, -127, 127).astype(np.int8)
    return q.reshape(g.shape[0], -1), scales


def pack_int4(q: np.ndarray) -> np.ndarray:
    """q [N, K] values 0..15 -> [N, K/2] uint8 (column 2b low nibble, 2b+1 high)."""
    q = np.asarray(q, dtype=np.uint8)
    if q.ndim != 2 or q.shape[1] % 2:
        raise ValueError(f"pack_int4: expected [N, K] with K even, got {list(q.shape)}")
    if np.any(q > 15):
        raise ValueError("pack_int4: values must be in 0..15")
    return (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """[N, K/2] uint8 -> q [N, K] uint8 in 0..15."""
    p = np.asarray(packed, dtype=np.uint8)
    q = np.empty((p.shape[0], 2 * p.shape[1]), dtype=np.uint8)  # [N, K]
    q[:, 0::2] = p & 0x0F
    q[:, 1::2] = p >> 4
    return q


def quantize_int4(w, group: int | None = 32, scale_dtype=np.float32):
    """Asymmetric min/max round-to-nearest int4: (packed uint8 [N, K/2], scales [N, K/G],
    offsets [N, K/G]).

    offset = min, scale = (max - min) / 15 per group (both rounded to scale_dtype first);
    q = round((w - offset) / scale) in 0..15. A constant group gets scale 0 and q 0, so it
    is reproduced exactly by its offset (when the offset's dtype holds it).
    """
    g, G = _groups(w, group)  # [N, K/G, G]
    if G % 2:
        raise ValueError(f"quantize_int4: group size {G} must be even (two columns a byte)")
    dt = _scale_dtype(scale_dtype)
    lo, hi = np.min(g, axis=2), np.max(g, axis=2)  # [N, K/G]
    offsets = lo.astype(dt)
    scales = ((hi - lo) / 15.0).astype(dt)
    s = scales.astype(np.float64)[:, :, None]  # [N, K/G, 1]
    o = offsets.astype(np.float64)[:, :, None]
    q = np.where(s > 0, np.rint((g - o) / np.where(s > 0, s, 1.0)), 0.0)
    q = np.clip(q, 0, 15).astype(np.uint8).reshape(g.shape[0], -1)  # [N, K]
    return pack_int4(q), scales, offsets


def is_quantized(name: str, tensors: dict) -> bool:
    """True when `name` is stored as int8/int4 (it has a `.scales` companion)."""
    return name + ".scales" in tensors


def group_size(name: str, tensors: dict) -> int:
    """G of a quantized weight."""
    q, scales = np.asarray(tensors[name]), np.asarray(tensors[name + ".scales"])
    K = q.shape[1] * (2 if name + ".offsets" in tensors else 1)
    return K // scales.shape[1]


def dequantize(name: str, tensors: dict) -> np.ndarray:
    """Weight `name` as float64 [N, K]: decoded from int8/int4 + companions (the products
    taken in float32, as the format defines them), or the float tensor as it is."""
    a = np.asarray(tensors[name])
    if not is_quantized(name, tensors):
        return a.astype(np.float64)
    scales = np.asarray(tensors[name + ".scales"], dtype=np.float32)  # [N, K/G]
    if name + ".offsets" in tensors:  # int4
        q = unpack_int4(a).astype(np.float32)  # [N, K]
        offsets = np.asarray(tensors[name + ".offsets"], dtype=np.float32)  # [N, K/G]
        G = q.shape[1] // scales.shape[1]
        s = np.repeat(scales, G, axis=1)
        o = np.repeat(offsets, G, axis=1)
        # Two rounded float32 steps, exactly as the engine's scalar reference does.
        w = (s * q).astype(np.float32) + o
        return w.astype(np.float32).astype(np.float64)
    q = a.astype(np.float32)  # [N, K] from int8
    G = q.shape[1] // scales.shape[1]
    return (np.repeat(scales, G, axis=1) * q).astype(np.float32).astype(np.float64)


def logical_shapes(shapes: dict) -> dict[str, tuple]:
    """{name: stored shape} -> {name: shape as the config sees it}: quantized weights
    [N, K] (an int4 one, known by its `.offsets`, is stored [N, K/2]) and their companions
    left out."""
    out = {}
    for name, shape in shapes.items():
        if name.endswith((".scales", ".offsets")) and name.rsplit(".", 1)[0] in shapes:
            continue
        shape = tuple(int(d) for d in shape)
        if name + ".offsets" in shapes and len(shape) == 2:
            shape = (shape[0], 2 * shape[1])
        out[name] = shape
    return out


def quantize_tensors(tensors: dict, kind: str, group: int | None = 32,
                     scale_dtype=np.float32) -> dict:
    """Every quantizable weight of `tensors` quantized to `kind` ("int8" | "int4");
    returns the entries for write_model (weights replaced, companions added).

    A weight whose K the group does not divide is refused by name (pick a group that
    divides every in-dimension, or None for one group a row)."""
    if kind not in ("int8", "int4"):
        raise ValueError(f"quantize_tensors: kind {kind!r}: expected 'int8' or 'int4'")
    out = {}
    for name, t in tensors.items():
        if not is_quantizable(name):
            out[name] = t
            continue
        try:
            if kind == "int8":
                out[name], out[name + ".scales"] = quantize_int8(t, group, scale_dtype)
            else:
                out[name], out[name + ".scales"], out[name + ".offsets"] = quantize_int4(
                    t, group, scale_dtype)
        except ValueError as e:
            raise ValueError(f"tensor '{name}': {e}") from None
    return out


# ---------------------------------------------------------------------------------------
# `tinyloop quantize IN OUT --weights f16|bf16|int8|int4 [--group G]`

QUANTIZE_WEIGHTS = ("f16", "bf16", "int8", "int4")


def quantize_model(src, dst, weights: str, group: int | None = 32, scale_dtype: str = "f16") -> str:
    """Write `src` (any .tinyloop) to `dst` with its weights as `weights`: f16 / bf16 store
    every 2-D tensor so; int8 / int4 quantize the linears, the embedding and the head
    (round to nearest, `group` columns a scale, None: one a row; scales and offsets in
    `scale_dtype`), other 2-D tensors stay float32. A quantized input is dequantized first.
    Tokenizer and chat template are kept. Returns dst."""
    from .format import read_model, write_model

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


def log_softmax(z: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, in float64 (KL divergences of nearby distributions
    need the precision)."""
    z = np.asarray(z, np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def compare_models(ref_path, test_path, windows: list, loops: int | None = None,
                   progress: bool = True, ref_kwargs: dict | None = None,
                   test_kwargs: dict | None = None) -> dict:
    """Next-token distributions of `test_path` against `ref_path` on token windows (each an
    int32 array): mean and max KL(ref || test) per predicted token, top-1 agreement, both
    perplexities (each window's tokens after the first are predicted) and the seconds each
    side spent in score(). ref_kwargs / test_kwargs go to the two Models, so one file can be
    compared with itself under other settings (e.g. fp16_body=True)."""
    import sys
    import time

    import tinyloop_py as tl
    from tqdm import tqdm

    kl = agree = kl_max = 0.0
    n = n_pred = 0
    nll = {"ref": 0.0, "test": 0.0}
    secs = {"ref": 0.0, "test": 0.0}
    with tl.Model(ref_path, **(ref_kwargs or {})) as a, tl.Model(test_path, **(test_kwargs or {})) as b:
        L = loops or a.config()["default_loops"]
        for ids in tqdm(windows, desc="compare", unit="window", disable=not progress, file=sys.stderr):
            lp = {}
            for side, m in (("ref", a), ("test", b)):
                t0 = time.perf_counter()
                lp[side] = log_softmax(m.score(ids, loops=L))  # [T, V]
                secs[side] += time.perf_counter() - t0
            la, lb = lp["ref"], lp["test"]
            row_kl = np.sum(np.exp(la) * (la - lb), axis=1)  # [T]
            kl += float(row_kl.sum())
            kl_max = max(kl_max, float(row_kl.max()))
            agree += float(np.sum(la.argmax(axis=1) == lb.argmax(axis=1)))
            tgt = np.arange(len(ids) - 1)
            nll["ref"] -= float(la[tgt, ids[1:]].sum())
            nll["test"] -= float(lb[tgt, ids[1:]].sum())
            n += len(ids)
            n_pred += len(ids) - 1
    count = max(1, n_pred)
    return dict(loops=L, positions=n, mean_kl=kl / max(1, n), max_kl=kl_max,
                top1_agreement=agree / max(1, n),
                ppl_ref=float(np.exp(nll["ref"] / count)), ppl_test=float(np.exp(nll["test"] / count)),
                seconds_ref=secs["ref"], seconds_test=secs["test"])


def eval_windows(model_path, files: list, ctx: int = 256, max_windows: int = 8,
                 tail_fraction: float = 0.05, seed: int = 0) -> tuple[list, str]:
    """Held-out token windows for compare_models, and what they are: the last
    `tail_fraction` of each text file (the bundled model's held-out slice) through the
    model's tokenizer, cut as `tinyloop perplexity` does; random ids when the model has no
    tokenizer or no file is given."""
    from .perplexity import read_slice, token_stream, window_starts
    from .text import load_tokenizer

    tok = load_tokenizer(model_path) if files else None
    if tok is None:
        from .format import read_model
        V = read_model(model_path).config["vocab_size"]
        rng = np.random.default_rng(seed)
        return ([rng.integers(0, V, size=ctx).astype(np.int32) for _ in range(max_windows)],
                f"{max_windows} windows of {ctx} random token ids (no tokenizer or no text)")
    stream = token_stream(tok, [read_slice(p, tail_fraction) for p in files], None)
    ctx = min(ctx, len(stream))
    starts = window_starts(len(stream), ctx, max_windows)
    return ([stream[s:s + ctx] for s in starts],
            f"{len(starts)} windows of {ctx} tokens from the last {tail_fraction:.0%} of "
            f"{len(files)} file(s)")


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
