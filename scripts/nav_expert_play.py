"""Joint play of the navigation experts on the held-out seeds: success rate, SPL, nDTW, reward.

.venv/bin/python scripts/nav_expert_play.py [--seeds N]
"""

from __future__ import annotations

import argparse
import statistics

from bidswarm.envs.experts import play_expert_episode
from bidswarm.envs.navigation import NavigationConfig, NavigationEnv

BID_LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=None, help="first N held-out seeds only")
    args = parser.parse_args()
    env = NavigationEnv(NavigationConfig())
    seeds = env.heldout_seeds()[: args.seeds]
    episodes = [play_expert_episode(env, seed, BID_LEVELS) for seed in seeds]
    for key in ("success", "spl", "ndtw", "navigation_error", "reward", "decisions"):
        values = [episode.metrics[key] for episode in episodes]
        spread = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
        print(f"{key:>16}: {statistics.fmean(values):.3f} +- {spread:.3f}")
    actors = [actor for episode in episodes for actor in episode.actors]
    shares = {role: actors.count(role) / len(actors) for role in env.roles}
    print(f"{'participation':>16}: " + ", ".join(f"{r} {s:.0%}" for r, s in shares.items()))
    print(f"{'episodes':>16}: {len(episodes)} held-out seeds")


if __name__ == "__main__":
    main()
