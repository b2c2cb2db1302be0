"""The reduced-precision layers (Model(fp16_body=True) / TINYLOOP_EXPERIMENTAL_FP16_BODY=1,
ops/matmul_bf16dot.h): it really takes the other path (logits differ, within a KL bound of
the float32 body), its weight copies are counted (instead of the originals they replace),
int8 weights are left alone, the env and kwarg select it, and it keeps batch invariance (a
prompt scored in one forward gives the tokens and logits of step-by-step decoding, bit for
bit)."""
import os

import numpy as np
import pytest

import tinyloop_py as tl
from tinyloop_py import _testing  # test and benchmark hooks
from tinyloop.random_model import write_random_model

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BUNDLED = os.path.join(ROOT, "models", "tinyloop-demo.tinyloop")
IDS = np.random.default_rng(0).integers(1, 8192, size=48).astype(np.int32)


def log_softmax(z):
    z = z.astype(np.float64)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


def n_layers(cfg):
    return cfg["n_pre_blocks"] + cfg["n_loop_layers"] + cfg["n_post_blocks"]


def copy_bytes(cfg, dtypes_float=True):
    """Bytes of the packed copies: the pre, loop and post layers' matmuls and the linear_concat
    inject."""
    D, F = cfg["dim"], cfg["ffn_dim"]
    q, kv = cfg["n_heads"] * cfg["head_dim"], cfg["n_kv_heads"] * cfg["head_dim"]
    shapes = [(q, D), (kv, D), (kv, D), (D, q), (F, D), (F, D), (D, F)] * n_layers(cfg)
    if cfg["inject"] == "linear_concat":
        shapes.append((D, 2 * D))
    return sum(-(-n // 64) * 64 * -(-k // 2) * 4 for n, k in shapes)


def original_bytes(path, cfg):
    """Bytes of the file's weights the copies replace (their pages are released after packing
    and they are no longer counted: LoopedModel::release_copied_originals)."""
    from tinyloop.bench import read_header

    elem = {"F32": 4, "F16": 2, "BF16": 2}
    dt = {v["dtype"] for k, v in read_header(path).items()
          if k.split(".")[0] in ("pre", "loop", "post") and len(v["shape"]) == 2}
    assert len(dt) == 1, dt
    D, F = cfg["dim"], cfg["ffn_dim"]
    q, kv = cfg["n_heads"] * cfg["head_dim"], cfg["n_kv_heads"] * cfg["head_dim"]
    n = (q * D + 2 * kv * D + D * q + 3 * F * D) * n_layers(cfg)
    if cfg["inject"] == "linear_concat":
        n += D * 2 * D
    return elem[dt.pop()] * n


@pytest.mark.skipif(not os.path.exists(BUNDLED), reason="bundled model missing")
def test_bundled_model_changes_slightly_and_counts_its_copies():
    with tl.Model(BUNDLED) as exact, tl.Model(BUNDLED, fp16_body=True) as low:
        cfg = low.config()
        assert cfg["fp16_body"] is True and exact.config()["fp16_body"] is False
        assert cfg["mlp"] == "swiglu" and not cfg["qkv_fused"]
        extra = (low.vram_usage_mb() - exact.vram_usage_mb()) * 1024 * 1024
        assert extra == copy_bytes(cfg) - original_bytes(BUNDLED, cfg)
        for L in (1, 6, 16):
            a, b = exact.score(IDS, loops=L), low.score(IDS, loops=L)
            assert not np.array_equal(a, b), f"L={L}: the flag changed nothing"
            p, q = log_softmax(a), log_softmax(b)
            kl = np.sum(np.exp(p) * (p - q), -1)  # [T]
            # Measured ~4e-7 mean on held-out text (bench/fp16_body.py); bf16 rounding of one
            # matmul input is ~2^-9 relative, so 1e-4 is loose but far below a broken kernel.
            assert kl.mean() < 1e-4 and kl.max() < 1e-3, f"L={L}: KL mean {kl.mean():.2e} max {kl.max():.2e}"
            assert np.mean(p.argmax(-1) == q.argmax(-1)) >= 0.95


@pytest.mark.skipif(not os.path.exists(BUNDLED), reason="bundled model missing")
def test_batch_invariance_score_equals_stepwise_decode():
    """Prefill of 8 then one token a step (fp32 K/V, as score uses) == one scoring forward,
    bit for bit; greedy generation picks the tokens the scoring forward's argmax picks."""
    with tl.Model(BUNDLED, kv_mode="fp32", fp16_body=True) as m:
        full = m.score(IDS, loops=6)  # [T, V]
        steps = _testing.stepwise_logits(m, IDS, 8, loops=6)  # rows predict after ids[7], ids[8], ...
        np.testing.assert_array_equal(steps, full[7:])
        prompt = IDS[:6]
        out = np.asarray(m.generate(prompt, max_tokens=24, loops=6, stop_at_eos=False), np.int32)
        np.testing.assert_array_equal(out[:len(prompt)], prompt)
        gen = out[len(prompt):]  # [24]
        scored = m.score(np.concatenate([prompt, gen]), loops=6)
        np.testing.assert_array_equal(scored[len(prompt) - 1:-1].argmax(-1), gen)


def test_env_kwarg_and_int8_weights_untouched(tmp_path, monkeypatch):
    f32 = write_random_model(str(tmp_path / "f32.tinyloop"), "huginn", seed=1, weight_dtype="f32")
    i8 = write_random_model(str(tmp_path / "i8.tinyloop"), "huginn", seed=1, weight_dtype="int8")
    ids = IDS[:12] % 64
    monkeypatch.setenv("TINYLOOP_EXPERIMENTAL_FP16_BODY", "1")
    with tl.Model(f32) as on, tl.Model(f32, fp16_body=False) as off:  # the kwarg wins
        assert on.config()["fp16_body"] and not off.config()["fp16_body"]
        extra = (on.vram_usage_mb() - off.vram_usage_mb()) * 1024 * 1024
        assert extra == copy_bytes(on.config()) - original_bytes(f32, on.config())
        a, b = off.score(ids, loops=3), on.score(ids, loops=3)
        assert not np.array_equal(a, b)
        assert np.max(np.abs(a - b)) < 2e-2 * np.max(np.abs(a))
    monkeypatch.setenv("TINYLOOP_EXPERIMENTAL_FP16_BODY", "0")
    with tl.Model(f32) as m:
        assert not m.config()["fp16_body"]
    # int8 weights: no copies, the same bits as without the flag.
    with tl.Model(i8, fp16_body=True) as on, tl.Model(i8) as off:
        assert on.vram_usage_mb() == off.vram_usage_mb()
        np.testing.assert_array_equal(on.score(ids, loops=3), off.score(ids, loops=3))


def test_bench_compares_both_bodies(tmp_path, capsys):
    import json

    from tinyloop import bench

    path = write_random_model(str(tmp_path / "m.tinyloop"), "llama", seed=2, weight_dtype="bf16")
    assert bench.main(["--model", path, "-p", "8", "-n", "2", "-r", "1", "-t", "1",
                       "--fp16-body", "off,on", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted((r["fp16_body"], r["test"]) for r in rows) == [
        (False, "pp8"), (False, "tg2"), (True, "pp8"), (True, "tg2")]
    assert bench.main(["--model", path, "-p", "8", "-n", "0", "-r", "1", "--fp16-body", "on"]) == 0
    assert "(bf16 body)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--fp16-body"):
        bench.main(["--model", path, "--fp16-body", "yes"])
