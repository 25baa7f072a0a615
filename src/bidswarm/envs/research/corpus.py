"""Documents and questions of the research task, and their JSONL files (docs/research.md).

A corpus file holds one document per line: ``{"id": "d0412", "title": "...", "text": "..."}``.
A questions file holds one question per line: ``{"id": ..., "question": ..., "answer": ...,
"split": "train" | "heldout"}`` with optional ``aliases`` (other accepted answers) and ``hops``
(the gold reasoning chain the scripted experts follow).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class Document:
    """One corpus page. ``id`` is what ``browser.open`` takes."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Hop:
    """One step of a question's reasoning chain.

    subject: the entity this hop starts from (what to search for).
    doc_id:  the document about ``subject`` that states the fact.
    pattern: text that ``browser.find`` matches in that document to show the fact.
    answer:  the entity or value the fact gives (the next hop's subject).
    """

    subject: str
    doc_id: str
    pattern: str
    answer: str


@dataclass(frozen=True)
class Question:
    """A multi-hop question with its gold answer; ``hops`` is empty when the chain is unknown."""

    id: str
    question: str
    answer: str
    split: str
    aliases: tuple[str, ...] = ()
    hops: tuple[Hop, ...] = ()


def read_jsonl(path: str | Path) -> list[dict]:
    """The JSON objects of a JSONL file; a clear error names the line that does not parse."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not a JSON object ({error})") from error
    return rows


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> None:
    """Write one JSON object per line (UTF-8)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def _require(row: dict, key: str, where: str) -> str:
    if not isinstance(row.get(key), str) or not row[key].strip():
        raise ValueError(f"{where}: field {key!r} must be a non-empty string")
    return row[key]


def read_documents(path: str | Path) -> list[Document]:
    """Load a corpus JSONL file; ids must be unique."""
    documents = []
    for number, row in enumerate(read_jsonl(path), start=1):
        where = f"{path}:{number}"
        documents.append(
            Document(_require(row, "id", where), _require(row, "title", where), row.get("text", ""))
        )
    check_unique_ids(documents)
    return documents


def read_questions(path: str | Path) -> list[Question]:
    """Load a questions JSONL file (format in the module docstring)."""
    questions = []
    for number, row in enumerate(read_jsonl(path), start=1):
        where = f"{path}:{number}"
        split = row.get("split")
        if split not in SPLITS:
            raise ValueError(f"{where}: field 'split' must be one of {SPLITS}, got {split!r}")
        hops = tuple(
            Hop(
                _require(hop, "subject", where),
                _require(hop, "doc_id", where),
                _require(hop, "pattern", where),
                _require(hop, "answer", where),
            )
            for hop in row.get("hops", [])
        )
        questions.append(
            Question(
                id=_require(row, "id", where),
                question=_require(row, "question", where),
                answer=_require(row, "answer", where),
                split=split,
                aliases=tuple(row.get("aliases", [])),
                hops=hops,
            )
        )
    return questions


def document_row(document: Document) -> dict:
    return {"id": document.id, "title": document.title, "text": document.text}


def question_row(question: Question) -> dict:
    row: dict = {
        "id": question.id,
        "question": question.question,
        "answer": question.answer,
        "split": question.split,
    }
    if question.aliases:
        row["aliases"] = list(question.aliases)
    if question.hops:
        row["hops"] = [
            {"subject": h.subject, "doc_id": h.doc_id, "pattern": h.pattern, "answer": h.answer}
            for h in question.hops
        ]
    return row


def check_unique_ids(documents: list[Document]) -> None:
    seen: set[str] = set()
    for document in documents:
        if document.id in seen:
            raise ValueError(f"document id {document.id!r} appears twice in the corpus")
        seen.add(document.id)


def corpus_fingerprint(documents: list[Document]) -> str:
    """A hash of every id, title and text: the key of the cached search index."""
    digest = hashlib.sha256()
    for document in documents:
        for part in (document.id, document.title, document.text):
            digest.update(part.encode("utf-8"))
            digest.update(b"\x00")
    return digest.hexdigest()[:16]
