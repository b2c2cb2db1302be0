"""`tinyloop chat MODEL`: a REPL that keeps the conversation.

With a chat template in the model file (SmolLM2-Instruct, Llama-3-Instruct... converted by
`tinyloop convert`), every turn renders the whole conversation through the template (Jinja2,
as transformers' apply_chat_template) with the generation prompt, and the model answers
until an end-of-turn token. Without one, the conversation is plain text: each line is
appended to what came before and the model continues it. An empty line quits.

The conversation is re-tokenised every turn (the template may rewrite earlier turns, e.g.
strip thinking), but it is not re-computed: replies come from a serving engine
(`tinyloop_py.Engine`) with automatic prefix caching, which keeps the KV blocks of each
turn's prompt, so the next turn computes only what follows the longest unchanged block
prefix (the last reply and the new message). The output is the same as a fresh
`generate` of the whole prompt (the engine is bit-identical to it). Beam search
(`--beam-size`) is not served by the engine and re-prefills. When the conversation no
longer fits in max_seq_len, the oldest turns are dropped (the system message stays).
"""
from __future__ import annotations

import sys

from .cli_args import decode_kwargs
from .conversation import Conversation, stop_sequences
from .repl import turn_seed, typed_lines

# Positions per KV block of the chat engine: a turn reuses the earlier prompt in whole blocks.
_BLOCK = 16


def _kv_budget_mb(model, args) -> float:
    """KV pool for one conversation at max_seq_len, twice (the running turn and the cached
    blocks of the previous prompt), in the widest storage (fp32 K and V, or an fp32 h row)."""
    c = model.config()
    loops = getattr(args, "loops", None) or c["default_loops"]
    slots = c["n_pre_blocks"] + loops * c["n_loop_layers"] + c["n_post_blocks"]
    row_bytes = 4 * max(2 * c["n_kv_heads"] * c["head_dim"], c["dim"])
    return max(4.0, 2 * slots * row_bytes * (model.max_seq_len + _BLOCK) / 2**20)


def _engine(model, args):
    """The serving engine that keeps earlier turns' KV, or None for beam search."""
    if (getattr(args, "beam_size", 0) or 0) >= 2:
        return None
    import tinyloop_py as tl

    return tl.Engine(model, kv_budget_mb=_kv_budget_mb(model, args), kv_block_size=_BLOCK,
                     max_num_seqs=1, prefix_caching=True)


def run(model, tokenizer, template: str | None, args, stdin=None, stdout=None,
        stats: dict | None = None) -> int:
    """The REPL. stats, when given, receives the engine's counters at the end (tests)."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    cfg = model.config()
    conv = Conversation(tokenizer, template, cfg, getattr(args, "system", None))
    stops = stop_sequences(tokenizer, cfg["eos_ids"])
    mode = "chat template" if template is not None else "no chat template: plain continuation"
    print(f"({mode}; an empty line quits)", file=stdout, flush=True)
    engine = _engine(model, args)
    try:
        _loop(model, engine, tokenizer, conv, stops, args, stdin, stdout)
    except KeyboardInterrupt:  # Ctrl-C: leave quietly, as an empty line does
        stdout.write("\n")
    finally:
        if engine is not None:
            if stats is not None:
                stats.update(engine.stats())
            engine.close()
    return 0


def _reply(model, engine, prompt, on_token, seed, stops, kwargs) -> list[int]:
    """The new tokens of one turn, streamed to on_token (False from it stops the reply)."""
    if engine is None:
        r = model.generate_stream(prompt, on_token, seed=seed, stop_sequences=stops, **kwargs)
        return r["tokens"][len(prompt):]
    kwargs = {k: v for k, v in kwargs.items() if k not in ("beam_size", "length_penalty")}
    handle = engine.submit(prompt, seed=seed, stop_sequences=stops, **kwargs)
    for tok in handle:
        if on_token(tok) is False:
            handle.cancel()
            break
    return list(handle.result().tokens)


def _loop(model, engine, tokenizer, conv, stops, args, stdin, stdout) -> None:
    import numpy as np
    from .text import TextStreamer

    turn = 0
    for line in typed_lines(stdin, stdout):
        conv.add_user(line)
        try:
            ids = conv.prompt_ids(model.max_seq_len - args.max_tokens)
        except ValueError as e:
            conv.messages.pop()
            print(f"tinyloop chat: {e}", file=stdout, flush=True)
            continue
        prompt = np.asarray(ids, dtype=np.int32)  # [T]
        streamer = TextStreamer(tokenizer, stdout, prompt_ids=ids)
        seed = turn_seed(args.seed, turn)
        turn += 1
        new = _reply(model, engine, prompt, streamer, seed, stops, decode_kwargs(args))
        conv.add_reply(tokenizer.decode(new))  # special tokens (end of turn) skipped
        stdout.write("\n")
        stdout.flush()
