"""Reading and writing `.tinyloop` model files (docs/model-format.md) with numpy.

The file is a safetensors container: u64 header length N, N bytes of JSON (padded with
spaces so the data section starts on a multiple of 64), then every tensor back to back.
The container's constants (magic, versions, alignment, dtypes) and the config's fields and
rules are the engine's, read through `tinyloop_py` (include/tinyloop/container_format.h,
config_fields.def), so this module holds no copy of them.
"""

from __future__ import annotations

import functools
import json
import os
import struct
import tempfile
from dataclasses import dataclass, field

import numpy as np

from .config import engine_module, expected_tensors, normalize_config

__all__ = [
    "ModelContents",
    "write_model",
    "read_model",
    "to_bf16_bits",
    "from_bf16_bits",
]

_WEIGHT_DTYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16"}  # write_model's weight_dtype


@functools.cache
def _container() -> dict:
    """The container's constants as the engine declares them (include/tinyloop/
    container_format.h, tinyloop_py.container_format): magic, versions, alignment, dtypes."""
    return engine_module().container_format()


def _dtype_size(dtype: str) -> int | None:
    """Bytes per element of a dtype the format knows, None for any other name."""
    info = _container()["dtypes"].get(dtype)
    return None if info is None else info["size"]


def _dtypes_for(use: str) -> tuple:
    """The dtypes of one use: "float" (F32/F16/BF16 weights), "quantized" (I8/U8, version 2),
    "unsupported" (named but refused)."""
    return tuple(n for n, d in _container()["dtypes"].items() if d["use"] == use)


def __getattr__(name: str):
    # Public constants, read from the engine when first asked for.
    if name == "DATA_ALIGNMENT":  # the data section starts on a multiple of this
        return _container()["data_alignment"]
    if name == "QUANT_FORMAT_VERSION":  # the version of files holding a quantized weight
        return int(_container()["format_version_quant"])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class ModelContents:
    """What `read_model` returns."""

    config: dict  # normalized (every field filled)
    # name -> float64 array, F16/BF16 decoded; quantized weights (I8/U8) stay int8/uint8
    # as stored, beside their float64 `.scales` / `.offsets` (tinyloop.quantize.dequantize)
    tensors: dict
    dtypes: dict  # name -> stored dtype string ("F32", "F16", "BF16", "I8", "U8")
    metadata: dict  # the raw `__metadata__` (str -> str)
    tokenizer_json: str | None = None
    chat_template: str | None = None
    data_offset: int = 0  # byte offset of the data section in the file
    offsets: dict = field(default_factory=dict)  # name -> (begin, end) inside the data section


# ---------------------------------------------------------------------------------------
# bfloat16 <-> float32 bits


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest, ties to even.

    NaN stays NaN (quiet bit forced, so rounding can not turn it into inf).
    """
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    lsb = (bits >> np.uint64(16)) & np.uint64(1)
    rounded = ((bits + np.uint64(0x7FFF) + lsb) >> np.uint64(16)).astype(np.uint16)
    nan = np.isnan(np.asarray(a, dtype=np.float32))
    quiet = ((bits >> np.uint64(16)) | np.uint64(0x0040)).astype(np.uint16)
    return np.where(nan, quiet, rounded)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


# ---------------------------------------------------------------------------------------
# writing


def _stored_dtype(name: str, a: np.ndarray, weight_dtype: str) -> str:
    """The safetensors dtype a tensor is written as. numpy int8 / uint8 arrays are I8 / U8
    (quantized weights); `.scales` / `.offsets` companions F16 when given as float16, else
    F32 (never re-rounded to weight_dtype: that would change them); other 2-D tensors take
    weight_dtype; norms and biases (1-D) stay F32, as the format requires."""
    if a.dtype == np.int8:
        return "I8"
    if a.dtype == np.uint8:
        return "U8"
    if name.endswith((".scales", ".offsets")):
        return "F16" if a.dtype == np.float16 else "F32"
    return _WEIGHT_DTYPES[weight_dtype] if a.ndim == 2 else "F32"


def _encode_tensor(name: str, a: np.ndarray, weight_dtype: str) -> tuple[str, bytes]:
    """(safetensors dtype, little-endian bytes), the dtype by _stored_dtype."""
    a = np.asarray(a)
    dtype = _stored_dtype(name, a, weight_dtype)
    if dtype in _dtypes_for("quantized"):
        return dtype, np.ascontiguousarray(a).tobytes()
    f32 = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "F32":
        return dtype, f32.astype("<f4").tobytes()
    if dtype == "F16":
        return dtype, f32.astype("<f2").tobytes()  # numpy rounds to nearest even
    return dtype, to_bf16_bits(f32).astype("<u2").tobytes()


def _layout(entries: list[tuple[str, str, tuple, bytes]]) -> list[tuple[str, str, tuple, bytes]]:
    """Decreasing element size, so each tensor starts on a multiple of its element size;
    the sort is stable, so the config's tensor order is kept within one size."""
    return sorted(entries, key=lambda e: -_dtype_size(e[1]))


def _header_bytes(entries, metadata: dict) -> bytes:
    """The JSON header, space-padded so that 8 + len is a multiple of DATA_ALIGNMENT."""
    header: dict = {_container()["metadata_key"]: metadata}
    offset = 0
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    c = _container()
    pad = (-(c["header_len_bytes"] + len(text))) % c["data_alignment"]
    return text + b" " * pad


