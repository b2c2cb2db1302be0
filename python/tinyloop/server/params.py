"""From a validated request to what the engine takes: the model name check, the output
length against the context, stop strings (as text and as token-id stop sequences), the
grammar, logprobs, the timeout."""
from __future__ import annotations

import asyncio
import functools


from .errors import ApiError, bad_param
from .protocol import engine_kwargs
from .schema import grammar_pattern


@functools.lru_cache(maxsize=None)
def check_model(state, name: str | None) -> None:
    if name is not None and name != state.model_name:
        raise ApiError(404, f"The model '{name}' does not exist (this server serves '{state.model_name}').",
                       "model", "model_not_found")


def output_length(state, prompts: list[list[int]], requested: int | None, default: int | None,
                  param: str = "max_tokens") -> int:
    """max_tokens for the engine: the request's, or `default` (None: the rest of the
    context), refused with 400 when the prompt and the output do not fit max_seq_len."""
    longest = max(len(p) for p in prompts)
    room = state.max_seq_len - longest
    if room < 1:
        raise bad_param("prompt" if param != "messages" else "messages",
                        f"This model's maximum context length is {state.max_seq_len} tokens, and the prompt "
                        f"has {longest}: no room for any output.", "context_length_exceeded")
    if requested is None:
        return room if default is None else min(default, room)
    if requested > room:
        raise bad_param(param, f"This model's maximum context length is {state.max_seq_len} tokens. However, "
                        f"you requested {longest + requested} tokens ({longest} in the prompt, {requested} "
                        f"for the output). Please reduce the prompt or {param}.", "context_length_exceeded")
    return requested


def stop_sequences(state, stops: list[str]) -> list[list[int]]:
    """Each stop string's own token ids: the engine then stops on them a step earlier than
    the text-level match would (the text-level match is what decides, stops.py)."""
    if state.tokenizer is None:
        return []
    out = []
    for s in stops:
        ids = state.encode(s, add_special_tokens=False)
        if ids and ids not in out:
            out.append(ids)
    return out


async def build_kwargs(state, req, max_tokens: int, stops: list[str], logprobs: int | None,
                       extra_stop_ids=()) -> dict:
    """The request's SamplingParams kwargs."""
    kw = engine_kwargs(req, max_tokens, state.cfg["vocab_size"])
    seqs = stop_sequences(state, stops) + [list(s) for s in extra_stop_ids]
    if seqs:
        kw["stop_sequences"] = seqs
    if logprobs is not None:
        kw["logprobs"] = logprobs
    found = await asyncio.to_thread(grammar_pattern, req)  # outlines-core + translation
    if found is not None:
        pattern, param = found
        if state.tokenizer is None:
            raise bad_param(param, "this model has no tokenizer, which a grammar needs")
        # compiling a schema's DFA can take a while: off the event loop
        kw["grammar"] = await asyncio.to_thread(state.grammars.get, pattern, param)
    if state.timeout > 0:
        kw["timeout"] = state.timeout
    return kw
