"""A conversation as messages, and how it becomes prompt ids: through the model's chat
template (Jinja2, as transformers' apply_chat_template) or, without one, as plain text.
Shared by `tinyloop chat` (chat.py) and the HTTP server's chat completions (server/).
"""
from __future__ import annotations

# End-of-turn markers of common templates (llama.cpp treats them as end of generation too);
# the model's eos_ids may name only one of them.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>")


def stop_sequences(tokenizer, eos_ids) -> list[list[int]]:
    ids = {tokenizer.token_to_id(t) for t in _END_OF_TURN} - {None} - set(eos_ids)
    return [[i] for i in sorted(ids)]


def special_tokens(tokenizer, cfg) -> dict:
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
        self.special = special_tokens(tokenizer, cfg)
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
