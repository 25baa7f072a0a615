"""BM25 search over the corpus (``bm25s``), built once and cached on disk by corpus hash.

The index is immutable after it is built: environments share one instance and it is never
part of an environment snapshot. Results of a query are memoised for the same reason, in a plain
dict (an index, and an environment holding one, pickles).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

# bm25s runs a JAX top-k when it is imported, if JAX is installed: JAX's GPU backend would then
# take 75% of the GPU's memory for its own pool (measured on an H200: 105 of 140 GiB, and the
# 4B agents' update ran out of memory). Its top-k of one query is CPU work; a JAX_PLATFORMS the
# user set is kept.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import bm25s

from bidswarm.envs.research.corpus import Document, corpus_fingerprint

TOKEN = re.compile(r"\w+")
STOPWORDS = frozenset(
    {
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "for",
        "from",
        "has",
        "have",
        "in",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "that",
        "the",
        "this",
        "to",
        "was",
        "were",
        "what",
        "which",
        "who",
        "with",
    }
)
TITLE_CANDIDATES = 10
"""Candidates beyond ``k`` searched for a page whose title is the query."""
MEMO_SIZE = 65536
"""Query results an index remembers; when full, it forgets them all and starts again."""
INDEX_VERSION = 2
"""Bumped when tokenisation or indexed fields change, so old caches are rebuilt."""


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens without stopwords (the same for documents and queries)."""
    return [token for token in TOKEN.findall(text.lower()) if token not in STOPWORDS]


def with_char_ngrams(words: list[str], n: int) -> list[str]:
    """``words`` plus the character ``n``-grams of each word (marked ``#``, word edges ``^ $``),
    so a misspelt word still shares most of its terms with the right one; 0: words only."""
    if n <= 0:
        return words
    grams = []
    for word in words:
        padded = f"^{word}$"
        grams += [f"#{padded[i : i + n]}" for i in range(max(len(padded) - n + 1, 1))]
    return words + grams


def _indexed_text(document: Document) -> str:
    # The title counts twice: a search for a name should rank that entity's own page first.
    return f"{document.title} {document.title} {document.text}"


class SearchIndex:
    """Ranked search over ``documents``; :meth:`search` returns document positions."""

    def __init__(self, documents: list[Document], retriever: bm25s.BM25, char_ngrams: int = 0):
        self.documents = documents
        self.retriever = retriever
        self.char_ngrams = char_ngrams
        """Words are also indexed as character n-grams of this length (0: words only)."""
        self._memo: dict[tuple[str, int], tuple[tuple[int, float], ...]] = {}

    @classmethod
    def build(cls, documents: list[Document], char_ngrams: int = 0) -> SearchIndex:
        """Index ``documents`` in memory."""
        retriever = bm25s.BM25()
        terms = [with_char_ngrams(tokenize(_indexed_text(d)), char_ngrams) for d in documents]
        retriever.index(terms, show_progress=False)
        return cls(documents, retriever, char_ngrams)

    @classmethod
    def cached(
        cls, documents: list[Document], cache_dir: str | Path, char_ngrams: int = 0
    ) -> SearchIndex:
        """Load the index of ``documents`` from ``cache_dir``, building and saving it if absent.

        The folder is keyed on a hash of the corpus, so an edited corpus gets a fresh index.
        """
        key = f"v{INDEX_VERSION}-n{char_ngrams}-{corpus_fingerprint(documents)}"
        folder = Path(cache_dir) / key
        done = folder / "complete.json"
        if done.exists():
            retriever = bm25s.BM25.load(str(folder), show_progress=False, verbosity=0)
            return cls(documents, retriever, char_ngrams)
        index = cls.build(documents, char_ngrams)
        staging = folder.with_name(f"{key}.partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        index.retriever.save(str(staging), show_progress=False)
        (staging / "complete.json").write_text(json.dumps({"documents": len(documents)}))
        try:
            staging.rename(folder)
        except OSError:  # another process saved the same index first; theirs is identical
            shutil.rmtree(staging, ignore_errors=True)
        return index

    def search(self, query: str, k: int) -> tuple[tuple[int, float], ...]:
        """The top ``k`` (position, score), a page titled exactly ``query`` first (memoised)."""
        hits = self._memo.get((query, k))
        if hits is None:
            hits = self._search(query, k)
            if len(self._memo) >= MEMO_SIZE:
                self._memo.clear()
            self._memo[(query, k)] = hits
        return hits

    def _search(self, query: str, k: int) -> tuple[tuple[int, float], ...]:
        """:meth:`search` without the memo.

        A search for a name should give that entity's own page first, but BM25 can rank a
        short page mentioning the name more often (an observatory named after its city) above
        it; the title rule puts the named page on top when it is among the first candidates.
        """
        tokens = tokenize(query)
        if not tokens:
            return ()
        k = min(k, len(self.documents))
        candidates = min(k + TITLE_CANDIDATES, len(self.documents))
        terms = with_char_ngrams(tokens, self.char_ngrams)
        positions, scores = self.retriever.retrieve([terms], k=candidates, show_progress=False)
        hits = [
            (int(position), float(score))
            for position, score in zip(positions[0], scores[0], strict=True)
            if score > 0.0
        ]
        hits.sort(key=lambda hit: tokenize(self.documents[hit[0]].title) != tokens)
        return tuple(hits[:k])

    def search_batch(self, queries: list[str], k: int) -> list[list[int]]:
        """Positions of the top ``k`` documents for each query, in one call (benchmarks)."""
        tokens = [with_char_ngrams(tokenize(q), self.char_ngrams) or ["\x00"] for q in queries]
        positions, scores = self.retriever.retrieve(
            tokens, k=min(k, len(self.documents)), show_progress=False
        )
        return [
            [int(p) for p, s in zip(row, row_scores, strict=True) if s > 0.0]
            for row, row_scores in zip(positions, scores, strict=True)
        ]
