"""Depth-wise scoring (docs/loop-depth.md): every function is one forward, checked against
brute force score(prompt, loops=l) for each depth it reports, and the trajectory against
the numpy reference's per-iteration states."""
import numpy as np
import pytest

import tinyloop_py as tl
import reference

PROMPT = np.array([5, 17, 3, 42, 8, 91, 23, 60, 11, 2, 77], dtype=np.int32)
NAMES = ["huginn", "ouro", "gpt_learned", "huginn_gqa_f16"]


@pytest.mark.parametrize("name", NAMES)
def test_logit_lens_equals_score_at_each_depth(test_models, name):
    m = test_models[name]
    with tl.Model(m.path) as model:
        lens = model.score_logit_lens(PROMPT, loops=5)
        assert lens.dtype == np.float32 and lens.shape == (5, len(PROMPT), m.cfg["vocab_size"])
        for l in range(1, 6):
            np.testing.assert_array_equal(lens[l - 1], model.score(PROMPT, loops=l))
        default = model.score_logit_lens(PROMPT)
        assert default.shape[0] == m.cfg["default_loops"]


@pytest.mark.parametrize("name", NAMES + ["llama"])
def test_trajectory_matches_reference_states(test_models, name):
    m = test_models[name]
    with tl.Model(m.path) as model:
        tr = model.score_trajectory(PROMPT, loops=4)
    _, states = reference.forward(m.cfg, m.tensors, PROMPT, 4, return_states=True)
    T, D, n_pre = len(PROMPT), m.cfg["dim"], m.cfg["n_pre_blocks"]
    assert tr["embedding"].shape == (T, D) and tr["embedding"].dtype == np.float32
    assert tr["pre"].shape == (n_pre, T, D) and tr["iterations"].shape == (4, T, D)
    def close(got, want, tol=1e-4):  # relative to the array's scale (init may be all zeros)
        return np.max(np.abs(got - want)) <= tol * max(1.0, np.max(np.abs(want)))

    assert close(tr["embedding"], states["embed"], 1e-5)
    for k in range(n_pre):
        assert close(tr["pre"][k], states["pre"][k])
    assert close(tr["init"], states["init"])
    for i in range(4):
        assert close(tr["iterations"][i], states["iterations"][i]), f"iteration {i}"


def _log_softmax(z):
    z = np.asarray(z, np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("shallow,deep", [(1, 4), (2, 3), (3, 3)])
def test_uncertainty_is_kl_of_deep_from_shallow(test_models, shallow, deep):
    m = test_models["huginn"]
    with tl.Model(m.path) as model:
        r = model.score_with_uncertainty(PROMPT, shallow, deep)
        s, d = model.score(PROMPT, loops=shallow), model.score(PROMPT, loops=deep)
    np.testing.assert_array_equal(r["shallow_logits"], s)
    np.testing.assert_array_equal(r["deep_logits"], d)
    lp_d, lp_s = _log_softmax(d), _log_softmax(s)
    want = np.sum(np.exp(lp_d) * (lp_d - lp_s), axis=-1)  # KL(p_deep || p_shallow)
    assert r["kl"].shape == (len(PROMPT),) and r["kl"].dtype == np.float64
    np.testing.assert_allclose(r["kl"], want, rtol=1e-6, atol=1e-9)
    if shallow == deep:
        assert np.all(r["kl"] == 0)
    else:
        assert np.all(r["kl"] > 0)


@pytest.mark.parametrize("name,shallow,deep,escalate", [("huginn", 1, 2, None), ("ouro", 2, 3, 6),
                                                        ("gpt_learned", 1, 3, 3)])
def test_consistency_escalates_disagreeing_positions(test_models, name, shallow, deep, escalate):
    m = test_models[name]
    with tl.Model(m.path) as model:
        r = model.score_with_consistency(PROMPT, shallow, deep, escalate_loops=escalate)
        esc = 2 * deep if escalate is None else escalate
        s, d, e = (model.score(PROMPT, loops=l) for l in (shallow, deep, esc))
    sa, da = s.argmax(-1), d.argmax(-1)
    disagree = sa != da
    assert r["escalate_loops"] == esc
    np.testing.assert_array_equal(r["shallow_argmax"], sa)
    np.testing.assert_array_equal(r["deep_argmax"], da)
    np.testing.assert_array_equal(r["escalated"], disagree)
    np.testing.assert_array_equal(r["escalated_positions"], np.flatnonzero(disagree))
    assert r["agreement"] == pytest.approx(1 - disagree.mean())
    assert disagree.any() and not disagree.all()  # the test exercises both branches
    want = np.where(disagree[:, None], e, d)
    # Escalated rows come from a run over a prefix of the rows: same math, so only
    # kernel-level rounding could differ.
    np.testing.assert_allclose(r["logits"], want, rtol=0, atol=1e-5 * np.abs(want).max())
    np.testing.assert_array_equal(r["final_argmax"], want.argmax(-1))


def test_bad_depth_arguments_raise_value_error(test_models):
    m = test_models["huginn"]
    with tl.Model(m.path) as model:
        for call, arg in [(lambda: model.score_logit_lens(PROMPT, loops=0), "loops"),
                          (lambda: model.score_trajectory(PROMPT, loops=-1), "loops"),
                          (lambda: model.score_with_uncertainty(PROMPT, 0, 2), "shallow_loops"),
                          (lambda: model.score_with_uncertainty(PROMPT, 3, 2), "deep_loops"),
                          (lambda: model.score_with_consistency(PROMPT, 2, 1), "deep_loops"),
                          (lambda: model.score_with_consistency(PROMPT, 1, 3, escalate_loops=2),
                           "escalate_loops"),
                          (lambda: model.score_logit_lens(np.array([], np.int32)), "prompt"),
                          (lambda: model.score_trajectory([1, 2, 1000]), "prompt")]:
            with pytest.raises(ValueError, match=arg):
                call()
