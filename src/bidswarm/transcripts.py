"""Episode transcripts: what the agents actually said, step by step (docs/mlflow.md).

Each held-out evaluation logs a few sampled episodes, and the last bid update a few fork pairs
(the recorded branch against the counterfactual one), two ways: as MLflow traces (one trace
per episode, one span per decision step, shown in the run's Traces tab) and as one readable
HTML page per evaluation (artifact ``transcripts/<key>.html``). A step shows who bid what, who
acted, the action text, the environment's reply, the reward and the credit the configured rule
gives it (the credit the action update would train on).
"""

from __future__ import annotations

import html
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass

from bidswarm.algorithms.credit import CreditRule
from bidswarm.envs.base import role_name
from bidswarm.rollout.forks import ForkExample
from bidswarm.rollout.memory_credit import episode_reads
from bidswarm.rollout.records import Episode, StepRecord

EPISODES_PER_EVALUATION = 3
"""Episodes of each evaluation that get a transcript."""
FORK_PAIRS_PER_RUN = 3
"""Fork pairs of the last bid update that get a transcript."""


@dataclass
class StepLine:
    """One decision step as read by a person."""

    index: int
    bids: dict[str, str]
    """Agent name -> its bid level ("0.6"), or "malformed: <reply>"."""
    actor: str
    action: str
    reply: str
    """The environment's feedback on the action."""
    reward: float
    credit: float | None
    """The credit rule's credit of this acting step (None: skipped step)."""

    def as_dict(self) -> dict[str, object]:
        return {
            "step": self.index,
            "bids": self.bids,
            "actor": self.actor,
            "action": self.action,
            "environment": self.reply,
            "reward": self.reward,
            "credit": self.credit,
        }


@dataclass
class Transcript:
    """One episode's steps, with what it is (``title``) and its total reward."""

    title: str
    world: int
    steps: list[StepLine]
    total_reward: float


def agent_names(roles: Sequence[str | None]) -> list[str]:
    """``agent0_logger``-style names (as the metrics and ``final/`` folders name them)."""
    return [f"agent{index}_{role_name(role)}" for index, role in enumerate(roles)]


def credits_of(
    episode: Episode, rule: CreditRule | None, levels: Sequence[float], seed: int
) -> dict[int, float]:
    """Step index -> the credit ``rule`` gives each acting step of ``episode`` (empty: no rule)."""
    if rule is None:
        return {}
    acting = episode.acting_steps
    credits, _ = rule(
        [s.reward for s in acting],
        [s.decision.credited_bid for s in acting],
        [s.decision.credited_runner_up_bid for s in acting],
        random.Random(f"transcript/{seed}/{episode.seed}"),
        levels,
        episode_reads(episode),
    )
    return {step.index: credit for step, credit in zip(acting, credits, strict=True)}


def step_line(step: StepRecord, names: list[str], credit: float | None) -> StepLine:
    bids = {
        names[agent]: f"{bid.level:g}" if bid.parsed else f"malformed: {bid.reply.text!r}"
        for agent, bid in sorted(step.bids.items())
    }
    actor = "nobody (skipped)" if step.actor is None else names[step.actor]
    action = step.action.text if step.action is not None else ""
    if step.actor is not None and not step.valid_action:
        action += "  [invalid]"
    return StepLine(step.index, bids, actor, action, step.message, step.reward, credit)


def transcript(
    episode: Episode,
    title: str,
    roles: Sequence[str | None],
    credits: dict[int, float] | None = None,
) -> Transcript:
    names = agent_names(roles)
    lines = [step_line(s, names, (credits or {}).get(s.index)) for s in episode.steps]
    return Transcript(title, episode.seed, lines, episode.total_reward)


def sample_episodes(episodes: list[Episode], k: int, seed: int) -> list[Episode]:
    """``k`` episodes drawn with a fixed seed, in their original order."""
    picked = sorted(
        random.Random(f"transcripts/{seed}").sample(range(len(episodes)), min(k, len(episodes)))
    )
    return [episodes[i] for i in picked]


OUTCOME = {1: "the recorded branch won", -1: "the counterfactual branch won", 0: "a tie"}


