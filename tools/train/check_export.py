#!/usr/bin/env python3
"""Check an exported .tinyloop: it loads with tinyloop.format.read_model, its tokenizer
round-trips text, and the JAX forward of the training tool on the stored (f16) weights
agrees with the independent numpy reference (tests/python/reference.py: forward) at several
depths.

    python3 tools/train/check_export.py models/tinyloop-demo.tinyloop
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))  # reference.py, the numpy oracle

import numpy as np  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--loops", default="1,2,6,16")
    ap.add_argument("--text", default="It is a truth universally acknowledged, that a single man")
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--max-len", type=int, default=256,
                    help="also check a window of this many ids from the held-out text (0: skip)")
    a = ap.parse_args(argv)

    from tinyloop.format import read_model
    mc = read_model(a.model)
    cfg = mc.config
    print(f"read_model ok: {len(mc.tensors)} tensors, dtypes {sorted(set(mc.dtypes.values()))}, "
          f"{os.path.getsize(a.model) / 1e6:.2f} MB")
    print(f"config: {cfg}")
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(mc.tokenizer_json)
    ids = tok.encode(a.text).ids
    assert tok.decode(ids) == a.text, "tokenizer round trip failed"
    print(f"tokenizer ok: vocab {tok.get_vocab_size()}, eos {cfg['eos_ids']} = "
          f"{[tok.id_to_token(i) for i in cfg['eos_ids']]}, {len(ids)} ids for the probe text")

    seqs = [ids]
    if a.max_len:
        with open("/work/shared/data/corpus/austen.txt", encoding="utf-8") as f:
            tail = f.read()[-20000:]  # inside the held-out slice (last 5%)
        seqs.append(tok.encode(tail).ids[:min(a.max_len, cfg["max_seq_len"])])
    import jax
    jax.config.update("jax_enable_x64", False)
    import jax.numpy as jnp

    import model_jax as M
    import reference
    params = {k: jnp.asarray(np.asarray(v, np.float32)) for k, v in mc.tensors.items()}
    worst = 0.0
    for L, ids in [(int(x), q) for x in a.loops.split(",") for q in seqs]:
        ref = reference.forward(cfg, mc.tensors, ids, L)                       # [T, V] float64
        got = np.asarray(M.forward(cfg, params, jnp.asarray([ids]), L))[0]    # [T, V] float32
        rel = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
        same_argmax = float(np.mean(got.argmax(-1) == ref.argmax(-1)))
        print(f"L={L} T={len(ids)}: max|jax-ref|/max|ref| = {rel:.2e}, argmax agreement {same_argmax:.3f}, "
              f"last-row logits ref {ref[-1, :3]} jax {got[-1, :3]}")
        worst = max(worst, rel)
    ok = worst <= a.tol
    print(f"{'PASS' if ok else 'FAIL'}: worst relative difference {worst:.2e} (tolerance {a.tol})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
