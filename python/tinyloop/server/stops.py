"""Text-level stop strings, as OpenAI applies them (docs/server.md, "stop").

A stop string is text, and the model's tokens need not line up with it: " the end" can be
one token or three, or end inside a token (" endless"). The engine stops on token-id
sequences (each stop string's own tokenization is passed as one, which catches the common
case a step earlier), but the rule that counts is this one: the output text is cut right
before the first occurrence of any stop string, and the stop string is not returned.

While streaming, text that could be the beginning of a stop string is held back until it
either completes the stop string (then it is dropped) or cannot any more (then it is sent).
"""
from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.text = ""     # all output text so far
        self.sent = 0      # how much of it has been released
        self.cut: int | None = None  # where the first stop string begins, once found

    def _held_from(self) -> int:
        """Start of the longest suffix of the text that is a proper prefix of a stop string."""
        best = len(self.text)
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:k]):
                    best = min(best, len(self.text) - k)
                    break
        return best

    def push(self, delta: str) -> str:
        """Add output text; returns the text that can be released now ("" while held back or
        after a stop). `stopped` tells whether a stop string was found."""
        if self.cut is not None or not delta:
            return ""
        start = max(0, len(self.text) - max((len(s) for s in self.stops), default=0))
        self.text += delta
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            self.cut = min(hits)
            out = self.text[self.sent:self.cut]
            self.sent = self.cut
            return out
        upto = self._held_from() if self.stops else len(self.text)
        out = self.text[self.sent:upto]
        self.sent = max(self.sent, upto)
        return out

    @property
    def stopped(self) -> bool:
        return self.cut is not None

    def flush(self) -> str:
        """At the end of the output: the held-back text (it can no longer become a stop)."""
        if self.cut is not None:
            return ""
        out = self.text[self.sent:]
        self.sent = len(self.text)
        return out
