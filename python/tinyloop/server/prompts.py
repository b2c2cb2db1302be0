"""Prompts as token ids: completions' prompts (text or ids) and chat messages (through the
model's chat template, tinyloop.chat / tinyloop.text, or a plain transcript when the model
has none, e.g. the bundled model)."""
from __future__ import annotations

from ..conversation import Conversation
from .errors import bad_param

# Without a chat template the conversation is a plain transcript the model continues:
#   System: ...\nUser: ...\nAssistant: ...\nUser: ...\nAssistant:
# and the reply stops where the model starts writing the next user turn.
_ROLE_NAMES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}
TRANSCRIPT_STOPS = ["\nUser:"]


def completion_prompt_ids(state, prompt, index: int, n_prompts: int) -> list[int]:
    param = "prompt" if n_prompts == 1 else f"prompt[{index}]"
    if isinstance(prompt, str):
        try:
            ids = state.encode(prompt)
        except ValueError as e:
            raise bad_param(param, str(e)) from None
        if not ids:
            raise bad_param(param, "the prompt encodes to no tokens")
        return ids
    vocab = state.cfg["vocab_size"]
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise bad_param(param, f"token id {bad[0]} is out of range (the vocabulary has {vocab} ids)")
    return list(prompt)


def chat_prompt_ids(state, messages, add_generation_prompt: bool = True) -> tuple[list[int], list[str], bool]:
    """(prompt ids, extra stop strings, whether the template was used)."""
    if state.tokenizer is None:
        raise bad_param("messages", "this model has no tokenizer: use /v1/completions with token ids")
    if state.template is not None:
        conv = Conversation(state.tokenizer, state.template, state.cfg)
        conv.messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text(),
                          **({"name": m.name} if m.name else {})} for m in messages]
        if not add_generation_prompt:
            from ..text import render_chat
            text = render_chat(state.template, conv.messages, add_generation_prompt=False, **state.special)
            return state.encode(text, add_special_tokens=False), [], True
        try:
            # no budget: an API request that does not fit is refused (400), never shortened
            return conv.prompt_ids(2**31), [], True
        except ValueError as e:  # a template that raises (e.g. roles out of order)
            raise bad_param("messages", str(e)) from None
    lines = [f"{_ROLE_NAMES[m.role]}: {m.text()}" for m in messages]
    text = "\n".join(lines)
    if add_generation_prompt:
        text += "\nAssistant:"
    return state.encode(text), list(TRANSCRIPT_STOPS), False
