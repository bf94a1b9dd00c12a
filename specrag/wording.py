"""Counts, articles and durations in messages, as English has them: `1 dead letter`, `3 dead
letters`, `an index`, `a datastore`, `5m14s`. Every layer's messages use these (a count's noun is
singular)."""
from __future__ import annotations

VOWEL_SOUNDS = tuple("aeiou")


def count(n: int, noun: str, plural: str | None = None) -> str:
    """`1 dead letter`, `0 dead letters`; ``noun`` singular, its plural with an -s unless given."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def a(phrase: str) -> str:
    """`an index`, `a datastore`, `an encoder`: the article by the phrase's first letter."""
    return f"{'an' if phrase[:1].lower() in VOWEL_SOUNDS else 'a'} {phrase}"


def duration(seconds: float) -> str:
    """`1h05m`, `5m14s`, `9s`: a time taken or left."""
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")
