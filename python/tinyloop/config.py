"""The model config of a `.tinyloop` file (docs/model-format.md, "Config" and "Tensor names").

The fields, their defaults and rules are the engine's (include/tinyloop/config_fields.def,
src/io/config.cc), read through `tinyloop_py`: `config_fields` lists them, `normalize_config`
fills every default and checks the rules with the engine's reader. `expected_tensors` lists
every tensor a config needs with its shape; `preset_config` gives small test-sized configs
for the three families (Llama-style, Huginn, Ouro).
"""

from __future__ import annotations

import functools
import json

__all__ = [
    "config_fields",
    "normalize_config",
    "expected_tensors",
    "check_tensor_shapes",
    "preset_config",
    "uses_rope",
    "layer_prefixes",
]

# qk_norm's epsilon (include/tinyloop/config.h kQkNormEps): the float32 epsilon 2^-23.
QK_NORM_EPS = 2.0 ** -23
# Input channels of a value-embedding gate (config.h kValueGateDim): Parcae's ve_gate reads
# the first 32 channels of the layer's normed input.
VALUE_GATE_DIM = 32


def engine_module():
    """The engine module `tinyloop_py`, which holds the one declaration of the format
    (include/tinyloop/config_fields.def, container_format.h; docs/model-format.md,
    "Adding a config field"). Imported on first use, so `import tinyloop` needs no engine."""
    try:
        import tinyloop_py
    except ImportError as e:
        raise ImportError("tinyloop.config and tinyloop.format read the model format from the "
                          "engine module tinyloop_py, which is not installed (pip install "
                          "loopformer, or pip install . in a checkout)") from e
    return tinyloop_py


@functools.cache
def _schema() -> tuple:
    return tuple(engine_module().config_schema())


def config_fields() -> list[dict]:
    """Every config field in the doc table's order, as the engine declares it (a copy): dicts
    with name, kind, presence ("required" | "optional" | "derived"), default, doc, and min /
    max (int fields) or choices (enum fields). See tinyloop_py.config_schema."""
    return [dict(f) for f in _schema()]


def _int_field(name: str) -> dict:
    return next(f for f in _schema() if f["name"] == name)


def __getattr__(name: str):
    # Limits and the format version come from the engine, read when first asked for.
    if name == "MAX_LOOPS":  # include/tinyloop/config.h kMaxLoops (docs/limits.md)
        return _int_field("default_loops")["max"]
    if name == "MAX_SEQ_LEN":  # config.h kMaxSeqLen
        return _int_field("max_seq_len")["max"]
    if name == "FORMAT_VERSION":  # the version of float-only files (container_format.h)
        return int(engine_module().container_format()["format_version_float"])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _to_json(cfg: dict) -> str:
    """The config as JSON text for the engine; a value JSON can not hold (NaN, a numpy
    integer, an object) is refused naming its field."""
    if not isinstance(cfg, dict):
        raise ValueError(f"config: expected a JSON object, got {type(cfg).__name__}")
    for name, value in cfg.items():
        if not isinstance(name, str):
            raise ValueError(f"config field {name!r}: field names are strings")
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            raise ValueError(f"config field '{name}': {value!r} is not a JSON value (expected "
                             f"a finite number, a string, a boolean, null or a list)") from None
    return json.dumps(cfg)


def normalize_config(cfg: dict) -> dict:
    """Every field of the config table filled in (defaults applied), checked by the engine's
    own reader (src/io/config.cc), so Python accepts exactly the configs a load accepts.

    Raises ValueError (tinyloop_py.ModelFormatError) naming the field: unknown field,
    missing required field, wrong type, or a broken consistency rule. The input is not
    modified.
    """
    return engine_module().check_config(_to_json(cfg))


def uses_rope(cfg: dict) -> bool:
    return cfg["pos_encoding"] in ("rope_half", "rope_interleaved")


def layer_prefixes(cfg: dict) -> dict[str, list[str]]:
    """The tensor-name prefixes of the pre, loop and post layers, in application order."""
    return {
        "pre": [f"pre.{i}." for i in range(cfg["n_pre_blocks"])],
        "loop": [f"loop.{j}." for j in range(cfg["n_loop_layers"])],
        "post": [f"post.{k}." for k in range(cfg["n_post_blocks"])],
    }


