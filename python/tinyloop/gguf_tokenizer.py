"""A Hugging Face `tokenizers` tokenizer.json built from a GGUF file's vocabulary, and its
chat template. `tinyloop.convert` embeds both in the `.tinyloop` file.

A GGUF file carries the tokenizer as arrays (`tokenizer.ggml.tokens`, `.merges`,
`.token_type`) plus two names: `tokenizer.ggml.model` (the algorithm) and
`tokenizer.ggml.pre` (which pre-tokenizer regexes split the text before BPE). llama.cpp maps
each `pre` name to a list of regexes (src/llama-vocab.cpp); applying them one after another,
each splitting every piece into matches and the text between matches, is exactly what a
Hugging Face `Split(pattern, behavior="Isolated")` does. So the tokenizer here is

    pre_tokenizer = Sequence(Split(regex_1), ..., Split(regex_n), ByteLevel(use_regex=False))
    model         = BPE(vocab, merges, ignore_merges as llama.cpp sets it)
    decoder       = ByteLevel

and it gives the same ids as llama.cpp's tokenizer (tests/oracles checks that on SmolLM2).
The `gpt2` model (byte-level BPE: Llama 3, SmolLM, Qwen2, GPT-2...) and the `llama` model
(SentencePiece BPE with byte fallback: Llama 2, TinyLlama, Mistral...) are supported;
anything else is refused with a ValueError that names it.
"""
from __future__ import annotations

import json

__all__ = ["tokenizer_json_from_gguf", "chat_template_from_gguf", "SUPPORTED_PRE"]

# llama.cpp's regexes (src/llama-vocab.cpp, llm_tokenizer_bpe), copied verbatim.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
           r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
          r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# `tokenizer.ggml.pre` -> (regexes applied in order, ignore_merges, default add_bos).
# ignore_merges: a word that is itself a vocabulary token is taken whole (llama.cpp sets it
# for the Llama 3 family; Hugging Face's Llama 3 tokenizer.json has "ignore_merges": true).
_PRE_GROUPS = (
    (("llama3", "llama-v3", "llama-bpe", "falcon3"), [_LLAMA3], True, True),
    (("dbrx", "smaug-bpe"), [_LLAMA3], False, False),
    (("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
     [r"\p{N}", _GPT2], False, False),
    (("gpt-2", "phi-2", "roberta-bpe", "mpt", "olmo", "jais"), [_GPT2], False, False),
    (("qwen2", "stablelm2", "megrez"), [_QWEN2], False, False),
)
_PRE = {name: (regexes, ignore, bos) for names, regexes, ignore, bos in _PRE_GROUPS for name in names}
SUPPORTED_PRE = tuple(sorted(_PRE))

# GGUF token types (gguf.TokenType / llama.cpp LLAMA_TOKEN_TYPE_*).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


def _field(reader, key: str, default=None):
    """A metadata value as a Python object (str, int, float, bool, list), or default."""
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _token_id(reader, key: str, n_tokens: int) -> int | None:
    """A token id field, or None when absent or out of range (llama.cpp ignores those too)."""
    v = _field(reader, key)
    return int(v) if v is not None and 0 <= int(v) < n_tokens else None


def chat_template_from_gguf(reader) -> str | None:
    """The default chat template (`tokenizer.chat_template`, Jinja2 text), or None."""
    t = _field(reader, "tokenizer.chat_template")
    return str(t) if t else None


def _added_token(i: int, content: str, special: bool) -> dict:
    # normalized=False: matched against the raw text, never split by the pre-tokenizer.
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def _post_processor(add_bos: bool, add_eos: bool, tokens: list[str], bos: int | None,
                    eos: int | None) -> dict | None:
    """TemplateProcessing that adds BOS/EOS to encode() as llama.cpp's tokenize(add_bos=True)
    does; None when the file asks for neither."""
    single, specials = [], {}
    if add_bos and bos is not None:
        single.append({"SpecialToken": {"id": tokens[bos], "type_id": 0}})
        specials[tokens[bos]] = {"id": tokens[bos], "ids": [bos], "tokens": [tokens[bos]]}
    single.append({"Sequence": {"id": "A", "type_id": 0}})
    if add_eos and eos is not None:
        single.append({"SpecialToken": {"id": tokens[eos], "type_id": 0}})
        specials[tokens[eos]] = {"id": tokens[eos], "ids": [eos], "tokens": [tokens[eos]]}
    if not specials:
        return None
    pair = single + [{"Sequence": {"id": "B", "type_id": 1}}]
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials}


