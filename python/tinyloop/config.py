"""The model config of a `.tinyloop` file (docs/model-format.md, "Config" and "Tensor names").

`normalize_config` fills every default and checks the consistency rules; `expected_tensors`
lists every tensor a config needs with its shape; `preset_config` gives small test-sized
configs for the three families (Llama-style, Huginn, Ouro).
"""

from __future__ import annotations

import math

__all__ = [
    "FORMAT_VERSION",
    "normalize_config",
    "expected_tensors",
    "check_tensor_shapes",
    "preset_config",
    "uses_rope",
    "layer_prefixes",
]

FORMAT_VERSION = 1

_REQUIRED = object()  # marks a field without a default

# field -> (kind, default). Kinds: "int", "float", "bool", "uint64", "int_or_null", "int_list",
# or a tuple of the allowed strings. The order is the doc table's; written configs keep it.
_FIELDS = {
    "dim": ("int", _REQUIRED),
    "vocab_size": ("int", _REQUIRED),
    "n_heads": ("int", _REQUIRED),
    "n_kv_heads": ("int", None),  # None here: derived from n_heads (JSON null is refused)
    "head_dim": ("int", None),  # None here: derived as dim / n_heads
    "ffn_dim": ("int", _REQUIRED),
    "n_pre_blocks": ("int", 0),
    "n_loop_layers": ("int", _REQUIRED),
    "n_post_blocks": ("int", 0),
    "default_loops": ("int", 1),
    "max_seq_len": ("int", 2048),
    "norm_type": (("rmsnorm", "layernorm"), "rmsnorm"),
    "norm_eps": ("float", 1e-5),
    "norm_bias": ("bool", False),
    "norm_placement": (("pre", "huginn_sandwich", "ouro_sandwich"), "pre"),
    "qkv_fused": ("bool", False),
    "attn_qkv_bias": ("bool", False),
    "attn_out_bias": ("bool", False),
    "mlp_bias": ("bool", False),
    "qk_norm": ("bool", False),
    "value_embed_layers": ("int_list", []),
    "pos_encoding": (("rope_half", "rope_interleaved", "learned", "none"), "rope_half"),
    "rope_theta": ("float", 10000.0),
    "mlp": (("swiglu", "gelu", "gelu_tanh", "relu2"), "swiglu"),
    "embed_scale": ("float", 1.0),
    "init_state": (("input", "zeros", "random"), "input"),
    "init_state_std": ("float", 0.0),
    "init_state_seed": ("uint64", 0),
    "init_state_per_call": ("bool", False),
    "prelude_norm": ("bool", False),
    "inject": (("none", "add", "linear_concat"), "none"),
    "loop_norm": ("bool", False),
    "post_loop_norm": (("none", "final", "own"), "none"),
    "post_loop_proj": ("bool", False),
    "final_norm": ("bool", True),
    "tie_embeddings": ("bool", False),
    "exit_gate": ("bool", False),
    "exit_gate_mode": (("off", "threshold", "step", "weighted"), "off"),
    "exit_gate_threshold": ("float", 1.0),
    "exit_gate_step": ("int", 0),
    "bos_id": ("int_or_null", None),
    "eos_ids": ("int_list", []),
}

# Upper limits, as the engine's (include/tinyloop/config.h kMaxLoops / kMaxSeqLen,
# docs/limits.md): a file over them is refused here as it would be at load.
MAX_LOOPS = 4096
# qk_norm's epsilon (include/tinyloop/config.h kQkNormEps): the float32 epsilon 2^-23.
QK_NORM_EPS = 2.0 ** -23
# Input channels of a value-embedding gate (config.h kValueGateDim): Parcae's ve_gate reads
# the first 32 channels of the layer's normed input.
VALUE_GATE_DIM = 32
MAX_SEQ_LEN = 2**24
_MAXIMUM = {"default_loops": MAX_LOOPS, "max_seq_len": MAX_SEQ_LEN}

