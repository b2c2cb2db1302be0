"""One choice of one request, from submit to its last token, on the event loop.

`ChoiceRun.submit()` hands the request to the engine (whose thread does all the work);
a pump task then waits on the request's eventfd (`loop.add_reader`, as
tinyloop.engine.AsyncEngine does, so no thread waits per request and the loop never
blocks), turns the token ids into UTF-8-safe text (engine.TextDecoder), applies the
text-level stop strings (stops.StopMatcher) and queues `Piece`s for whoever answers the
HTTP request. It is written here rather than on top of AsyncEngine.tokens because the
server needs more than the ids: the handle itself (cancel, the first-token signal for
n > 1), the logprobs, and the RequestOutput at the end (finish reason, loops per token).

Cancelling the pump (the client went away, the request failed) cancels the engine
request, which frees its KV blocks at the engine's next step.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..engine import TextDecoder
from .stops import StopMatcher


@dataclass
class Piece:
    """Released output: text and the tokens behind it (with their logprobs when asked:
    (token id, logprob, [(id, logprob), ...]) each), and their loop depths when known."""
    text: str
    tokens: list = field(default_factory=list)
    logprobs: list | None = None
    loops: list | None = None
    final: bool = False


class ChoiceRun:
    def __init__(self, state, prompt_ids: list[int], kwargs: dict, stops: list[str],
                 want_logprobs: bool, index: int = 0,
                 queue: asyncio.Queue | None = None):
        self.state = state
        self.index = index
        self.prompt_ids = prompt_ids
        self.kwargs = kwargs
        self.want_logprobs = want_logprobs
        self.matcher = StopMatcher(stops)
        self.decoder = TextDecoder(state.tokenizer, prompt_ids) if state.tokenizer else None
        self.handle = None
        self.queue = queue if queue is not None else asyncio.Queue()  # (index, Piece)
        self.first = asyncio.Event()  # first token arrived, or the request ended
        self.task: asyncio.Task | None = None
        self.pending: list = []       # (id, logprob entry, start, end, loops) not yet released
        self.n_tokens = 0             # generated tokens (all of them, even past a stop string)
        self.output = None            # the engine's RequestOutput
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.text = ""                # everything released
        self.finished = False         # the final piece was queued

    def submit(self) -> None:
        """Hands the request to the engine; raises what submit raises (tl.QueueFull,
        ValueError naming a parameter, RuntimeError for a prompt that does not fit)."""
        self.handle = self.state.engine.submit(self.prompt_ids, **self.kwargs)
        self.task = asyncio.get_running_loop().create_task(self._pump())

    def cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.handle is not None and not self.handle.done:
            self.handle.cancel()

    # ------------------------------------------------------------------ the pump

    def _poll(self) -> list:
        """[(token id, loops, logprob entry or None)] that arrived since the last poll."""
        return [(int(t), int(loops), (float(lp), [(int(i), float(v)) for i, v in top]) if self.want_logprobs else None)
                for t, loops, lp, top in self.handle.poll_detail()]

    def _take(self, items) -> None:
        if self.matcher.stopped:
            return  # tokens after a stop string (the cancel takes effect at the next step)
        for tid, loops, lp in items:
            self.n_tokens += 1
            start = len(self.matcher.text)
            delta = self.decoder.push([tid]) if self.decoder else ""
            released = self.matcher.push(delta)
            self.pending.append((tid, lp, start, len(self.matcher.text), loops))
            if released:
                self._release(released)
            if self.matcher.stopped:
                self.handle.cancel()
                return

    def _release(self, text: str, final: bool = False) -> None:
        upto = self.matcher.sent
        keep, out = [], []
        for tok in self.pending:
            _, _, start, end, _ = tok
            if start < upto or (end <= upto and not self.matcher.stopped) or (final and not self.matcher.stopped):
                out.append(tok)
            elif not self.matcher.stopped:
                keep.append(tok)
        self.pending = keep
        self.text += text
        ids = [t[0] for t in out]
        piece = Piece(text=text, tokens=ids,
                      logprobs=[(t[0], t[1][0], t[1][1]) for t in out] if self.want_logprobs else None,
                      loops=[t[4] for t in out], final=final)
        self.queue.put_nowait((self.index, piece))

    def _take_all(self) -> None:
        items = self._poll()
        if items:
            self._take(items)
            self.first.set()

    async def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        fd = self.handle.fileno()
        loop.add_reader(fd, ready.set)
        try:
            while True:
                # Poll, then look at done: poll() drains the eventfd, so a finish signalled
                # before it is only seen through done (reading done first would miss it and
                # wait forever); one signalled after it wakes the reader.
                self._take_all()
                if self.handle.done:
                    self._take_all()  # what arrived with the end
                    break
                await ready.wait()
                ready.clear()
            try:
                self.output = self.handle.result()
                reason = self.output.finish_reason
            except RuntimeError as e:  # the request failed inside the engine
                self.error, reason = str(e), "error"
            self.finish_reason = "stop" if self.matcher.stopped else reason
            self._release(self.matcher.flush(), final=True)
            self.finished = True
        except Exception as e:  # a bug here must end the choice, not hang its reader
            self.error, self.finish_reason = f"{type(e).__name__}: {e}", "error"
            raise
        finally:
            loop.remove_reader(fd)
            if not self.handle.done:
                self.handle.cancel()
            self.first.set()
            if not self.finished:
                self.finish_reason = self.finish_reason or "cancelled"
                self.queue.put_nowait((self.index, Piece(text="", final=True)))

    # ------------------------------------------------------------------ at the end

    @property
    def loops_per_token(self) -> list[int]:
        return list(self.output.loops_per_token) if self.output is not None else []

    @property
    def loop_sum(self) -> int:
        return sum(self.loops_per_token)
