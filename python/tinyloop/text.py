"""Text in, text out: a Model's embedded tokenizer (Hugging Face `tokenizers`) and a
streamer that prints decoded text as tokens arrive."""
from __future__ import annotations

import sys


def load_tokenizer(model):
    """The model's embedded tokenizer as a `tokenizers.Tokenizer`, or None when it has none."""
    text = model.tokenizer_json()
    if not text:
        return None
    from tokenizers import Tokenizer  # imported lazily: only text models need it
    return Tokenizer.from_str(text)


class TextStreamer:
    """on_token callback that writes decoded text as it grows. Byte-level BPE tokens can
    split a UTF-8 character, and whether a space joins two tokens depends on the tokenizer,
    so it decodes prompt + output together and writes only the new stable suffix beyond
    what was written so far (a trailing U+FFFD means a character is still incomplete).
    Initially the prompt's own decoded text counts as written."""

    def __init__(self, tokenizer, out=None, prompt_ids=()):
        self.tok = tokenizer
        self.out = out or sys.stdout
        self.ids: list[int] = [int(t) for t in prompt_ids]
        self.printed = tokenizer.decode(self.ids) if self.ids else ""

    def __call__(self, tok: int) -> bool:
        self.ids.append(int(tok))
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd"):
            return True
        self.out.write(text[len(self.printed):])
        self.out.flush()
        self.printed = text
        return True
