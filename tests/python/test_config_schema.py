"""One schema for the config and the container (docs/model-format.md, "Adding a config field").

A config field is declared once, in include/tinyloop/config_fields.def. These tests prove
that every place that lists fields is derived from that table: the schema the engine exports,
what Python's normalize_config fills, what write_model puts in a file, and what Model.config
returns are the same set, and a config with every field off its default survives
Python -> file -> C++ -> dict unchanged. A field added to the table without a
non-default value below fails test_every_field_has_a_non_default_value_here, by name.
"""

import json
import struct

import numpy as np
import pytest

tl = pytest.importorskip("tinyloop_py")

from tinyloop import config as C  # noqa: E402
from tinyloop import format as F  # noqa: E402
from tinyloop.random_model import random_tensors  # noqa: E402

# What Model.config adds to the file's fields: the engine's choices for this Model
# (python/bindings/bind_model.cc, config_dict).
MODEL_EXTRAS = {"trained_max_seq_len", "kv_mode", "quant_activations", "fp16_body",
                "kv_cache_disabled"}

# A valid config with every field set to something other than its default (derived fields:
# other than what they would derive to). Every field of the schema must appear here.
NON_DEFAULT = dict(
    dim=64, vocab_size=97, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=96,
    n_pre_blocks=1, n_loop_layers=2, n_post_blocks=1, default_loops=3, max_seq_len=48,
    norm_type="layernorm", norm_eps=1e-6, norm_bias=True, norm_placement="huginn_sandwich",
    qkv_fused=True, attn_qkv_bias=True, attn_out_bias=True, mlp_bias=True, qk_norm=True,
    value_embed_layers=[1, 3], pos_encoding="rope_interleaved", rope_theta=500000.0,
    mlp="gelu_tanh", embed_scale=2.5, init_state="random", init_state_std=0.25,
    init_state_seed=77, init_state_per_call=True, prelude_norm=True, inject="linear_concat",
    loop_norm=True, post_loop_norm="own", post_loop_proj=True, final_norm=False,
    tie_embeddings=True, exit_gate=True, exit_gate_mode="threshold", exit_gate_threshold=0.75,
    exit_gate_step=2, bos_id=1, eos_ids=[2, 5],
)


def names(fields):
    return [f["name"] for f in fields]


def test_schema_is_the_engines_table():
    schema = tl.config_schema()
    assert C.config_fields() == schema
    assert len(set(names(schema))) == len(schema)  # no field twice
    kinds = {"int", "uint64", "float", "bool", "enum", "int_or_null", "int_list"}
    for f in schema:
        assert f["kind"] in kinds, f
        assert f["presence"] in ("required", "optional", "derived"), f
        assert f["doc"], f  # every field says what it is
        if f["kind"] == "enum":
            assert f["default"] in f["choices"], f
        if f["presence"] != "optional":
            assert f["default"] is None, f
    assert C.MAX_LOOPS == 4096 and C.MAX_SEQ_LEN == 2**24  # docs/limits.md


def test_every_field_has_a_non_default_value_here():
    for f in tl.config_schema():
        assert f["name"] in NON_DEFAULT, f"add field {f['name']!r} to NON_DEFAULT"
        if f["presence"] == "optional":
            assert NON_DEFAULT[f["name"]] != f["default"], f["name"]
    assert set(NON_DEFAULT) == set(names(tl.config_schema()))
    c = C.normalize_config({k: v for k, v in NON_DEFAULT.items() if k not in ("n_kv_heads", "head_dim")})
    assert (c["n_kv_heads"], c["head_dim"]) == (4, 16)  # so 2 and 8 are not the derived ones


def test_python_fills_exactly_the_schema_fields_in_order():
    required = {f["name"]: 64 for f in tl.config_schema() if f["presence"] == "required"}
    required["n_heads"] = 4
    c = C.normalize_config(required)
    assert list(c) == names(tl.config_schema())
    for f in tl.config_schema():
        if f["presence"] == "optional":
            assert c[f["name"]] == f["default"], f["name"]


def test_every_field_round_trips_python_file_engine(tmp_path):
    cfg = C.normalize_config(NON_DEFAULT)
    assert cfg == NON_DEFAULT  # nothing dropped or coerced on the Python side
    path = F.write_model(tmp_path / "every.tinyloop", cfg, random_tensors(cfg, seed=5))
    written = json.loads(F.read_model(path).metadata["config"])
    assert list(written) == names(tl.config_schema())
    with tl.Model(path) as m:
        got = m.config()
    assert set(got) == set(names(tl.config_schema())) | MODEL_EXTRAS
    assert {k: got[k] for k in NON_DEFAULT} == NON_DEFAULT
    assert got["trained_max_seq_len"] == NON_DEFAULT["max_seq_len"]


@pytest.mark.parametrize("value", [float("nan"), np.int64(3), object()])
def test_values_json_cannot_hold_are_refused_by_name(value):
    with pytest.raises(ValueError, match="'dim'"):
        C.normalize_config(dict(NON_DEFAULT, dim=value))


def test_engine_errors_reach_python_as_value_errors_naming_the_field():
    with pytest.raises(tl.ModelFormatError, match="'n_kv_heads'"):
        C.normalize_config(dict(NON_DEFAULT, n_kv_heads=3))
    with pytest.raises(ValueError, match="missing required field 'dim'"):
        C.normalize_config({k: v for k, v in NON_DEFAULT.items() if k != "dim"})


def test_writer_takes_the_container_constants_from_the_engine(tmp_path):
    fmt = tl.container_format()
    assert F.DATA_ALIGNMENT == fmt["data_alignment"]
    assert F.QUANT_FORMAT_VERSION == int(fmt["format_version_quant"])
    assert C.FORMAT_VERSION == int(fmt["format_version_float"])
    float_dtypes = {n for n, d in fmt["dtypes"].items() if d["use"] == "float"}
    assert set(F._WEIGHT_DTYPES.values()) <= float_dtypes  # write_model's weight_dtype names
    cfg = C.preset_config("llama")
    path = F.write_model(tmp_path / "m.tinyloop", cfg, random_tensors(cfg), weight_dtype="bf16")
    blob = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    assert (fmt["header_len_bytes"] + n) % fmt["data_alignment"] == 0
    header = json.loads(blob[fmt["header_len_bytes"]:fmt["header_len_bytes"] + n])
    meta = header[fmt["metadata_key"]]
    assert meta[fmt["metadata_keys"]["format"]] == fmt["format_name"]
    assert meta[fmt["metadata_keys"]["format_version"]] == fmt["format_version_float"]
    for name, entry in header.items():
        if name != fmt["metadata_key"]:
            assert entry["dtype"] in fmt["dtypes"], name


def test_the_doc_table_lists_every_field_in_order():
    import os
    doc = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "model-format.md")
    text = open(doc, encoding="utf-8").read()
    table = text.split("## Config (JSON, version 1)", 1)[1].split("Consistency rules", 1)[0]
    rows = [line.split("|")[1].strip().strip("`") for line in table.splitlines()
            if line.startswith("| `")]
    assert rows == names(tl.config_schema())
