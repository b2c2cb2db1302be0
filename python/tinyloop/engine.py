"""The serving engine from Python: text in and out, and asyncio (docs/serving.md).

`tinyloop_py.Engine` (the extension module) serves token ids: `submit(prompt_ids, params)`
returns a handle that yields token ids as the engine thread emits them. This module adds
what an application around it needs:

- `TextEngine(model)`: prompts as text through the model's own tokenizer, and each
  request's output as text deltas (byte-level BPE tokens can split a UTF-8 character: a
  delta is only released once it decodes cleanly).
- `AsyncEngine(engine)`: `async for` over a request's tokens or text deltas without
  blocking the event loop. The engine thread never touches Python; each handle has an
  eventfd that turns readable when output arrives, which the loop watches with
  `add_reader`, so no thread waits per request.

    import tinyloop_py as tl
    from tinyloop.engine import AsyncEngine, TextEngine

    with tl.Model("model.tinyloop") as model:
        eng = TextEngine(model, kv_budget_mb=512)
        for delta in eng.stream("Once upon a time", max_tokens=32, loops=8):
            print(delta, end="", flush=True)
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Iterable, Iterator

import tinyloop_py as tl

from .text import get_tokenizer


class TextDecoder:
    """Incremental detokenization of one request: feed ids, get the new text. Decodes the
    output with up to `context` earlier ids for the left context (whether a token starts
    with a space depends on what precedes it) and holds back a trailing U+FFFD (a character
    split across tokens) until the next token completes it."""

    def __init__(self, tokenizer, prompt_ids: Iterable[int] = (), context: int = 8):
        self.tok = tokenizer
        self.ids = [int(t) for t in prompt_ids][-context:]
        self.n_context = len(self.ids)
        self.emitted = (tokenizer.decode(self.ids) if self.ids else "").rstrip("\ufffd")

    def push(self, token_ids: Iterable[int]) -> str:
        self.ids.extend(int(t) for t in token_ids)
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        new = text[len(self.emitted):]
        self.emitted = text
        return new


class TextEngine:
    """tl.Engine with text prompts and text output. model: a tl.Model (its weights are
    shared) or a path; engine_kwargs go to tl.Engine (kv_budget_mb, max_num_seqs, ...)."""

    def __init__(self, model, tokenizer=None, **engine_kwargs):
        self.model = model if not isinstance(model, str) else tl.Model(model)
        self.tokenizer = tokenizer or get_tokenizer(self.model)
        self.engine = tl.Engine(self.model, **engine_kwargs)

    def encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt).ids
            if not ids:
                raise ValueError("prompt: the text encodes to no tokens")
            return ids
        return [int(t) for t in prompt]

    def submit(self, prompt, params=None, **kwargs):
        """A tl.RequestHandle for a text (or token id) prompt."""
        return self.engine.submit(self.encode(prompt), params, **kwargs)

    def stream(self, prompt, params=None, **kwargs) -> Iterator[str]:
        """Text deltas of one request as they are generated (cancelled if the caller
        stops iterating early)."""
        ids = self.encode(prompt)
        handle = self.engine.submit(ids, params, **kwargs)
        dec = TextDecoder(self.tokenizer, ids)
        try:
            for tok in handle:
                delta = dec.push([tok])
                if delta:
                    yield delta
        finally:
            if not handle.done:
                handle.cancel()

    def generate(self, prompts, params=None, **kwargs) -> list[str]:
        """The completions of several prompts, submitted together (they share steps)."""
        outs = self.engine.generate_batch([self.encode(p) for p in prompts], params, **kwargs)
        return [self.tokenizer.decode(o.tokens) for o in outs]

    def close(self, drain: bool = False) -> None:
        self.engine.close(drain)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class AsyncEngine:
    """asyncio front of a tl.Engine (or a TextEngine, for text deltas). Every coroutine
    returns to the event loop while the engine works; a task cancelled while it awaits a
    request cancels the request, so its KV is freed at once."""

    def __init__(self, engine):
        if isinstance(engine, TextEngine):
            self.text, self.engine = engine, engine.engine
        else:
            self.text, self.engine = None, engine

    async def tokens(self, prompt, params=None, **kwargs) -> AsyncIterator[int]:
        """Token ids of one request as they arrive."""
        ids = self.text.encode(prompt) if self.text else prompt
        handle = self.engine.submit(ids, params, **kwargs)
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        fd = handle.fileno()
        loop.add_reader(fd, ready.set)
        try:
            while True:
                for tok in handle.poll():
                    yield tok
                if handle.done:
                    for tok in handle.poll():  # what arrived with the end
                        yield tok
                    handle.result()  # raises RuntimeError when the request failed
                    return
                await ready.wait()
                ready.clear()
        finally:
            loop.remove_reader(fd)
            if not handle.done:
                handle.cancel()

    async def stream(self, prompt, params=None, **kwargs) -> AsyncIterator[str]:
        """Text deltas of one request (needs a TextEngine)."""
        if not self.text:
            raise TypeError("stream() needs AsyncEngine(TextEngine(...)) for a tokenizer")
        ids = self.text.encode(prompt)
        dec = TextDecoder(self.text.tokenizer, ids)
        async for tok in self.tokens(ids, params, **kwargs):
            delta = dec.push([tok])
            if delta:
                yield delta

    async def generate(self, prompt, params=None, **kwargs) -> list[int]:
        """All generated token ids of one request."""
        return [t async for t in self.tokens(prompt, params, **kwargs)]
