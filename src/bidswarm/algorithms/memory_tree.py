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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReadEdge:
    """A note that an acting step read: who wrote it and how well it matched.

    writer: position, among the episode's acting steps, of the step that wrote the note
            (earlier than the reader).
    score:  the note's retrieval score in the reader's observation.
    """

    writer: int
    score: float


@dataclass(frozen=True)
class MemoryTreeCredit:
    """The tree rule's result for one episode's acting steps (each list has shape [T]).

    roots:     each step's credit from the base rule (its tree's root).
    credits:   the credit each acting step keeps, summed over every tree that reaches it.
    received:  the part of ``credits`` that came down read edges (what writing earned).
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
    credits (6, 0, 5), received (5, 0, 0).
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
            if depth == max_depth or not reads[step]:
                credits[step] += amount
                continue
            sent = memory_share * amount
            credits[step] += amount - sent
            for edge, weight in zip(reads[step], weights[step], strict=True):
                below[edge.writer] += sent * weight
        received = [r + b for r, b in zip(received, below, strict=True)]
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
