"""The line loop that `tinyloop talk` and `tinyloop chat` share: a "> " prompt per line,
until an empty line or the end of the input."""
from __future__ import annotations

from typing import Iterator, TextIO


def typed_lines(stdin: TextIO, stdout: TextIO) -> Iterator[str]:
    """Each line typed at a "> " prompt, without its newline; stops at an empty (or blank)
    line or at the end of stdin."""
    while True:
        stdout.write("> ")
        stdout.flush()
        line = stdin.readline()
        if not line or not line.strip():
            return
        yield line.rstrip("\n")


def turn_seed(seed: int | None, turn: int) -> int | None:
    """--seed for turn `turn` (0-based): seed + turn, so a session is reproducible but no two
    turns sample alike; None (fresh entropy) stays None."""
    return None if seed is None else seed + turn
