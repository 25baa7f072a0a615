"""The browser tools, named as in OpenResearcher, and who owns them.

``browser.search(query)`` (Searcher), ``browser.open(id)`` (Opener), ``browser.find(pattern)``
(Finder) and ``answer(text)`` (Finder: the role that reads the facts gives the final answer).
A reply may hold reasoning around the call; the first call in it counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TOOL_OWNERS: dict[str, str] = {
    "browser.search": "searcher",
    "browser.open": "opener",
    "browser.find": "finder",
    "answer": "finder",
}
CALL = re.compile(r"(browser\.search|browser\.open|browser\.find|answer)\s*\(")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class ToolCall:
    tool: str
    argument: str


def parse_call(reply: str) -> ToolCall | str:
    """The first tool call in ``reply``, or a short message saying why there is none."""
    match = CALL.search(reply)
    if match is None:
        return "no tool call; write e.g. browser.search(query)"
    rest = reply[match.end() :].split("\n", 1)[0]
    if ")" not in rest:
        return f"{match.group(1)}( is not closed by ')'"
    argument = rest[: rest.rindex(")")].strip().strip("\"'`").strip()
    if not argument:
        return f"{match.group(1)}() needs an argument"
    return ToolCall(match.group(1), argument)


def sentences(text: str) -> list[str]:
    """The sentences of a document, in order."""
    return [s for s in SENTENCE_END.split(text.strip()) if s]


def find_in_text(text: str, pattern: str, page_words: int) -> list[tuple[int, str]]:
    """(page, sentence) of each sentence holding ``pattern`` as whole words, case-insensitive.

    A plain phrase, not a regular expression: a model's reply can never be a bad pattern.
    """
    needle = re.compile(r"(?<!\w)" + re.escape(pattern.strip()) + r"(?!\w)", re.IGNORECASE)
    found = []
    words_before = 0
    for sentence in sentences(text):
        if needle.search(sentence):
            found.append((words_before // page_words, sentence))
        words_before += len(sentence.split())
    return found


def page_count(text: str, page_words: int) -> int:
    return max(1, -(-len(text.split()) // page_words))


def page_text(text: str, page: int, page_words: int) -> str:
    words = text.split()
    return " ".join(words[page * page_words : (page + 1) * page_words])


def snippet(title: str, text: str, words: int = 4) -> str:
    """A few words of ``text`` after its opening mention of ``title`` (the informative part)."""
    tokens = text.split()
    skip = {t.lower() for t in title.split()} | {"the"}
    start = 0
    while start < len(tokens) and tokens[start].lower().strip(".,") in skip:
        start += 1
    return " ".join(tokens[start : start + words])


def truncate_words(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` words, the last being ``...`` when it was cut."""
    words = text.split()
    if len(words) <= limit:
        return " ".join(words)
    return " ".join([*words[: max(limit - 1, 0)], "..."])
