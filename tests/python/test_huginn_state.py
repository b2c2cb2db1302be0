"""Huginn's run-time initial state (docs/loop-depth.md "Random initial state").

Huginn's reference draws the loop's initial state afresh on every forward
(`initialize_state`: torch.randn, trunc_normal_(std * init_scale, cut at 3 std) times
emb_scale; init_scale = 0 gives zeros). A converted Huginn file says init_state_per_call,
and the engine draws per call from the call's seed. Checked here: the distribution against
the reference's (analytic moments and a two-sample KS test against numpy draws of the same
truncated normal), reproducibility under a seed, generate against the numpy reference model
with the call's state, init_scale 0 against the zero-state conversion, the serving engine,
and the argument checks.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import reference
from tinyloop.convert import convert
from tinyloop.format import read_model

from convert_oracle import write_hf_folder
from test_convert_hf import HUGINN, huginn_tensors

tl = pytest.importorskip("tinyloop_py")

IDS = [3, 17, 5, 40, 8, 61, 23, 2, 11, 70]
D = HUGINN["n_embd"]
STD = math.sqrt(2 / (5 * D)) * math.sqrt(D)  # init_values.std * emb_scale
# The std of a standard normal truncated at +-3 (what trunc_normal_(a=-3s, b=3s) draws).
_PHI3 = math.exp(-4.5) / math.sqrt(2 * math.pi)
TRUNC_STD = math.sqrt(1 - 6 * _PHI3 / math.erf(3 / math.sqrt(2)))


def _convert(tmp_path, name, state_init):
    c = {**HUGINN, "state_init": state_init, "qk_bias": False}
    t = huginn_tensors(c, np.random.default_rng(11))
    t = {k: v for k, v in t.items() if not k.endswith("qk_bias")}
    folder = write_hf_folder(tmp_path / name, c, t)
    dst = str(tmp_path / f"{name}.tinyloop")
    convert(folder, dst, progress=False)
    return dst


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("huginn_state")
    return {"random": _convert(d, "random", "like-init"), "zero": _convert(d, "zero", "zero")}


def test_converted_file_draws_per_call(files):
    cfg = read_model(files["random"]).config
    assert cfg["init_state"] == "random" and cfg["init_state_per_call"] is True
    assert cfg["init_state_std"] == pytest.approx(STD)
    assert read_model(files["zero"]).config["init_state"] == "zeros"


def _init(model, seed, scale=1.0):
    return model.score_trajectory(IDS, loops=1, seed=seed, init_scale=scale)["init"]  # [T, D]


def _ks_two_sample(a, b) -> float:
    """Kolmogorov-Smirnov statistic sup |F_a - F_b|."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    return float(np.max(np.abs(np.searchsorted(a, grid, side="right") / a.size -
                               np.searchsorted(b, grid, side="right") / b.size)))


@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_state_is_distributed_as_the_reference(files, scale):
    with tl.Model(files["random"]) as m:
        draws = np.stack([_init(m, seed, scale) for seed in range(60)])  # [60, T, D]
    x = draws.reshape(-1).astype(np.float64)
    sigma = STD * scale
    assert np.max(np.abs(x)) <= 3 * sigma * (1 + 1e-6)  # cut at 3 std, as trunc_normal_
    want_std = sigma * TRUNC_STD
    assert abs(x.mean()) < 5 * want_std / math.sqrt(x.size)
    assert x.std() == pytest.approx(want_std, rel=0.03)
    # The reference's sampler: numpy's normal, redrawn outside +-3 (an independent generator).
    rng = np.random.default_rng(0)
    z = rng.standard_normal(3 * x.size)
    ref = sigma * z[np.abs(z) <= 3][: x.size]
    n = x.size
    crit = 1.63 * math.sqrt(2 / n)  # alpha = 0.01
    assert _ks_two_sample(x, ref) < crit
    # Independent across seeds and positions: no correlation between two calls' states.
    r = np.corrcoef(draws[0].reshape(-1), draws[1].reshape(-1))[0, 1]
    assert abs(r) < 5 / math.sqrt(draws[0].size)


def test_fixed_seed_reproduces_and_seeds_differ(files):
    with tl.Model(files["random"]) as m:
        a, b, c = _init(m, 7), _init(m, 7), _init(m, 8)
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)
        # No seed: the file's fixed state, the one score() uses (reproducible evaluation).
        np.testing.assert_array_equal(m.score_trajectory(IDS, loops=1)["init"],
                                      m.score_trajectory(IDS, loops=1)["init"])
        g1 = m.generate(IDS, max_tokens=8, temperature=0.9, seed=5, stop_at_eos=False)
        g2 = m.generate(IDS, max_tokens=8, temperature=0.9, seed=5, stop_at_eos=False)
        assert g1 == g2


def test_generate_uses_the_calls_state(files):
    """generate(seed=s) == the numpy reference decode from the state drawn for seed s."""
    model = read_model(files["random"])
    cfg = dict(model.config)
    with tl.Model(files["random"]) as m:
        for seed in (1, 2):
            got = m.generate(IDS, max_tokens=5, loops=3, seed=seed, stop_at_eos=False)
            ref_cfg = {**cfg, "init_state_seed": reference.call_state_seed(cfg, seed)}
            want = reference.generate(ref_cfg, model.tensors, IDS, 5, 3, eos_ids=[])
            assert got == want, f"seed {seed}"
            traj = m.score_trajectory(IDS, loops=1, seed=seed)["init"]
            s0 = reference.random_state(ref_cfg["init_state_seed"], np.arange(len(IDS)), D, STD)
            np.testing.assert_allclose(traj, s0, rtol=1e-6, atol=1e-6)


def test_init_scale_zero_is_the_zero_state(files):
    with tl.Model(files["random"]) as m, tl.Model(files["zero"]) as z:
        t = m.score_trajectory(IDS, loops=4, seed=3, init_scale=0.0)
        assert not t["init"].any()
        np.testing.assert_array_equal(t["iterations"], z.score_trajectory(IDS, loops=4)["iterations"])
        for seed in (None, 4):
            assert m.generate(IDS, max_tokens=6, loops=4, init_scale=0.0, seed=seed, stop_at_eos=False) == \
                z.generate(IDS, max_tokens=6, loops=4, stop_at_eos=False)


def test_serving_engine_draws_like_generate(files):
    with tl.Model(files["random"]) as m:
        want = {s: m.generate(IDS, max_tokens=6, loops=3, seed=s, stop_at_eos=False)[len(IDS):]
                for s in (21, 22)}
        with tl.Engine(m) as eng:
            handles = {s: eng.submit(IDS, tl.SamplingParams(max_tokens=6, loops=3, seed=s, stop_at_eos=False))
                       for s in (21, 22)}
            for s, h in handles.items():
                assert h.result(timeout=60).tokens == want[s]


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf"), 1e7])
def test_bad_init_scale_is_refused(files, bad):
    with tl.Model(files["random"]) as m:
        with pytest.raises(ValueError, match="init_scale"):
            m.generate(IDS, max_tokens=2, init_scale=bad)
        with pytest.raises(ValueError, match="init_scale"):
            m.score_trajectory(IDS, loops=1, init_scale=bad)
    with pytest.raises(ValueError, match="init_scale"):
        tl.SamplingParams(init_scale=bad)


def test_init_scale_on_a_model_without_random_state_is_refused(files):
    with tl.Model(files["zero"]) as z:
        with pytest.raises(ValueError, match="init_scale applies only"):
            z.generate(IDS, max_tokens=2, init_scale=0.5)
        assert z.generate(IDS, max_tokens=2, init_scale=1.0)  # the default is always fine
