"""Figures of a run: reward against training FLOPs, participation share per role, and a
contribution tree of the memory credit rule (docs/memory.md). The figures that compare
strategies are the report's (:mod:`bidswarm.report.figures`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator


def plot_reward_vs_flops(
    history: list[dict[str, float]],
    path: Path,
    run_name: str = "",
    sft_flops: float = 0.0,
    evaluations: dict[str, tuple[float, float, float]] | None = None,
) -> Path:
    """Training reward (mean +- SE of each update's episodes) against cumulative training
    FLOPs, SFT's included (RL starts at ``sft_flops``); ``evaluations``: label -> (FLOPs,
    held-out mean, SE), drawn as points with error bars (before RL, after RL)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    if history:
        flops = [sft_flops + h["flops/total"] for h in history]
        mean = [h["reward/mean"] for h in history]
        se = [h["reward/se"] for h in history]
        ax.plot(flops, mean, marker="o", ms=3, label="training episodes (RL)")
        ax.fill_between(
            flops,
            [m - s for m, s in zip(mean, se, strict=True)],
            [m + s for m, s in zip(mean, se, strict=True)],
            alpha=0.25,
        )
    for n, (label, (x, mean_, se_)) in enumerate((evaluations or {}).items()):
        ax.errorbar(
            [x], [mean_], yerr=[se_], fmt="s", ms=6, capsize=4, color=f"C{n + 1}", label=label
        )
    if sft_flops:
        ax.axvline(sft_flops, color="grey", ls=":", lw=1, label="end of SFT")
    if history or evaluations:
        ax.legend(fontsize=8)
    ax.set_xlabel("training FLOPs (SFT + RL rollouts and updates)")
    ax.set_ylabel("episode reward")
    ax.set_title(f"Reward vs training FLOPs{f': {run_name}' if run_name else ''}", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_participation(history: list[dict[str, float]], path: Path, run_name: str = "") -> Path:
    """Share of acting steps taken by each role over the updates (whole-number ticks)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    roles = sorted(
        {k.split("/", 1)[1] for h in history for k in h if k.startswith("participation/")}
    )
    for role in roles:
        ax.plot(
            [h["update"] for h in history],
            [h.get(f"participation/{role}", 0.0) for h in history],
            label=role,
        )
    ax.set_xlabel("update")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("share of acting steps")
    ax.set_ylim(0, 1)
    ax.set_title(f"Participation share per role{f': {run_name}' if run_name else ''}", fontsize=10)
    if roles:
        ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


TREE_COLOURS = {"root": "#f4d35e", "action": "#a8dadc", "read": "#e5e5e5", "write": "#f4a261"}


def plot_contribution_tree(
    nodes: Sequence[Any], labels: Sequence[str], path: Path, title: str
) -> Path:
    """A contribution tree (``algorithms.credit.memory_tree.contribution_tree`` nodes, parents
    before children) top-down: root, the actor's action and its reads, the notes' writers below."""
    children: dict[int, list[int]] = {}
    for index, node in enumerate(nodes):
        if node.parent is not None:
            children.setdefault(node.parent, []).append(index)
    x: dict[int, float] = {}
    depth = {0: 0} if nodes else {}
    for index, node in enumerate(nodes):
        if node.parent is not None:
            depth[index] = depth[node.parent] + 1
    leaves = 0

    def place(index: int) -> float:
        nonlocal leaves
        kids = children.get(index, [])
        if not kids:
            x[index] = float(leaves)
            leaves += 1
        else:
            x[index] = sum(place(kid) for kid in kids) / len(kids)
        return x[index]

    if nodes:
        place(0)
    width = max(leaves, 1)
    levels = max(depth.values(), default=0) + 1
    fig, ax = plt.subplots(figsize=(max(6.0, 2.6 * width), 1.5 + 1.3 * levels))
    for index, node in enumerate(nodes):
        if node.parent is not None:
            parent = node.parent
            ax.plot([x[parent], x[index]], [-depth[parent], -depth[index]], color="grey", lw=1)
        ax.text(
            x[index],
            -depth[index],
            labels[index],
            ha="center",
            va="center",
            fontsize=7,
            bbox={"boxstyle": "round", "fc": TREE_COLOURS.get(node.kind, "white"), "ec": "grey"},
        )
    ax.set_xlim(-0.8, width - 0.2)
    ax.set_ylim(-levels + 0.4, 0.6)
    ax.axis("off")
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_calibration(
    pairs: Sequence[tuple[str, float, float]], path: Path, top_level: float, run_name: str = ""
) -> Path:
    """Bids against their value targets (``bids.loss=calibrated``): one point per (role, bid,
    measured value of acting in bid units) of the last bid update's forks, the diagonal where
    a bid prices its value."""
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    for role in sorted({role for role, _, _ in pairs}):
        values = [(target, bid) for r, bid, target in pairs if r == role]
        ax.scatter([t for t, _ in values], [b for _, b in values], s=12, alpha=0.6, label=role)
    ax.plot([0, top_level], [0, top_level], color="grey", linewidth=1, label="bid = value")
    ax.set_xlabel("value of acting (share of the open reward, bid units)")
    ax.set_ylabel("bid")
    ax.set_title(f"calibration of the bids {run_name}".strip(), fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
