"""Structured output: `response_format` (json_object / json_schema) and the `regex`
extension -> a tl.Grammar (docs/grammar.md, docs/server.md "Structured output").

A JSON schema becomes a regex through outlines-core (`build_regex_from_schema`, pinned in
requirements-dev.txt) rather than a hand-written converter. Its regex is written for
Unicode code points (Python / Rust `regex` semantics), while tl.Grammar matches bytes: a
class like outlines' string character `[^"\\\x00-\x1F\x7F-\x9F]` means "any code point but
these" there, but "any byte but these" to tl.Grammar, which would forbid every UTF-8
continuation byte 0x80-0x9F (so half of all non-ASCII characters) and admit invalid UTF-8.
So the regex is parsed with Python's own parser (re._parser) and written out again in
tl.Grammar syntax with every class expanded to UTF-8 byte sequences (the classic
code-point-range -> UTF-8-range split). Constructs with no regular-language meaning
(lookaround, backreferences, word boundaries, inline flags) are refused by name.

The translation keeps every output inside the original regex's language: positive \\d \\w
\\s become their ASCII forms (a subset of Python's Unicode classes), and inside a negated
class they are expanded exactly, so the complement is never larger than Python's.
"""
from __future__ import annotations

import functools
import json
import re
import threading
from collections import OrderedDict

from .errors import ApiError, bad_param

try:  # Python 3.11+: the parser lives in re._parser; sre_parse is the old name
    from re import _constants as C
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover
    import sre_constants as C
    import sre_parse

MAX_CODE = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
MAX_REPEAT_COUNT = 10000  # tl.Grammar's limit on {m,n}


class Unsupported(ValueError):
    """A regex construct tl.Grammar cannot express; the message names it."""


# ---------------------------------------------------------------- code point sets

def _normalize(ranges) -> list[tuple[int, int]]:
    """Sorted, merged, surrogate-free code point ranges."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    res = []
    for lo, hi in out:  # surrogates are not characters: UTF-8 cannot encode them
        if hi < SURROGATES[0] or lo > SURROGATES[1]:
            res.append((lo, hi))
            continue
        if lo < SURROGATES[0]:
            res.append((lo, SURROGATES[0] - 1))
        if hi > SURROGATES[1]:
            res.append((SURROGATES[1] + 1, hi))
    return res


def _complement(ranges) -> list[tuple[int, int]]:
    out, nxt = [], 0
    for lo, hi in _normalize(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODE:
        out.append((nxt, MAX_CODE))
    return _normalize(out)


_ASCII_CATEGORY = {
    C.CATEGORY_DIGIT: [(0x30, 0x39)],
    C.CATEGORY_WORD: [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    C.CATEGORY_SPACE: [(0x09, 0x0D), (0x20, 0x20)],
}
_NEGATED = {C.CATEGORY_NOT_DIGIT: C.CATEGORY_DIGIT, C.CATEGORY_NOT_WORD: C.CATEGORY_WORD,
            C.CATEGORY_NOT_SPACE: C.CATEGORY_SPACE}
_CATEGORY_RE = {C.CATEGORY_DIGIT: r"\d", C.CATEGORY_WORD: r"\w", C.CATEGORY_SPACE: r"\s"}


@functools.lru_cache(maxsize=None)
def _unicode_category(cat) -> tuple:
    """Python's exact (Unicode) set for \\d \\w \\s, as ranges (computed once)."""
    rx = re.compile(_CATEGORY_RE[cat])
    ranges, start = [], None
    for cp in range(MAX_CODE + 2):
        hit = cp <= MAX_CODE and not (SURROGATES[0] <= cp <= SURROGATES[1]) and rx.match(chr(cp)) is not None
        if hit and start is None:
            start = cp
        elif not hit and start is not None:
            ranges.append((start, cp - 1))
            start = None
    return tuple(ranges)


def _category(cat, exact: bool) -> list[tuple[int, int]]:
    if cat in _NEGATED:  # \D \W \S: the complement of the exact set, never larger than Python's
        return _complement(_unicode_category(_NEGATED[cat]))
    if cat in _ASCII_CATEGORY:
        return list(_unicode_category(cat)) if exact else _ASCII_CATEGORY[cat]
    raise Unsupported(f"the class escape {cat} (only \\d \\w \\s and their negations)")


def _class_set(items) -> list[tuple[int, int]]:
    negate = any(op is C.NEGATE for op, _ in items)
    ranges = []
    for op, av in items:
        if op is C.NEGATE:
            continue
        if op is C.LITERAL:
            ranges.append((av, av))
        elif op is C.RANGE:
            ranges.append(av)
        elif op is C.CATEGORY:
            ranges.extend(_category(av, exact=negate))
        else:
            raise Unsupported(f"the class item {op}")
    return _complement(ranges) if negate else _normalize(ranges)


