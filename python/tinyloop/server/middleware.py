"""The gate every HTTP request passes before the app (a plain ASGI middleware, so it sees
the raw body and the status of every response, streamed ones included):

- counts requests by endpoint and status for /metrics, and the API requests in flight
  (the drain on SIGTERM waits for them);
- while draining, refuses new API requests with 503 (in-flight ones finish);
- with --api-key, refuses API requests without `Authorization: Bearer KEY` with 401;
- refuses a body over --max-body-bytes with 413, by its Content-Length or, for a chunked
  body, as soon as the bytes read pass the limit; the body is read whole here and handed
  to the app from memory.
"""
from __future__ import annotations

import hmac

from .errors import error_body

# Paths behind the API key and the drain; /, /health and /metrics stay open.
API_PREFIXES = ("/v1/", "/tokenize", "/detokenize", "/tokenizer_info")
KNOWN = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize", "/tokenizer_info",
         "/health", "/metrics", "/")


def endpoint_label(path: str) -> str:
    if path in KNOWN:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    return "other"  # unknown paths must not grow the metric's label set


class Gate:
    def __init__(self, app, state, api_key: str | None, max_body_bytes: int):
        self.app = app
        self.state = state
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes

    async def _reply(self, send, status: int, message: str, param=None, code=None, headers=()):
        import json

        body = json.dumps(error_body(status, message, param, code)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()), *headers]})
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope) -> bool:
        if not self.api_key:
            return True
        for k, v in scope.get("headers", []):
            if k == b"authorization":
                scheme, _, token = v.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(),
                                                                          self.api_key.encode())
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        label = endpoint_label(path)
        counters = self.state.counters
        status_seen = {"status": 500}

        async def send_counted(msg):
            if msg["type"] == "http.response.start":
                status_seen["status"] = msg["status"]
            await send(msg)

        is_api = path.startswith(API_PREFIXES)
        if is_api:
            with counters.lock:
                counters.in_flight += 1
        try:
            await self._handle(scope, receive, send_counted, is_api)
        finally:
            if is_api:
                with counters.lock:
                    counters.in_flight -= 1
            counters.request_done(label, status_seen["status"])

    async def _handle(self, scope, receive, send, is_api):
        if is_api and self.state.draining:
            return await self._reply(send, 503, "the server is shutting down", code="server_shutting_down")
        if is_api and not self._authorized(scope):
            return await self._reply(send, 401, "Incorrect API key provided: send it as "
                                     "'Authorization: Bearer KEY'.", code="invalid_api_key",
                                     headers=[(b"www-authenticate", b"Bearer")])
        limit = self.max_body_bytes
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    declared = int(v)
                except ValueError:
                    return await self._reply(send, 400, "bad Content-Length header")
                if declared > limit:
                    return await self._reply(send, 413, f"the request body is {declared} bytes, more "
                                             f"than the server's limit of {limit} (--max-body-bytes)",
                                             code="request_too_large")
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > limit:
                return await self._reply(send, 413, f"the request body is over the server's limit of "
                                         f"{limit} bytes (--max-body-bytes)", code="request_too_large")
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        return await self.app(scope, replay, send)