def expected_tensors(cfg: dict) -> dict[str, tuple]:
    """Every tensor name the config needs -> its shape, per the doc's "Tensor names" table,
    from the engine's own rules (src/io/config.cc, expected_tensor_list).

    Order: embed, pos_emb, inject, pre layers, loop layers, post layers, prelude_norm,
    loop_norm, post_loop_norm, post_loop_proj, final_norm, head, exit_gate (a stable order
    the writer keeps within each element size). Raises ValueError naming the field for a
    config the loader refuses.
    """
    return engine_module().expected_tensors(_to_json(cfg))


def check_tensor_shapes(cfg: dict, shapes: dict[str, tuple]) -> None:
    """Raise ValueError naming the first missing, leftover or wrongly shaped tensor."""
    want = expected_tensors(cfg)
    for name, shape in want.items():
        if name not in shapes:
            raise ValueError(f"tensor '{name}': missing (the config needs shape {list(shape)})")
        got = tuple(int(d) for d in shapes[name])
        if got != tuple(shape):
            raise ValueError(f"tensor '{name}': shape {list(got)}, the config needs {list(shape)}")
    for name in shapes:
        if name not in want:
            raise ValueError(f"tensor '{name}': not used by the config (leftover)")


# Small, odd-sized configs; each exercises one family's distinctive options.
_PRESETS = {
    # Llama-style: everything but one layer in the prelude, a 1-layer loop run once.
    "llama": dict(dim=64, vocab_size=97, n_heads=4, n_kv_heads=2, ffn_dim=160,
                  n_pre_blocks=2, n_loop_layers=1, n_post_blocks=0, default_loops=1,
                  max_seq_len=64, norm_placement="pre", pos_encoding="rope_half",
                  mlp="swiglu", tie_embeddings=False, bos_id=1, eos_ids=[2]),
    # Huginn-0125: sandwich blocks, fused qkv with bias, interleaved RoPE, linear adapter,
    # random initial state, ln_f used after the loop and before the head, scaled tied embed.
    "huginn": dict(dim=64, vocab_size=97, n_heads=4, ffn_dim=160,
                   n_pre_blocks=1, n_loop_layers=2, n_post_blocks=1, default_loops=4,
                   max_seq_len=64, norm_placement="huginn_sandwich", qkv_fused=True,
                   attn_qkv_bias=True, pos_encoding="rope_interleaved", mlp="swiglu",
                   embed_scale=8.0, init_state="random", init_state_std=0.5,
                   init_state_seed=1234, inject="linear_concat", post_loop_norm="final",
                   final_norm=True, tie_embeddings=True, norm_eps=1e-6, eos_ids=[3]),
    # Ouro: the whole stack looped, sandwich norms, a norm after every iteration, exit gate.
    "ouro": dict(dim=64, vocab_size=97, n_heads=4, ffn_dim=160,
                 n_pre_blocks=0, n_loop_layers=2, n_post_blocks=0, default_loops=4,
                 max_seq_len=64, norm_placement="ouro_sandwich", pos_encoding="rope_half",
                 mlp="swiglu", loop_norm=True, final_norm=False, exit_gate=True,
                 norm_eps=1e-6, eos_ids=[2, 5]),
}


def preset_config(kind: str, **overrides) -> dict:
    """A normalized small config of family `kind` ("llama", "huginn", "ouro"), with overrides.

    Overrides are plain config fields, so other families' options are one keyword away:
    `pos_encoding="learned"`, `norm_type="layernorm", norm_bias=True`, `mlp="gelu"`,
    `inject="add"`, `init_state="zeros"`, ... An override of None removes the field, so
    its default applies (e.g. `head_dim=None`).
    """
    if kind not in _PRESETS:
        raise ValueError(f"preset kind {kind!r}: expected one of {sorted(_PRESETS)}")
    cfg = dict(_PRESETS[kind])
    for name, value in overrides.items():
        if value is None:
            cfg.pop(name, None)
        else:
            cfg[name] = value
    return normalize_config(cfg)