def fork_transcripts(
    forks: list[ForkExample], roles: Sequence[str | None], k: int = FORK_PAIRS_PER_RUN
) -> list[Transcript]:
    """Two transcripts per fork of the first ``k`` forks (decided ones before ties): the
    recorded episode from the forked step on, and the counterfactual branch in which the
    runner-up acted at that step; their titles say which scored more from there."""
    names = agent_names(roles)
    chosen = sorted(forks, key=lambda fork: fork.preference == 0)[:k]
    written = []
    for n, fork in enumerate(chosen):
        step, outcome = fork.step, OUTCOME[fork.preference]
        recorded = Episode(
            fork.episode.seed, [s for s in fork.episode.steps if s.index >= step.index]
        )
        winner = names[step.actor] if step.actor is not None else "nobody"
        runner_up = (
            names[step.decision.runner_up] if step.decision.runner_up is not None else "nobody"
        )
        written.append(
            transcript(
                recorded,
                f"fork {n} at step {step.index}: recorded, {winner} acts ({outcome})",
                roles,
            )
        )
        written.append(
            transcript(
                fork.branch,
                f"fork {n} at step {step.index}: counterfactual, {runner_up} acts ({outcome})",
                roles,
            )
        )
    return written


def render_html(heading: str, transcripts: list[Transcript]) -> str:
    """A self-contained page: one table per transcript, one row per decision step."""
    parts = [
        "<!doctype html><meta charset='utf-8'>",
        f"<title>{html.escape(heading)}</title>",
        "<style>body{font-family:sans-serif;font-size:13px}table{border-collapse:collapse;"
        "margin-bottom:2em}td,th{border:1px solid #ccc;padding:2px 6px;vertical-align:top}"
        "th{background:#eee}.r{text-align:right}</style>",
        f"<h1>{html.escape(heading)}</h1>",
    ]
    for t in transcripts:
        parts.append(
            f"<h2>{html.escape(t.title)}: world {t.world}, total reward {t.total_reward:g}</h2>"
        )
        parts.append(
            "<table><tr><th>step</th><th>bids</th><th>actor</th><th>action</th>"
            "<th>environment</th><th>reward</th><th>credit</th></tr>"
        )
        for s in t.steps:
            bids = ", ".join(f"{name}: {level}" for name, level in s.bids.items())
            credit = "" if s.credit is None else f"{s.credit:.3g}"
            cells = [str(s.index), bids, s.actor, s.action, s.reply]
            parts.append(
                "<tr>"
                + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
                + f"<td class=r>{s.reward:g}</td><td class=r>{credit}</td></tr>"
            )
        parts.append("</table>")
    return "\n".join(parts) + "\n"


def log_traces(
    experiment_id: str, run_id: str, transcripts: list[Transcript], tags: dict[str, str]
) -> list[str]:
    """One MLflow trace per transcript (linked to ``run_id``), one span per step; returns the
    trace ids. Needs ``mlflow.set_tracking_uri`` to point at the run's store."""
    # OpenTelemetry draws trace and span ids from Python's global generator, which the run
    # seeded: two jobs of one seed would write the same trace ids (the second overwrites the
    # first). Draw them from fresh entropy and leave the run's random stream untouched.
    state = random.getstate()
    random.seed(os.urandom(16))
    try:
        return _log_traces(experiment_id, run_id, transcripts, tags)
    finally:
        random.setstate(state)


def _log_traces(
    experiment_id: str, run_id: str, transcripts: list[Transcript], tags: dict[str, str]
) -> list[str]:
    import mlflow
    from mlflow.entities.trace_location import MlflowExperimentLocation

    ids = []
    for t in transcripts:
        with mlflow.start_span(
            name=t.title,
            span_type="AGENT",
            trace_destination=MlflowExperimentLocation(experiment_id),
            run_id=run_id,
            attributes={"world": t.world},
        ) as root:
            root.set_inputs({"world": t.world})
            for s in t.steps:
                with mlflow.start_span(
                    name=f"step {s.index}: {s.actor}", span_type="CHAIN"
                ) as span:
                    span.set_inputs({"bids": s.bids, "actor": s.actor})
                    span.set_outputs(
                        {"action": s.action, "environment": s.reply, "reward": s.reward}
                    )
                    span.set_attributes(
                        {"reward": s.reward} | ({} if s.credit is None else {"credit": s.credit})
                    )
            root.set_outputs({"total_reward": t.total_reward, "steps": len(t.steps)})
            mlflow.update_current_trace(tags=tags)
            ids.append(root.trace_id)
    # Traces are exported in the background: write them now, before anything (the next job of
    # a sweep in this process setting the tracking URI again) can reset the exporter.
    mlflow.flush_trace_async_logging()
    return ids