# Sizes that must be >= 1 (n_pre_blocks and n_post_blocks may be 0).
_POSITIVE = ("dim", "vocab_size", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
             "n_loop_layers", "default_loops", "max_seq_len")


def _is_int(v) -> bool:
    # bool is an int subclass in Python; JSON true is not a size.
    return isinstance(v, int) and not isinstance(v, bool)


def _check_type(name: str, kind, value):
    """Return `value` converted to the field's canonical Python type, or raise ValueError."""
    if isinstance(kind, tuple):
        if value not in kind:
            raise ValueError(f"config field '{name}': {value!r} is not one of {list(kind)}")
        return value
    if kind == "int":
        if not _is_int(value):
            raise ValueError(f"config field '{name}': expected an integer, got {value!r}")
        return int(value)
    if kind == "uint64":
        if not _is_int(value) or not 0 <= value < 2**64:
            raise ValueError(f"config field '{name}': expected an integer in [0, 2^64), "
                             f"got {value!r}")
        return int(value)
    if kind == "float":
        if not (_is_int(value) or isinstance(value, float)) or not math.isfinite(value):
            raise ValueError(f"config field '{name}': expected a finite number, got {value!r}")
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"config field '{name}': expected true or false, got {value!r}")
        return value
    if kind == "int_or_null":
        if value is not None and not _is_int(value):
            raise ValueError(f"config field '{name}': expected an integer or null, got {value!r}")
        return value
    if kind == "int_list":
        if not isinstance(value, (list, tuple)) or not all(_is_int(v) for v in value):
            raise ValueError(f"config field '{name}': expected a list of integers, got {value!r}")
        return [int(v) for v in value]
    raise AssertionError(f"unknown field kind {kind!r}")


def _fill_fields(cfg: dict) -> dict:
    """Type-check the given fields and fill the plain defaults (derived ones stay None)."""
    if not isinstance(cfg, dict):
        raise ValueError(f"config: expected a JSON object, got {type(cfg).__name__}")
    unknown = sorted(set(cfg) - set(_FIELDS))
    if unknown:
        raise ValueError(f"config field '{unknown[0]}': unknown field")
    out = {}
    for name, (kind, default) in _FIELDS.items():
        if name in cfg:
            out[name] = _check_type(name, kind, cfg[name])
        elif default is _REQUIRED:
            raise ValueError(f"config field '{name}': required field is missing")
        else:
            out[name] = list(default) if isinstance(default, list) else default
    return out


def _fill_derived(c: dict) -> None:
    """Defaults that depend on other fields: n_kv_heads = n_heads, head_dim = dim / n_heads."""
    if c["n_heads"] < 1:
        raise ValueError(f"config field 'n_heads': must be >= 1, got {c['n_heads']}")
    if c["n_kv_heads"] is None:
        c["n_kv_heads"] = c["n_heads"]
    if c["head_dim"] is None:
        if c["dim"] % c["n_heads"] != 0:
            raise ValueError(f"config field 'head_dim': no default, dim {c['dim']} is not a "
                             f"multiple of n_heads {c['n_heads']}")
        c["head_dim"] = c["dim"] // c["n_heads"]


