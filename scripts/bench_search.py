"""Speed of the research task's BM25 search and of one environment step.

    .venv/bin/python scripts/bench_search.py [--queries N]

Queries are entity names and question texts of the generated world. Prints queries per second
one at a time (the environment's path, memo cache bypassed), in one batch, and environment
steps per second (expert moves, observations included); the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from bidswarm.envs.research import ResearchConfig, ResearchEnv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=5000)
    args = parser.parse_args()

    start = time.perf_counter()
    env = ResearchEnv(ResearchConfig())
    load_s = time.perf_counter() - start
    index = env.data.index
    rng = random.Random(0)
    pool = [hop.subject for q in env.data.train for hop in q.hops]
    pool += [q.question for q in env.data.train]
    queries = [rng.choice(pool) for _ in range(args.queries)]
    k = env.config.search_top_k

    start = time.perf_counter()
    for query in queries:
        index._search(query, k)  # the uncached search, as on a first visit
    single_qps = len(queries) / (time.perf_counter() - start)

    start = time.perf_counter()
    index.search_batch(queries, k)
    batch_qps = len(queries) / (time.perf_counter() - start)

    steps, seed = 0, 0
    env.reset(seed)
    start = time.perf_counter()
    while steps < args.steps:
        if env.done:
            seed += 1
            env.reset(seed)
        env.step(None, env.expert_action(None) or "")
        env.observation(None)
        steps += 1
    steps_per_s = steps / (time.perf_counter() - start)

    print(f"corpus {len(env.data.documents)} documents, index ready in {load_s:.2f} s")
    print(f"search: {single_qps:.0f} queries/s one at a time, {batch_qps:.0f} queries/s batched")
    print(f"environment: {steps_per_s:.0f} expert steps/s (search results memoised)")
    print(
        json.dumps(
            {
                "documents": len(env.data.documents),
                "index_ready_s": round(load_s, 3),
                "queries_per_s": round(single_qps, 1),
                "batched_queries_per_s": round(batch_qps, 1),
                "env_steps_per_s": round(steps_per_s, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
