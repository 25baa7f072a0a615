"""Config schema of the research task (``conf/task/research.yaml``); importable without torch."""

from __future__ import annotations

from dataclasses import dataclass

from bidswarm.envs.base import TaskConfig


@dataclass
class ResearchConfig(TaskConfig):
    """Deep research over an offline corpus (PAPER.md section 6, OpenResearcher).

    Seeds index questions: training seed ``s`` asks training question ``s mod n``, held-out
    seed ``heldout_seed_offset + i`` asks held-out question ``i``.

    corpus_path / questions_path: JSONL files (docs/research.md); None generates the
        fictional world of ``world_seed`` (both None, or both set).
    n_train_seeds / n_heldout_seeds: how many questions of each split the generated world
        has (a given file's own split sizes win; held-out seeds then use its first
        ``n_heldout_seeds`` held-out questions).
    cache_dir: where the BM25 index is saved, keyed on a hash of the corpus.
    judge: ``match`` (normalised exact match or token F1 >= ``f1_threshold``) or ``llm``
        (an OpenAI-compatible endpoint at ``judge_url``; key from the environment variable
        named by ``judge_api_key_env``, never from the config).
    private_results: see the field (the memory experiment's variant, docs/memory.md).
    """

    name: str = "research"
    max_decisions: int = 24
    n_train_seeds: int = 1000
    n_heldout_seeds: int = 50
    corpus_path: str | None = None
    questions_path: str | None = None
    world_seed: int = 0
    min_hops: int = 2
    max_hops: int = 4
    cache_dir: str = "outputs/cache/research"
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


def validate_research_config(config: ResearchConfig) -> None:
    """Raise ValueError naming the ``task.`` key whose value cannot work."""
    problems = []
    if config.max_decisions < 1:
        problems.append(f"task.max_decisions={config.max_decisions} must be >= 1")
    if (config.corpus_path is None) != (config.questions_path is None):
        problems.append("task.corpus_path and task.questions_path must be set together")
    if not 1 <= config.min_hops <= config.max_hops:
        problems.append(
            f"task.min_hops={config.min_hops} / task.max_hops={config.max_hops}: need "
            "1 <= min_hops <= max_hops"
        )
    if config.search_top_k < 1:
        problems.append(f"task.search_top_k={config.search_top_k} must be >= 1")
    if config.search_char_ngrams < 0:
        problems.append(f"task.search_char_ngrams={config.search_char_ngrams} must be >= 0")
    if config.page_words < 5:
        problems.append(f"task.page_words={config.page_words} must be >= 5")
    if config.judge not in ("match", "llm"):
        problems.append(f"task.judge={config.judge!r} must be 'match' or 'llm'")
    if config.judge == "llm" and not (config.judge_url and config.judge_model):
        problems.append("task.judge='llm' needs task.judge_url and task.judge_model")
    if not 0.0 < config.f1_threshold <= 1.0:
        problems.append(f"task.f1_threshold={config.f1_threshold} must be in (0, 1]")
    if config.judge_retries < 0:
        problems.append(f"task.judge_retries={config.judge_retries} must be >= 0")
    if config.private_results and config.memory.size < 1:
        problems.append(
            "task.private_results=True needs the shared memory: set task.memory.size >= 1"
        )
    if problems:
        raise ValueError("; ".join(problems))