def _check_rules(c: dict) -> None:
    """The consistency rules of docs/model-format.md; each error names the offending field."""
    for name in _POSITIVE:
        if c[name] < 1:
            raise ValueError(f"config field '{name}': must be >= 1, got {c[name]}")
    for name in ("n_pre_blocks", "n_post_blocks"):
        if c[name] < 0:
            raise ValueError(f"config field '{name}': must be >= 0, got {c[name]}")
    for name, most in _MAXIMUM.items():
        if c[name] > most:
            raise ValueError(f"config field '{name}': must be <= {most} (docs/limits.md), "
                             f"got {c[name]}")
    if c["n_heads"] % c["n_kv_heads"] != 0:
        raise ValueError(f"config field 'n_kv_heads': {c['n_kv_heads']} does not divide "
                         f"n_heads {c['n_heads']}")
    if uses_rope(c) and c["head_dim"] % 2 != 0:
        raise ValueError(f"config field 'head_dim': must be even with {c['pos_encoding']}, "
                         f"got {c['head_dim']}")
    if c["norm_eps"] < 0:
        raise ValueError(f"config field 'norm_eps': must be >= 0, got {c['norm_eps']}")
    if c["rope_theta"] <= 0:
        raise ValueError(f"config field 'rope_theta': must be > 0, got {c['rope_theta']}")
    if c["norm_bias"] and c["norm_type"] != "layernorm":
        raise ValueError("config field 'norm_bias': only allowed with norm_type 'layernorm'")
    if c["init_state_std"] < 0:
        raise ValueError(f"config field 'init_state_std': must be >= 0, got {c['init_state_std']}")
    if c["init_state"] == "random" and not c["init_state_std"] > 0:
        raise ValueError("config field 'init_state_std': must be > 0 when init_state is 'random'")
    if c["post_loop_norm"] == "final" and not c["final_norm"]:
        raise ValueError("config field 'post_loop_norm': 'final' needs final_norm true")
    if c["exit_gate_mode"] != "off" and not c["exit_gate"]:
        raise ValueError("config field 'exit_gate_mode': not 'off' but exit_gate is false")
    if not 0 <= c["exit_gate_threshold"] <= 1:
        raise ValueError(f"config field 'exit_gate_threshold': must be in [0, 1], "
                         f"got {c['exit_gate_threshold']}")
    if not 0 <= c["exit_gate_step"] <= MAX_LOOPS:
        raise ValueError(f"config field 'exit_gate_step': must be in [0, {MAX_LOOPS}], "
                         f"got {c['exit_gate_step']}")
    if c["exit_gate_mode"] == "step" and c["exit_gate_step"] < 1:
        raise ValueError("config field 'exit_gate_step': must be >= 1 when exit_gate_mode is 'step'")
    _check_value_embed_layers(c)
    V = c["vocab_size"]
    if c["bos_id"] is not None and not 0 <= c["bos_id"] < V:
        raise ValueError(f"config field 'bos_id': {c['bos_id']} is outside [0, {V})")
    for t in c["eos_ids"]:
        if not 0 <= t < V:
            raise ValueError(f"config field 'eos_ids': {t} is outside [0, {V})")


def _check_value_embed_layers(c: dict) -> None:
    """Indices over the pre, loop and post layers in order, increasing; the gate needs
    VALUE_GATE_DIM input channels."""
    layers = c["value_embed_layers"]
    n = c["n_pre_blocks"] + c["n_loop_layers"] + c["n_post_blocks"]
    for a, b in zip(layers, layers[1:]):
        if b <= a:
            raise ValueError(f"config field 'value_embed_layers': must be increasing, got {layers}")
    for i in layers:
        if not 0 <= i < n:
            raise ValueError(f"config field 'value_embed_layers': {i} is outside [0, {n}) "
                             f"(the pre, loop and post layers in order)")
    if layers and c["dim"] < VALUE_GATE_DIM:
        raise ValueError(f"config field 'value_embed_layers': the gate reads {VALUE_GATE_DIM} "
                         f"channels, dim is {c['dim']}")


def normalize_config(cfg: dict) -> dict:
    """Every field of the config table filled in (defaults applied), checked.

    Raises ValueError naming the field: unknown field, missing required field, wrong type,
    or a broken consistency rule. The input is not modified.
    """
    c = _fill_fields(cfg)
    _fill_derived(c)
    _check_rules(c)
    return c


def uses_rope(cfg: dict) -> bool:
    return cfg["pos_encoding"] in ("rope_half", "rope_interleaved")


def layer_prefixes(cfg: dict) -> dict[str, list[str]]:
    """The tensor-name prefixes of the pre, loop and post layers, in application order."""
    return {
        "pre": [f"pre.{i}." for i in range(cfg["n_pre_blocks"])],
        "loop": [f"loop.{j}." for j in range(cfg["n_loop_layers"])],
        "post": [f"post.{k}." for k in range(cfg["n_post_blocks"])],
    }


