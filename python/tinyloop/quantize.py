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
the numpy dtype it is given. Rewriting a whole file is `quantize_file.py` (`tinyloop
quantize`); measuring what it changed is `quant_eval.py`.
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
