"""Joint play of the research experts on the held-out questions: accuracy and participation.

    .venv/bin/python scripts/research_expert_play.py [--seeds N] [--corpus C --questions Q]

The experts follow each question's gold hop chain (search the entity, open its page, find the
relation, answer) under their bidding rule; the last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bidswarm.envs.experts import play_expert_episode
from bidswarm.envs.research import ResearchConfig, ResearchEnv

BID_LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=None, help="first N held-out seeds only")
    parser.add_argument("--corpus", default=None, help="corpus JSONL (docs/research.md)")
    parser.add_argument("--questions", default=None, help="questions JSONL (docs/research.md)")
    parser.add_argument("--heldout", type=int, default=50, help="task.n_heldout_seeds")
    args = parser.parse_args()

    start = time.perf_counter()
    env = ResearchEnv(
        ResearchConfig(
            corpus_path=args.corpus, questions_path=args.questions, n_heldout_seeds=args.heldout
        )
    )
    loaded = time.perf_counter() - start
    seeds = env.heldout_seeds()[: args.seeds]
    start = time.perf_counter()
    episodes = [play_expert_episode(env, seed, BID_LEVELS) for seed in seeds]
    played = time.perf_counter() - start

    success = [e.metrics["success"] for e in episodes]
    accuracy = statistics.fmean(success)
    se = statistics.stdev(success) / len(success) ** 0.5 if len(success) > 1 else 0.0
    decisions = statistics.fmean(e.decisions for e in episodes)
    actors = [actor for episode in episodes for actor in episode.actors if actor]
    shares = {role: actors.count(role) / len(actors) for role in env.roles}
    print(
        f"held-out accuracy {accuracy:.1%} +- {se:.1%} over {len(episodes)} questions, "
        f"mean F1 {statistics.fmean(e.metrics['f1'] for e in episodes):.3f}, "
        f"decisions {decisions:.1f}, participation "
        + ", ".join(f"{role} {share:.0%}" for role, share in shares.items())
    )
    print(
        f"corpus {len(env.data.documents)} documents, loaded in {loaded:.2f} s; "
        f"played in {played:.2f} s"
    )
    print(
        json.dumps(
            {
                "heldout_accuracy": accuracy,
                "heldout_accuracy_se": se,
                "questions": len(episodes),
                "mean_decisions": decisions,
                "participation": shares,
                "documents": len(env.data.documents),
                "load_s": round(loaded, 3),
                "play_s": round(played, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