def _write_atomically(path: str, chunks, check) -> None:
    """Write to a temp file in the target directory, `check(temp path)`, then rename over
    `path`, so a reader never sees a half-written or refused model."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tinyloop-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        check(tmp)
        # mkstemp creates 0600; a model file is ordinary data, so honour the umask instead.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_model(path, config: dict, tensors: dict, tokenizer_json: str | None = None,
                chat_template: str | None = None, weight_dtype: str = "f32") -> str:
    """Write a `.tinyloop` file. Returns the path.

    The config is normalized (every field written). `tensors` must match the config's
    expected tensors exactly: the file is checked by the engine's loader before it replaces
    `path` (tinyloop_py.check_model_file, the checks of read_model and Model()); 2-D weight
    matrices are stored as `weight_dtype`
    ("f32" | "f16" | "bf16"), norms and biases as F32. Raises ValueError naming the
    problem (config field, tensor, dtype).

    Quantized weights (format version 2, docs/model-format.md) are ordinary entries: an
    int8 weight is a numpy int8 [N, K] array plus `NAME.scales`; an int4 one a uint8
    [N, K/2] array plus `NAME.scales` and `NAME.offsets` (tinyloop.quantize makes them).
    Companions given as float16 are stored F16, others F32. The file gets format_version 2
    when any weight is quantized, 1 otherwise.
    """
    if weight_dtype not in _WEIGHT_DTYPES:
        raise ValueError(f"weight_dtype {weight_dtype!r}: expected one of {list(_WEIGHT_DTYPES)}")
    cfg = normalize_config(config)
    # The config's tensors in its order, each weight's companions after it, then anything
    # else given, so the loader's check below sees (and names) leftovers too.
    order = [n + c for n in expected_tensors(cfg) for c in ("", ".scales", ".offsets")]
    order = [n for n in order if n in tensors] + [n for n in tensors if n not in set(order)]
    entries = []
    for n in order:
        dtype, data = _encode_tensor(n, np.asarray(tensors[n]), weight_dtype)
        entries.append((n, dtype, tuple(np.shape(tensors[n])), data))
    c = _container()
    quantized = any(e[1] in _dtypes_for("quantized") for e in entries)
    version = c["format_version_quant"] if quantized else c["format_version_float"]
    entries = _layout(entries)
    keys = c["metadata_keys"]
    metadata = {keys["format"]: c["format_name"], keys["format_version"]: version,
                keys["config"]: json.dumps(cfg)}
    if tokenizer_json is not None:
        metadata[keys["tokenizer"]] = str(tokenizer_json)
    if chat_template is not None:
        metadata[keys["chat_template"]] = str(chat_template)
    header = _header_bytes(entries, metadata)
    path = os.fspath(path)
    # The u64 length (struct "<Q") is header_len_bytes long.
    _write_atomically(path, [struct.pack("<Q", len(header)), header] + [e[3] for e in entries],
                      lambda tmp: _check_written(tmp, path))
    return path


def _check_written(tmp: str, path: str) -> None:
    """The engine's loader on the temp file; its message names `path`, where the file goes."""
    try:
        engine_module().check_model_file(tmp)
    except ValueError as e:
        raise ValueError(str(e).replace(tmp, path)) from None


# ---------------------------------------------------------------------------------------
# reading


def _read_bytes(path: str) -> bytes:
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such model file")
    with open(path, "rb") as f:
        return f.read()


def _header(blob: bytes) -> tuple[dict, int]:
    """(header object, data section offset) of a file the engine has validated."""
    start = _container()["header_len_bytes"]
    (n,) = struct.unpack_from("<Q", blob, 0)  # the u64 header length
    return json.loads(blob[start:start + n].decode("utf-8")), start + n


def _decode(blob: bytes, start: int, dtype: str, shape: tuple) -> np.ndarray:
    """float64 copy of one tensor's data; I8 / U8 (quantized weights) stay int8 / uint8."""
    count = int(np.prod(shape, dtype=np.int64))
    if dtype in _dtypes_for("quantized"):
        np_dtype = np.int8 if dtype == "I8" else np.uint8
        return np.frombuffer(blob, dtype=np_dtype, count=count, offset=start).reshape(
            shape).copy()
    if dtype == "BF16":
        raw = np.frombuffer(blob, dtype="<u2", count=count, offset=start)
        return from_bf16_bits(raw).astype(np.float64).reshape(shape)
    np_dtype = {"F32": "<f4", "F16": "<f2"}[dtype]
    return np.frombuffer(blob, dtype=np_dtype, count=count, offset=start).astype(
        np.float64).reshape(shape)


def read_model(path) -> ModelContents:
    """Load a `.tinyloop` file, validated by the engine's own loader (tinyloop_py.
    check_model_file: the checks of Model(), docs/model-format.md "The loader checks"), so
    Python accepts exactly the files the engine does. Raises ValueError naming the problem."""
    path = os.fspath(path)
    blob = _read_bytes(path)
    cfg = engine_module().check_model_file(path)
    try:
        header, data_start = _header(blob)
        meta = header.pop(_container()["metadata_key"])
        parsed = {n: (e["dtype"], tuple(e["shape"]), *e["data_offsets"])
                  for n, e in header.items()}
    except (ValueError, KeyError, TypeError, struct.error):
        parsed = None
    # The bytes read are the ones the engine checked only if the file did not change in
    # between; the checked file's tensors end exactly at its end.
    if parsed is None or data_start + max((p[3] for p in parsed.values()), default=0) != len(blob):
        raise ValueError(f"{path}: the file changed on disk while it was being read")
    tensors = {n: _decode(blob, data_start + p[2], p[0], p[1]) for n, p in parsed.items()}
    return ModelContents(
        config=cfg, tensors=tensors, dtypes={n: p[0] for n, p in parsed.items()},
        metadata=dict(meta), tokenizer_json=meta.get(_container()["metadata_keys"]["tokenizer"]),
        chat_template=meta.get(_container()["metadata_keys"]["chat_template"]),
        data_offset=data_start, offsets={n: (p[2], p[3]) for n, p in parsed.items()})
