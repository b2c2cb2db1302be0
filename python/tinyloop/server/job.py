"""All the choices of one API request: prompts x n, submitted so that the n choices of a
prompt share its KV, their pieces merged in arrival order, and the errors of submit turned
into HTTP statuses.

n > 1: the first choice of each prompt is submitted alone; once its first token has come
out, its prompt has been prefilled and the prompt's whole KV blocks are in the engine's
prefix cache, so the other n - 1 choices (seeds seed+1, seed+2, ...) are submitted then and
only compute the prompt's last partial block. Submitting all n at once would prefill the
prompt n times side by side.
"""
from __future__ import annotations

import asyncio
import re

import tinyloop_py as tl

from .errors import ApiError, bad_param
from .generation import ChoiceRun

_PARAM_NAMES = ("max_tokens", "loops", "temperature", "top_k", "top_p", "repetition_penalty", "seed",
                "presence_penalty", "frequency_penalty", "logprobs", "kv_budget_mb", "early_exit_patience",
                "early_exit_min_L", "early_exit_tau", "early_exit_peek_every", "early_exit_logit_margin",
                "grammar", "stop_sequences", "prompt", "timeout", "exit_gate_threshold", "exit_gate_step",
                "exit_gate_kv", "exit_gate_mode", "exit_gate")
_EXT_NAME = {"early_exit_patience": "early_exit.patience", "early_exit_min_L": "early_exit.min_L",
             "early_exit_tau": "early_exit.tau", "early_exit_peek_every": "early_exit.peek_every",
             "early_exit_logit_margin": "early_exit.logit_margin", "stop_sequences": "stop",
             "grammar": "response_format", "kv_budget_mb": "max_tokens",
             "exit_gate_threshold": "exit_gate.threshold", "exit_gate_step": "exit_gate.step",
             "exit_gate_kv": "exit_gate.kv", "exit_gate_mode": "exit_gate"}


def _param_of(message: str) -> str | None:
    for word in re.findall(r"[A-Za-z_]+", message):
        if word in _PARAM_NAMES:
            return _EXT_NAME.get(word, word)
    return None


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


class Job:
    def __init__(self, state, prompts: list[list[int]], n: int, kwargs: dict, stops: list[str],
                 want_logprobs: bool):
        self.state = state
        self.prompts = prompts
        self.n = n
        self.queue: asyncio.Queue = asyncio.Queue()
        self.choices: list[ChoiceRun] = []
        seed = kwargs.get("seed")
        for p, ids in enumerate(prompts):
            for i in range(n):
                kw = dict(kwargs)
                if seed is not None:
                    kw["seed"] = (seed + i) % 2**64
                self.choices.append(ChoiceRun(state, ids, kw, stops, want_logprobs,
                                              index=p * n + i, queue=self.queue))

    def _submit(self, c: ChoiceRun) -> None:
        try:
            c.submit()
        except tl.QueueFull as e:
            if self.state.draining:
                raise ApiError(503, "the server is shutting down", None, "server_shutting_down") from None
            raise ApiError(429, f"the request queue is full ({e}); retry later", None, "queue_full") from None
        except TypeError as e:  # an engine build without this parameter
            raise bad_param(None, f"this engine does not support a parameter: {e}", "unsupported_parameter") from None
        except ValueError as e:
            raise bad_param(_param_of(str(e)), str(e)) from None
        except RuntimeError as e:
            raise bad_param(_param_of(str(e)) or "prompt", str(e)) from None

    async def start(self) -> None:
        """Submits every choice (first of each prompt, then the rest once it has a token).
        On an error, cancels what was submitted and raises ApiError."""
        try:
            firsts = self.choices[::self.n]
            for c in firsts:
                self._submit(c)
            if self.n > 1:
                await asyncio.gather(*(c.first.wait() for c in firsts))
                for c in self.choices:
                    if c.handle is None:
                        self._submit(c)
        except BaseException:
            self.cancel()
            raise

    def cancel(self) -> None:
        for c in self.choices:
            c.cancel()

    async def pieces(self):
        """(choice index, Piece) as they come, until every choice's final piece."""
        left = len(self.choices)
        while left:
            index, piece = await self.queue.get()
            if piece.final:
                left -= 1
            yield index, piece

    async def collect(self) -> tuple[dict, dict]:
        """A whole (non-streamed) answer: starts the job, then every choice's text pieces
        and logprob entries by choice index, once all have ended."""
        await self.start()
        texts = {c.index: [] for c in self.choices}
        entries = {c.index: [] for c in self.choices}
        async for index, piece in self.pieces():
            texts[index].append(piece.text)
            if piece.logprobs:
                entries[index].extend(piece.logprobs)
        return texts, entries

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def completion_tokens(self) -> int:
        return sum(c.n_tokens for c in self.choices)

    @property
    def loop_sum(self) -> int:
        return sum(c.loop_sum for c in self.choices)

    def usage(self) -> dict:
        done = self.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": done,
                "total_tokens": self.prompt_tokens + done,
                "mean_loops": round(self.loop_sum / done, 4) if done else None}

    def record(self) -> None:
        self.state.counters.add_usage(self.prompt_tokens, self.completion_tokens, self.loop_sum)


async def until_disconnect(request) -> None:
    """Returns when the client has gone (the body has been read by then, so the next ASGI
    message is the disconnect)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


async def run_guarded(request, coro, on_gone):
    """Awaits `coro` unless the client disconnects first: then cancels it, calls on_gone()
    (which cancels the engine requests, freeing their KV at once) and raises ClientGone."""
    task = asyncio.ensure_future(coro)
    watch = asyncio.ensure_future(until_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        watch.cancel()
        on_gone()
        raise
    if task.done():
        watch.cancel()
        return task.result()
    task.cancel()
    on_gone()
    raise ClientGone()
