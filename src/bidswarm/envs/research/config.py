"""Config schema of the research task (``conf/task/research.yaml``); importable without torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from bidswarm.checks import Problems
from bidswarm.envs.base import TaskConfig


@dataclass
class WorldSize:
    """How many entities of each kind the generated world has (the default gives about 3,000
    documents; ``conf/debug/task/reward_research.yaml`` uses a few dozen)."""

    regions: int = 24
    cities: int = 240
    orgs: int = 420
    people: int = 1900
    events: int = 420


@dataclass
class ResearchConfig(TaskConfig):
    """Deep research over an offline corpus (docs/method.md section 6, OpenResearcher).

    Seeds index questions: training seed ``s`` asks training question ``s mod n``, held-out
    seed ``heldout_seed_offset + i`` asks held-out question ``i``.

    corpus_path / questions_path: JSONL files (docs/research.md); None generates the
        fictional world of ``world_seed`` (both None, or both set).
    n_train_seeds / n_heldout_seeds: how many questions of each split the generated world
        has (a given file's own split sizes win; held-out seeds then use its first
        ``n_heldout_seeds`` held-out questions).
    cache_dir: where the BM25 index is saved, keyed on a hash of the corpus; None: the user's
        cache folder (``$XDG_CACHE_HOME/bidswarm/research``, else ``~/.cache/...``).
    judge: ``match`` (normalised exact match or token F1 >= ``f1_threshold``) or ``llm``
        (an OpenAI-compatible endpoint at ``judge_url``; key from the environment variable
        named by ``judge_api_key_env``, never from the config).
    private_results: see the field (the memory experiment's variant, docs/memory.md).
    actions: ``split`` (the paper's) or ``shared`` [ours]: every role may call every tool and
        the world draws whose call of each works (``research/shared.py``).
    open_order / open_hops: see the fields (who moves the question on is a choice,
        docs/environments.md).
    """

    name: str = "research"
    max_decisions: int = 24
    n_train_seeds: int = 1000
    n_heldout_seeds: int = 50
    corpus_path: str | None = None
    questions_path: str | None = None
    world_seed: int = 0
    world_size: WorldSize = field(default_factory=WorldSize)
    """The generated world's entities of each kind (unused with ``corpus_path``): a smaller
    world has fewer names to learn and fewer distractors per search."""
    min_hops: int = 2
    max_hops: int = 4
    cache_dir: str | None = None
    search_top_k: int = 3
    search_char_ngrams: int = 3
    """Words are also indexed as character n-grams of this length, so a query with a misspelt
    name still finds its page, as a web search engine would [ours]; 0: exact words only."""
    page_words: int = 25
    judge: str = "match"
    f1_threshold: float = 0.8
    judge_url: str | None = None
    judge_model: str | None = None
    judge_api_key_env: str | None = None
    judge_retries: int = 2
    judge_timeout_s: float = 30.0
    private_results: bool = False
    """[ours] Each role sees only its own tool's latest result (the others see which call was
    made, not what it returned) and the facts found are not listed: what one role learns reaches
    another only through the shared memory, which it needs (``task.memory.size`` >= 1)."""

    open_order: bool = False
    """[ours] The experts leave open when to answer: once a search result's snippet shows the
    final answer, the Finder may answer from it (bid 0.8) or the Opener may open the page to
    find the fact first, the longer way (bid 0.6, ``ALTERNATIVE_BID``), so the step is
    contested and who acts decides how soon the question is answered. False: the paper's
    experts, one step after another along the chain."""

    open_hops: bool = False
    """[ours] The experts leave open when to move on to the next hop: once a search result's
    snippet shows the value an earlier hop asks for (the next hop's subject), the Searcher may
    search that value at once (bid 0.8), or the Opener may open the page to find the fact
    first, the longer way (bid 0.6). A search for a name a snippet of the results on screen
    shows notes that result's line as a fact (``Facts`` counts it), so the screen always says
    which hop the question has reached. False: the paper's experts and notes."""

    def problems(self) -> list[str]:
        problems = Problems(super().problems())
        problems.require(
            (self.corpus_path is None) == (self.questions_path is None),
            "task.corpus_path",
            self.corpus_path,
            "task.corpus_path and task.questions_path must be set together",
        )
        problems.require(
            1 <= self.min_hops <= self.max_hops,
            "task.min_hops",
            self.min_hops,
            f"need 1 <= min_hops <= max_hops (task.max_hops={self.max_hops})",
        )
        for kind, count in vars(self.world_size).items():
            problems.at_least(f"task.world_size.{kind}", count, 1)
        problems.require(
            self.world_size.cities >= self.world_size.regions,
            "task.world_size.cities",
            self.world_size.cities,
            f"each of the {self.world_size.regions} regions needs a capital city",
        )
        problems.at_least("task.search_top_k", self.search_top_k, 1)
        problems.at_least("task.search_char_ngrams", self.search_char_ngrams, 0)
        problems.at_least("task.page_words", self.page_words, 5)
        problems.require(
            self.judge in ("match", "llm"), "task.judge", self.judge, "must be 'match' or 'llm'"
        )
        if self.judge == "llm":
            for key in ("judge_url", "judge_model"):
                problems.require(
                    bool(getattr(self, key)),
                    f"task.{key}",
                    getattr(self, key),
                    "needed by judge=llm",
                )
        problems.unit_interval("task.f1_threshold", self.f1_threshold, low_open=True)
        problems.at_least("task.judge_retries", self.judge_retries, 0)
        problems.require(
            not self.private_results or self.memory.size >= 1,
            "task.private_results",
            self.private_results,
            "needs the shared memory: set task.memory.size >= 1",
        )
        problems.require(
            not (self.private_results and self.actions == "shared"),
            "task.actions",
            self.actions,
            "task.private_results is the split variant's: use task.actions=split",
        )
        for key in ("open_order", "open_hops"):
            problems.require(
                not (self.private_results and getattr(self, key)),
                f"task.{key}",
                getattr(self, key),
                "the private-results experts decide from their own views only: unset one of "
                f"task.{key} and task.private_results",
            )
        if self.judge_url is not None:
            problems.require(
                urlsplit(self.judge_url).scheme in ("http", "https"),
                "task.judge_url",
                self.judge_url,
                "an http:// or https:// URL of an OpenAI-compatible API (e.g. http://host:8000/v1)",
            )
        problems.positive("task.judge_timeout_s", self.judge_timeout_s)
        return problems
