"""Logprobs in OpenAI's two shapes, and the prompt's own logprobs for `echo`.

Generated tokens carry theirs from the engine (handle.poll_detail(): the log-softmax of
the logits after penalties and the grammar mask, before temperature / top-k / top-p). The
prompt's come from one scoring pass (`Model.score`: the logits of every position, off the
event loop), log-softmaxed here in float64; the first prompt token has none (nothing
precedes it), which OpenAI writes as null.

An entry is (token id, logprob or None, [(id, logprob), ...] or None).

A token the grammar or a stop rule masked has logprob -inf, which JSON cannot carry: it is
written as -9999.0, as vLLM does (found by tests/python/test_server_fuzz.py: a json_object
request with top_logprobs larger than the tokens the grammar allowed).
"""
from __future__ import annotations

import asyncio
import math

import numpy as np

MASKED_LOGPROB = -9999.0  # a -inf (impossible) token's logprob in JSON


def _finite(v):
    return v if v is None or math.isfinite(v) else MASKED_LOGPROB


async def prompt_entries(state, ids: list[int], loops: int | None, k: int) -> list[tuple]:
    logits = await asyncio.to_thread(state.model.score, np.asarray(ids, dtype=np.int32), loops)
    x = logits.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
    out = [(ids[0], None, None)]
    for i in range(1, len(ids)):
        row = x[i - 1]
        top = np.argsort(-row, kind="stable")[:k] if k > 0 else []
        out.append((ids[i], float(row[ids[i]]), [(int(t), float(row[t])) for t in top]))
    return out


def completion_logprobs(state, entries, text_start: int = 0) -> dict:
    """/v1/completions: parallel lists tokens / token_logprobs / top_logprobs / text_offset."""
    tokens, lps, tops, offsets = [], [], [], []
    pos = text_start
    for tid, lp, top in entries:
        s = state.token_string(tid)
        tokens.append(s)
        lps.append(_finite(lp))
        tops.append(None if top is None else {state.token_string(i): _finite(v) for i, v in top})
        offsets.append(pos)
        pos += len(s)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(state, entries) -> dict:
    """/v1/chat/completions: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    def one(tid, lp):
        return {"token": state.token_string(tid), "logprob": _finite(lp), "bytes": list(state.token_raw(tid))}

    return {"content": [dict(one(tid, lp), top_logprobs=[one(i, v) for i, v in (top or [])])
                        for tid, lp, top in entries], "refusal": None}


def merge_completion_logprobs(parts: list[dict]) -> dict:
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for p in parts:
        for key in out:
            out[key].extend(p[key])
    return out
