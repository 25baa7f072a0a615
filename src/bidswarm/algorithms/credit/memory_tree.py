"""Tree-based credit over a shared memory (seed 002): credit for whoever wrote what was used.

Every acting step t of an episode is the root of a contribution tree holding its credit from
the base rule (Eq. 2 of MPT, bucket brigade, by default) [ours: the seed roots the tree in the
reward]. The root's children are the actor's action and the notes its observation showed (the
step's *reads*); each note leads to the step that wrote it, which is a node of the same kind
again (its action, its own reads). Credit flows top-down:

- a node with reads keeps ``1 - memory_share`` of what reaches it for its action [ours: the
  seed lets the edge weights decide the action's share too] and sends ``memory_share`` down its
  read edges, split by ``w = softmax(read score / temperature)`` (the seed's attention weights
  with a temperature; our scores are the memory's retrieval scores [ours]);
- a node without reads, or at depth ``max_depth``, keeps all of it;
- width is bounded by the memory's ``top_k`` (a step reads at most that many notes).

Credits are summed per acting step (a step can be reached from many roots), so the total is
conserved: ``sum(credits) == sum(root credits)``. No reads, or ``max_depth`` 0, gives back the
base rule's credits; a note nobody read earns its writer nothing. The seed's learned event
scorer (an attention network over past events) is not built: docs/memory.md says why.

As a credit rule (``credit=memory_tree``, :class:`MemoryTree`) its parameters are
:class:`MemoryTreeConfig`'s.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from bidswarm.algorithms.credit.base import (
    CREDIT_RULES,
    CreditConfig,
    CreditRule,
    ReadEdge,
    Reads,
    make_credit,
    register,
)
from bidswarm.checks import Allowed, Parameter, at_least, positive, unit_interval


@dataclass(frozen=True)
class MemoryTreeCredit:
    """The tree rule's result for one episode's acting steps (each list has shape [T]).

    roots:     each step's credit from the base rule (its tree's root).
    credits:   the credit each acting step keeps, summed over every tree that reaches it.
    received:  the part of ``credits`` that came down read edges (what writing earned): what
               the step keeps of the credit that reached it as a writer, not what it passed on
               down its own reads (that is counted where it is kept).
    entropies: the entropy (nats) of the edge weights of each step that read notes.
    """

    roots: list[float]
    credits: list[float]
    received: list[float]
    entropies: list[float] = field(default_factory=list)


def edge_weights(scores: Sequence[float], temperature: float) -> list[float]:
    """softmax(scores / temperature): how a node splits the share it sends down its reads."""
    if not scores:
        return []
    scaled = [score / temperature for score in scores]
    top = max(scaled)
    exps = [math.exp(value - top) for value in scaled]
    total = sum(exps)
    return [value / total for value in exps]


def entropy(weights: Sequence[float]) -> float:
    """Shannon entropy of a weight vector, in nats (0 for a single edge)."""
    return -sum(w * math.log(w) for w in weights if w > 0.0)


def _check(
    root_credits: Sequence[float],
    reads: Sequence[Sequence[ReadEdge]],
    memory_share: float,
    temperature: float,
    max_depth: int,
) -> None:
    if len(reads) != len(root_credits):
        raise ValueError(
            f"reads must have one entry per acting step: {len(reads)} for "
            f"{len(root_credits)} credits"
        )
    if not 0.0 <= memory_share <= 1.0:
        raise ValueError(f"credit.memory_share={memory_share!r}: must lie in [0, 1]")
    if not (math.isfinite(temperature) and temperature > 0.0):
        raise ValueError(f"credit.temperature={temperature!r}: must be a finite number > 0")
    if max_depth < 0:
        raise ValueError(f"credit.max_depth={max_depth!r}: must be >= 0")
    for step, step_reads in enumerate(reads):
        for edge in step_reads:
            if not 0 <= edge.writer < step:
                raise ValueError(
                    f"acting step {step} read a note written at acting step {edge.writer}; "
                    "a note is written before it is read"
                )


def memory_tree_credit(
    root_credits: Sequence[float],
    reads: Sequence[Sequence[ReadEdge]],
    memory_share: float,
    temperature: float,
    max_depth: int,
) -> MemoryTreeCredit:
    """Credit over the contribution trees of one episode (module docstring; seed 002 with
    Eq. 2 of MPT at the roots).

    Args:
        root_credits: each acting step's credit from the base rule, shape [T].
        reads: per acting step, the notes its observation showed (``ReadEdge``), shape [T, <=k].
        memory_share: the share a node sends down its read edges (``credit.memory_share``).
        temperature: of the softmax over read scores (``credit.temperature``).
        max_depth: read edges followed from a root at most (``credit.max_depth``; 0: none).

    Returns:
        :class:`MemoryTreeCredit`; ``sum(credits) == sum(root_credits)`` up to rounding.

    Example: credits (1, 0, 10), step 2 read step 0's note, share 0.5, depth 1 ->
    credits (6, 0, 5), received (5, 0, 0). A chain, step 2 read step 1's note and step 1 step
    0's, credits (0, 0, 8), depth 2 -> credits (2, 2, 4), received (2, 2, 0): step 1 passes
    on half of the 4 that reach it, so writers keep 4 of the 8, not 4 + 2.
    """
    _check(root_credits, reads, memory_share, temperature, max_depth)
    n = len(root_credits)
    weights = [
        edge_weights([edge.score for edge in step_reads], temperature) for step_reads in reads
    ]
    credits, received = [0.0] * n, [0.0] * n
    arriving = [float(c) for c in root_credits]  # what reaches each step at this depth
    for depth in range(max_depth + 1):
        below = [0.0] * n
        for step in range(n):
            amount = arriving[step]
            passes_on = depth < max_depth and bool(reads[step])
            sent = memory_share * amount if passes_on else 0.0
            credits[step] += amount - sent
            if depth > 0:  # it reached the step down a read edge: its note earned it
                received[step] += amount - sent
            if passes_on:
                for edge, weight in zip(reads[step], weights[step], strict=True):
                    below[edge.writer] += sent * weight
        arriving = below
    entropies = [entropy(w) for w in weights if w]
    return MemoryTreeCredit([float(c) for c in root_credits], credits, received, entropies)


@dataclass(frozen=True)
class TreeNode:
    """One node of a drawn contribution tree.

    kind:   ``root`` (a step's credit), ``action`` (what the actor keeps), ``read`` (a note the
            step read) or ``write`` (the step that wrote that note).
    step:   the acting step the node belongs to (for ``read``: the reader).
    value:  credit at the node.
    parent: index of the parent node (None for the root).
    weight: edge weight from the parent (reads: softmax of scores; action: its kept share).
    score:  the read's retrieval score (reads only).
    writer: the writing acting step (reads only).
    """

    kind: str
    step: int
    value: float
    parent: int | None = None
    weight: float = 1.0
    score: float = 0.0
    writer: int | None = None


def contribution_tree(
    root: int,
    root_credit: float,
    reads: Sequence[Sequence[ReadEdge]],
    memory_share: float,
    temperature: float,
    max_depth: int,
) -> list[TreeNode]:
    """The tree of acting step ``root`` alone, node by node (parents before children), as
    :func:`memory_tree_credit` splits ``root_credit`` over it: for drawing and for tests."""
    nodes = [TreeNode("root", root, float(root_credit))]
    frontier = [(0, 0)]  # (node index, depth)
    while frontier:
        index, depth = frontier.pop(0)
        node = nodes[index]
        step_reads = reads[node.step] if depth < max_depth else ()
        kept = 1.0 - memory_share if step_reads else 1.0
        nodes.append(TreeNode("action", node.step, node.value * kept, index, kept))
        weights = edge_weights([edge.score for edge in step_reads], temperature)
        for edge, weight in zip(step_reads, weights, strict=True):
            value = node.value * memory_share * weight
            nodes.append(TreeNode("read", node.step, value, index, weight, edge.score, edge.writer))
            nodes.append(TreeNode("write", edge.writer, value, len(nodes) - 1))
            frontier.append((len(nodes) - 1, depth + 1))
    return nodes


def tree_bases() -> list[str]:
    """Rules whose credits can root the trees: those that draw no randomness (diagnostics replay
    them), read no memory and take no parameters."""
    return sorted(
        name
        for name, rule in CREDIT_RULES.items()
        if not (rule.draws_randomness or rule.reads_memory) and rule.Config is CreditConfig
    )


@dataclass
class MemoryTreeConfig(CreditConfig):
    """``credit=memory_tree`` (seed 002, docs/memory.md): credit for the writers of the shared
    memory's notes that an acting step read. Without a memory (``task.memory.size`` 0) no step
    reads a note and it gives the base rule's credits."""

    base: str = "bucket_brigade"
    """The rule whose credits root the trees (:func:`tree_bases`)."""
    memory_share: float = 0.5
    """[ours] Share of what reaches a step that goes down its read edges; the rest is kept."""
    temperature: float = 1.0
    """Of the softmax over read scores that weighs the read edges."""
    max_depth: int = 2
    """Read edges followed from a step at most (0: the base rule)."""


