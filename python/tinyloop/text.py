"""Text in, text out: a Model's embedded tokenizer (Hugging Face `tokenizers`), the byte
string of every token (for tl.Grammar), the chat template, and a streamer that prints
decoded text as tokens arrive. docs/text.md shows them in use.

A model is either an open `tinyloop_py.Model` or the path of a `.tinyloop` file; from a path
only the file's JSON header is read (the tokenizer and chat template live in its metadata),
never the weights.
"""
from __future__ import annotations

import json
import os
import struct
import sys

__all__ = ["load_tokenizer", "get_tokenizer", "token_bytes", "grammar", "read_metadata",
           "chat_template", "render_chat", "TextStreamer"]


def read_metadata(path) -> dict:
    """The `__metadata__` (str -> str) of a `.tinyloop` file, reading only its header."""
    path = os.fspath(path)
    with open(path, "rb") as f:  # FileNotFoundError names the path
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path}: truncated header (not a tinyloop file)")
        (n,) = struct.unpack("<Q", head)
        if n > os.path.getsize(path) - 8:
            raise ValueError(f"{path}: header length {n} exceeds the file (not a tinyloop file)")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: header is not JSON ({e})") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: no __metadata__ in the header (not a tinyloop file)")
    return meta


def _tokenizer_text(model) -> str:
    if isinstance(model, (str, os.PathLike)):
        return read_metadata(model).get("tokenizer", "")
    return model.tokenizer_json()


def load_tokenizer(model):
    """The model's embedded tokenizer as a `tokenizers.Tokenizer`, or None when it has none."""
    text = _tokenizer_text(model)
    if not text:
        return None
    from tokenizers import Tokenizer  # imported lazily: only text models need it
    return Tokenizer.from_str(text)


def get_tokenizer(model):
    """Like load_tokenizer, but a model without a tokenizer is a ValueError."""
    tok = load_tokenizer(model)
    if tok is None:
        where = os.fspath(model) if isinstance(model, (str, os.PathLike)) else "the model"
        raise ValueError(f"{where} has no embedded tokenizer (convert it with `tinyloop convert`, "
                         "which embeds the source's tokenizer)")
    return tok


def _vocab_size(model) -> int | None:
    if isinstance(model, (str, os.PathLike)):
        cfg = json.loads(read_metadata(model).get("config", "{}"))
        return cfg.get("vocab_size")
    if hasattr(model, "config"):
        return model.config()["vocab_size"]
    return None


def token_bytes(model, special_as_text: bool = False) -> list[bytes]:
    """One bytes object per token id of `model` (a Model, a path, or a tokenizers.Tokenizer):
    the exact bytes each id adds to the output (tinyloop.grammar_vocab explains how).
    Special tokens get b"" unless special_as_text. With a model, the list has exactly
    vocab_size entries (ids the tokenizer does not know, e.g. padding rows, get b"")."""
    from .grammar_vocab import token_bytes as from_tokenizer

    if hasattr(model, "encode") and hasattr(model, "to_str"):  # already a Tokenizer
        return from_tokenizer(model, special_as_text)
    out = from_tokenizer(get_tokenizer(model), special_as_text)
    n = _vocab_size(model)
    if n is not None:
        if len(out) > n:
            raise ValueError(f"the tokenizer has {len(out)} ids but the model's vocab_size is {n}")
        out += [b""] * (n - len(out))
    return out


def grammar(model, pattern):
    """A tl.Grammar ready for model.generate(grammar=...): `pattern` is a regex (str/bytes)
    or an existing tl.Grammar (e.g. tl.Grammar.digits(1, 6)); its token vocabulary is set
    from the model's tokenizer."""
    import tinyloop_py as tl

    g = pattern if isinstance(pattern, tl.Grammar) else tl.Grammar(pattern)
    g.set_token_vocabulary(token_bytes(model))
    return g


def chat_template(model) -> str | None:
    """The model's chat template (Jinja2 text) or None. `model` is a path (the header is
    read), or an object with a chat_template() method."""
    if isinstance(model, (str, os.PathLike)):
        return read_metadata(model).get("chat_template") or None
    get = getattr(model, "chat_template", None)
    return (get() or None) if callable(get) else None


def render_chat(template: str, messages: list[dict], add_generation_prompt: bool = True,
                **special_tokens) -> str:
    """Render a Hugging Face chat template the way transformers' apply_chat_template does
    (sandboxed Jinja2, trim_blocks, lstrip_blocks, loop controls, raise_exception,
    strftime_now). special_tokens become template variables (bos_token="<s>", eos_token=...)."""
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise RuntimeError("chat templates need jinja2 (pip install jinja2)") from None
    from jinja2 import TemplateError

    def raise_exception(message):
        raise TemplateError(message)

    def strftime_now(fmt):  # Llama 3.x templates print today's date
        import datetime
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(template).render(messages=messages,
                                                add_generation_prompt=add_generation_prompt,
                                                **special_tokens)
    except TemplateError as e:
        raise ValueError(f"chat template: {e}") from None


class TextStreamer:
    """on_token callback that writes decoded text as it grows. Byte-level BPE tokens can
    split a UTF-8 character, and whether a space joins two tokens depends on the tokenizer,
    so it decodes the output together with up to `context` earlier ids and writes only the
    new stable suffix beyond what was written so far (a trailing U+FFFD means a character is
    still incomplete). Initially the prompt's own decoded text counts as written. `text`
    holds everything written (the output only)."""

    def __init__(self, tokenizer, out=None, prompt_ids=(), context: int = 8):
        self.tok = tokenizer
        self.out = out or sys.stdout
        # A few prompt ids give the first output token its left context (a leading space
        # is decided by what precedes it); decoding the whole prompt every step would make
        # long chats quadratic.
        self.ids: list[int] = [int(t) for t in prompt_ids][-context:]
        # (a prompt ending inside a UTF-8 character: the output completes it and prints it)
        self.printed = (tokenizer.decode(self.ids) if self.ids else "").rstrip("\ufffd")
        self.text = ""

    def __call__(self, tok: int) -> bool:
        self.ids.append(int(tok))
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd"):
            return True
        new = text[len(self.printed):]
        self.out.write(new)
        self.out.flush()
        self.text += new
        self.printed = text
        return True
