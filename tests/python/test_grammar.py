"""tl.Grammar (docs/grammar.md) against Python's `re` as the oracle.

Patterns are drawn from the syntax both engines share and mean the same by it, so the
pattern text is given to `re` unchanged: literals written as \\xHH or \\<punctuation>
(never raw non-ASCII bytes, which tl.Grammar groups into UTF-8 characters), classes with
escaped members, `.` (both exclude only b"\\n": no DOTALL), \\d \\w \\s and negations
(both ASCII-only on bytes), * + ? {m} {m,} {m,n} {,n} with optional lazy ?, | ( ) (?:).
`re.fullmatch` gives the whole-output semantics.
"""
import json
import random
import re
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import tinyloop_py as tl

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Bytes the generated patterns and strings are made of: a small set so matches are common,
# with the awkward ones (newline, NUL, 0xff, regex metacharacters) in it.
ALPHABET = b"abc\n.{ \x00\xff-"


def lit(b: int) -> bytes:
    """One byte as pattern text that means that byte in both engines."""
    c = bytes([b])
    if c.isalnum() and b < 0x80:
        return c
    if 0x20 <= b < 0x7F:
        return b"\\" + c
    return b"\\x%02x" % b


byte_of_alphabet = st.sampled_from(list(ALPHABET))
class_escapes = st.sampled_from([b"\\d", b"\\w", b"\\s", b"\\D", b"\\W", b"\\S"])


@st.composite
def char_class(draw):
    items = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.integers(0, 2))
        if kind == 0:
            items.append(lit(draw(byte_of_alphabet)))
        elif kind == 1:
            lo, hi = sorted([draw(st.integers(0, 255)), draw(st.integers(0, 255))])
            items.append(b"\\x%02x-\\x%02x" % (lo, hi))
        else:
            items.append(draw(class_escapes))
    neg = b"^" if draw(st.booleans()) else b""
    return b"[" + neg + b"".join(items) + b"]"


atoms = st.one_of(
    byte_of_alphabet.map(lit),
    char_class(),
    st.just(b"."),
    class_escapes,
)

quantifiers = st.sampled_from([b"", b"", b"*", b"+", b"?", b"{2}", b"{1,}", b"{0,2}", b"{,2}", b"{1,3}",
                               b"*?", b"+?", b"??", b"{1,2}?"])


def _has_quantifier(text: bytes) -> bool:
    text = text.replace(b"(?:", b"(")  # a non-capturing group's "?" is not a quantifier
    return any(c in text for c in (b"*", b"+", b"?", b"{"))


def patterns():
    def extend(inner):
        group = st.tuples(st.sampled_from([b"(", b"(?:"]), inner).map(lambda t: t[0] + t[1] + b")")
        # A quantifier on a group that already holds one ((a*)*, (a+|b)+) sends Python's
        # backtracking `re` (the oracle) into exponential time on non-matching strings, so
        # only quantifier-free groups are repeated; nested repetition is still tested by
        # the C++ grammar tests.
        quantified_group = group.flatmap(
            lambda g: st.tuples(st.just(g), quantifiers if not _has_quantifier(g) else st.just(b"")))
        piece = st.one_of(st.tuples(atoms, quantifiers), quantified_group).map(lambda t: t[0] + t[1])
        concat = st.lists(piece, min_size=0, max_size=4).map(b"".join)
        return st.lists(concat, min_size=1, max_size=3).map(b"|".join)

    return st.recursive(st.tuples(atoms, quantifiers).map(lambda t: t[0] + t[1]), extend, max_leaves=8)


def compile_or_skip(p: bytes):
    """The Grammar, or None when its language is empty (checked against re)."""
    try:
        return tl.Grammar(p)
    except ValueError as e:
        msg = str(e)
        if "matches no string" in msg:
            return None
        if "too complex" in msg or "too large" in msg:
            assume(False)
        raise


def live_walk(g, rng: random.Random, max_len=10) -> bytes:
    """Random bytes that keep the grammar alive, stopping at random once accepting."""
    out, s = b"", g.initial_state()
    for _ in range(rng.randint(0, max_len)):
        nexts = [b for b in range(256) if g.advance_bytes(s, bytes([b])) != tl.Grammar.DEAD]
        if not nexts:
            break
        b = rng.choice(nexts)
        out, s = out + bytes([b]), g.advance_bytes(s, bytes([b]))
    return out


@SETTINGS
@given(p=patterns(), strings=st.lists(st.binary(max_size=8).map(
    lambda bs: bytes(ALPHABET[x % len(ALPHABET)] for x in bs)), max_size=12), seed=st.integers(0, 2**32))
