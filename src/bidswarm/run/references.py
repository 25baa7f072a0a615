"""[ours] Reference rules at each held-out evaluation (``eval.reference_rules``): the run's
agents under another coordination rule on the same worlds, and the paired gap to the run's
own rule. ``expert_owner`` (the task's expert picks who acts) bounds what the bid channel
could reach with the same trained actions: its gap is how much who-acts costs the swarm."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger

from bidswarm.coordination import CoordinationConfig, make_coordination
from bidswarm.rollout.evaluation import Evaluation
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.statistics import paired_difference


def play_references(
    loop: RolloutLoop, rules: list[str], held_out: Callable[[RolloutLoop], Evaluation | None]
) -> dict[str, Evaluation | None]:
    """``held_out`` (the run's held-out evaluation: every process plays its share, None on the
    processes but the first) of ``loop``'s swarm under each rule of ``rules``; none for the
    monolithic agent, who has no roles to pick from."""
    if None in loop.swarm.roles:
        return {}
    return {
        name: held_out(loop.with_rule(make_coordination(CoordinationConfig(name=name))))
        for name in rules
    }


def record_references(
    logger: Logger,
    state: dict[str, Any],
    key: str,
    evaluation: Evaluation,
    references: dict[str, Evaluation | None],
    step: int,
    heldout: Path,
) -> dict[str, float]:
    """Log each reference's metrics as ``<key>_<rule>/*`` at ``step``, keep them (and its
    per-world rewards) in the run's state and write its per-world results into ``heldout``
    (``<key>_<rule>_worlds.json``, :meth:`Evaluation.write_worlds`); returns
    ``gap_to_<rule>/mean|ci_low|ci_high``: the reference's held-out reward minus
    ``evaluation``'s, paired over the worlds."""
    gaps: dict[str, float] = {}
    for name, reference in references.items():
        if reference is None:
            continue
        logger.log_metrics({f"{key}_{name}/{k}": v for k, v in reference.metrics.items()}, step)
        state[f"{key}_{name}"] = reference.metrics
        state[f"{key}_{name}_worlds"] = {str(w): r for w, r in reference.world_rewards.items()}
        reference.write_worlds(heldout, f"{key}_{name}")
        diff = paired_difference(reference.world_rewards, evaluation.world_rewards)
        gaps |= {
            f"gap_to_{name}/mean": diff.mean,
            f"gap_to_{name}/ci_low": diff.ci_low,
            f"gap_to_{name}/ci_high": diff.ci_high,
        }
    return gaps
