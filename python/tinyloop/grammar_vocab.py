"""The `token_bytes` list a tl.Grammar needs (docs/grammar.md): the exact bytes each token id
adds to the output, from a Hugging Face `tokenizers.Tokenizer`.

Grammars work on bytes, not decoded strings: a byte-level BPE token can be half of a UTF-8
character, and `tokenizer.decode([id])` would turn it into U+FFFD. So the bytes come from
the vocabulary itself:

- ByteLevel decoders (GPT-2, RoBERTa, Llama 3, Qwen...): every character of a token string
  stands for one byte through GPT-2's bytes_to_unicode table.
- Metaspace / byte-fallback decoders (SentencePiece style: Llama 2, Mistral...): "▁" is a
  space, "<0xHH>" is the byte HH, the rest is UTF-8.

Special tokens (added tokens marked special: EOS, BOS, chat markers) get b"": a grammar
never allows an empty token, and EOS goes through Grammar.eos_allowed instead. Pass
special_as_text=True to give them their literal text instead (then a permissive grammar
like ".*" could emit "<|endoftext|>" as text).
"""
from __future__ import annotations

import json
import re

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others
    are shifted to U+0100 and up."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1)))
    table, shifted = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


def _decoder_types(decoder) -> set[str]:
    if not decoder:
        return set()
    if decoder.get("type") == "Sequence":
        return {t for d in decoder.get("decoders", []) for t in _decoder_types(d)}
    return {decoder.get("type")}


def token_bytes(tokenizer, special_as_text: bool = False) -> list[bytes]:
    """One bytes object per token id of `tokenizer` (a tokenizers.Tokenizer)."""
    spec = json.loads(tokenizer.to_str())
    kinds = _decoder_types(spec.get("decoder"))
    vocab = tokenizer.get_vocab(with_added_tokens=False)
    added = tokenizer.get_added_tokens_decoder()
    out = [b""] * (max(list(vocab.values()) + list(added)) + 1)  # ids need not be dense
    if "ByteLevel" in kinds:
        table = gpt2_unicode_to_byte()
        convert = lambda s: bytes(table[c] for c in s)  # noqa: E731
    elif kinds & {"Metaspace", "ByteFallback", "Replace", "Fuse", "Strip"}:
        def convert(s):
            m = _BYTE_FALLBACK.match(s)
            return bytes([int(m.group(1), 16)]) if m else s.replace("\u2581", " ").encode("utf-8")
    else:
        raise ValueError(f"token_bytes: unsupported tokenizer decoder {sorted(kinds) or 'none'} "
                         "(supported: ByteLevel, Metaspace/ByteFallback)")
    for s, i in vocab.items():
        if i not in added:
            out[i] = convert(s)
    for i, tok in added.items():
        out[i] = b"" if tok.special and not special_as_text else tok.content.encode("utf-8")
    return out
