"""`tinyloop chat MODEL`: a REPL that keeps the conversation.

With a chat template in the model file (SmolLM2-Instruct, Llama-3-Instruct... converted by
`tinyloop convert`), every turn renders the whole conversation through the template (Jinja2,
as transformers' apply_chat_template) with the generation prompt, and the model answers
until an end-of-turn token. Without one, the conversation is plain text: each line is
appended to what came before and the model continues it. An empty line quits.

The conversation is re-tokenised every turn (the template may rewrite earlier turns, e.g.
strip thinking), so the prompt is prefilled whole each time: fine for small models and
short chats. When it no longer fits in max_seq_len, the oldest turns are dropped (the
system message stays).
"""
from __future__ import annotations

import sys

# End-of-turn markers of common templates (llama.cpp treats them as end of generation too);
# the model's eos_ids may name only one of them.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>")


def _stop_sequences(tokenizer, eos_ids) -> list[list[int]]:
    ids = {tokenizer.token_to_id(t) for t in _END_OF_TURN} - {None} - set(eos_ids)
    return [[i] for i in sorted(ids)]


def _special_tokens(tokenizer, cfg) -> dict:
    """bos_token / eos_token strings for the template (Llama 3's template prints bos_token)."""
    out = {}
    if cfg.get("bos_id") is not None:
        out["bos_token"] = tokenizer.id_to_token(cfg["bos_id"]) or ""
    if cfg.get("eos_ids"):
        out["eos_token"] = tokenizer.id_to_token(cfg["eos_ids"][0]) or ""
    return out


class Conversation:
    """The messages so far and how to turn them into prompt ids (template or plain text)."""

    def __init__(self, tokenizer, template: str | None, cfg: dict, system: str | None = None):
        self.tok = tokenizer
        self.template = template
        self.special = _special_tokens(tokenizer, cfg)
        self.messages: list[dict] = [{"role": "system", "content": system}] if system else []

    def prompt_ids(self, budget: int) -> list[int]:
        """Ids of the conversation plus the generation prompt, at most `budget` of them,
        dropping the oldest turns (never the system message or the last user turn)."""
        from .text import render_chat

        while True:
            if self.template is not None:
                text = render_chat(self.template, self.messages, add_generation_prompt=True, **self.special)
                # The template writes BOS itself where the model wants one.
                ids = self.tok.encode(text, add_special_tokens=False).ids
            else:
                ids = self.tok.encode("".join(m["content"] for m in self.messages)).ids
            if len(ids) <= budget:
                return ids
            first = 1 if self.messages and self.messages[0]["role"] == "system" else 0
            if len(self.messages) - first <= 1:
                if self.template is None:  # plain text: keep the most recent tokens
                    return ids[-budget:]
                raise ValueError(f"the message is {len(ids)} tokens, more than the {budget} that fit "
                                 "(raise --max-seq-len or lower --max-tokens)")
            del self.messages[first]

    def add_user(self, text: str) -> None:
        if self.template is not None:
            self.messages.append({"role": "user", "content": text})
        else:
            sep = "\n" if self.messages else ""
            self.messages.append({"role": "user", "content": sep + text})

    def add_reply(self, text: str) -> None:
        if self.template is not None:
            self.messages.append({"role": "assistant", "content": text.strip()})
        else:
            self.messages.append({"role": "assistant", "content": text})


def run(model, tokenizer, template: str | None, args, stdin=None, stdout=None) -> int:
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    cfg = model.config()
    conv = Conversation(tokenizer, template, cfg, getattr(args, "system", None))
    stops = _stop_sequences(tokenizer, cfg["eos_ids"])
    mode = "chat template" if template is not None else "no chat template: plain continuation"
    print(f"({mode}; an empty line quits)", file=stdout, flush=True)
    try:
        _loop(model, tokenizer, conv, stops, args, stdin, stdout)
    except KeyboardInterrupt:  # Ctrl-C: leave quietly, as an empty line does
        stdout.write("\n")
    return 0


def _loop(model, tokenizer, conv, stops, args, stdin, stdout) -> None:
    import numpy as np
    from .cli import decode_kwargs
    from .text import TextStreamer

    turn = 0
    while True:
        stdout.write("> ")
        stdout.flush()
        line = stdin.readline()
        if not line or not line.strip():
            return
        conv.add_user(line.rstrip("\n"))
        try:
            ids = conv.prompt_ids(model.max_seq_len - args.max_tokens)
        except ValueError as e:
            conv.messages.pop()
            print(f"tinyloop chat: {e}", file=stdout, flush=True)
            continue
        prompt = np.asarray(ids, dtype=np.int32)
        streamer = TextStreamer(tokenizer, stdout, prompt_ids=ids)
        seed = None if args.seed is None else args.seed + turn
        turn += 1
        r = model.generate_stream(prompt, streamer, seed=seed, stop_sequences=stops, **decode_kwargs(args))
        new = r["tokens"][len(ids):]
        conv.add_reply(tokenizer.decode(new))  # special tokens (end of turn) skipped
        stdout.write("\n")
        stdout.flush()
