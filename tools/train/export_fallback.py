"""Minimal .tinyloop writer following docs/model-format.md, used only when
python/tinyloop/format.py is not importable. Same signature as tinyloop.format.write_model."""
import json

import numpy as np

_DT = {"f32": (np.float32, "F32"), "f16": (np.float16, "F16")}


def write_model(path, config, tensors, tokenizer_json=None, chat_template=None, weight_dtype="f16"):
    items = []
    for name, arr in tensors.items():
        arr = np.asarray(arr)
        is_norm_or_bias = name.endswith(".bias") or "norm" in name
        np_dt, tag = _DT["f32" if is_norm_or_bias else weight_dtype]
        little_endian = np_dt.__call__(0).dtype.newbyteorder("<")
        items.append((name, np.ascontiguousarray(arr.astype(np_dt)).astype(little_endian), tag))
    items.sort(key=lambda t: (-t[1].itemsize, t[0]))
    header, off = {}, 0
    for name, arr, tag in items:
        header[name] = {"dtype": tag, "shape": list(arr.shape), "data_offsets": [off, off + arr.nbytes]}
        off += arr.nbytes
    meta = {"format": "tinyloop", "format_version": "1", "config": json.dumps(config)}
    if tokenizer_json is not None:
        meta["tokenizer"] = tokenizer_json
    if chat_template is not None:
        meta["chat_template"] = chat_template
    header["__metadata__"] = meta
    hb = json.dumps(header).encode("utf-8")
    hb += b" " * ((-(8 + len(hb))) % 64)
    with open(path, "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for _, arr, _ in items:
            f.write(arr.tobytes())
