#!/usr/bin/env python3
"""Exact match per loop count, split by the longest carry chain of each addition problem.

Reads a training workdir's checkpoint (ckpt.npz: parameters and config) and evaluates the
held-out addition problems (tasks.heldout_set, the same set the trainer uses) at each L,
bucketed by the length of the longest run of carries (0 = no carry at all). Shows whether
depth is used where the problem needs sequential steps, even when the overall accuracy is
flat in L.

    tools/train/.venv/bin/python tools/train/probe_depth.py tools/train/.cache/exp/e5 \\
        --task-size 4 --task-format pad --carry-bias 0.5
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402


def longest_carry_chain(prompt):
    a, b = prompt.rstrip("=").split("+")
    a, b = int(a), int(b)
    best = run = carry = 0
    while a or b:
        s = a % 10 + b % 10 + carry
        carry = int(s >= 10)
        run = run + 1 if carry else 0
        best = max(best, run)
        a //= 10
        b //= 10
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workdir")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--task-size", type=int, default=5)
    ap.add_argument("--task-min-size", type=int, default=0)
    ap.add_argument("--task-format", default="plain")
    ap.add_argument("--carry-bias", type=float, default=0.0)
    ap.add_argument("--depths", default="1,2,4,8,16,32")
    ap.add_argument("--tokenizer-json", default="", help="default: the digits tokenizer in .cache for the vocab size")
    a = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    from tokenizers import Tokenizer

    import data
    import model_jax as M
    import tasks as TK

    z = np.load(os.path.join(a.workdir, "ckpt.npz"))
    cfg = json.loads(str(z["config"]))
    params = {k[2:]: jnp.asarray(z[k]) for k in z.files if k.startswith("p/")}
    tj = a.tokenizer_json or os.path.join(
        data.CACHE_DIR, f"tokenizer-{data.corpus_digest(data.DEFAULT_CORPUS)}-{cfg['vocab_size']}-digits.json")
    tok = Tokenizer.from_file(tj)
    cmap = TK.charmap(tok)
    TK.set_format(a.task_format, a.carry_bias)
    probs = TK.heldout_set("add", a.n, a.task_size, a.task_min_size or None)
    # the chain length of the problem as written (pad/rev formats: read back the operands)
    chains = np.asarray([longest_carry_chain(p) for p, _ in probs])
    width = max(len(p) + len(ans) + 1 for p, ans in probs)
    xs, ys, ms = TK.eval_arrays(probs, cmap, width)

    @jax.jit
    def ok_fn(ids, tgt, mask, L):
        pred = jnp.argmax(M.forward(cfg, params, ids, L), axis=-1)
        return jnp.sum((pred != tgt) * mask, axis=-1) == 0

    depths = [int(d) for d in a.depths.split(",")]
    res = {}
    for L in depths:
        ok = np.concatenate([np.asarray(ok_fn(jnp.asarray(xs[i:i + 250]), jnp.asarray(ys[i:i + 250]),
                                              jnp.asarray(ms[i:i + 250]), L))
                             for i in range(0, len(xs), 250)])
        res[L] = ok
    buckets = sorted(set(chains.tolist()))
    print(f"{a.workdir}: exact match (%) by longest carry chain, {len(probs)} held-out problems")
    print("chain | n | " + " | ".join(f"L={L}" for L in depths))
    for c in buckets:
        sel = chains == c
        print(f"{c} | {int(sel.sum())} | " + " | ".join(f"{100 * res[L][sel].mean():.1f}" for L in depths))
    print("all | " + str(len(probs)) + " | " + " | ".join(f"{100 * res[L].mean():.1f}" for L in depths))


if __name__ == "__main__":
    main()
