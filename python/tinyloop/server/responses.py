"""What /v1/completions and /v1/chat/completions do alike with a started Job: stream its
pieces as server-sent events, or collect them and turn a failed choice into its HTTP error;
and the `tinyloop` extension field of each choice (docs/server.md)."""
from __future__ import annotations

from fastapi.responses import StreamingResponse

from . import sse
from .errors import ApiError, error_body
from .job import run_guarded


async def stream_job(request, job, events) -> StreamingResponse:
    """Starts the job (cancelled if the client leaves first) and streams `events`, an async
    generator of SSE lines over the job's pieces (it runs only once the response is sent)."""
    await run_guarded(request, job.start(), job.cancel)
    return StreamingResponse(events, media_type="text/event-stream", headers=sse.HEADERS)


async def collect_job(request, job) -> tuple[list, list]:
    """Runs the job to the end: (texts, entries), each a list per choice index; raises the
    ApiError of the first choice that timed out, failed or was cancelled."""
    try:
        texts, entries = await run_guarded(request, job.collect(), job.cancel)
    finally:
        job.record()
    raise_on_failure(job)
    return texts, entries


def raise_on_failure(job) -> None:
    for c in job.choices:
        if c.finish_reason == "timeout":
            raise ApiError(408, "the request did not finish within the server's --timeout", None, "timeout")
        if c.finish_reason == "error":
            raise ApiError(500, f"generation failed: {c.error}", None, "internal_error")
        if c.finish_reason == "cancelled":
            raise ApiError(503, "the request was cancelled (the server is shutting down)", None,
                           "server_shutting_down")


def tinyloop_fields(c) -> dict:
    """A choice's `tinyloop` field: the loop depth behind each token, their mean, and why it
    stopped in detail."""
    loops = c.loops_per_token
    return {"loops_per_token": loops, "mean_loops": round(sum(loops) / len(loops), 4) if loops else None,
            "stop_detail": c.output.stop_detail if c.output is not None else c.finish_reason}


def chunk_event(base: dict, choice: dict, want_usage: bool) -> str:
    """One streamed chunk holding `choice`. A client that asked for the usage at the end
    (stream_options.include_usage) gets "usage": null on every other chunk, as OpenAI sends."""
    body = dict(base, choices=[choice])
    if want_usage:
        body["usage"] = None
    return sse.event(body)


def failure_event(c) -> str | None:
    """The error event sent before a choice's last chunk when its generation failed."""
    if c.finish_reason != "error":
        return None
    return sse.event(error_body(500, f"generation failed: {c.error}", None, "internal_error"))


def closing_events(job, base: dict, want_usage: bool) -> list[str]:
    """The end of a stream: the usage chunk (when asked for), then [DONE]."""
    events = [sse.event(dict(base, choices=[], usage=job.usage()))] if want_usage else []
    return events + [sse.DONE]
