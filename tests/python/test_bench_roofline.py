"""bench/roofline.py: its byte and flop counts (against the model file's own tensor table and
hand counts), the decode columns' arithmetic, the machine probe it reads, and one short run
on a tiny random model through its command line."""
import os
import sys

import pytest

import tinyloop_py as tl
from tinyloop_py import _testing

_REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(_REPO, "bench"))
sys.path.insert(0, os.path.join(_REPO, "python"))

import roofline  # noqa: E402
from tinyloop.bench import read_header  # noqa: E402

TINY = dict(dim=64, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=300, n_pre_blocks=1, n_loop_layers=2,
            n_post_blocks=1, default_loops=3, max_seq_len=256)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tinyloop.random_model import write_random_model
    return write_random_model(str(tmp_path_factory.mktemp("roofline") / "tiny.tinyloop"), "llama", seed=5, **TINY)


def test_kv_bytes_by_hand():
    # The benchmark model at L = 8: 1 + 8 * 2 + 1 = 18 slots, 12 kv heads of 64.
    c = dict(n_pre_blocks=1, n_loop_layers=2, n_post_blocks=1, n_kv_heads=12, head_dim=64)
    assert roofline.kv_bytes_per_position(c, 8, "fp16") == 18 * 2 * 12 * 64 * 2
    assert roofline.kv_bytes_per_position(c, 8, "int8") == 18 * 2 * 12 * (64 + 4)  # + a float scale a row
    assert roofline.kv_bytes_per_position(c, 8, "fp32") == 18 * 2 * 12 * 64 * 4
    with pytest.raises(ValueError, match="h_fp16"):
        roofline.kv_bytes_per_position(c, 8, "h_fp16")


def test_prefill_flops_match_the_files_matrices(tiny_model):
    # Independent count: every 2-D weight of a layer block in the file's tensor table, loop
    # layers once per iteration; the attention term is the formula's own (no tensor holds it).
    m = tl.Model(tiny_model)
    c, loops, n = m.config(), 3, 40
    m.close()
    macs = 0
    for name, t in read_header(tiny_model).items():
        if len(t["shape"]) != 2 or not name.startswith(("pre.", "loop.", "post.")):
            continue
        rows, cols = t["shape"]
        macs += rows * cols * (loops if name.startswith("loop.") else 1)
    slots = 1 + loops * 2 + 1
    attn = slots * 2 * c["n_heads"] * c["head_dim"] * (n + 1) / 2
    assert roofline.prefill_flops_per_token(c, loops, n) == pytest.approx(2 * (macs + attn))


def test_decode_columns_arithmetic():
    # 100 t/s at D0; 100 MB more K/V a token; the machine reads 50 GB/s. At 25 GB/s the extra
    # bytes take 4 ms: 1 / 14 ms = 71.4 t/s measured; at 50 GB/s 2 ms: 1 / 12 ms = 83.3 t/s.
    implied, ceiling = roofline.decode_columns(100.0, 1 / 0.014, 1e8, 50.0)
    assert implied == pytest.approx(25.0)
    assert ceiling == pytest.approx(1 / 0.012)
    # No extra time measured (noise): an infinite rate, not a division by zero.
    assert roofline.decode_columns(100.0, 100.0, 1e8, 50.0)[0] == float("inf")


def test_machine_bounds_probe():
    b = _testing.machine_bounds(1, read_mib=8, reps=1)
    assert b["threads"] == 1 and b["simd_target"] == tl.cpu_info()["simd_target"]
    assert 0.1 < b["read_gbps"] < 4000 and 0.1 < b["fma_gflops"] < 384
    for bad in (dict(threads=0), dict(threads=1025), dict(read_mib=0), dict(read_mib=1 << 40), dict(reps=0)):
        with pytest.raises(ValueError):
            _testing.machine_bounds(**{"threads": 1, "read_mib": 8, "reps": 1, **bad})


def test_short_run_prints_both_tables(tiny_model, capsys):
    assert roofline.main(["--model", tiny_model, "-L", "3", "-t", "1", "-p", "16", "-n", "4", "-d", "8,64",
                          "-r", "1", "--read-mib", "8", "--kv-mode", "fp16,int8"]) == 0
    out = capsys.readouterr().out
    pp = [line for line in out.splitlines() if line.startswith("| TinyLoop") and len(line.split("|")) == 6]
    tg = [line for line in out.splitlines() if line.startswith("| TinyLoop") and len(line.split("|")) == 10]
    assert len(pp) == 2 and len(tg) == 4
    for row in pp:
        rate, gflops = float(row.split("|")[2]), float(row.split("|")[3])
        assert rate > 0 and gflops > 0
    deep = [r for r in tg if r.split("|")[2].strip() == "64"]
    assert len(deep) == 2 and all(float(r.split("|")[6]) > 0 for r in deep)  # ceiling t/s


def test_bad_arguments_are_refused(tiny_model):
    for argv in (["--kv-mode", "h_fp16"], ["-d", "0"], ["-p", "0", "-n", "0"], ["-r", "0"],
                 ["--weight-dtype", "f8"]):
        with pytest.raises(SystemExit):
            roofline.main(["--model", tiny_model, *argv])
    with pytest.raises(SystemExit):  # llama.cpp is compared on F16 weights only
        roofline.main(["--weight-dtype", "int8", "--llama"])
