"""Figures of a run: reward against training FLOPs, and participation share per role."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def plot_reward_vs_flops(history: list[dict[str, float]], path: Path) -> Path:
    """Training reward (mean +- SE of each update's episodes) against cumulative FLOPs."""
    fig, ax = plt.subplots(figsize=(6, 4))
    if history:
        flops = [h["flops/total"] for h in history]
        mean = [h["reward/mean"] for h in history]
        se = [h["reward/se"] for h in history]
        ax.plot(flops, mean, marker="o", ms=3)
        ax.fill_between(
            flops,
            [m - s for m, s in zip(mean, se, strict=True)],
            [m + s for m, s in zip(mean, se, strict=True)],
            alpha=0.25,
        )
    ax.set_xlabel("training FLOPs (rollout + updates)")
    ax.set_ylabel("episode reward")
    ax.set_title("Reward vs training FLOPs")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_participation(history: list[dict[str, float]], path: Path) -> Path:
    """Share of acting steps taken by each role over the updates."""
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
    ax.set_ylabel("share of acting steps")
    ax.set_ylim(0, 1)
    ax.set_title("Participation share per role")
    if roles:
        ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
