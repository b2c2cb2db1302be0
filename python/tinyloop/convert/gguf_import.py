"""GGUF files of the `llama` architecture -> `.tinyloop`, read with PyPI `gguf`'s GGUFReader.

Mapping (a plain model maps exactly onto the looped family, as in hf_llama):
    token_embd.weight -> embed.weight         output.weight -> head.weight (absent: tied)
    blk.{i}.attn_norm / attn_q / attn_k / attn_v / attn_output / ffn_norm / ffn_gate /
    ffn_up / ffn_down -> {layer}attn_norm / attn.wq / wk / wv / wo / mlp_norm /
    mlp.w_gate / w_up / w_down, with layer = pre.{i} for i < N-1 and loop.0 for the last
    output_norm.weight -> final_norm.weight
    n_pre_blocks = N-1, n_loop_layers = 1, default_loops = 1

llama.cpp's converter permutes the Q and K rows of HF checkpoints so that its "normal"
RoPE rotates adjacent pairs (2i, 2i+1): that is our `rope_interleaved`, so rows are kept
as stored. Tensor types: F32, F16, BF16 kept as floats; Q8_0, Q4_0, Q4_1 kept quantized
losslessly (gguf_repack). Anything else is refused before anything is written.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from ..config import MAX_SEQ_LEN
from ..quantize import is_quantizable
from .common import Job, Plan
from .gguf_check import check_gguf_structure
from .gguf_repack import FLOAT_TYPES, QUANT_TYPES, float_values, repack

__all__ = ["plan_gguf", "open_gguf"]

_LAYER_TENSORS = (  # GGUF name in blk.{i}. -> ours in the layer
    ("attn_norm", "attn_norm"), ("attn_q", "attn.wq"), ("attn_k", "attn.wk"),
    ("attn_v", "attn.wv"), ("attn_output", "attn.wo"), ("ffn_norm", "mlp_norm"),
    ("ffn_gate", "mlp.w_gate"), ("ffn_up", "mlp.w_up"), ("ffn_down", "mlp.w_down"),
)


def open_gguf(path: str):
    """A GGUFReader, or ValueError naming the file and what is wrong with it."""
    from gguf import GGUFReader

    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file")
    size = os.path.getsize(path)
    # Every count and length checked against the file size first: GGUFReader allocates
    # whatever the header declares.
    check_gguf_structure(path)
    try:
        reader = GGUFReader(path)
    except Exception as e:  # GGUFReader raises ValueError, IndexError, KeyError, ...
        why = str(e) or type(e).__name__
        if "is not a valid GGMLQuantizationType" in why:
            raise ValueError(f"{path}: unknown GGUF tensor type ({why})") from None
        raise ValueError(f"{path}: not a readable GGUF file, truncated or corrupt "
                         f"({size} bytes; GGUFReader: {why})") from None
    for t in reader.tensors:  # every tensor's bytes are inside the file
        if t.data.nbytes != t.n_bytes:
            raise ValueError(f"{path}: truncated: tensor '{t.name}' needs {t.n_bytes} bytes, "
                             f"the file holds {t.data.nbytes}")
    return reader


def _field(reader, key: str, default=None):
    f = reader.get_field(key)
    if f is None:
        return default
    return f.contents()


def _int(reader, src: str, key: str, default=None, minimum=None, maximum=None) -> int:
    """An integer metadata value, typed as one in the file (a string "12" is refused, not
    parsed), within [minimum, maximum] when given."""
    v = _field(reader, key, default)
    if v is None:
        raise ValueError(f"{src}: GGUF metadata '{key}' is missing")
    if isinstance(v, list):
        raise ValueError(f"{src}: GGUF metadata '{key}' is a per-layer list {v[:4]}...: "
                         f"only one value for all layers is supported")
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{src}: GGUF metadata '{key}' must be an integer, got "
                         f"{type(v).__name__} {v!r}")
    v = int(v)
    if minimum is not None and v < minimum:
        raise ValueError(f"{src}: GGUF metadata '{key}' = {v}: must be >= {minimum}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{src}: GGUF metadata '{key}' = {v}: must be <= {maximum} "
                         f"(docs/limits.md)")
    return v


def _float(reader, src: str, key: str, default: float) -> float:
    """A number metadata value (an integer or a float in the file; a string is refused)."""
    v = _field(reader, key, default)
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ValueError(f"{src}: GGUF metadata '{key}' must be a number, got "
                         f"{type(v).__name__} {v!r}")
    return float(v)


# llama.* metadata plan_gguf reads, or refuses by value (docs/convert.md).
_LLAMA_KEYS = frozenset({
    "block_count", "embedding_length", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.key_length", "attention.value_length",
    "rope.dimension_count", "vocab_size", "context_length", "attention.layer_norm_rms_epsilon",
    "rope.freq_base", "rope.scaling.type", "rope.scaling.factor", "expert_count"})
# expert_used_count only matters with experts (refused); original_context_length only with
# RoPE scaling (refused).
_LLAMA_IGNORABLE = frozenset({"expert_used_count", "rope.scaling.original_context_length"})
# Namespaces that describe the file, not the function: the reader's own fields, general.*
# (name, file type, license, ...), tokenizer.* (read by tinyloop.gguf_tokenizer, which
# checks what it uses), llama-quantize's quantize.* notes and split.* (a split file is
# refused by its missing tensors).
_IGNORABLE_PREFIXES = ("GGUF.", "general.", "tokenizer.", "quantize.", "split.")


def _check_metadata_keys(reader, src: str, arch: str) -> None:
    """No silent acceptance: a metadata key that is neither read nor known to be harmless
    (e.g. llama.attention.clamp_kqv, llama.rope.scaling.attn_factor) is refused by name."""
    for key in reader.fields:
        if key.startswith(_IGNORABLE_PREFIXES):
            continue
        sub = key[len(arch) + 1:] if key.startswith(arch + ".") else None
        if sub is not None and (sub in _LLAMA_KEYS or sub in _LLAMA_IGNORABLE):
            continue
        raise ValueError(f"{src}: GGUF metadata '{key}' is not understood by the GGUF {arch} "
                         f"importer and could change the model's outputs; refusing rather "
                         f"than converting a model that may not match llama.cpp's "
                         f"(docs/convert.md lists the keys it honours)")


def _refuse_metadata(reader, src: str, arch: str) -> None:
    _check_metadata_keys(reader, src, arch)
    scaling = _field(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"{src}: GGUF metadata '{arch}.rope.scaling.type' = {scaling!r}: "
                         f"RoPE scaling is not supported")
    factor = _field(reader, f"{arch}.rope.scaling.factor")
    if factor not in (None, 0.0, 1.0):
        raise ValueError(f"{src}: GGUF metadata '{arch}.rope.scaling.factor' = {factor}: "
                         f"RoPE scaling is not supported")
    if reader.get_field("rope_freqs.weight") is not None or any(
            t.name == "rope_freqs.weight" for t in reader.tensors):
        raise ValueError(f"{src}: tensor 'rope_freqs.weight' (Llama 3 RoPE scaling) is not "
                         f"supported")
    experts = _field(reader, f"{arch}.expert_count", 0)
    if experts:
        raise ValueError(f"{src}: GGUF metadata '{arch}.expert_count' = {experts}: mixture "
                         f"of experts is not supported")


def _tensor_job(src_name: str, shape: tuple, dst: str) -> Job:
    def build(d):
        t = d[src_name]
        if t.tensor_type in QUANT_TYPES:
            if is_quantizable(dst):
                return repack(dst, t.tensor_type, t.data, shape[0], shape[1])
            from gguf.quants import dequantize  # a quantized norm: exact in float32

            return {dst: np.asarray(dequantize(t.data, t.tensor_type), np.float32).reshape(shape)}
        return {dst: float_values(t.tensor_type, t.data, shape)}
    return Job({src_name: shape}, build, label=dst)


def _check_types(reader, src: str) -> None:
    for t in reader.tensors:
        if t.tensor_type not in FLOAT_TYPES + QUANT_TYPES:
            raise ValueError(f"{src}: tensor '{t.name}' has type {t.tensor_type.name}; "
                             f"supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1")


def _tokenizer(reader, src: str):
    """(tokenizer.json, chat template) from the GGUF metadata, through tinyloop.gguf_tokenizer
    when it is there. A vocabulary it cannot express is reported, and the model is still
    converted (token ids in and out), since the weights are fine."""
    try:
        from ..gguf_tokenizer import chat_template_from_gguf, tokenizer_json_from_gguf
    except ImportError:
        return None, _field(reader, "tokenizer.chat_template")
    try:
        tok = tokenizer_json_from_gguf(reader)
    except ValueError as e:
        print(f"tinyloop convert: {src}: tokenizer not embedded: {e}", file=sys.stderr)
        tok = None
    return tok, chat_template_from_gguf(reader)


def plan_gguf(path) -> Plan:
    src = os.fspath(path)
    reader = open_gguf(src)
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{src}: GGUF architecture {arch!r} is not supported (only 'llama')")
    _refuse_metadata(reader, src, arch)
    _check_types(reader, src)
    tensors = {t.name: t for t in reader.tensors}
    shapes = {t.name: tuple(int(x) for x in reversed(t.shape.tolist())) for t in reader.tensors}
    N = _int(reader, src, f"{arch}.block_count", minimum=1)
    # Each block is 9 tensors: a block count the file cannot hold is refused before one job
    # per tensor is planned (block_count = 1e6 in a 27 KB file once took 7.4 GB).
    if N > len(reader.tensors) // len(_LAYER_TENSORS):
        raise ValueError(f"{src}: GGUF metadata '{arch}.block_count' = {N}, but the file holds "
                         f"only {len(reader.tensors)} tensors ({len(_LAYER_TENSORS)} per block: "
                         f"tensors missing)")
    D = _int(reader, src, f"{arch}.embedding_length", minimum=1)
    F = _int(reader, src, f"{arch}.feed_forward_length", minimum=1)
    H = _int(reader, src, f"{arch}.attention.head_count", minimum=1)
    KVH = _int(reader, src, f"{arch}.attention.head_count_kv", H, minimum=1)
    hd = _int(reader, src, f"{arch}.attention.key_length", D // H if D % H == 0 else 0)
    if hd <= 0 or _int(reader, src, f"{arch}.attention.value_length", hd) != hd:
        raise ValueError(f"{src}: GGUF metadata '{arch}.attention.key_length' / value_length: "
                         f"need one head size (embedding_length {D}, head_count {H})")
    rope_dim = _int(reader, src, f"{arch}.rope.dimension_count", hd)
    if rope_dim != hd:
        raise ValueError(f"{src}: GGUF metadata '{arch}.rope.dimension_count' = {rope_dim}: "
                         f"partial RoPE is not supported (head size {hd})")
    if "token_embd.weight" not in shapes:
        raise ValueError(f"{src}: tensor 'token_embd.weight' is missing")
    embd = shapes["token_embd.weight"]
    if len(embd) != 2 or min(embd) < 1:
        raise ValueError(f"{src}: tensor 'token_embd.weight' has shape {list(embd)}: expected "
                         f"[vocab_size, embedding_length], both >= 1")
    V = _int(reader, src, f"{arch}.vocab_size", embd[0], minimum=1)
    tied = "output.weight" not in shapes
    eos = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                "tokenizer.ggml.eom_token_id"):
        v = _field(reader, key)
        if v is not None:
            v = _int(reader, src, key)
            if v not in eos:
                eos.append(v)
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    if bos is not None:
        bos = _int(reader, src, "tokenizer.ggml.bos_token_id")
    config = dict(
        dim=D, vocab_size=V, n_heads=H, n_kv_heads=KVH, head_dim=hd, ffn_dim=F,
        n_pre_blocks=N - 1, n_loop_layers=1, n_post_blocks=0, default_loops=1,
        max_seq_len=_int(reader, src, f"{arch}.context_length", 2048, minimum=1,
                         maximum=MAX_SEQ_LEN),
        norm_type="rmsnorm",
        norm_eps=_float(reader, src, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        norm_placement="pre", pos_encoding="rope_interleaved",
        rope_theta=_float(reader, src, f"{arch}.rope.freq_base", 10000.0), mlp="swiglu",
        final_norm=True, tie_embeddings=tied, bos_id=None if bos is None else int(bos),
        eos_ids=eos)
    dims = {"attn_norm": (D,), "attn_q": (H * hd, D), "attn_k": (KVH * hd, D),
            "attn_v": (KVH * hd, D), "attn_output": (D, H * hd), "ffn_norm": (D,),
            "ffn_gate": (F, D), "ffn_up": (F, D), "ffn_down": (D, F)}
    jobs = [_tensor_job("token_embd.weight", (V, D), "embed.weight")]
    for i in range(N):
        layer = f"pre.{i}." if i < N - 1 else "loop.0."
        for ggml, ours in _LAYER_TENSORS:
            jobs.append(_tensor_job(f"blk.{i}.{ggml}.weight", dims[ggml], f"{layer}{ours}.weight"))
    jobs.append(_tensor_job("output_norm.weight", (D,), "final_norm.weight"))
    if not tied:
        jobs.append(_tensor_job("output.weight", (V, D), "head.weight"))
    tok, template = _tokenizer(reader, src)
    return Plan(src=src, config=config, jobs=jobs, source_shapes=shapes,
                load=lambda name: tensors[name], tokenizer_json=tok, chat_template=template)
