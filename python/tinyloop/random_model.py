"""Random test models: tensors whose activations stay O(1) through many loop iterations.

    python3 -m tinyloop.random_model OUT --kind huginn --dim 96 --seed 3 --weight-dtype bf16
    python3 -m tinyloop.random_model OUT --kind llama --weight-dtype int4 --group 32
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np

from .config import expected_tensors, normalize_config, preset_config
from .format import write_model
from .quantize import quantize_tensors

__all__ = ["random_tensors", "write_random_model", "main"]

# Scales, and why:
_NORM_NOISE = 0.1  # norm weights 1 + N(0, 0.1): not all-ones, so a missing weight shows
_BIAS_STD = 0.1  # small but nonzero, so a dropped or misplaced bias changes the logits
_POS_STD = 0.5  # learned positions: visible next to a unit-scale embedding
_HEAD_GAIN = 2.0  # head on a unit-RMS normed state: logits std about 2


def _linear_std(name: str, shape: tuple) -> float:
    """N(0, 1/sqrt(in)) keeps a unit-scale input at unit scale; the residual-branch outputs
    (wo, w_down) get 1/sqrt(2) so 'pre' models grow slowly over many iterations."""
    gain = 1.0 / math.sqrt(2.0) if (".wo." in name or ".w_down." in name) else 1.0
    return gain / math.sqrt(shape[1])


def _embed_std(cfg: dict) -> float:
    """A tied embedding doubles as the head, so it is sized like the head (logits std ~2);
    an untied one is sized so that embed * embed_scale has unit scale."""
    if cfg["tie_embeddings"]:
        return _HEAD_GAIN / math.sqrt(cfg["dim"])
    scale = abs(cfg["embed_scale"])
    return 1.0 / scale if scale > 0 else 1.0


def _std_and_mean(cfg: dict, name: str, shape: tuple) -> tuple[float, float]:
    """(std, mean) of the normal a tensor is drawn from."""
    if name == "embed.weight":
        return _embed_std(cfg), 0.0
    if name == "pos_emb.weight":
        return _POS_STD, 0.0
    if name == "head.weight":
        return _HEAD_GAIN / math.sqrt(cfg["dim"]), 0.0
    if name.endswith(".bias"):
        return _BIAS_STD, 0.0
    if len(shape) == 1:  # a norm weight
        return _NORM_NOISE, 1.0
    return _linear_std(name, shape), 0.0  # linears, inject, exit gate


# The largest random model written: it is built in float32 memory first (docs/limits.md).
MAX_RANDOM_PARAMS = 2**31


def random_tensors(cfg: dict, seed: int = 0) -> dict:
    """Every tensor the config needs, float32, drawn in expected_tensors order from
    numpy's default_rng(seed) (so the same config and seed give the same model)."""
    cfg = normalize_config(cfg)
    shapes = expected_tensors(cfg)
    n_params = sum(int(np.prod(s, dtype=object)) for s in shapes.values())
    if n_params > MAX_RANDOM_PARAMS:
        raise ValueError(f"a random model of {n_params:,} parameters is larger than random-model "
                         f"writes (at most {MAX_RANDOM_PARAMS:,}: {4 * MAX_RANDOM_PARAMS >> 30} GiB of "
                         f"float32 while it is built)")
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_tensors(cfg).items():
        std, mean = _std_and_mean(cfg, name, shape)
        out[name] = (mean + std * rng.standard_normal(shape)).astype(np.float32)
    return out


WEIGHT_DTYPES = ("f32", "f16", "bf16", "int8", "int4")


def write_random_model(path, cfg_or_kind, seed: int = 0, weight_dtype: str = "f32",
                       group: int | None = 32, scale_dtype: str = "f32", **overrides) -> str:
    """Write a random model; `cfg_or_kind` is a config dict or a preset kind name.

    weight_dtype "int8" / "int4" quantizes every linear, the embedding and the head
    (tinyloop.quantize, round to nearest) with `group` columns a scale (None: one group a
    row; it must divide every in-dimension) and scales/offsets stored as `scale_dtype`
    ("f32" | "f16"); other 2-D tensors (pos_emb, exit gate) stay F32."""
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"weight_dtype {weight_dtype!r}: expected one of {list(WEIGHT_DTYPES)}")
    if isinstance(cfg_or_kind, str):
        cfg = preset_config(cfg_or_kind, **overrides)
    else:
        cfg = normalize_config({**cfg_or_kind, **overrides})
    tensors = random_tensors(cfg, seed)
    if weight_dtype in ("int8", "int4"):
        if scale_dtype not in ("f32", "f16"):
            raise ValueError(f"scale_dtype {scale_dtype!r}: expected 'f32' or 'f16'")
        tensors = quantize_tensors(tensors, weight_dtype, group,
                                   np.float16 if scale_dtype == "f16" else np.float32)
        weight_dtype = "f32"
    return write_model(path, cfg, tensors, weight_dtype=weight_dtype)


# ---------------------------------------------------------------------------------------
# command line

_INT_FLAGS = ("dim", "vocab_size", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
              "n_pre_blocks", "n_loop_layers", "n_post_blocks", "default_loops", "max_seq_len")


def _parse_set(items: list[str]) -> dict:
    """--set key=JSON (bare words that are not JSON are taken as strings)."""
    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(text)
        except json.JSONDecodeError:
            out[key] = text
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m tinyloop.random_model",
                                 description="Write a random .tinyloop model for tests.")
    ap.add_argument("out", help="output path")
    ap.add_argument("--kind", default="llama", choices=["llama", "huginn", "ouro"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--weight-dtype", default="f32", choices=list(WEIGHT_DTYPES))
    ap.add_argument("--group", type=int, default=32,
                    help="int8/int4: columns per scale (0: one group a row)")
    ap.add_argument("--scale-dtype", default="f32", choices=["f32", "f16"],
                    help="int8/int4: dtype of the scales and offsets")
    for name in _INT_FLAGS:
        ap.add_argument("--" + name.replace("_", "-"), dest=name, type=int, default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="any other config field, e.g. --set pos_encoding=learned")
    args = ap.parse_args(argv)
    overrides = {n: getattr(args, n) for n in _INT_FLAGS if getattr(args, n) is not None}
    overrides.update(_parse_set(args.set))
    try:
        path = write_random_model(args.out, args.kind, seed=args.seed,
                                  weight_dtype=args.weight_dtype, group=args.group or None,
                                  scale_dtype=args.scale_dtype, **overrides)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
