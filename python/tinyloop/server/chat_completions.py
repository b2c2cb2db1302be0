"""POST /v1/chat/completions: messages through the model's chat template (or a plain
transcript without one), n choices, logprobs / top_logprobs, streamed or not."""
from __future__ import annotations

import logging
import time
import uuid

from fastapi.responses import JSONResponse

from .job import Job
from .logprobs import chat_logprobs
from .params import build_kwargs, check_model, output_length
from .prompts import chat_prompt_ids
from .protocol import ChatCompletionRequest
from .responses import (chunk_event, closing_events, collect_job, failure_event, stream_job,
                        tinyloop_fields)

log = logging.getLogger("tinyloop.server")


async def handle(state, request, req: ChatCompletionRequest):
    check_model(state, req.model)
    if req.user:
        log.info("request for user %r", req.user)  # OpenAI's end-user id: accepted, logged
    ids, extra_stops, templated = chat_prompt_ids(state, req.messages)
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_tokens = output_length(state, [ids], req.output_limit(), None, param)
    stops = req.stop_list() + extra_stops
    k = (req.top_logprobs or 0) if req.logprobs else None
    kwargs = await build_kwargs(state, req, max_tokens, stops, k,
                                       extra_stop_ids=state.chat_stop_ids if templated else ())
    job = Job(state, [ids], req.n, kwargs, stops, k is not None)
    base = {"id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion", "created": int(time.time()),
            "model": state.model_name, "system_fingerprint": None}
    # Without a template the reply continues "Assistant:": its leading space is the
    # transcript's, not the reply's.
    strip_lead = not templated

    if req.stream:
        return await stream_job(request, job,
                                _stream(state, req, job, dict(base, object="chat.completion.chunk"), strip_lead))

    texts, entries = await collect_job(request, job)
    choices = []
    for c in job.choices:
        text = "".join(texts[c.index])
        if strip_lead:
            text = text.lstrip(" ")
        choices.append({"index": c.index, "message": {"role": "assistant", "content": text, "refusal": None},
                        "logprobs": chat_logprobs(state, entries[c.index]) if k is not None else None,
                        "finish_reason": c.finish_reason, "tinyloop": tinyloop_fields(c)})
    return JSONResponse(dict(base, choices=choices, usage=job.usage()))


async def _stream(state, req, job, base, strip_lead: bool):
    want_usage = bool(req.stream_options and req.stream_options.include_usage)
    want_lp = req.logprobs
    by_index = {c.index: c for c in job.choices}
    started = {c.index: False for c in job.choices}

    def chunk(index, delta, entries, finish, extra):
        ch = {"index": index, "delta": delta,
              "logprobs": chat_logprobs(state, entries or []) if want_lp else None,
              "finish_reason": finish, "tinyloop": extra}
        return chunk_event(base, ch, want_usage)

    try:
        for c in job.choices:  # the role first, as OpenAI does
            yield chunk(c.index, {"role": "assistant", "content": ""}, None, None, {"loops": []})
        async for index, piece in job.pieces():
            c = by_index[index]
            text = piece.text
            if strip_lead and not started[index]:
                text = text.lstrip(" ")
                started[index] = bool(text)
            if piece.final:
                if failure := failure_event(c):
                    yield failure
                delta = {"content": text} if text else {}
                yield chunk(index, delta, piece.logprobs, c.finish_reason, dict(tinyloop_fields(c), loops=piece.loops))
            elif text or piece.logprobs:
                yield chunk(index, {"content": text}, piece.logprobs, None, {"loops": piece.loops})
        for event in closing_events(job, base, want_usage):
            yield event
    finally:
        job.cancel()
        job.record()
