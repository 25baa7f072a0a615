"""Where a run turns ``cfg.credit`` into credit rules: the collector's (RL updates) and the one
that annotates transcripts and draws the memory tree (docs/memory.md). Elsewhere the run reads
``cfg.credit`` once: :meth:`bidswarm.run.phases.Run.evaluate_and_record` asks whether it is
``memory_tree`` (then it draws a tree)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bidswarm.algorithms.credit import CreditRule, make_credit_rule
from bidswarm.rollout.collector import Collector
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.memory_credit import draw_example_tree
from bidswarm.rollout.records import Episode


def make_collector(cfg: DictConfig, loop: RolloutLoop, train_seeds: list[int]) -> Collector:
    """The collector of RL updates on ``train_seeds``, crediting actions by ``cfg.credit``."""
    credit = OmegaConf.to_container(cfg.credit)
    return Collector(
        loop,
        cfg.rl,
        credit.pop("name"),
        train_seeds,
        cfg.seed,
        credit_parameters=credit,
    )


def configured_credit_rule(cfg: DictConfig) -> CreditRule:
    """``cfg.credit`` as a rule (``make_credit_rule``): what transcripts show as each step's
    credit and the memory tree draws."""
    return make_credit_rule(**OmegaConf.to_container(cfg.credit))


def draw_memory_tree(
    cfg: DictConfig, episodes: list[Episode], loop: RolloutLoop, path: Path
) -> Path:
    """``path`` (a PNG): the contribution tree of one evaluation step."""
    return draw_example_tree(
        episodes,
        configured_credit_rule(cfg),
        loop.swarm.roles,
        loop.swarm.bid_levels,
        path,
    )
