"""How much a rewritten model differs from its source: KL divergence, top-1 agreement and
perplexity of the two engines' logits over held-out text windows (the report of `tinyloop
quantize`, and of the reduced-precision benchmarks in bench/).
"""
from __future__ import annotations

import numpy as np

__all__ = ["log_softmax", "compare_models", "eval_windows"]


def log_softmax(z: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, in float64 (KL divergences of nearby distributions
    need the precision)."""
    z = np.asarray(z, np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def compare_models(ref_path, test_path, windows: list, loops: int | None = None,
                   progress: bool = True, ref_kwargs: dict | None = None,
                   test_kwargs: dict | None = None) -> dict:
    """Next-token distributions of `test_path` against `ref_path` on token windows (each an
    int32 array): mean and max KL(ref || test) per predicted token, top-1 agreement, both
    perplexities (each window's tokens after the first are predicted) and the seconds each
    side spent in score(). ref_kwargs / test_kwargs go to the two Models, so one file can be
    compared with itself under other settings (e.g. fp16_body=True)."""
    import sys
    import time

    import tinyloop_py as tl
    from tqdm import tqdm

    kl = agree = kl_max = 0.0
    n = n_pred = 0
    nll = {"ref": 0.0, "test": 0.0}
    secs = {"ref": 0.0, "test": 0.0}
    with tl.Model(ref_path, **(ref_kwargs or {})) as a, tl.Model(test_path, **(test_kwargs or {})) as b:
        L = loops or a.config()["default_loops"]
        for ids in tqdm(windows, desc="compare", unit="window", disable=not progress, file=sys.stderr):
            lp = {}
            for side, m in (("ref", a), ("test", b)):
                t0 = time.perf_counter()
                lp[side] = log_softmax(m.score(ids, loops=L))  # [T, V]
                secs[side] += time.perf_counter() - t0
            la, lb = lp["ref"], lp["test"]
            row_kl = np.sum(np.exp(la) * (la - lb), axis=1)  # [T]
            kl += float(row_kl.sum())
            kl_max = max(kl_max, float(row_kl.max()))
            agree += float(np.sum(la.argmax(axis=1) == lb.argmax(axis=1)))
            tgt = np.arange(len(ids) - 1)
            nll["ref"] -= float(la[tgt, ids[1:]].sum())
            nll["test"] -= float(lb[tgt, ids[1:]].sum())
            n += len(ids)
            n_pred += len(ids) - 1
    count = max(1, n_pred)
    return dict(loops=L, positions=n, mean_kl=kl / max(1, n), max_kl=kl_max,
                top1_agreement=agree / max(1, n),
                ppl_ref=float(np.exp(nll["ref"] / count)), ppl_test=float(np.exp(nll["test"] / count)),
                seconds_ref=secs["ref"], seconds_test=secs["test"])


def eval_windows(model_path, files: list, ctx: int = 256, max_windows: int = 8,
                 tail_fraction: float = 0.05, seed: int = 0) -> tuple[list, str]:
    """Held-out token windows for compare_models, and what they are: the last
    `tail_fraction` of each text file (the bundled model's held-out slice) through the
    model's tokenizer, cut as `tinyloop perplexity` does; random ids when the model has no
    tokenizer or no file is given."""
    from .perplexity import read_slice, token_stream, window_starts
    from .text import load_tokenizer

    tok = load_tokenizer(model_path) if files else None
    if tok is None:
        from .format import read_model
        V = read_model(model_path).config["vocab_size"]
        rng = np.random.default_rng(seed)
        return ([rng.integers(0, V, size=ctx).astype(np.int32) for _ in range(max_windows)],
                f"{max_windows} windows of {ctx} random token ids (no tokenizer or no text)")
    stream = token_stream(tok, [read_slice(p, tail_fraction) for p in files], None)
    ctx = min(ctx, len(stream))
    starts = window_starts(len(stream), ctx, max_windows)
    return ([stream[s:s + ctx] for s in starts],
            f"{len(starts)} windows of {ctx} tokens from the last {tail_fraction:.0%} of "
            f"{len(files)} file(s)")
