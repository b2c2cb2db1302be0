"""Server-sent events in OpenAI's streaming format: one `data: {json}` event per chunk, a
blank line after each, and `data: [DONE]` last."""
from __future__ import annotations

import json

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # proxies must not buffer


def event(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n\n"