def tokenizer_json_from_gguf(reader) -> str | None:
    """tokenizer.json text for the GGUF file read by `reader` (a gguf.GGUFReader), or None
    when the file has no tokenizer. Raises ValueError naming an unsupported tokenizer model
    or pre-tokenizer, or inconsistent arrays."""
    model = _field(reader, "tokenizer.ggml.model")
    if model is None:
        return None
    model = str(model)
    if model == "llama":
        return _spm_tokenizer_json(reader)
    if model != "gpt2":
        raise ValueError(f"GGUF tokenizer model {model!r} is not supported "
                         "(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece)")
    pre = str(_field(reader, "tokenizer.ggml.pre", "default"))
    if pre not in _PRE:
        raise ValueError(f"GGUF pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported "
                         f"(supported: {', '.join(SUPPORTED_PRE)})")
    regexes, ignore_merges, add_bos_default = _PRE[pre]

    tokens = [str(t) for t in _field(reader, "tokenizer.ggml.tokens", [])]
    if not tokens:
        raise ValueError("GGUF tokenizer: tokenizer.ggml.tokens is missing or empty")
    types = [int(t) for t in _field(reader, "tokenizer.ggml.token_type", [_NORMAL] * len(tokens))]
    if len(types) != len(tokens):
        raise ValueError(f"GGUF tokenizer: {len(types)} token types for {len(tokens)} tokens")
    merges_raw = _field(reader, "tokenizer.ggml.merges")
    if merges_raw is None:
        raise ValueError("GGUF tokenizer: tokenizer.ggml.merges is missing (a 'gpt2' BPE needs it)")
    merges = []
    for m in merges_raw:
        a, sep, b = str(m).partition(" ")  # byte-level tokens never contain a plain space
        if not sep:
            raise ValueError(f"GGUF tokenizer: malformed merge {m!r} (expected 'left right')")
        merges.append([a, b])

    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if t in vocab:
            raise ValueError(f"GGUF tokenizer: token {t!r} appears twice (ids {vocab[t]} and {i})")
        vocab[t] = i
    # Control tokens (<|im_start|>, <|endoftext|>...) are special: matched whole in the input,
    # skipped by decode(skip_special_tokens=True). User-defined tokens are matched whole too
    # (llama.cpp always does) but decode as their text.
    added = [_added_token(i, t, types[i] == _CONTROL) for i, t in enumerate(tokens)
             if types[i] in (_CONTROL, _USER_DEFINED)]

    bos, eos = (_token_id(reader, k, len(tokens)) for k in ("tokenizer.ggml.bos_token_id",
                                                             "tokenizer.ggml.eos_token_id"))
    add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", add_bos_default))
    add_eos = bool(_field(reader, "tokenizer.ggml.add_eos_token", False))

    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            *({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False}
              for r in regexes),
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ]},
        "post_processor": _post_processor(add_bos, add_eos, tokens, bos, eos),
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges},
    }
    text = json.dumps(spec, ensure_ascii=False)
    _check_loads(text, pre)
    return text


def _spm_merges(tokens: list[str], types: list[int], scores: list[float]) -> list[list[str]]:
    """BPE merges equivalent to SentencePiece's score-driven merging, as transformers'
    SentencePieceExtractor builds them: every split of a normal piece into two vocabulary
    pieces is a merge, ranked by the merged piece's score (higher first)."""
    vocab = {t: i for i, t in enumerate(tokens) if types[i] in (_NORMAL, _USER_DEFINED)}
    merges = []
    for piece, i in vocab.items():
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
        merges.extend((scores[i], l, r) for l, r in local)
    merges.sort(key=lambda m: -m[0])  # stable: equal scores keep the order above
    return [[l, r] for _, l, r in merges]


def _spm_tokenizer_json(reader) -> str:
    """`tokenizer.ggml.model` "llama" (SentencePiece BPE with byte fallback: Llama 2,
    TinyLlama, Mistral...). llama.cpp merges adjacent pieces by the merged piece's score, maps
    ' ' to U+2581, prepends one to each text fragment when add_space_prefix (default true) --
    the first one and every one after a special token -- and falls back to <0xXX> byte tokens.
    The Hugging Face equivalent: BPE with score-ranked merges and byte_fallback, and a
    Prepend + Replace normalizer, which runs per fragment between added tokens."""
    tokens = [str(t) for t in _field(reader, "tokenizer.ggml.tokens", [])]
    if not tokens:
        raise ValueError("GGUF tokenizer: tokenizer.ggml.tokens is missing or empty")
    types = [int(t) for t in _field(reader, "tokenizer.ggml.token_type", [_NORMAL] * len(tokens))]
    scores = _field(reader, "tokenizer.ggml.scores")
    if scores is None:  # the merge order of a SentencePiece vocabulary is its scores
        raise ValueError("GGUF tokenizer: SentencePiece ('llama') vocabulary without tokenizer.ggml.scores")
    scores = [float(x) for x in scores]
    if not len(types) == len(scores) == len(tokens):
        raise ValueError(f"GGUF tokenizer: {len(tokens)} tokens, {len(types)} token types, {len(scores)} scores")
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # a repeated piece keeps its first id
    unk = _token_id(reader, "tokenizer.ggml.unknown_token_id", len(tokens))
    unk_token = tokens[unk] if unk is not None else None
    added = [_added_token(i, t, types[i] in (_CONTROL, _UNKNOWN)) for i, t in enumerate(tokens)
             if types[i] in (_CONTROL, _USER_DEFINED, _UNKNOWN)]

    bos, eos = (_token_id(reader, k, len(tokens)) for k in ("tokenizer.ggml.bos_token_id",
                                                             "tokenizer.ggml.eos_token_id"))
    add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", True))
    add_eos = bool(_field(reader, "tokenizer.ggml.add_eos_token", False))
    space_prefix = bool(_field(reader, "tokenizer.ggml.add_space_prefix", True))
    normalizers = ([{"type": "Prepend", "prepend": "\u2581"}] if space_prefix else []) + \
        [{"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": None,
        "post_processor": _post_processor(add_bos, add_eos, tokens, bos, eos),
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            *([{"type": "Strip", "content": " ", "start": 1, "stop": 0}] if space_prefix else []),
        ]},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk_token, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
                  "ignore_merges": False, "vocab": vocab, "merges": _spm_merges(tokens, types, scores)},
    }
    text = json.dumps(spec, ensure_ascii=False)
    _check_loads(text, "llama (SentencePiece)")
    return text


def _check_loads(text: str, pre: str) -> None:
    """Fail here, naming the file's pre-tokenizer, rather than when a user first runs it."""
    try:
        from tokenizers import Tokenizer
    except ImportError:  # the converter may run without tokenizers installed
        return
    try:
        Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises its own Exception subclass
        raise ValueError(f"GGUF tokenizer (pre {pre!r}): the built tokenizer.json does not load: {e}") from None
