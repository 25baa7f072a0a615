"""A shared memory of short notes that every task can offer (seed 002; docs/memory.md).

An agent writes a note by adding ``note: <text>`` to its reply (a reply that is only a note is
a turn spent writing). Every observation shows the ``top_k`` notes that score highest against
what the agent sees (token overlap, [ours]), newest first; when an agent acts, which notes its
observation showed, with their scores, is that step's *reads*. A write and the reads of one
step form its :class:`MemoryTrace`, recorded on the step: the tree credit rule
(``algorithms/credit/memory_tree.py``) sends credit from a step down its reads to the writers.

The memory is part of the environment state: :meth:`SharedMemory.state` is plain data that an
environment's ``snapshot()`` includes, so forks carry the notes. ``size`` 0 turns it off: then
observations and replies are untouched (a ``note:`` in a reply is just text).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bidswarm.envs.quoting import quote_word

NOTE_MARKER = re.compile(r"\bnote:", re.IGNORECASE)
_WORD = re.compile(r"[a-z0-9]+")


@dataclass
class MemoryConfig:
    """``task.memory``: the shared memory of notes (off by default).

    size: notes kept; when full, writing forgets the oldest note. 0: no memory.
    top_k: notes shown in an observation (those scoring highest against it).
    note_words: a longer note is cut to this many words (and counted, never an error).
    """

    size: int = 0
    top_k: int = 3
    note_words: int = 8


def memory_problems(config: MemoryConfig) -> list[str]:
    """``task.memory.<key>=<value>: what is allowed`` for each value that cannot work."""
    problems = []
    if config.size < 0:
        problems.append(f"task.memory.size={config.size}: must be >= 0 (0: no memory)")
    if config.top_k < 1:
        problems.append(f"task.memory.top_k={config.top_k}: must be >= 1")
    if config.note_words < 1:
        problems.append(f"task.memory.note_words={config.note_words}: must be >= 1")
    return problems


@dataclass(frozen=True)
class Note:
    """A note in the memory: the decision step that wrote it, its writer's role, its text."""

    step: int
    writer: str
    text: str


@dataclass(frozen=True)
class Read:
    """A note an acting agent's observation showed, and its retrieval score there."""

    step: int
    writer: str
    score: float


@dataclass(frozen=True)
class MemoryTrace:
    """What one acting step did with the memory.

    reads: the notes the actor's observation showed when it acted (best score first).
    wrote: the note it wrote, if any (after cutting).
    cut:   whether that note was longer than ``note_words`` and was cut.
    """

    reads: tuple[Read, ...] = ()
    wrote: Note | None = None
    cut: bool = False


def split_note(reply: str) -> tuple[str, str | None]:
    """``(the reply without its note, the note's text)``; ``(reply, None)`` without a note.

    The note is everything after the first ``note:`` (any case), on one line.
    """
    match = NOTE_MARKER.search(reply)
    if match is None:
        return reply, None
    note = " ".join(reply[match.end() :].split())
    return reply[: match.start()].strip(), note


def memo_entries(observation: str) -> list[str]:
    """The notes an observation's ``Memo:`` line shows, newest first, each ``writer: text``."""
    line = next((ln for ln in observation.splitlines() if ln.startswith("Memo: ")), "")
    return line.removeprefix("Memo: ").split(" | ") if line else []


def words(text: str) -> set[str]:
    """Lower-case word set of ``text``, the unit of token overlap."""
    return set(_WORD.findall(text.lower()))


def overlap_score(note: str, query: str) -> float:
    """Retrieval score [ours]: how many distinct words of the note the query holds."""
    return float(len(words(note) & words(query)))


class SharedMemory:
    """The notes of one episode (see the module docstring); ``enabled`` is ``size > 0``."""

    def __init__(self, config: MemoryConfig):
        problems = memory_problems(config)
        if problems:
            raise ValueError("; ".join(problems))
        self.config = config
        self.notes: list[Note] = []
        self.writes = 0
        self.cut_notes = 0

    @property
    def enabled(self) -> bool:
        return self.config.size > 0

    def clear(self) -> None:
        self.notes, self.writes, self.cut_notes = [], 0, 0

    def read(self, query: str) -> tuple[Read, ...]:
        """The ``top_k`` notes scoring highest against ``query`` (newer first among equals)."""
        ranked = sorted(
            ((overlap_score(note.text, query), note) for note in self.notes),
            key=lambda pair: (-pair[0], -pair[1].step),
        )
        return tuple(Read(n.step, n.writer, s) for s, n in ranked[: self.config.top_k])

    def show(self, reads: tuple[Read, ...]) -> str:
        """The observation's memory line, newest note first (``""`` when nothing is shown)."""
        if not reads:
            return ""
        by_step = {note.step: note for note in self.notes}
        shown = sorted(reads, key=lambda read: -read.step)
        return "Memo: " + " | ".join(f"{r.writer}: {by_step[r.step].text}" for r in shown)

    def write(self, step: int, writer: str, text: str) -> tuple[Note | None, bool]:
        """Keep a note (cut to ``note_words``, each word as observations quote it:
        ``envs/quoting.py``); forget the oldest when full. An empty note is not written.
        Returns (the note kept, whether it was cut)."""
        tokens = text.split()
        if not tokens:
            return None, False
        kept = [quote_word(token) for token in tokens[: self.config.note_words]]
        cut = len(tokens) > self.config.note_words or kept != tokens[: self.config.note_words]
        note = Note(step, writer, " ".join(kept))
        self.notes.append(note)
        del self.notes[: -self.config.size]
        self.writes += 1
        self.cut_notes += int(cut)
        return note, cut

    def metrics(self) -> dict[str, float]:
        """Episode metrics: notes written and notes cut to ``note_words``."""
        return {"memory/notes": float(self.writes), "memory/notes_cut": float(self.cut_notes)}

    # -- fork contract -------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Plain data (JSON-able, new lists each call) that :meth:`load` returns to."""
        return {
            "notes": [[n.step, n.writer, n.text] for n in self.notes],
            "writes": self.writes,
            "cut": self.cut_notes,
        }

    def load(self, state: dict[str, Any]) -> None:
        self.notes = [Note(*note) for note in state["notes"]]
        self.writes, self.cut_notes = state["writes"], state["cut"]
