"""Synthetic tasks whose answers need sequential steps, in plain text, for the looped model.

Tasks (one problem a line, the answer right after the prompt, then a newline):

- `add`: multi-digit addition, most significant digit first, no padding:
  `4821+377=5198` (prompt `4821+377=`, answer `5198`). Each operand has a length drawn
  uniformly from [min_digits, max_digits] and no leading zero (a 1-digit operand may be 0).
  The first answer digit depends on the whole carry chain below it.
- `chain`: following a chain of variable assignments: `a=3;b=a+4;c=b-2;c?5` (prompt up
  to and including `?`, answer `5`). Each variable after the first is the previous one plus or
  minus a digit; values stay in [0, 99]. Variable names are distinct lowercase letters.

Held-out split, by construction: a problem is held out when the first 8 bytes of
sha256(prompt) read as a big-endian integer, mod 1000, are < HELD_PER_MILLE (2%). The
training sampler redraws held-out problems, so no held-out problem is ever trained on; the
evaluation set is the first n distinct held-out problems drawn from a fixed seed.

Every character of a problem is one token for a tokenizer whose pre-tokenizer splits
digits individually and keeps punctuation apart (tokenizer.py "digits"); `check_charmap`
verifies that against the tokenizer at start-up, so rows are built from a char -> id map.
"""
import hashlib

import numpy as np

HELD_PER_MILLE = 20
TASKS = ("add", "chain")
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def is_held(prompt):
    h = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "big")
    return h % 1000 < HELD_PER_MILLE


def _number(rng, n_digits):
    if n_digits == 1:
        return int(rng.integers(0, 10))
    return int(rng.integers(10 ** (n_digits - 1), 10 ** n_digits))


FORMATS = ("plain", "pad", "rev", "padrev")
ADD_FORMAT = ["plain"]   # set by set_format(); one format per process
CARRY_BIAS = [0.0]       # set by set_format()


