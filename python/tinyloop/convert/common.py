"""What every importer shares: a conversion plan (target tensor <- source tensors), its
checks, running it under a progress bar, and writing the `.tinyloop` file.

An importer (gguf_import, hf_llama, hf_huginn, hf_ouro) only describes the mapping: the
config, and one `Job` per target tensor naming the source tensors it reads with the shapes
the source config implies. `run_plan` then checks everything that can be checked without
reading tensor data (missing, leftover, wrongly shaped or wrongly typed source tensors, the
target config and shapes) BEFORE it builds a single tensor, builds the tensors under a tqdm
bar, and hands them to `tinyloop.format.write_model`, which writes to a temp file and
renames it into place. So a refused input never leaves a file behind, not even a temp file.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..config import check_tensor_shapes, normalize_config
from ..format import write_model
from ..quantize import logical_shapes

__all__ = ["Job", "Plan", "run_plan", "choose_weight_dtype", "shape_str"]


def shape_str(shape) -> str:
    return str([int(d) for d in shape])


@dataclass
class Job:
    """Builds the target tensors of one model weight from some source tensors.

    sources: source name -> the shape (numpy order) the source config implies.
    build:   {source name: array} -> {target name: array}; a quantized weight yields the
             weight and its `.scales` / `.offsets` companions.
    """

    sources: dict
    build: Callable[[dict], dict]
    label: str = ""


@dataclass
class Plan:
    """Everything an importer decided, before any tensor data is read."""

    src: str  # the input, for messages
    config: dict  # the target config (docs/model-format.md), not yet normalized
    jobs: list  # [Job], one per target weight, in the config's tensor order
    source_shapes: dict  # every tensor of the input: name -> shape (numpy order)
    load: Callable[[str], np.ndarray]  # reads one source tensor's data
    ignored: set = field(default_factory=set)  # source tensors deliberately not used
    target_shapes: dict = field(default_factory=dict)  # target name -> stored shape
    tokenizer_json: str | None = None
    chat_template: str | None = None


def _check_sources(plan: Plan) -> None:
    """Missing, leftover and wrongly shaped source tensors, named."""
    used: set = set()
    for job in plan.jobs:
        for name, want in job.sources.items():
            if name not in plan.source_shapes:
                raise ValueError(f"{plan.src}: tensor '{name}' is missing (the config needs "
                                 f"shape {shape_str(want)})")
            got = tuple(int(d) for d in plan.source_shapes[name])
            if got != tuple(int(d) for d in want):
                raise ValueError(f"{plan.src}: tensor '{name}' has shape {shape_str(got)}, the "
                                 f"config needs {shape_str(want)}")
            used.add(name)
    extra = sorted(set(plan.source_shapes) - used - set(plan.ignored))
    if extra:
        raise ValueError(f"{plan.src}: tensor '{extra[0]}' is not used by this architecture "
                         f"(unexpected tensor; {len(extra)} in all)")


def choose_weight_dtype(tensors: dict) -> str:
    """The one float storage type `write_model` gets for the 2-D float weights: F16 or BF16
    when every such weight is already that type, F32 otherwise (lossless for a mix).
    Quantized weights keep their own types; norms and biases are always F32."""
    kinds = set()
    for name, a in tensors.items():
        if np.ndim(a) != 2 or name.endswith((".scales", ".offsets")):
            continue
        if isinstance(a, BF16Array):
            kinds.add("bf16")
        elif a.dtype not in (np.int8, np.uint8):
            kinds.add("f16" if a.dtype == np.float16 else "f32")
    return kinds.pop() if len(kinds) == 1 else "f32"


class BF16Array(np.ndarray):
    """float32 values that came from bfloat16 storage: `choose_weight_dtype` keeps them
    BF16 (the float32 -> bf16 rounding is then exact). numpy has no bfloat16 type."""


def as_bf16_values(a: np.ndarray) -> np.ndarray:
    """Mark a float32 array of bfloat16 values (see BF16Array)."""
    return np.asarray(a, dtype=np.float32).view(BF16Array)


def _progress(jobs, enabled: bool, desc: str):
    if not enabled:
        return jobs
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a nicety; convert without it
        return jobs

    return tqdm(jobs, desc=desc, unit="tensor", leave=False)


def run_plan(plan: Plan, dst, progress: bool = True) -> str:
    """Check the plan, build the tensors, write `dst`. Returns the path written."""
    try:
        cfg = normalize_config(plan.config)
    except ValueError as e:
        raise ValueError(f"{plan.src}: the converted config is not valid: {e}") from None
    _check_sources(plan)
    dst = os.fspath(dst)
    parent = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(parent):
        raise ValueError(f"{dst}: the output folder {parent} does not exist")
    if os.path.isdir(dst):
        raise ValueError(f"{dst}: is a folder; give the .tinyloop file to write")
    tensors: dict = {}
    for job in _progress(plan.jobs, progress, f"converting {os.path.basename(plan.src)}"):
        data = {name: plan.load(name) for name in job.sources}
        tensors.update(job.build(data))
    try:
        check_tensor_shapes(cfg, logical_shapes({n: np.shape(t) for n, t in tensors.items()}))
    except ValueError as e:  # a mapping bug, not bad input; still never write such a file
        raise ValueError(f"{plan.src}: converted tensors do not fit the config: {e}") from None
    return write_model(dst, cfg, tensors, tokenizer_json=plan.tokenizer_json,
                       chat_template=plan.chat_template,
                       weight_dtype=choose_weight_dtype(tensors))
