"""Counts and articles in messages, as English has them: `1 dead letter`, `3 dead letters`,
`an index`, `a datastore`. Every layer's messages use these (a count's noun is singular)."""
from __future__ import annotations

VOWEL_SOUNDS = tuple("aeiou")


def count(n: int, noun: str, plural: str | None = None) -> str:
    """`1 dead letter`, `0 dead letters`; ``noun`` singular, its plural with an -s unless given."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def a(phrase: str) -> str:
    """`an index`, `a datastore`, `an encoder`: the article by the phrase's first letter."""
    return f"{'an' if phrase[:1].lower() in VOWEL_SOUNDS else 'a'} {phrase}"
