"""Joint play of the crafting experts on the held-out seeds: success rate and mean +- SE reward.

.venv/bin/python scripts/expert_play.py [--target iron_pickaxe|all] [--seeds N]
"""

from __future__ import annotations

import argparse
import statistics

from bidswarm.envs.crafting import CraftingConfig, CraftingEnv, techtree
from bidswarm.envs.experts import play_expert_episode

BID_LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]


def mean_and_standard_error(values: list[float]) -> tuple[float, float]:
    spread = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
    return statistics.fmean(values), spread


def report(target: str, n_seeds: int | None) -> None:
    env = CraftingEnv(CraftingConfig(target=target))
    seeds = env.heldout_seeds()[:n_seeds]
    episodes = [play_expert_episode(env, seed, BID_LEVELS) for seed in seeds]
    success, success_se = mean_and_standard_error([e.metrics["success"] for e in episodes])
    reward, reward_se = mean_and_standard_error([e.total_reward for e in episodes])
    decisions, _ = mean_and_standard_error([float(e.decisions) for e in episodes])
    actors = [actor for episode in episodes for actor in episode.actors if actor]
    shares = ", ".join(f"{role} {actors.count(role) / len(actors):.0%}" for role in env.roles)
    print(
        f"{target:>15}: success {success:.1%} +- {success_se:.1%}, "
        f"reward {reward:.1f} +- {reward_se:.1f}, decisions {decisions:.1f}, "
        f"participation {shares} ({len(episodes)} held-out seeds)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="iron_pickaxe", choices=[*techtree.TARGETS, "all"])
    parser.add_argument("--seeds", type=int, default=None, help="first N held-out seeds only")
    args = parser.parse_args()
    for target in techtree.TARGETS if args.target == "all" else [args.target]:
        report(target, args.seeds)


if __name__ == "__main__":
    main()
