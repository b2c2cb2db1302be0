"""Perplexity of a model on text files, computed with the engine's own `score`.

    tinyloop perplexity MODEL FILE... [--loops 1,2,4,8,16] [--ctx 256] [--tail-fraction 0.05]

Each file (or, with --tail-fraction f, its last ceil(f * n) characters: the held-out slice
of the bundled model) is encoded with the model's tokenizer and followed by its EOS token;
the streams are concatenated in the order given and cut into non-overlapping windows of
--ctx tokens (with --max-windows N, N of them spread evenly over the stream). Every token of a window except the
first is predicted from the tokens before
it in that window; perplexity is exp(mean negative log-likelihood) over all of them.
"""
from __future__ import annotations

import math
import sys

import numpy as np


def read_slice(path: str, tail_fraction: float | None) -> str:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if tail_fraction is None:
        return text
    n = len(text)
    return text[n - math.ceil(tail_fraction * n):]


def token_stream(tokenizer, texts: list[str], eos_id: int | None) -> np.ndarray:
    """The texts encoded one after another, each followed by eos_id when there is one. [N]."""
    out: list[int] = []
    for t in texts:
        out.extend(tokenizer.encode(t).ids)
        if eos_id is not None:
            out.append(eos_id)
    return np.asarray(out, dtype=np.int32)


def window_nll(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """-log p(ids[t+1] | ids[:t+1]) for t < T-1, from logits [T, V] (float64). [T-1]."""
    z = logits[:-1].astype(np.float64)  # [T-1, V]
    m = z.max(axis=1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(z - m).sum(axis=1)))  # [T-1]
    return lse - z[np.arange(len(z)), ids[1:]]


def window_starts(n_tokens: int, ctx: int, max_windows: int | None) -> list[int]:
    """Starts of the non-overlapping ctx-token windows; with max_windows, that many spread
    evenly over the whole stream (so every file of a multi-file text is represented)."""
    n = n_tokens // ctx
    if n < 1:
        raise ValueError(f"the text has {n_tokens} tokens, fewer than one window of {ctx}")
    picked = range(n) if not max_windows or max_windows >= n else \
        np.linspace(0, n - 1, max_windows).round().astype(int)
    return [int(w) * ctx for w in picked]


def perplexities(model, stream: np.ndarray, loops_list: list[int], ctx: int,
                 max_windows: int | None = None, progress: bool = True) -> dict[int, float]:
    """{L: perplexity} over the non-overlapping ctx-token windows of stream."""
    from tqdm import tqdm

    starts = window_starts(len(stream), ctx, max_windows)
    n_windows = len(starts)
    total = {L: 0.0 for L in loops_list}
    count = 0
    bar = tqdm(total=n_windows * len(loops_list), disable=not progress, unit="window",
               desc="perplexity", file=sys.stderr)
    for start in starts:
        ids = stream[start:start + ctx]  # [ctx]
        for L in loops_list:
            total[L] += float(window_nll(model.score(ids, loops=L), ids).sum())
            bar.update(1)
        count += ctx - 1
    bar.close()
    return {L: math.exp(total[L] / count) for L in loops_list}


def main_args(args) -> int:
    import tinyloop_py as tl
    from .text import load_tokenizer

    try:
        loops_list = [int(x) for x in str(args.loops).split(",") if x]
    except ValueError:
        raise ValueError(f"--loops: expected comma-separated integers, got {args.loops!r}") from None
    if not loops_list or min(loops_list) < 1:
        raise ValueError(f"--loops: every depth must be >= 1, got {args.loops!r}")
    if args.ctx < 2:
        raise ValueError(f"--ctx must be >= 2 (a window predicts ctx - 1 tokens), got {args.ctx}")
    if args.tail_fraction is not None and not 0 < args.tail_fraction <= 1:
        raise ValueError(f"--tail-fraction must be in (0, 1], got {args.tail_fraction}")
    if args.max_windows is not None and args.max_windows < 1:
        raise ValueError(f"--max-windows must be >= 1, got {args.max_windows}")
    with tl.Model(args.model) as model:
        tokenizer = load_tokenizer(model)
        if tokenizer is None:
            print("tinyloop perplexity: the model has no embedded tokenizer", file=sys.stderr)
            return 2
        eos = model.config()["eos_ids"]
        texts = [read_slice(p, args.tail_fraction) for p in args.files]
        stream = token_stream(tokenizer, texts, eos[0] if eos else None)
        ppl = perplexities(model, stream, loops_list, args.ctx, args.max_windows,
                           progress=not args.quiet)
    n_win = len(window_starts(len(stream), args.ctx, args.max_windows))
    print(f"{n_win} windows x {args.ctx} tokens ({n_win * (args.ctx - 1)} predicted tokens) "
          f"of {len(stream)} tokens")
    print("| loops | perplexity |")
    print("| ---: | ---: |")
    for L, p in ppl.items():
        print(f"| {L} | {p:.2f} |")
    return 0
