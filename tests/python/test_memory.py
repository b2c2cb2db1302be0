"""vram_usage_mb: weights + live caches + workspace (docs/generation.md, "Memory")."""
import os

import numpy as np

import tinyloop_py as tl


def test_vram_counts_weights_and_live_caches(test_models):
    m = test_models["huginn"]
    with tl.Model(m.path, max_seq_len=1024) as model:
        idle = model.vram_usage_mb()
        weights_mb = os.path.getsize(m.path) / 2**20
        assert 0.8 * weights_mb < idle <= weights_mb * 1.01
        during = []
        model.generate_stream(np.array([1, 2, 3], dtype=np.int32),
                              lambda t: during.append(model.vram_usage_mb()) or True,
                              max_tokens=500, loops=8, stop_at_eos=False)
        # KV: (1 + 8*2 + 1) slots x 503 positions x 2 (K, V) x 64 dims x 2 bytes ~ 2.2 MiB
        expected_kv = 18 * 503 * 2 * 64 * 2 / 2**20
        assert max(during) - idle > 0.9 * expected_kv
        assert model.vram_usage_mb() == idle  # released after the call


def _rss_file_kib() -> int:
    """This process's resident file-backed pages (the model's mapping among them), KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1])
    raise AssertionError("no RssFile in /proc/self/status")


def test_packed_copies_release_the_mapped_originals(tmp_path):
    """int8 weights with the packed q8 kernel: the backend's copies are what the kernels read,
    so the file pages packing faulted in are dropped again (ModelFile::release_pages) and
    vram_usage_mb counts the copies instead of the originals; the scalar kernels, which read
    the originals, fault them back and give the same tokens."""
    import pytest

    from tinyloop.random_model import write_random_model

    if tl.cpu_info()["q8_kernel"] not in ("amx-int8", "avx512vnni", "avx2"):
        pytest.skip("no packed q8 kernel on this CPU (needs AVX512-VNNI or AVX2)")
    path = str(tmp_path / "int8.tinyloop")
    write_random_model(path, "llama", seed=3, weight_dtype="int8", group=32, scale_dtype="f16",
                       dim=256, n_heads=4, n_kv_heads=4, ffn_dim=1024, vocab_size=2048,
                       n_pre_blocks=1, n_loop_layers=2, n_post_blocks=1)
    size_kib = os.path.getsize(path) / 1024
    prompt = np.array([5, 6, 7, 8], dtype=np.int32)
    with tl.Model(path, quant_activations="f32") as exact:
        f32_mb = exact.vram_usage_mb()
    before = _rss_file_kib()
    with tl.Model(path, quant_activations="q8") as model:
        grown = _rss_file_kib() - before
        # Packing read every matmul weight (nearly the whole file); without the release all of
        # it would stay resident.
        assert grown < 0.25 * size_kib, (grown, size_kib)
        # The originals of the matmul weights are no longer counted: the copies (a little
        # larger than the int8 bytes they pack) replace them, so the total stays near the f32
        # model's, not twice it.
        assert model.vram_usage_mb() < 1.25 * f32_mb
        fast = model.generate(prompt, max_tokens=12, loops=3, temperature=0.0, stop_at_eos=False)
        tl.set_force_scalar(True)
        try:
            scalar = model.generate(prompt, max_tokens=12, loops=3, temperature=0.0, stop_at_eos=False)
        finally:
            tl.set_force_scalar(False)
        assert list(fast) == list(scalar)
