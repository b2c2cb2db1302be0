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
