"""Judging a final answer: normalised exact match / token F1, or an LLM over HTTP.

The default judge is the one of SQuAD-style QA: lower-case, drop punctuation and articles,
compare. An answer succeeds when it matches exactly or its token F1 reaches a threshold.

The optional LLM judge asks an OpenAI-compatible ``/chat/completions`` endpoint whether the
answer is correct. A failed call is retried; when every try fails the match judge decides and
the failure is counted (never an exception inside an episode). The API key is read from an
environment variable at call time and is never stored, logged or put in a config.
"""

from __future__ import annotations

import json
import os
import re
import string
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass

ARTICLES = re.compile(r"\b(a|an|the)\b")
PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, without punctuation, articles or extra spaces."""
    text = text.lower().translate(PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(gold)


def token_f1(prediction: str, gold: str) -> float:
    """Harmonic mean of token precision and recall after :func:`normalize_answer`."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class Verdict:
    """success: the binary reward's decision; f1: best token F1; judge_failed: LLM fell back."""

    success: bool
    f1: float
    judge_failed: bool = False


class MatchJudge:
    """Success when the answer matches a gold answer exactly or with F1 >= ``f1_threshold``."""

    def __init__(self, f1_threshold: float = 0.8):
        self.f1_threshold = f1_threshold

    def judge(self, question: str, prediction: str, golds: list[str]) -> Verdict:
        del question  # the match judge only compares strings
        f1 = max(token_f1(prediction, gold) for gold in golds)
        success = any(exact_match(prediction, gold) for gold in golds) or f1 >= self.f1_threshold
        return Verdict(success, f1)


JUDGE_PROMPT = (
    "You grade answers to questions. Question: {question}\nGold answer: {gold}\n"
    "Predicted answer: {prediction}\nIs the predicted answer correct? Reply with exactly one "
    "word: CORRECT or INCORRECT."
)


class LLMJudgeError(RuntimeError):
    """The judge endpoint gave no usable verdict."""


class HttpJudge:
    """An LLM judge behind an OpenAI-compatible endpoint, falling back to :class:`MatchJudge`.

    url: the API base (``http://host:8000/v1``); ``/chat/completions`` is appended.
    api_key_env: the name of the environment variable that holds the key (None: no key).
    """

    def __init__(
        self,
        url: str,
        model: str,
        fallback: MatchJudge,
        api_key_env: str | None = None,
        retries: int = 2,
        timeout_s: float = 30.0,
        retry_wait_s: float = 0.5,
    ):
        self.endpoint = url.rstrip("/") + "/chat/completions"
        self.model = model
        self.fallback = fallback
        self.api_key_env = api_key_env
        self.retries = retries
        self.timeout_s = timeout_s
        self.retry_wait_s = retry_wait_s

    def judge(self, question: str, prediction: str, golds: list[str]) -> Verdict:
        """The LLM's verdict (F1 still from the match judge); after failed tries, the fallback's."""
        matched = self.fallback.judge(question, prediction, golds)
        for attempt in range(self.retries + 1):
            try:
                success = self._ask(question, prediction, " / ".join(golds))
                return Verdict(success, matched.f1)
            except LLMJudgeError:
                if attempt < self.retries:
                    time.sleep(self.retry_wait_s * 2**attempt)
        return Verdict(matched.success, matched.f1, judge_failed=True)

    def _ask(self, question: str, prediction: str, gold: str) -> bool:
        body = {
            "model": self.model,
            "temperature": 0.0,
            "max_tokens": 4,
            "messages": [
                {
                    "role": "user",
                    "content": JUDGE_PROMPT.format(
                        question=question, gold=gold, prediction=prediction
                    ),
                }
            ],
        }
        headers = {"Content-Type": "application/json"}
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if key:
                headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(
            self.endpoint, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                reply = json.loads(response.read())
            text = reply["choices"][0]["message"]["content"]
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
            # The message names the failure kind only: headers (the key) never reach a log.
            raise LLMJudgeError(type(e).__name__) from None
        verdict = text.strip().upper()
        if verdict.startswith("INCORRECT"):
            return False
        if verdict.startswith("CORRECT"):
            return True
        raise LLMJudgeError("reply is neither CORRECT nor INCORRECT")
