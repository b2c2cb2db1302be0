"""Reading a Hugging Face model folder: config.json, the safetensors weights (one file or
shards listed in model.safetensors.index.json), tokenizer.json, the chat template and the
EOS ids. Shared by the Llama, Huginn and Ouro importers.

Tensors are listed (name, shape, dtype) without reading their data, so an importer can
refuse a bad checkpoint before any work; data is read one tensor at a time. F32 and F16 go
through `safetensors` itself; BF16, which numpy has no type for, is read from the same file
as uint16 bit patterns (safetensors gives its offsets) and widened to float32 exactly.
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np

from ..format import from_bf16_bits
from .common import as_bf16_values

__all__ = ["HFFolder", "config_int", "config_float"]

_FLOAT_DTYPES = ("F32", "F16", "BF16")


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def config_int(cfg: dict, src: str, *keys, default=None) -> int:
    """The first of `keys` present in the HF config, as an int (a bool is refused)."""
    for k in keys:
        if cfg.get(k) is not None:
            v = cfg[k]
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{src}: config field '{k}': expected an integer, got {v!r}")
            return v
    if default is not None:
        return default
    raise ValueError(f"{src}: config field '{keys[0]}' is missing")


def config_float(cfg: dict, src: str, key: str, default=None) -> float:
    v = cfg.get(key)
    if v is None:
        if default is None:
            raise ValueError(f"{src}: config field '{key}' is missing")
        return float(default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{src}: config field '{key}': expected a number, got {v!r}")
    return float(v)


class HFFolder:
    """One Hugging Face model folder."""

    def __init__(self, path):
        self.path = os.fspath(path)
        cfg_path = os.path.join(self.path, "config.json")
        if not os.path.isfile(cfg_path):
            raise ValueError(f"{self.path}: no config.json (not a Hugging Face model folder)")
        self.config = _read_json(cfg_path)
        if not isinstance(self.config, dict):
            raise ValueError(f"{cfg_path}: expected a JSON object")
        self._files = self._weight_files()
        self.shapes: dict = {}  # name -> shape
        self.dtypes: dict = {}  # name -> safetensors dtype string
        self._where: dict = {}  # name -> file
        self._list_tensors()

    # -- weights --------------------------------------------------------------------

    def _weight_files(self) -> list[str]:
        index = os.path.join(self.path, "model.safetensors.index.json")
        if os.path.isfile(index):
            weight_map = _read_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"{index}: no 'weight_map'")
            files = sorted(set(weight_map.values()))
            for f in files:
                if not os.path.isfile(os.path.join(self.path, f)):
                    raise ValueError(f"{index}: shard '{f}' is missing from {self.path}")
            self._index = weight_map
            return [os.path.join(self.path, f) for f in files]
        self._index = None
        files = sorted(f for f in os.listdir(self.path) if f.endswith(".safetensors"))
        if not files:
            bins = [f for f in os.listdir(self.path) if f.endswith((".bin", ".pt", ".pth"))]
            hint = f" (found {bins[0]}: PyTorch pickles are not read; save with " \
                   f"safe_serialization=True)" if bins else ""
            raise ValueError(f"{self.path}: no *.safetensors weights{hint}")
        return [os.path.join(self.path, f) for f in files]

    def _list_tensors(self) -> None:
        from safetensors import safe_open

        for path in self._files:
            try:
                with safe_open(path, framework="np") as f:
                    for name in f.keys():
                        if name in self._where:
                            raise ValueError(f"{path}: tensor '{name}' is also in "
                                             f"{self._where[name]}")
                        sl = f.get_slice(name)
                        self.shapes[name] = tuple(int(d) for d in sl.get_shape())
                        self.dtypes[name] = str(sl.get_dtype())
                        self._where[name] = path
            except ValueError:
                raise
            except Exception as e:  # safetensors raises its own error types
                raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
        if self._index is not None:
            for name, f in self._index.items():
                if name not in self._where:
                    raise ValueError(f"{self.path}: tensor '{name}' is listed in the index "
                                     f"but not found in {f}")

    def check_float(self, names) -> None:
        """Refuse, by name, a tensor not stored as F32, F16 or BF16 (e.g. a GPTQ int)."""
        for name in names:
            if name in self.dtypes and self.dtypes[name] not in _FLOAT_DTYPES:
                raise ValueError(f"{self._where[name]}: tensor '{name}' has dtype "
                                 f"{self.dtypes[name]}; only F32, F16 and BF16 are supported")

    def load(self, name: str) -> np.ndarray:
        """One tensor: float32 (F32, and BF16 widened exactly) or float16 (F16)."""
        path, dtype = self._where[name], self.dtypes[name]
        if dtype == "BF16":
            return as_bf16_values(from_bf16_bits(self._raw_u16(path, name)))
        from safetensors import safe_open

        with safe_open(path, framework="np") as f:
            return np.array(f.get_tensor(name))

    def _raw_u16(self, path: str, name: str) -> np.ndarray:
        """A 2-byte tensor's bit patterns, located through the safetensors header."""
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            begin, end = header[name]["data_offsets"]
            f.seek(8 + n + begin)
            raw = f.read(end - begin)
        if len(raw) != end - begin:
            raise ValueError(f"{path}: tensor '{name}' is truncated")
        return np.frombuffer(raw, dtype="<u2").reshape(self.shapes[name])

    # -- text -----------------------------------------------------------------------

    def tokenizer_json(self) -> str | None:
        """tokenizer.json verbatim (it must be JSON), or None."""
        path = os.path.join(self.path, "tokenizer.json")
        if not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        return text

    def chat_template(self) -> str | None:
        """chat_template.jinja, else tokenizer_config.json's `chat_template` (a string, or a
        list of named templates of which 'default' is taken)."""
        jinja = os.path.join(self.path, "chat_template.jinja")
        if os.path.isfile(jinja):
            with open(jinja, encoding="utf-8") as f:
                return f.read()
        path = os.path.join(self.path, "tokenizer_config.json")
        if not os.path.isfile(path):
            return None
        tmpl = _read_json(path).get("chat_template")
        if isinstance(tmpl, list):
            named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
            tmpl = named.get("default")
        return tmpl if isinstance(tmpl, str) else None

    def eos_ids(self) -> list[int]:
        """`eos_token_id` of config.json, then of generation_config.json (int or list),
        without repeats, in that order."""
        out: list[int] = []
        sources = [self.config]
        gen = os.path.join(self.path, "generation_config.json")
        if os.path.isfile(gen):
            sources.append(_read_json(gen))
        for cfg in sources:
            v = cfg.get("eos_token_id")
            for t in (v if isinstance(v, list) else [v]):
                if isinstance(t, int) and not isinstance(t, bool) and t not in out:
                    out.append(t)
        return out

    def bos_id(self) -> int | None:
        v = self.config.get("bos_token_id")
        return v if isinstance(v, int) and not isinstance(v, bool) else None
