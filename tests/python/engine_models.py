"""Random models of every family variant, written once per test session, for the engine
tests. Each entry: name -> (config, tensors as float64 from the written file, path)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from tinyloop.config import preset_config
from tinyloop.format import read_model
from tinyloop.random_model import write_random_model


@dataclass
class TestModel:
    name: str
    path: str
    cfg: dict
    tensors: dict  # float64, decoded from the file (so f16/bf16 rounding is included)


# Variants covering the family: GQA and MHA, both RoPE layouts and learned positions,
# the three norm placements, fused/split QKV, biases, every inject / init_state kind,
# GELU, LayerNorm, and f16/bf16 weight storage.
VARIANTS = {
    "llama": ("llama", {}, "f32"),
    "huginn": ("huginn", {}, "f32"),
    "ouro": ("ouro", {}, "f32"),
    "gpt_learned": ("llama", dict(pos_encoding="learned", norm_type="layernorm", norm_bias=True,
                                  mlp="gelu", attn_qkv_bias=True, attn_out_bias=True, mlp_bias=True,
                                  n_kv_heads=4, n_pre_blocks=1, n_loop_layers=1, n_post_blocks=1,
                                  inject="add", init_state="zeros", default_loops=3), "f32"),
    "huginn_gqa_f16": ("huginn", dict(n_kv_heads=2, qkv_fused=False, mlp="gelu_tanh",
                                      init_state="input", inject="add"), "f16"),
    "ouro_interleaved_bf16": ("ouro", dict(pos_encoding="rope_interleaved", n_kv_heads=1,
                                           post_loop_norm="own", exit_gate=False), "bf16"),
}


def build(tmpdir: str, name: str, **extra) -> TestModel:
    kind, overrides, dtype = VARIANTS[name]
    overrides = {"max_seq_len": 128, **overrides, **extra}
    cfg = preset_config(kind, **overrides)
    path = os.path.join(tmpdir, f"{name}.tinyloop")
    write_random_model(path, cfg, seed=7, weight_dtype=dtype)
    contents = read_model(path)
    return TestModel(name, path, contents.config, contents.tensors)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |b|: relative to the scale of the logits, not per element."""
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))