def _add_norm(out: dict, c: dict, name: str) -> None:
    out[f"{name}.weight"] = (c["dim"],)
    if c["norm_bias"]:
        out[f"{name}.bias"] = (c["dim"],)


def _add_linear(out: dict, name: str, n_out: int, n_in: int, bias: bool) -> None:
    out[f"{name}.weight"] = (n_out, n_in)
    if bias:
        out[f"{name}.bias"] = (n_out,)


def _add_layer(out: dict, c: dict, p: str, value_embed: bool) -> None:
    """The tensors of one transformer layer with name prefix `p` (e.g. 'loop.0.')."""
    D, F, hd = c["dim"], c["ffn_dim"], c["head_dim"]
    H, KVH = c["n_heads"], c["n_kv_heads"]
    sandwich = c["norm_placement"] != "pre"
    _add_norm(out, c, p + "attn_norm")
    if sandwich:
        _add_norm(out, c, p + "attn_post_norm")
    _add_norm(out, c, p + "mlp_norm")
    if sandwich:
        _add_norm(out, c, p + "mlp_post_norm")
    qb = c["attn_qkv_bias"]
    if c["qkv_fused"]:
        _add_linear(out, p + "attn.wqkv", (H + 2 * KVH) * hd, D, qb)
    else:
        _add_linear(out, p + "attn.wq", H * hd, D, qb)
        _add_linear(out, p + "attn.wk", KVH * hd, D, qb)
        _add_linear(out, p + "attn.wv", KVH * hd, D, qb)
    _add_linear(out, p + "attn.wo", D, H * hd, c["attn_out_bias"])
    if value_embed:
        out[p + "attn.value_embed.weight"] = (c["vocab_size"], KVH * hd)
        out[p + "attn.value_gate.weight"] = (KVH, VALUE_GATE_DIM)
    mb = c["mlp_bias"]
    if c["mlp"] == "swiglu":
        _add_linear(out, p + "mlp.w_gate", F, D, mb)
    _add_linear(out, p + "mlp.w_up", F, D, mb)
    _add_linear(out, p + "mlp.w_down", D, F, mb)


def expected_tensors(cfg: dict) -> dict[str, tuple]:
    """Every tensor name the config needs -> its shape, per the doc's "Tensor names" table.

    Order: embed, pos_emb, inject, pre layers, loop layers, post layers, prelude_norm,
    loop_norm, post_loop_norm, post_loop_proj, final_norm, head, exit_gate (a stable order
    the writer keeps within each element size).
    """
    c = normalize_config(cfg)
    D, V = c["dim"], c["vocab_size"]
    out: dict[str, tuple] = {"embed.weight": (V, D)}
    if c["pos_encoding"] == "learned":
        out["pos_emb.weight"] = (c["max_seq_len"], D)
    if c["inject"] == "linear_concat":
        out["inject.weight"] = (D, 2 * D)  # no bias: the doc lists none for inject
    prefixes = [p for group in layer_prefixes(c).values() for p in group]  # pre, loop, post
    for i, p in enumerate(prefixes):
        _add_layer(out, c, p, i in c["value_embed_layers"])
    if c["prelude_norm"]:
        _add_norm(out, c, "prelude_norm")
    if c["loop_norm"]:
        _add_norm(out, c, "loop_norm")
    if c["post_loop_norm"] == "own":
        _add_norm(out, c, "post_loop_norm")
    if c["post_loop_proj"]:
        out["post_loop_proj.weight"] = (D, D)  # no bias: Parcae's C has none
    if c["final_norm"]:
        _add_norm(out, c, "final_norm")
    if not c["tie_embeddings"]:
        out["head.weight"] = (V, D)
    if c["exit_gate"]:
        out["exit_gate.weight"] = (1, D)
        out["exit_gate.bias"] = (1,)  # always present with the gate, whatever the bias flags
    return out


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
