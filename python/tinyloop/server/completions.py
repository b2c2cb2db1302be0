"""POST /v1/completions: text (or token id) prompts, one or a batch, n choices each, echo
and logprobs, streamed or not (docs/server.md)."""
from __future__ import annotations

import logging
import time
import uuid

from fastapi.responses import JSONResponse, StreamingResponse

from . import sse
from .job import Job
from .logprobs import completion_logprobs, prompt_entries
from .params import build_kwargs, check_model, output_length
from .prompts import completion_prompt_ids
from .protocol import CompletionRequest
from .responses import (chunk_event, closing_events, collect_job, failure_event, stream_job,
                        tinyloop_fields)

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions

log = logging.getLogger("tinyloop.server")


async def handle(state, request, req: CompletionRequest):
    check_model(state, req.model)
    if req.user:
        log.info("request for user %r", req.user)  # OpenAI's end-user id: accepted, logged
    prompts = [completion_prompt_ids(state, p, i, len(req.prompt)) for i, p in enumerate(req.prompt)]
    prompt_texts = [p if isinstance(p, str) else state.decode(p) for p in req.prompt]
    rid, created = "cmpl-" + uuid.uuid4().hex, int(time.time())
    k = req.logprobs
    echo_lp = None
    if req.echo and k is not None:  # the prompt's logprobs, one scoring pass per prompt
        echo_lp = [await prompt_entries(state, ids, req.loops, k) for ids in prompts]

    if req.echo and req.max_tokens == 0:  # score only: nothing is generated
        return _prompt_only(state, req, rid, created, prompts, prompt_texts, echo_lp)

    max_tokens = output_length(state, prompts, req.max_tokens, DEFAULT_MAX_TOKENS)
    stops = req.stop_list()
    kwargs = await build_kwargs(state, req, max_tokens, stops, k)
    job = Job(state, prompts, req.n, kwargs, stops, k is not None)
    base = {"id": rid, "object": "text_completion", "created": created, "model": state.model_name}

    if req.stream:
        return await stream_job(request, job, _stream(state, req, job, base, prompt_texts, echo_lp))

    texts, entries = await collect_job(request, job)
    choices = []
    for c in job.choices:
        p = c.index // req.n
        text = "".join(texts[c.index])
        lp = None
        if k is not None:
            head = echo_lp[p] if echo_lp else []
            start = 0 if req.echo else len(prompt_texts[p])
            lp = completion_logprobs(state, head + entries[c.index], start)
        choices.append({"index": c.index, "text": (prompt_texts[p] if req.echo else "") + text,
                        "logprobs": lp, "finish_reason": c.finish_reason, "tinyloop": tinyloop_fields(c)})
    return JSONResponse(dict(base, choices=choices, usage=job.usage()))


def _prompt_only(state, req, rid, created, prompts, prompt_texts, echo_lp):
    choices = []
    for p, text in enumerate(prompt_texts):
        for i in range(req.n):
            lp = completion_logprobs(state, echo_lp[p], 0) if echo_lp else None
            choices.append({"index": p * req.n + i, "text": text, "logprobs": lp, "finish_reason": "length"})
    n_prompt = sum(len(p) for p in prompts)
    usage = {"prompt_tokens": n_prompt, "completion_tokens": 0, "total_tokens": n_prompt, "mean_loops": None}
    state.counters.add_usage(n_prompt, 0, 0)
    body = {"id": rid, "object": "text_completion", "created": created, "model": state.model_name,
            "choices": choices, "usage": usage}
    if not req.stream:
        return JSONResponse(body)

    async def one():
        for ch in choices:
            yield sse.event(dict(body, choices=[ch], usage=None))
        if req.stream_options and req.stream_options.include_usage:
            yield sse.event(dict(body, choices=[], usage=usage))
        yield sse.DONE

    return StreamingResponse(one(), media_type="text/event-stream", headers=sse.HEADERS)


async def _stream(state, req, job, base, prompt_texts, echo_lp):
    want_usage = bool(req.stream_options and req.stream_options.include_usage)
    k = req.logprobs
    by_index = {c.index: c for c in job.choices}
    offsets = {c.index: (0 if req.echo else len(prompt_texts[c.index // req.n])) for c in job.choices}

    def chunk(index, text, entries, finish, extra):
        lp = None
        if k is not None:
            lp = completion_logprobs(job.state, entries or [], offsets[index])
            offsets[index] += sum(len(t) for t in lp["tokens"])
        ch = {"index": index, "text": text, "logprobs": lp, "finish_reason": finish, "tinyloop": extra}
        return chunk_event(base, ch, want_usage)

    try:
        if req.echo:
            for c in job.choices:
                p = c.index // req.n
                yield chunk(c.index, prompt_texts[p], echo_lp[p] if echo_lp else None, None, {"loops": []})
        async for index, piece in job.pieces():
            c = by_index[index]
            if piece.final:
                if failure := failure_event(c):
                    yield failure
                extra = dict(tinyloop_fields(c), loops=piece.loops)
                yield chunk(index, piece.text, piece.logprobs, c.finish_reason, extra)
            elif piece.text:
                yield chunk(index, piece.text, piece.logprobs, None, {"loops": piece.loops})
        for event in closing_events(job, base, want_usage):
            yield event
    finally:
        job.cancel()
        job.record()
