"""What the server holds for its whole life: the model, its tokenizer and chat template,
the serving engine (its own thread does every forward pass), compiled grammars, and the
counters /metrics reports. One EngineState serves one model under one name."""
from __future__ import annotations

import os
import threading
import time
from collections import defaultdict

import tinyloop_py as tl

from ..conversation import special_tokens, stop_sequences
from ..text import chat_template, load_tokenizer, token_bytes
from .schema import GrammarCache


class Counters:
    """Server-side counters for /metrics (the engine's own come from eng.stats())."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)  # (endpoint, status) -> count
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.loop_iterations = 0      # sum of loops over every generated token
        self.in_flight = 0            # API requests being answered (drain waits for 0)

    def request_done(self, endpoint: str, status: int) -> None:
        with self.lock:
            self.requests[(endpoint, status)] += 1

    def add_usage(self, prompt: int, completion: int, loops: int) -> None:
        with self.lock:
            self.prompt_tokens += prompt
            self.completion_tokens += completion
            self.loop_iterations += loops


class EngineState:
    """model: a path to a .tinyloop file (or an open tl.Model). engine_kwargs go to tl.Engine
    (kv_budget_mb, max_num_seqs, max_queue, ...). timeout: seconds per request (0: none)."""

    def __init__(self, model, model_name: str | None = None, timeout: float = 0.0, **engine_kwargs):
        self.path = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
        self.model = tl.Model(self.path) if self.path is not None else model
        self.own_model = self.path is not None
        self.model_name = model_name or (os.path.splitext(os.path.basename(self.path))[0] if self.path else "tinyloop")
        self.cfg = self.model.config()
        self.max_seq_len = int(self.model.max_seq_len)
        self.default_loops = int(self.cfg["default_loops"])
        self.eos_ids = list(self.cfg.get("eos_ids") or [])
        self.tokenizer = load_tokenizer(self.model)
        self.template = chat_template(self.path) if self.path else chat_template(self.model)
        self.special = special_tokens(self.tokenizer, self.cfg) if self.tokenizer else {}
        # end-of-turn tokens of common templates (chat.py): a chat reply ends at them
        self.chat_stop_ids = stop_sequences(self.tokenizer, self.eos_ids) if self.tokenizer else []
        self.timeout = float(timeout)
        self.engine = tl.Engine(self.model, **engine_kwargs)
        self.grammars = GrammarCache(self.token_bytes)
        self.counters = Counters()
        self.draining = False
        self.created = int(time.time())
        self._token_bytes = None
        self._token_strings: dict[int, str] = {}

    # ------------------------------------------------------------------ tokens

    def token_bytes(self) -> list[bytes]:
        if self._token_bytes is None:
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: grammars need one")
            self._token_bytes = token_bytes(self.model)
        return self._token_bytes

    def token_string(self, tid: int) -> str:
        """A token as OpenAI's logprobs show it: its own bytes as text (a piece of a UTF-8
        character comes out as U+FFFD; the chat API's `bytes` field has the exact bytes)."""
        s = self._token_strings.get(tid)
        if s is None:
            b = self.token_raw(tid)
            s = b.decode("utf-8", "replace") if b else (self.tokenizer.id_to_token(tid) or "")
            self._token_strings[tid] = s
        return s

    def token_raw(self, tid: int) -> bytes:
        tb = self.token_bytes()
        if 0 <= tid < len(tb) and tb[tid]:
            return tb[tid]
        tok = self.tokenizer.id_to_token(tid) if 0 <= tid < self.cfg["vocab_size"] else None
        return (tok or "").encode("utf-8")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: send the prompt as token ids")
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(list(ids))

    def stats(self) -> dict:
        return self.engine.stats()

    def close(self, drain: bool = False) -> None:
        self.engine.close(drain)
        if self.own_model:
            self.model.close()