# ---------------------------------------------------------------- UTF-8 byte ranges

def _encode(cp: int) -> bytes:
    return chr(cp).encode("utf-8")


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """The code points lo..hi (no surrogates) as UTF-8 byte-range sequences: each sequence
    is a list of (first byte, last byte) ranges, one per byte, and every byte string they
    match is the UTF-8 of a code point in lo..hi (Russ Cox's / Rust regex-syntax's split)."""
    out, todo = [], [(lo, hi)]
    while todo:
        s, e = todo.pop()
        while True:
            split = False
            for max_cp in (0x7F, 0x7FF, 0xFFFF):  # same encoded length on both ends
                if s <= max_cp < e:
                    todo.append((max_cp + 1, e))
                    e = max_cp
                    split = True
                    break
            if split:
                continue
            if e <= 0x7F:
                out.append([(s, e)])
                break
            for i in (1, 2, 3):  # same leading bytes, full continuation ranges below
                m = (1 << (6 * i)) - 1
                if (s & ~m) != (e & ~m):
                    if s & m:
                        todo.append(((s | m) + 1, e))
                        e = s | m
                        split = True
                        break
                    if (e & m) != m:
                        todo.append((e & ~m, e))
                        e = (e & ~m) - 1
                        split = True
                        break
            if split:
                continue
            bs, be = _encode(s), _encode(e)
            out.append(list(zip(bs, be)))
            break
    return sorted(out)


def _byte_class(lo: int, hi: int) -> str:
    return f"\\x{lo:02x}" if lo == hi else f"[\\x{lo:02x}-\\x{hi:02x}]"


def _set_pattern(ranges) -> str:
    """A code point set as a tl.Grammar pattern (one atom)."""
    ranges = _normalize(ranges)
    if not ranges:
        raise Unsupported("a character class that matches nothing")
    ascii_parts, multi = [], []
    for lo, hi in ranges:
        if lo <= 0x7F:
            ascii_parts.append((lo, min(hi, 0x7F)))
        if hi > 0x7F:
            for seq in utf8_sequences(max(lo, 0x80), hi):
                multi.append("".join(_byte_class(a, b) for a, b in seq))
    alts = []
    if ascii_parts:
        alts.append("[" + "".join(f"\\x{a:02x}" if a == b else f"\\x{a:02x}-\\x{b:02x}"
                                  for a, b in ascii_parts) + "]")
    alts.extend(multi)
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _literal(cp: int) -> str:
    if cp < 0x80:
        ch = chr(cp)
        if ch.isalnum() or ch == "_":
            return ch
        if 0x20 <= cp < 0x7F:
            return "\\" + ch
        return f"\\x{cp:02x}"
    if SURROGATES[0] <= cp <= SURROGATES[1]:
        raise Unsupported(f"the surrogate code point U+{cp:04X}")
    return "(?:" + "".join(f"\\x{b:02x}" for b in _encode(cp)) + ")"


# ---------------------------------------------------------------- the translator

_ANCHORS = (C.AT_BEGINNING, C.AT_BEGINNING_STRING, C.AT_END, C.AT_END_STRING)


def _emit(items, top: bool) -> str:
    items = list(items)
    parts = []
    for i, (op, av) in enumerate(items):
        if op is C.LITERAL:
            parts.append(_literal(av))
        elif op is C.NOT_LITERAL:
            parts.append(_set_pattern(_complement([(av, av)])))
        elif op is C.ANY:  # no DOTALL: any character but \n
            parts.append(_set_pattern(_complement([(0x0A, 0x0A)])))
        elif op is C.IN:
            parts.append(_set_pattern(_class_set(av)))
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT):  # lazy: the same language (whole-output match)
            lo, hi, sub = av
            if lo > MAX_REPEAT_COUNT or (hi is not C.MAXREPEAT and hi > MAX_REPEAT_COUNT):
                raise Unsupported(f"the repeat count {{{lo},{'' if hi is C.MAXREPEAT else hi}}} "
                                  f"(at most {MAX_REPEAT_COUNT})")
            body = _emit(sub, False)
            if hi is C.MAXREPEAT:
                q = "*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}"
            elif lo == hi:
                q = f"{{{lo}}}"
            elif (lo, hi) == (0, 1):
                q = "?"
            else:
                q = f"{{{lo},{hi}}}"
            parts.append(f"(?:{body}){q}")
        elif op is C.SUBPATTERN:
            _group, add_flags, del_flags, sub = av
            if add_flags or del_flags:
                raise Unsupported("inline flags such as (?i)")
            parts.append(f"(?:{_emit(sub, False)})")
        elif op is C.BRANCH:
            parts.append("(?:" + "|".join(_emit(alt, False) for alt in av[1]) + ")")
        elif op is C.AT:
            first, last = i == 0, i == len(items) - 1
            if top and av in _ANCHORS and (first if av in _ANCHORS[:2] else last):
                continue  # the whole output is matched anyway
            raise Unsupported(f"the anchor or boundary {av} (only ^ first and $ last)")
        elif op in (C.ASSERT, C.ASSERT_NOT):
            raise Unsupported("lookahead / lookbehind")
        elif op is C.GROUPREF or op is C.GROUPREF_EXISTS:
            raise Unsupported("backreferences")
        else:
            raise Unsupported(f"the construct {op}")
    return "".join(parts)