@register("memory_tree")
class MemoryTree(CreditRule):
    """The ``base`` rule's credits are the roots of contribution trees over the shared memory's
    reads; a share ``memory_share`` of a step's credit goes down its read edges to the notes'
    writers (weights softmax(score / ``temperature``)), recursively to ``max_depth``."""

    Config = MemoryTreeConfig
    reads_memory = True

    def __init__(self, config: MemoryTreeConfig | None = None) -> None:
        self.config = config or MemoryTreeConfig(name="memory_tree")
        self.base = make_credit(CreditConfig(name=self.config.base))
        self.conserves_return = self.base.conserves_return  # the trees move credit, never lose it

    @classmethod
    def parameters(cls) -> list[Parameter]:
        bases = tree_bases()
        return [
            Parameter("base", Allowed(bases.__contains__, f"choose one of {bases}", "random")),
            Parameter("memory_share", unit_interval()),
            Parameter("temperature", positive()),
            Parameter("max_depth", at_least(0)),
        ]

    @classmethod
    def from_config(cls, config: MemoryTreeConfig) -> MemoryTree:
        return cls(config)

    def tree(
        self,
        rewards: Sequence[float],
        bids: Sequence[float],
        runner_up_bids: Sequence[float],
        rng: random.Random,
        levels: Sequence[float],
        reads: Reads = (),
    ) -> tuple[MemoryTreeCredit, float]:
        """The trees' credits (with what reached writers) and the base rule's discarded part."""
        roots, lost = self.base(rewards, bids, runner_up_bids, rng, levels)
        reads = reads or [[] for _ in roots]
        config = self.config
        tree = memory_tree_credit(
            roots, reads, config.memory_share, config.temperature, config.max_depth
        )
        return tree, lost

    def __call__(
        self,
        rewards: Sequence[float],
        bids: Sequence[float],
        runner_up_bids: Sequence[float],
        rng: random.Random,
        levels: Sequence[float],
        reads: Reads = (),
    ) -> tuple[list[float], float]:
        tree, lost = self.tree(rewards, bids, runner_up_bids, rng, levels, reads)
        return tree.credits, lost
