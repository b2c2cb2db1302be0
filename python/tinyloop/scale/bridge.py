"""An ASGI app called in-process, as an async generator of response chunks.

    async for chunk in call_asgi(app, request):
        ...   # first {"status": int, "headers": [(bytes, bytes), ...]}, then body bytes

`request` is a plain dict (it crosses Ray's object store): method, path, query_string,
headers ([name, value] bytes pairs), body (bytes, whole), client ([host, port] or None).

The app reads the body from `receive()` once; after it, `receive()` waits until the
consumer goes away: closing the generator (aclose(), or cancelling the task iterating it:
Serve does that when the caller's handle request is cancelled) answers
{"type": "http.disconnect"}, so the app sees exactly what a client disconnect looks like
to it behind uvicorn (tinyloop's server then cancels its engine requests, freeing their KV).
The scope says ASGI spec 2.3, so Starlette's StreamingResponse listens for that disconnect
(from 2.4 on it would wait for a failing send instead).

An app that fails before starting its response gives a 500 in OpenAI's error shape; one
that fails after ends its body there.
"""
from __future__ import annotations

import asyncio
import json
import logging

log = logging.getLogger("tinyloop.scale")

_END = object()
DRAIN_TIMEOUT_S = 5.0  # after a disconnect, how long the app may take to wind down


def build_scope(request: dict) -> dict:
    path = request.get("path") or "/"
    client = request.get("client")
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": (request.get("method") or "GET").upper(),
        "scheme": request.get("scheme") or "http",
        "path": path,
        "raw_path": path.encode("utf-8"),
        "query_string": request.get("query_string") or b"",
        "root_path": "",
        "headers": [(bytes(k).lower(), bytes(v)) for k, v in request.get("headers") or ()],
        "client": tuple(client) if client else None,
        "server": tuple(request["server"]) if request.get("server") else ("127.0.0.1", 80),
        "state": {},
    }


def _internal_error(message: str):
    body = json.dumps({"error": {"message": message, "type": "server_error", "param": None,
                                 "code": "internal_error"}}).encode()
    return ({"status": 500, "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]}, body)


async def call_asgi(app, request: dict, extra_headers=()):
    scope = build_scope(request)
    body = request.get("body") or b""
    queue: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    body_read = False
    started = False

    async def receive():
        nonlocal body_read
        if not body_read:
            body_read = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if not gone.is_set():  # after a disconnect, sends go nowhere (as uvicorn's do)
            await queue.put(message)

    async def run():
        try:
            await app(scope, receive, send)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # Starlette re-raises after its 500 response: logged once here
            log.exception("ASGI app failed on %s %s", scope["method"], scope["path"])
            await queue.put(("error", e))
        finally:
            queue.put_nowait(_END)

    task = asyncio.get_running_loop().create_task(run())
    try:
        while True:
            message = await queue.get()
            if message is _END:
                break
            if isinstance(message, tuple):  # the app raised
                if not started:
                    started = True
                    start, err_body = _internal_error(f"internal server error: {type(message[1]).__name__}: "
                                                      f"{message[1]}")
                    yield start
                    yield err_body
                break
            kind = message.get("type")
            if kind == "http.response.start" and not started:
                started = True
                headers = [(bytes(k), bytes(v)) for k, v in message.get("headers") or ()]
                yield {"status": int(message["status"]), "headers": headers + list(extra_headers)}
            elif kind == "http.response.body" and started:
                chunk = message.get("body") or b""
                if chunk:
                    yield bytes(chunk)
                if not message.get("more_body", False):
                    break
        if not started:  # the app returned without answering
            start, err_body = _internal_error("the app sent no response")
            yield start
            yield err_body
    finally:
        gone.set()
        if not task.done():
            try:
                await asyncio.wait({task}, timeout=DRAIN_TIMEOUT_S)
            finally:
                if not task.done():
                    task.cancel()