def test_matches_equals_re_fullmatch(p, strings, seed):
    oracle = re.compile(p)
    g = compile_or_skip(p)
    rng = random.Random(seed)
    if g is None:
        assert all(oracle.fullmatch(s) is None for s in strings + [b""] + [bytes([b]) for b in range(256)]), p
        return
    # random strings, near-misses built by walking live bytes, and a known match
    candidates = strings + [live_walk(g, rng) for _ in range(6)]
    candidates.append(g.shortest_completion(g.initial_state()))
    for s in candidates:
        assert g.matches(s) == (oracle.fullmatch(s) is not None), (p, s)
        for cut in range(len(s)):  # a prefix of a match is never dead
            if oracle.fullmatch(s):
                assert g.advance_bytes(g.initial_state(), s[:cut]) != tl.Grammar.DEAD, (p, s, cut)


def random_vocab(rng: random.Random, extra: int):
    """All 256 single bytes (ids 0..255, so every completion can be spelled), then random
    multi-byte tokens over ALPHABET, a few empty ones and duplicates."""
    vocab = [bytes([b]) for b in range(256)]
    for _ in range(extra):
        n = rng.choice([0, 2, 2, 3, 4, 6])
        vocab.append(bytes(rng.choice(ALPHABET) for _ in range(n)))
    vocab.append(vocab[300] if len(vocab) > 300 else b"ab")
    return vocab


@SETTINGS
@given(p=patterns(), seed=st.integers(0, 2**32))
def test_walking_allowed_tokens_yields_a_match(p, seed):
    g = compile_or_skip(p)
    assume(g is not None)
    rng = random.Random(seed)
    vocab = random_vocab(rng, 200)
    g.set_token_vocabulary(vocab)
    s, out = g.initial_state(), b""
    for _ in range(30):
        if g.is_accepting(s) and rng.random() < 0.3:
            break
        allowed = np.flatnonzero(g.allowed_tokens(s))
        if len(allowed) == 0:
            assert g.is_accepting(s) and not g.can_continue(s), (p, out)
            break
        t = int(rng.choice(list(allowed)))
        s = g.advance(s, t)
        assert s != tl.Grammar.DEAD
        out += vocab[t]
    for b in g.shortest_completion(s):  # finish along the single-byte tokens
        assert g.allowed_tokens(s)[b]
        s, out = g.advance(s, b), out + bytes([b])
    assert g.is_accepting(s) and g.eos_allowed(s)
    assert re.fullmatch(p, out) is not None, (p, out)


@SETTINGS
@given(p=patterns(), seed=st.integers(0, 2**32))
def test_mask_equals_brute_force(p, seed):
    g = compile_or_skip(p)
    assume(g is not None)
    rng = random.Random(seed)
    vocab = [b"", b"a", b"ab", b"abc", b"\n", b".{", b"\xff\x00", b"- ", b"c", b"ba", b"{", b"ab", b"zz"]
    vocab += [bytes(rng.choice(ALPHABET) for _ in range(rng.randint(1, 4))) for _ in range(20)]
    g.set_token_vocabulary(vocab)
    states = {g.initial_state(), tl.Grammar.DEAD}
    for _ in range(5):
        states.add(g.advance_bytes(g.initial_state(), live_walk(g, rng, 6)))
    for s in states:
        mask = g.allowed_tokens(s)
        assert mask.dtype == np.bool_ and mask.shape == (len(vocab),)
        for t, tok in enumerate(vocab):
            want = s != tl.Grammar.DEAD and tok != b"" and g.advance_bytes(s, tok) != tl.Grammar.DEAD
            assert bool(mask[t]) == want, (p, s, tok)
            assert g.advance(s, t) == (g.advance_bytes(s, tok) if want else tl.Grammar.DEAD)
    # independent of the DFA walk: every token allowed first can be completed into a match
    mask0 = g.allowed_tokens(g.initial_state())
    for t in np.flatnonzero(mask0):
        after = g.advance(g.initial_state(), int(t))
        assert re.fullmatch(p, vocab[t] + g.shortest_completion(after)) is not None, (p, vocab[t])


def test_walk_emits_re_match_for_spec_pattern():
    p = rb'\{"name":"[a-z]+"\}'
    g = tl.Grammar(p)
    vocab = [b'{"', b"name", b'":"', b"ab", b"c", b'"}', b"}", b'"', b"{", b":", b"A", b"", b"<|endoftext|>"]
    g.set_token_vocabulary(vocab)
    rng = random.Random(0)
    for _ in range(20):
        s, out = g.initial_state(), b""
        while not (g.is_accepting(s) and (rng.random() < 0.5 or not g.can_continue(s))):
            allowed = np.flatnonzero(g.allowed_tokens(s))
            assert len(allowed) > 0
            t = int(rng.choice(allowed))
            s, out = g.advance(s, t), out + vocab[t]
        assert re.fullmatch(p, out) and not g.can_continue(s)
        json.loads(out)
    assert not g.allowed_tokens(g.initial_state())[12]  # a special token is just bytes


