"""What an observation may show of what an agent wrote: its words, each of bounded length.

An observation quotes agents (a wasted reply, a search query, a note of the shared memory), and
a model may write anything: one 20,000-character "word", or characters no text space lists.
Every quote goes through :func:`quote`, so an observation's length is bounded by the task's
config (history, page and note sizes), never by a reply. Ordinary words are untouched.
"""

from __future__ import annotations

import re

WORD_CHARACTERS = 32
"""A quoted word longer than this is cut to it, ending in ``...`` (names, ids and numbers of
every task are shorter)."""

_OUTSIDE_THE_PLANE = re.compile("[\ud800-\udfff\U00010000-\U0010ffff]")
"""Surrogates and characters beyond Unicode's Basic Multilingual Plane (emoji): quoted as ``?``,
so a quote stays inside the observation space's characters (``envs/interop.py``)."""


def quote_word(word: str) -> str:
    """``word`` as an observation shows it: at most :data:`WORD_CHARACTERS` characters of the
    Basic Multilingual Plane."""
    word = _OUTSIDE_THE_PLANE.sub("?", word)
    if len(word) <= WORD_CHARACTERS:
        return word
    return word[: WORD_CHARACTERS - 3] + "..."


def quote(text: str, max_words: int | None = None) -> str:
    """``text``'s words (the first ``max_words``; None: all) through :func:`quote_word`, joined
    by single spaces."""
    words = text.split()
    if max_words is not None:
        words = words[:max_words]
    return " ".join(quote_word(word) for word in words)
