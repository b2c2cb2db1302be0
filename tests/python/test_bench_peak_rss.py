"""bench/peak_rss.py's pure helpers: /proc status parsing, KV byte counts, slot counts and
the markdown tables (no engine, no llama_cpp, no model files)."""
import os
import sys

_REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(_REPO, "bench"))

import peak_rss as pr  # noqa: E402

STATUS = """Name:\tpython3
Umask:\t0022
State:\tR (running)
VmPeak:\t 1234568 kB
VmHWM:\t  524288 kB
VmRSS:\t  262144 kB
RssAnon:\t  200000 kB
RssFile:\t   62144 kB
RssShmem:\t       0 kB
Threads:\t3
Cpus_allowed_list:\t0-1
"""


def test_parse_status_reads_kb_fields_only():
    s = pr.parse_status(STATUS)
    assert s["VmHWM"] == 524288 and s["VmRSS"] == 262144
    assert s["RssAnon"] + s["RssFile"] + s["RssShmem"] == s["VmRSS"]
    assert "Threads" not in s and "Name" not in s and "Cpus_allowed_list" not in s


def test_read_status_has_the_keys_of_this_process():
    s = pr.read_status()
    assert {"VmHWM", "VmRSS"} <= set(s)
    assert s["VmHWM"] >= s["VmRSS"] > 0


def test_kv_bytes_bench_model_and_smollm2():
    # bench model at L = 8: 1 + 8 * 2 + 1 = 18 slots, 12 kv heads x 64, F16 K and V
    cfg = dict(n_pre_blocks=1, n_loop_layers=2, n_post_blocks=1)
    assert pr.tinyloop_slots(cfg, 8) == 18
    assert pr.kv_bytes(18, 4096, 12, 64) == 18 * 4096 * 2 * 768 * 2 == 216 * 2**20
    # SmolLM2-135M: 30 layers, 3 kv heads x 64
    assert pr.kv_bytes(30, 4096, 3, 64) / 2**20 == 90.0


def test_llama_kv_shape_from_metadata():
    meta = {"general.architecture": "llama", "llama.block_count": "18",
            "llama.attention.head_count": "12", "llama.embedding_length": "768"}
    assert pr.llama_kv_shape(meta) == (18, 12, 64)  # head_count_kv defaults to head_count
    meta.update({"llama.attention.head_count_kv": "3", "llama.attention.key_length": "80"})
    assert pr.llama_kv_shape(meta) == (18, 3, 80)


def _result(engine, peak_kb, vram=None, model="bench L=8", weights="F16 / F16"):
    st = dict(VmHWM=peak_kb, VmRSS=peak_kb // 2, RssAnon=peak_kb // 4, RssFile=peak_kb // 4)
    return dict(model=model, weights=weights, engine=engine, before=dict(VmRSS=1024), load=st, run=st,
                vram_load=vram, vram_max=None if vram is None else vram + 1.0, kv_bytes=216 * 2**20)


def test_format_table_ratio_against_same_model_llama_row():
    rows = [_result("TinyLoop", 300 * 1024, vram=250.0), _result("llama.cpp", 400 * 1024),
            _result("TinyLoop", 100 * 1024, vram=90.0, weights="int4 / Q4_0")]
    lines = pr.format_table(rows, 4096, 16).splitlines()
    assert lines[0].startswith("| model | weights | engine |") and "4080 prefill + 15 decode" in lines[0]
    assert lines[1].count("|") == lines[0].count("|")
    assert lines[2] == "| bench L=8 | F16 / F16 | TinyLoop | 150.0 | 300.0 | 250.0 / 251.0 | 216.0 | 0.75 |"
    assert lines[3] == "| bench L=8 | F16 / F16 | llama.cpp | 200.0 | 400.0 | - | 216.0 | - |"
    assert lines[4].endswith("| - |")  # no llama.cpp row for int4: no ratio


def test_format_breakdown_columns():
    lines = pr.format_breakdown([_result("llama.cpp", 400 * 1024)]).splitlines()
    assert lines[2] == "| bench L=8 | F16 / F16 | llama.cpp | 1.0 | 100.0 / 100.0 | 100.0 / 100.0 | 400.0 |"
