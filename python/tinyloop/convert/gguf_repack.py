"""GGUF tensor data -> the `.tinyloop` storage types, losslessly, vectorised over blocks.

GGUF quantized rows are blocks of 32 values (ggml-common.h):
    Q8_0  [d f16][32 x int8 q]                 W = d * q
    Q4_0  [d f16][16 bytes]                    W = d * (q - 8)
    Q4_1  [d f16][m f16][16 bytes]             W = d * q + m
and a 4-bit block's byte j holds element j in its low nibble and element j + 16 in its
high nibble. Our int4 packs columns 2b / 2b+1 into byte b's low / high nibble, so the
nibbles are regrouped (a permutation: lossless). Group size G = 32 either way.

    Q8_0 -> int8 [N, K] + scales F16 [N, K/32]
    Q4_1 -> int4 [N, K/2] + scales = d, offsets = m (F16)
    Q4_0 -> int4 [N, K/2] + scales = d, offsets = -8 d (F16: exact, since multiplying
            by 8 only moves the exponent, unless 8 d overflows F16; then both companions
            are F32 for that tensor)
Our decode W = scales * q + offsets in float32 then equals ggml's exactly: d * q and 8 d
are exact in float32 and d * (q - 8) needs at most 15 significant bits.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from ..format import from_bf16_bits

__all__ = ["QUANT_TYPES", "FLOAT_TYPES", "float_values", "repack"]

_BLOCK = 32
QUANT_TYPES = (T.Q8_0, T.Q4_0, T.Q4_1)
FLOAT_TYPES = (T.F32, T.F16, T.BF16)
_BLOCK_BYTES = {T.Q8_0: 34, T.Q4_0: 18, T.Q4_1: 20}


def float_values(ttype, data: np.ndarray, shape: tuple) -> np.ndarray:
    """F32 / F16 data as float32 / float16 [shape]; BF16 widened to float32 exactly."""
    if ttype == T.BF16:
        from .common import as_bf16_values

        bits = np.ascontiguousarray(data).view(np.uint16).reshape(shape)
        return as_bf16_values(from_bf16_bits(bits))
    want = np.float32 if ttype == T.F32 else np.float16
    return np.array(data, dtype=want).reshape(shape)


def _blocks(ttype, data: np.ndarray, N: int, K: int) -> np.ndarray:
    """Raw bytes -> [N, K/32, block bytes] uint8."""
    raw = np.ascontiguousarray(data).view(np.uint8)
    return raw.reshape(N, K // _BLOCK, _BLOCK_BYTES[ttype])


def _unpack_ggml_nibbles(qs: np.ndarray) -> np.ndarray:
    """[N, nb, 16] bytes -> q [N, nb * 32] (element j: low nibble of byte j, element
    j + 16: high nibble of byte j)."""
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2)  # [N, nb, 32]
    return q.reshape(q.shape[0], -1)


def _pack_ours(q: np.ndarray) -> np.ndarray:
    """q [N, K] 0..15 -> [N, K/2] uint8, column 2b low nibble, 2b+1 high."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)


def repack(name: str, ttype, data: np.ndarray, N: int, K: int) -> dict:
    """One quantized GGUF tensor (logical [N, K]) -> {name, name.scales[, name.offsets]}."""
    b = _blocks(ttype, data, N, K)
    d = np.ascontiguousarray(b[:, :, 0:2]).view(np.float16)[:, :, 0]  # [N, K/32]
    if ttype == T.Q8_0:
        q = np.ascontiguousarray(b[:, :, 2:]).view(np.int8).reshape(N, K)  # [N, K]
        return {name: q, name + ".scales": d.copy()}
    if ttype == T.Q4_1:
        m = np.ascontiguousarray(b[:, :, 2:4]).view(np.float16)[:, :, 0]  # [N, K/32]
        q = _unpack_ggml_nibbles(b[:, :, 4:])
        return {name: _pack_ours(q), name + ".scales": d.copy(), name + ".offsets": m.copy()}
    if ttype == T.Q4_0:
        q = _unpack_ggml_nibbles(b[:, :, 2:])
        off = -8.0 * d.astype(np.float32)  # [N, K/32], exact in float32
        if np.all(np.abs(off) <= np.finfo(np.float16).max) or not np.all(np.isfinite(off)):
            scales, offsets = d.copy(), off.astype(np.float16)
        else:  # 8 d overflows F16: keep both companions F32 (same dtype, as the format asks)
            scales, offsets = d.astype(np.float32), off
        return {name: _pack_ours(q), name + ".scales": scales, name + ".offsets": offsets}
    raise AssertionError(f"not a quantized type the converter repacks: {ttype!r}")