@pytest.mark.parametrize("pattern,message", [
    ("ab)", "unbalanced ')' at position 2"),
    ("(ab", "missing ')' for the '(' at position 0"),
    ("ab{3,2}", "{m,n} with m > n at position 2"),
    ("+a", "nothing to repeat at position 0"),
    ("a\\q", "bad escape \\q at position 1"),
    ("[a-", "unterminated character class at position 0"),
    ("a{99999}", "repeat count exceeds 10000 at position 2"),
    ("[^\\x00-\\xff]", "pattern matches no string"),
])
def test_bad_patterns_raise_value_error_with_position(pattern, message):
    with pytest.raises(ValueError) as e:
        tl.Grammar(pattern)
    assert str(e.value) == message


def test_vocabulary_errors_and_state_checks():
    g = tl.Grammar("a+")
    assert g.vocab_size is None
    with pytest.raises(RuntimeError, match="set_token_vocabulary"):
        g.allowed_tokens(g.initial_state())
    with pytest.raises(RuntimeError, match="set_token_vocabulary"):
        g.advance(0, 0)
    with pytest.raises(ValueError, match="empty"):
        g.set_token_vocabulary([])
    g.set_token_vocabulary([b"a", "aa", b"b"])  # str is UTF-8
    assert g.vocab_size == 3
    assert list(g.allowed_tokens(0)) == [True, True, False]
    with pytest.raises(ValueError, match="token id 3 out of range"):
        g.advance(0, 3)
    with pytest.raises(ValueError, match="out of range"):
        g.allowed_tokens(g.num_states)
    assert not g.allowed_tokens(tl.Grammar.DEAD).any()
    assert g.advance(tl.Grammar.DEAD, 0) == tl.Grammar.DEAD
    assert "vocab_size=3" in repr(g)


def test_str_pattern_is_utf8_and_characters_are_atoms():
    g = tl.Grammar("é+")
    assert g.matches("éé".encode()) and g.matches("éé") and not g.matches(b"\xc3\xa9\xa9")
    assert g.pattern == "é+"
    assert tl.Grammar(b"\xff+").pattern == b"\xff+"


@SETTINGS
@given(lo=st.integers(0, 4), extra=st.one_of(st.none(), st.integers(0, 4)), s=st.text("0123456789a", max_size=9))
def test_digits(lo, extra, s):
    hi = None if extra is None else max(lo, 1) + extra
    g = tl.Grammar.digits(lo, hi)
    want = re.fullmatch("[0-9]{%d,%s}" % (lo, "" if hi is None else hi), s) is not None
    assert g.matches(s) == want


def test_digits_and_choice_errors():
    with pytest.raises(ValueError):
        tl.Grammar.digits(3, 2)
    with pytest.raises(ValueError):
        tl.Grammar.digits(-1)
    with pytest.raises(ValueError):
        tl.Grammar.choice([])


@SETTINGS
@given(options=st.lists(st.text(max_size=6), min_size=1, max_size=5), probe=st.text(max_size=6))
def test_choice_is_literal(options, probe):
    g = tl.Grammar.choice(options)
    for o in options:
        assert g.matches(o)
    assert g.matches(probe) == (probe in options)
    esc = tl.Grammar.escape(probe)
    assert tl.Grammar(esc).matches(probe)
    assert re.fullmatch(esc.encode(), probe.encode())  # the escaping is valid `re` too


SHAPE = {"name": "string", "age": "integer", "score": "number", "ok": "boolean", "none": "null",
         "tags": ["string"], "pos": {"x": "number", "y": "integer"}, 'we"ird\\key': "string"}


def values_for(shape):
    if isinstance(shape, dict):
        return st.fixed_dictionaries({k: values_for(v) for k, v in shape.items()})
    if isinstance(shape, list):
        return st.lists(values_for(shape[0]), max_size=3)
    return {
        "string": st.text(max_size=8),
        "integer": st.integers(-10**12, 10**12),
        "number": st.one_of(st.integers(-1000, 1000), st.floats(allow_nan=False, allow_infinity=False)),
        "boolean": st.booleans(),
        "null": st.none(),
    }[shape]


JSON_GRAMMAR = tl.Grammar.json_object(SHAPE)


@SETTINGS
@given(value=values_for(SHAPE), compact=st.booleans(), ascii_only=st.booleans())
def test_json_object_accepts_json_dumps(value, compact, ascii_only):
    text = json.dumps(value, separators=(",", ":") if compact else (", ", ": "), ensure_ascii=ascii_only)
    assert JSON_GRAMMAR.matches(text.encode()), text


