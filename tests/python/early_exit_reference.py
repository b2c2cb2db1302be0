"""An independent numpy float64 decode with early exit, for tests/python/test_early_exit.py.

Written from docs/loop-depth.md (section 1) and docs/kv-cache.md, on tests/python/reference.py's
pieces (embed, layer, initial_state, the norms), not on the engine's code. Plain and slow:
tokens go one at a time, prompt included, and every layer application is recomputed over
the history it attends to.

The cache is kept in "store-h" form: per layer application (slot) the INPUT row of every
position. A cached engine keeps K/V rows instead, but a K/V row is a per-row function of
that input (norm, projection, RoPE at the row's own position) and the weights of loop layer
j are the same in every iteration, so "copy slot (e-1, j)'s row into slot (i, j)" (the
latest rule) is the same as copying the input row. A layer's output for a new row is then
reference.layer() over [history rows, new row], last row.

Shapes: D = dim, V = vocab_size, L = loops.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import reference
from tinyloop.config import layer_prefixes, normalize_config


@dataclass
class ExitRun:
    tokens: list                 # prompt + emitted
    depths: list                 # [emitted] iterations behind each emitted token (first = L)
    rhos: list = field(default_factory=list)     # every hidden-L2 probe's rho
    gaps: list = field(default_factory=list)     # every margin probe's top1 - top2
    argmax_gaps: list = field(default_factory=list)  # top1 - top2 of each emitted token's logits


class _Decoder:
    def __init__(self, cfg, tensors, loops, max_len):
        self.cfg = normalize_config(cfg)
        self.t = tensors
        self.L = loops
        self.pre = layer_prefixes(self.cfg)["pre"]
        self.loop = layer_prefixes(self.cfg)["loop"]
        self.post = layer_prefixes(self.cfg)["post"]
        D = self.cfg["dim"]
        # slot key -> [max_len, D] input rows; keys ("pre", k), ("loop", i, j), ("post", k)
        self.h = {}
        for k in range(len(self.pre)):
            self.h[("pre", k)] = np.zeros((max_len, D))
        for i in range(loops):
            for j in range(len(self.loop)):
                self.h[("loop", i, j)] = np.zeros((max_len, D))
        for k in range(len(self.post)):
            self.h[("post", k)] = np.zeros((max_len, D))

    def _layer(self, key, prefix, row, p, commit=True):
        """Layer `prefix` on input row [D] at position p over slot `key`'s rows 0..p-1."""
        hist = self.h[key]
        H = np.vstack([hist[:p], row[None]])  # [p + 1, D]
        out = reference.layer(self.cfg, self.t, prefix, H, np.arange(p + 1))[-1]
        if commit:
            hist[p] = row
        return out

    def prelude(self, tok, p):
        x = reference.embed(self.cfg, self.t, [tok], [p])[0]  # [D]
        for k, prefix in enumerate(self.pre):
            x = self._layer(("pre", k), prefix, x, p)
        return x

    def iteration(self, i, s, x, p):
        c = self.cfg
        if c["inject"] == "add":
            s = s + x
        elif c["inject"] == "linear_concat":
            s = np.concatenate([s, x]) @ np.asarray(self.t["inject.weight"], np.float64).T
        for j, prefix in enumerate(self.loop):
            s = self._layer(("loop", i, j), prefix, s, p)
        if c["loop_norm"]:
            s = reference._norm(c, self.t, "loop_norm", s[None])[0]
        return s

    def readout(self, s, p, commit):
        """Logits [V] from loop state s [D]; commit=False leaves the post slots alone (a
        probe whose row a later readout of this position overwrites anyway)."""
        c = self.cfg
        if c["post_loop_norm"] == "final":
            s = reference._norm(c, self.t, "final_norm", s[None])[0]
        elif c["post_loop_norm"] == "own":
            s = reference._norm(c, self.t, "post_loop_norm", s[None])[0]
        for k, prefix in enumerate(self.post):
            s = self._layer(("post", k), prefix, s, p, commit)
        if c["final_norm"]:
            s = reference._norm(c, self.t, "final_norm", s[None])[0]
        head = self.t["embed.weight" if c["tie_embeddings"] else "head.weight"]
        return np.asarray(head, np.float64) @ s  # [V]

    def token(self, tok, p, ee, run):
        """Run position p; returns (logits [V], iterations run)."""
        x = self.prelude(tok, p)
        s = reference.initial_state(self.cfg, x[None], [p])[0]
        stable, n = 0, 0
        while n < self.L:
            prev = s
            s = self.iteration(n, s, x, p)
            n += 1
            probe = ee is not None and n < self.L and n >= ee["min_L"] and (n - ee["min_L"]) % ee["peek_every"] == 0
            if not probe:
                continue
            if ee["logit_margin"] > 0:
                z = self.readout(s, p, commit=False)
                top = np.sort(z)[::-1]
                gap = top[0] - top[1]
                run.gaps.append(gap)
                ok = gap > ee["logit_margin"]
            else:
                rho = np.linalg.norm(s - prev) / np.linalg.norm(s)
                run.rhos.append(rho)
                ok = rho < ee["tau"]
            stable = stable + 1 if ok else 0
            if stable >= ee["patience"]:
                break
        # The latest rule: skipped iterations' slots take iteration n-1's rows.
        for i in range(n, self.L):
            for j in range(len(self.loop)):
                self.h[("loop", i, j)][p] = self.h[("loop", n - 1, j)][p]
        return self.readout(s, p, commit=True), n


def decode(cfg, tensors, prompt, max_tokens, loops, patience=0, min_L=2, tau=1e-3, peek_every=1,
           logit_margin=0.0) -> ExitRun:
    """Greedy decode of max_tokens (no EOS stop) with early exit in decode steps only."""
    ee = None if patience == 0 else dict(patience=patience, min_L=min_L, tau=tau,
                                         peek_every=peek_every, logit_margin=logit_margin)
    prompt = [int(t) for t in prompt]
    dec = _Decoder(cfg, tensors, loops, len(prompt) + max_tokens)
    run = ExitRun(tokens=list(prompt), depths=[])
    for p, tok in enumerate(prompt):  # the prompt: always full depth
        logits, _ = dec.token(tok, p, None, run)
    depth = loops
    while True:
        top = np.sort(logits)[::-1]
        run.argmax_gaps.append(top[0] - top[1])
        tok = int(np.argmax(logits))
        run.tokens.append(tok)
        run.depths.append(depth)
        if len(run.depths) == max_tokens:
            return run
        logits, depth = dec.token(tok, len(run.tokens) - 1, ee, run)