def to_grammar_pattern(pattern: str) -> str:
    """A Python-syntax (Unicode) regex as a tl.Grammar (byte) pattern with the same
    language. Raises Unsupported naming the construct it cannot express."""
    try:
        parsed = sre_parse.parse(pattern)
    except re.error as e:
        raise Unsupported(f"not a valid regex ({e})") from None
    flags = parsed.state.flags & ~(re.UNICODE | re.ASCII)
    if flags:
        raise Unsupported("regex flags (case-insensitive, multiline, dotall, verbose)")
    return _emit(parsed, True)


# ---------------------------------------------------------------- JSON schema -> grammar

def schema_regex(schema) -> str:
    """outlines-core's regex for a JSON schema (a dict), as a tl.Grammar pattern. Raises
    ApiError 400 naming what could not be expressed."""
    from outlines_core.json_schema import build_regex_from_schema

    param = "response_format.json_schema.schema"
    try:
        rx = build_regex_from_schema(json.dumps(schema))
    except Exception as e:  # outlines-core raises ValueError / TypeError / its own errors
        raise bad_param(param, f"this JSON schema cannot be turned into a grammar: {e}",
                        "unsupported_schema") from None
    try:
        return to_grammar_pattern(rx)
    except Unsupported as e:
        raise bad_param(param, f"this JSON schema needs {e}, which the grammar engine cannot express",
                        "unsupported_schema") from None


# Any JSON object, for {"type": "json_object"}: outlines-core's regex for {"type": "object"}
# (nesting bounded to its recursion depth: a regular language has no unbounded nesting).
JSON_OBJECT_SCHEMA = {"type": "object"}


class GrammarCache:
    """Compiled tl.Grammars by pattern, their vocabulary set once (compiling a JSON
    schema's DFA and building the vocabulary's masks costs milliseconds to seconds, and
    clients send the same schema again and again). Thread-safe: compiled off the loop."""

    def __init__(self, token_bytes_fn, size: int = 32):
        self._token_bytes_fn = token_bytes_fn
        self._token_bytes = None
        self._size = size
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, object] = OrderedDict()

    def get(self, pattern: str, param: str):
        import tinyloop_py as tl

        with self._lock:
            g = self._cache.get(pattern)
            if g is not None:
                self._cache.move_to_end(pattern)
                return g
            if self._token_bytes is None:
                self._token_bytes = self._token_bytes_fn()
            vocab = self._token_bytes
        try:
            g = tl.Grammar(pattern)
        except ValueError as e:
            raise bad_param(param, f"{param}: {e}", "invalid_grammar") from None
        g.set_token_vocabulary(vocab)
        with self._lock:
            self._cache[pattern] = g
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return g


def grammar_pattern(req) -> tuple[str, str] | None:
    """(pattern, param) for a request's response_format / regex, or None."""
    rf = getattr(req, "response_format", None)
    regex = getattr(req, "regex", None)
    if rf is not None and rf.type != "text" and regex is not None:
        raise bad_param("regex", "pass either regex or response_format, not both")
    if regex is not None:
        return regex, "regex"
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return schema_regex(JSON_OBJECT_SCHEMA), "response_format"
    if rf.json_schema is None:
        raise bad_param("response_format.json_schema", "response_format json_schema needs a json_schema object",
                        "missing_required_parameter")
    schema = rf.json_schema.schema_
    if schema is None:
        raise bad_param("response_format.json_schema.schema", "json_schema needs a schema",
                        "missing_required_parameter")
    return schema_regex(schema), "response_format.json_schema.schema"


__all__ = ["ApiError", "GrammarCache", "Unsupported", "grammar_pattern", "schema_regex", "to_grammar_pattern",
           "utf8_sequences"]
