"""The shared memory in the collector's terms: an episode's reads as the edges of the tree credit
rule (``credit=memory_tree``), the rule's diagnostics per update, and the example tree drawn at
each evaluation (docs/memory.md)."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from bidswarm.algorithms.credit.memory_tree import (
    MemoryTree,
    MemoryTreeCredit,
    ReadEdge,
    contribution_tree,
)
from bidswarm.envs.base import MONOLITHIC, role_name
from bidswarm.rollout.records import Episode


def episode_reads(episode: Episode) -> list[list[ReadEdge]]:
    """Per acting step, the notes its actor read, each as an edge to the acting step that wrote
    it (a note from before the episode's first recorded step, e.g. a fork's prefix, has no
    writer here and is left out)."""
    acting = episode.acting_steps
    position = {step.index: i for i, step in enumerate(acting)}
    return [
        [
            ReadEdge(position[read.step], read.score)
            for read in (step.memory.reads if step.memory else ())
            if read.step in position
        ]
        for step in acting
    ]


def episode_tree(
    episode: Episode, rule: MemoryTree, rng: random.Random, levels: Sequence[float]
) -> MemoryTreeCredit:
    """The tree rule's result on one episode's acting steps."""
    acting = episode.acting_steps
    tree, _ = rule.tree(
        [s.reward for s in acting],
        [s.decision.credited_bid for s in acting],
        [s.decision.credited_runner_up_bid for s in acting],
        rng,
        levels,
        episode_reads(episode),
    )
    return tree


def _role(roles: Sequence[str | None], agent: int | None) -> str:
    return role_name(roles[agent] if agent is not None else MONOLITHIC)


def memory_tree_metrics(
    episodes: list[Episode],
    rule: MemoryTree,
    roles: Sequence[str | None],
    levels: Sequence[float],
) -> dict[str, float]:
    """Per update: ``memory/writer_share`` (of the roots' absolute credit, the part that came
    down read edges to writers) in all and per writer role, ``memory/edge_entropy`` (mean
    entropy, nats, of the edge weights of the steps that read), ``memory/reads_per_step``."""
    rng = random.Random(0)  # the tree's bases are deterministic; the rng is never drawn from
    received: dict[str, float] = defaultdict(float)
    root_total, entropies, reads, acting_steps = 0.0, [], 0, 0
    for episode in episodes:
        tree = episode_tree(episode, rule, rng, levels)
        acting = episode.acting_steps
        root_total += sum(abs(root) for root in tree.roots)
        for step, amount in zip(acting, tree.received, strict=True):
            received[_role(roles, step.actor)] += abs(amount)
        entropies += tree.entropies
        reads += sum(len(step_reads) for step_reads in episode_reads(episode))
        acting_steps += len(acting)
    total = max(root_total, 1e-12)
    metrics = {
        "memory/writer_share": sum(received.values()) / total,
        "memory/edge_entropy": sum(entropies) / len(entropies) if entropies else 0.0,
        "memory/reads_per_step": reads / max(acting_steps, 1),
    }
    for role in sorted({_role(roles, agent) for agent in range(len(roles))}):
        metrics[f"memory/writer_share/{role}"] = received[role] / total
    return metrics


def draw_example_tree(
    episodes: list[Episode],
    rule: MemoryTree,
    roles: Sequence[str | None],
    levels: Sequence[float],
    path: Path,
) -> Path:
    """Draw the contribution tree of one step to ``path`` (PNG): among the steps that read a
    note, the one with the largest credit at its root (any step when none read)."""
    from bidswarm.plots import plot_contribution_tree

    rng = random.Random(0)
    best = None  # (has reads, |root|, episode, acting position, tree, reads)
    for episode in episodes:
        tree = episode_tree(episode, rule, rng, levels)
        reads = episode_reads(episode)
        for position, root in enumerate(tree.roots):
            key = (bool(reads[position]), abs(root))
            if best is None or key > best[0]:
                best = (key, episode, position, tree, reads)
    if best is None:
        return plot_contribution_tree([], [], path, "no acting step to draw")
    _, episode, position, tree, reads = best
    config = rule.config
    nodes = contribution_tree(
        position,
        tree.roots[position],
        reads,
        config.memory_share,
        config.temperature,
        config.max_depth,
    )
    acting = episode.acting_steps
    labels = []
    for node in nodes:
        step = acting[node.step]
        who = _role(roles, step.actor)
        if node.kind == "root":
            text = f"step {step.index} ({who})\nroot credit {node.value:.3g}"
        elif node.kind == "action":
            reply = step.action.text if step.action else ""
            text = f"action: {reply[:28]}\nkeeps {node.value:.3g} (w {node.weight:.2f})"
        elif node.kind == "read":
            text = f"read (score {node.score:g})\nw {node.weight:.2f}: {node.value:.3g}"
        else:
            wrote = step.memory.wrote.text if step.memory and step.memory.wrote else ""
            text = f"step {step.index} ({who}) wrote\n'{wrote[:26]}': {node.value:.3g}"
        labels.append(text)
    title = (
        f"world {episode.seed}: credit of step {acting[position].index} down the memory "
        f"(share {config.memory_share:g}, T {config.temperature:g}, depth {config.max_depth})"
    )
    return plot_contribution_tree(nodes, labels, path, title)