def test_json_object_rejects_wrong_shapes():
    ok = {"name": "a", "age": 1, "score": 1.5, "ok": True, "none": None, "tags": [], "pos": {"x": 0, "y": 0},
          'we"ird\\key': ""}
    assert JSON_GRAMMAR.matches(json.dumps(ok))
    for bad in [dict(ok, age=1.5), dict(ok, name=1), dict(ok, tags=[1]), {k: ok[k] for k in reversed(ok)},
                {k: ok[k] for k in list(ok)[:-1]}]:
        assert not JSON_GRAMMAR.matches(json.dumps(bad)), bad
    assert not JSON_GRAMMAR.matches(json.dumps(ok, indent=2))  # newlines are not part of the shape
    with pytest.raises(ValueError, match="unknown type"):
        tl.Grammar.json_object({"a": "date"})
    with pytest.raises(ValueError, match="exactly one"):
        tl.Grammar.json_object({"a": ["string", "integer"]})
    with pytest.raises(TypeError):
        tl.Grammar.json_object({"a": 5})


def test_json_object_generation_walk_parses():
    """Random walks over a byte + JSON-ish token vocabulary always end in valid JSON of the shape."""
    shape = {"name": "string", "age": "integer", "tags": ["string"]}
    g = tl.Grammar.json_object(shape)
    vocab = [bytes([b]) for b in range(256)] + [b'{"', b'name', b'":', b' "', b'", "', b'age', b'tags', b'":[',
                                                b'"]', b'}', b'12', b'-', b'\\u00e9', "é".encode(), b'\\"', b'']
    g.set_token_vocabulary(vocab)
    rng = random.Random(1)
    for _ in range(30):
        s, out = g.initial_state(), b""
        for _ in range(40):
            allowed = np.flatnonzero(g.allowed_tokens(s))
            if len(allowed) == 0:
                break
            t = int(rng.choice(allowed))
            s, out = g.advance(s, t), out + vocab[t]
        out += g.shortest_completion(s)
        value = json.loads(out.decode("utf-8"))
        assert list(value) == list(shape)
        assert isinstance(value["name"], str) and isinstance(value["age"], int)
        assert all(isinstance(x, str) for x in value["tags"])


def test_concurrent_first_use_from_threads():
    shape = {"a": "string", "b": ["integer"], "c": {"d": "number"}}
    rng = random.Random(4)
    vocab = [bytes(rng.choice(b'abcd{}[]",:0123456789 .-e') for _ in range(rng.randint(1, 5))) for _ in range(5000)]
    serial = tl.Grammar.json_object(shape)
    serial.set_token_vocabulary(vocab)
    want = [serial.allowed_tokens(s) for s in range(serial.num_states)]
    shared = tl.Grammar.json_object(shape)
    shared.set_token_vocabulary(vocab)
    errors = []

    def worker(k):
        order = list(range(shared.num_states))
        random.Random(k).shuffle(order)
        for s in order:
            if not np.array_equal(shared.allowed_tokens(s), want[s]):
                errors.append((k, s))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def _train(kind):
    from tokenizers import ByteLevelBPETokenizer, SentencePieceBPETokenizer

    text = ["The quick brown fox jumps over the lazy dog.", 'He said: {"name": "Émile", "age": 42}',
            "naïve café — 東京 🙂"] * 20
    if kind == "bytelevel":
        tok = ByteLevelBPETokenizer()
        tok.train_from_iterator(text, vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False)
    else:
        tok = SentencePieceBPETokenizer()
        tok.train_from_iterator(text, vocab_size=200, special_tokens=["<unk>", "</s>"], show_progress=False)
    return tok._tokenizer


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace"])
def test_token_bytes_from_hf_tokenizers(kind):
    from tinyloop.grammar_vocab import token_bytes

    tok = _train(kind)
    vocab = token_bytes(tok)
    assert len(vocab) == tok.get_vocab_size()
    special = [i for i, t in tok.get_added_tokens_decoder().items() if t.special]
    assert special and all(vocab[i] == b"" for i in special)
    as_text = token_bytes(tok, special_as_text=True)
    assert all(as_text[i] == tok.id_to_token(i).encode() for i in special)
    for text in ['He said: {"name": "Émile", "age": 42}', "naïve café 東京 🙂 fox"]:
        ids = tok.encode(text).ids
        joined = b"".join(vocab[i] for i in ids)
        if kind == "bytelevel":
            assert joined == text.encode()
        else:  # SentencePiece puts "▁" (a space) in front of the first word
            assert joined.lstrip(b" ") == text.encode()
    g = tl.Grammar.json_object({"name": "string", "age": "integer"})
    g.set_token_vocabulary(vocab)
    s = g.initial_state()
    for i in tok.encode('{"name": "Émile", "age": 42}').ids if kind == "bytelevel" else []:
        assert g.allowed_tokens(s)[i]
        s = g.advance(s, i)
    assert kind != "bytelevel" or g.is_accepting(s)
