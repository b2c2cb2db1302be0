"""The CPU backend's process-wide settings (threads, SIMD or scalar kernels) and what they
must not change: logits are bit-identical for any thread count, SIMD and the scalar
reference agree within float rounding; and `tinyloop bench` runs."""
import json

import os

import numpy as np
import pytest

import tinyloop_py as tl
from tinyloop import bench

from engine_models import VARIANTS, rel_err

PROMPT = np.array([5, 17, 3, 42, 8, 91, 23, 60, 11, 2, 77, 30, 9], dtype=np.int32)


@pytest.fixture
def restore_cpu_settings():
    threads = tl.get_num_threads()
    yield
    tl.set_force_scalar(False)
    tl.set_num_threads(threads)


def test_thread_count_setting(restore_cpu_settings):
    tl.set_num_threads(3)
    assert tl.get_num_threads() == 3
    assert tl.cpu_info()["num_threads"] == 3
    tl.set_num_threads(0)  # < 1: the default (env TINYLOOP_NUM_THREADS or the core count)
    assert tl.get_num_threads() >= 1
    info = tl.cpu_info()
    assert info["simd_target"] in info["compiled_targets"]
    assert info["force_scalar"] is False
    # The q8 kernel: a packed one (AVX512-VNNI, AVX2), or the Highway one of the target in use.
    assert info["q8_kernel"] in ("amx-int8", "avx512vnni", "avx2", "portable-" + info["simd_target"])
    # The bf16 body's kernel; AMX exactly when the CPU has it (and nothing turned it off).
    assert info["bf16_kernel"] in ("amx", "avx512bf16", "portable-" + info["simd_target"])
    has_amx = "amx_bf16" in open("/proc/cpuinfo").read()
    off = os.environ.get("TINYLOOP_DISABLE_AMX") == "1"
    assert info["amx"] == (has_amx and not off) == (info["bf16_kernel"] == "amx")
    assert (info["amx_reason"] == "") == info["amx"], info["amx_reason"]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_threads_do_not_change_logits(test_models, restore_cpu_settings, name):
    with tl.Model(test_models[name].path) as model:
        tl.set_num_threads(1)
        one = model.score(PROMPT, loops=3)
        for n in (2, 4):
            tl.set_num_threads(n)
            np.testing.assert_array_equal(model.score(PROMPT, loops=3), one)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_simd_matches_scalar_reference(test_models, restore_cpu_settings, name):
    with tl.Model(test_models[name].path) as model:
        simd = model.score(PROMPT, loops=3)
        tl.set_force_scalar(True)
        assert tl.cpu_info()["force_scalar"] is True
        scalar = model.score(PROMPT, loops=3)
    # Both are within 1e-4 of the logit scale of the float64 reference (test_engine_forward).
    assert rel_err(simd, scalar.astype(np.float64)) < 1e-4


def test_bench_runs_on_a_small_model(test_models, capsys, restore_cpu_settings):
    path = test_models["llama"].path
    assert bench.main(["--model", path, "-p", "8", "-n", "4", "-L", "1,2", "-t", "1,2",
                       "--kernels", "simd,scalar", "-r", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    # loops x (simd at 1 and 2 threads, scalar at 1: it is single-threaded) x (pp, tg)
    assert len(rows) == 2 * 3 * 2
    assert {(r["kernels"], r["threads"]) for r in rows} == {("simd", 1), ("simd", 2), ("scalar", 1)}
    for r in rows:
        assert r["test"] in ("pp8", "tg4") and r["avg_ts"] > 0 and len(r["samples_ts"]) == 2
        assert ("weight_gb_s" in r) == (r["test"] == "tg4")
    # The table form, too.
    assert bench.main(["--model", path, "-p", "8", "-n", "4", "-r", "1"]) == 0
    assert "| pp8 |" in capsys.readouterr().out
