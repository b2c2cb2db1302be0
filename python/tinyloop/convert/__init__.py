"""`tinyloop convert`: GGUF files and Hugging Face folders -> `.tinyloop` (docs/convert.md).

    from tinyloop.convert import convert
    convert("smollm2.gguf", "smollm2.tinyloop")          # GGUF, llama architecture
    convert("path/to/hf-folder", "model.tinyloop")         # Llama, Huginn, Ouro, Nanbeige, Parcae

The importer is picked from the input: a `.gguf` file (or any file starting with the
GGUF magic), or a folder with a config.json whose `architectures` / `model_type` names a
supported model. Unsupported inputs raise ValueError naming what is not supported, before
anything is written.
"""
from __future__ import annotations

import os

from .common import run_plan

__all__ = ["convert", "plan_for", "SUPPORTED_HF"]

# config.json `architectures[0]` / `model_type` -> importer
SUPPORTED_HF = {
    "LlamaForCausalLM": "llama", "llama": "llama",
    "RavenForCausalLM": "huginn", "huginn_raven": "huginn",
    "OuroForCausalLM": "ouro", "ouro": "ouro",
    "NanbeigeForCausalLM": "nanbeige", "nanbeige": "nanbeige",
}

# Parcae's config.json (written by the authors' save_pretrained: the config dataclass as a
# dict) has no `architectures` / `model_type`; its `model_class_name` names the model.
_PARCAE_CLASS = "Parcae"


def _require(module: str, version: str) -> None:
    """The readers are optional dependencies of the package: say which one is missing."""
    try:
        __import__(module)
    except ImportError:
        raise RuntimeError(f"tinyloop convert needs the Python package '{module}' "
                           f"(pip install {module}=={version})") from None


def _is_gguf(path: str) -> bool:
    if path.lower().endswith(".gguf"):
        return True
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def _hf_kind(folder) -> str:
    c = folder.config
    archs = c.get("architectures") or []
    names = ([a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []) + \
        ([c["model_type"]] if isinstance(c.get("model_type"), str) else [])
    for n in names:
        if n in SUPPORTED_HF:
            return SUPPORTED_HF[n]
    if c.get("model_class_name") == _PARCAE_CLASS:
        return "parcae"
    what = names[0] if names else "(no 'architectures' or 'model_type')"
    raise ValueError(f"{folder.path}: architecture {what!r} is not supported (supported: "
                     f"LlamaForCausalLM, huginn_raven, ouro, nanbeige, Parcae "
                     f"(model_class_name), and GGUF llama)")


def plan_for(src):
    """The conversion plan for `src` (checked, nothing read but metadata and headers)."""
    src = os.fspath(src)
    if os.path.isdir(src):
        _require("safetensors", "0.7.0")
        from .hf_folder import HFFolder

        folder = HFFolder(src)
        kind = _hf_kind(folder)
        if kind == "llama":
            from .hf_llama import plan_llama
            return plan_llama(folder)
        if kind == "huginn":
            from .hf_huginn import plan_huginn
            return plan_huginn(folder)
        if kind == "nanbeige":
            from .hf_nanbeige import plan_nanbeige
            return plan_nanbeige(folder)
        if kind == "parcae":
            from .hf_parcae import plan_parcae
            return plan_parcae(folder)
        from .hf_ouro import plan_ouro
        return plan_ouro(folder)
    if not os.path.exists(src):
        raise FileNotFoundError(f"{src}: no such file or folder")
    if _is_gguf(src):
        _require("gguf", "0.19.0")
        from .gguf_import import plan_gguf
        return plan_gguf(src)
    raise ValueError(f"{src}: not a GGUF file (no GGUF magic) nor a Hugging Face model folder")


def convert(src, dst, *, progress: bool = True) -> str:
    """Convert `src` (a .gguf file or a Hugging Face folder) to the `.tinyloop` file `dst`.

    Returns the path written. Raises ValueError (FileNotFoundError for a missing input)
    naming the unsupported architecture, tensor type, config field, missing / unexpected /
    misshapen tensor or corrupt file; nothing is written then, not even a temp file.
    RuntimeError when the reader package (`gguf`, `safetensors`) is not installed.
    """
    plan = plan_for(src)
    if os.path.abspath(os.fspath(dst)) == os.path.abspath(os.fspath(src)):
        raise ValueError(f"{dst}: the output would overwrite the input")
    return run_plan(plan, dst, progress=progress)