def set_format(fmt, carry_bias=0.0):
    """fmt: one of FORMATS. carry_bias q > 0: operands are drawn digit by digit (max_digits
    digits, leading zeros dropped in the plain formats); at each position, with probability q
    the second operand's digit is 9 minus the first's (a "propagate" position), so long carry
    chains, the part that needs sequential steps, are common instead of rare (0.1^k)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown task format {fmt!r}")
    ADD_FORMAT[0] = fmt
    CARRY_BIAS[0] = float(carry_bias)


def _carry_pair(rng, n, q):
    da = rng.integers(0, 10, size=n)
    db = rng.integers(0, 10, size=n)
    prop = rng.random(n) < q
    db = np.where(prop, 9 - da, db)
    return int("".join(map(str, da))), int("".join(map(str, db)))


def gen_add(rng, max_digits, min_digits=1):
    """plain: `4821+377=5198`. pad: operands zero-padded to max_digits, the answer to
    max_digits + 1 (`4821+0377=05198`). rev: the answer written least significant digit first
    (`4821+377=8915`). padrev: both. Experiments only; plain is the default."""
    if CARRY_BIAS[0] > 0:
        a, b = _carry_pair(rng, max_digits, CARRY_BIAS[0])
    else:
        a = _number(rng, int(rng.integers(min_digits, max_digits + 1)))
        b = _number(rng, int(rng.integers(min_digits, max_digits + 1)))
    fmt = ADD_FORMAT[0]
    if fmt in ("pad", "padrev"):
        p, ans = f"{a:0{max_digits}d}+{b:0{max_digits}d}=", f"{a + b:0{max_digits + 1}d}"
    else:
        p, ans = f"{a}+{b}=", str(a + b)
    if fmt in ("rev", "padrev"):
        ans = ans[::-1]
    return p, ans


def gen_chain(rng, max_vars, min_vars=2):
    n = int(rng.integers(min_vars, max_vars + 1))
    names = rng.choice(list(LETTERS), size=n, replace=False)
    v = int(rng.integers(0, 10))
    parts = [f"{names[0]}={v}"]
    for i in range(1, n):
        d = int(rng.integers(1, 10))
        if v + d > 99 or (v - d >= 0 and rng.random() < 0.5):
            op, v = "-", v - d
        else:
            op, v = "+", v + d
        parts.append(f"{names[i]}={names[i - 1]}{op}{d}")
    return ";".join(parts) + f";{names[-1]}?", str(v)


def gen(task, rng, size, min_size=None):
    if task == "add":
        return gen_add(rng, size, min_size or 1)
    if task == "chain":
        return gen_chain(rng, size, min_size or 2)
    raise ValueError(f"unknown task {task!r}")


def sample_train(task, rng, size, min_size=None):
    """A training problem: never a held-out one."""
    while True:
        p, a = gen(task, rng, size, min_size)
        if not is_held(p):
            return p, a


def heldout_set(task, n, size, min_size=None, seed=20261202):
    """The first n distinct held-out problems drawn from a fixed seed (deterministic)."""
    rng = np.random.default_rng([seed, TASKS.index(task)])
    seen, out = set(), []
    tries = 0
    while len(out) < n:
        p, a = gen(task, rng, size, min_size)
        tries += 1
        if tries > 10_000_000:
            raise RuntimeError("held-out space too small for n problems")
        if is_held(p) and p not in seen:
            seen.add(p)
            out.append((p, a))
    return out


CHARS = "0123456789+-=;?\n" + LETTERS


def charmap(tok):
    """char -> token id for every character a task problem can contain."""
    out = {}
    for c in CHARS:
        ids = tok.encode(c).ids
        if len(ids) != 1:
            raise SystemExit(f"tokenizer splits {c!r} into {ids}: tasks need one token per character")
        out[c] = ids[0]
    return out


def check_charmap(tok, cmap, rng, n=200):
    """The tokenizer encodes whole problems exactly as the char map does (no merges across
    characters), so rows can be built without calling the tokenizer."""
    texts = []
    for t in TASKS:
        for _ in range(n):
            p, a = gen(t, rng, 8)
            texts.append(p + a + "\n")
    texts.append("".join(texts[:50]))
    for s in texts:
        got = tok.encode(s).ids
        want = [cmap[c] for c in s]
        if got != want:
            raise SystemExit(f"tokenizer does not split {s!r} one token per character: {got}")


def task_row(rng, task, size, cmap, length, min_size=None):
    """One packed row of `length` tokens of training problems, and its loss mask: 1 where the
    target (the next token) is an answer character or the newline that ends the answer."""
    ids, mask = [], []
    while len(ids) < length + 1:
        p, a = sample_train(task, rng, size, min_size)
        ids += [cmap[c] for c in p]
        mask += [0] * len(p)
        ids += [cmap[c] for c in a + "\n"]
        mask += [1] * (len(a) + 1)
    ids = np.asarray(ids[:length + 1], np.int32)
    m = np.asarray(mask[1:length + 1], np.float32)   # mask of the targets ids[1:]
    return ids[:-1], ids[1:], m


def eval_arrays(problems, cmap, width):
    """Teacher-forced exact match arrays: ids [n, width] (right-padded with the newline id),
    targets [n, width], mask [n, width] = 1 on the positions that predict an answer character
    or its final newline. Greedy decoding gets a problem exactly right iff every masked
    position's argmax equals its target (the prefixes it conditions on are then the greedy
    ones), so this equals greedy exact match, at one forward per problem."""
    n = len(problems)
    pad = cmap["\n"]
    ids = np.full((n, width + 1), pad, np.int32)
    mask = np.zeros((n, width), np.float32)
    for i, (p, a) in enumerate(problems):
        s = [cmap[c] for c in p + a + "\n"]
        if len(s) > width + 1:
            raise ValueError(f"problem longer than {width + 1} tokens: {p}{a}")
        ids[i, :len(s)] = s
        mask[i, len(p) - 1:len(s) - 1] = 1
    return ids[:, :-1], ids[:, 1:], mask
