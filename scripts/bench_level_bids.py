"""Seconds to read every agent's expected-level bids (``bids.reader=expected``, the default
channel's) for a decision step of N crafting worlds, with the bid prompts' shared head computed
once for all of them against every prompt computed in full, side by side on the same weights
and prompts, on the ``hf`` engine's rollout copy (``engine.score_branches``).

A level reader scores every level's canonical reply after every bid prompt
(``agents/branching.py``). SmolLM2's chat template and task text make ~85-90% of a crafting bid
prompt the same for every world; the tiny model's compact prompts share less than the 32
tokens a head needs, so it has nothing to gain.

    PYTHONPATH=src .venv/bin/python scripts/bench_level_bids.py        # SmolLM2, 32 worlds
    PYTHONPATH=src .venv/bin/python scripts/bench_level_bids.py --worlds 16 64 --repeats 3

The last line of stdout is one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from bench_rollout import model_config
from bidswarm.agents import policy as policy_module
from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate
from bidswarm.algorithms.auction import PAPER_BID_LEVELS
from bidswarm.config import DType
from bidswarm.engines.hf import HFEngine
from bidswarm.envs.crafting import CraftingEnv
from bidswarm.envs.crafting.config import CraftingConfig
from bidswarm.envs.experts import format_bid

LEVELS = list(PAPER_BID_LEVELS)  # the bid levels every preset uses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2_135m")
    parser.add_argument("--worlds", type=int, nargs="+", default=[32])
    parser.add_argument("--repeats", type=int, default=2, help="timed repeats; the fastest")
    parser.add_argument("--rollout-dtype", default="bfloat16", help="'none': the weights")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = model_config(args.model)
    cfg.rollout_dtype = None if args.rollout_dtype == "none" else DType(args.rollout_dtype)
    env = CraftingEnv(CraftingConfig())
    population = Population.build(cfg, list(env.roles), 1, None)
    population.eval()
    template = PromptTemplate.for_env(env, cfg.prompt_style, population[0].tokenizer, LEVELS)
    engine = HFEngine.from_config(cfg)
    result: dict[str, float] = {}
    for worlds in args.worlds:
        envs = []
        for seed in range(worlds):
            world = CraftingEnv(CraftingConfig())
            world.reset(seed)
            envs.append(world)
        prompts, replies = [], []
        for agent in population:
            texts = [template.bid(agent.role, world.observation(agent.role)) for world in envs]
            prompts.append(agent.encode_prompts(texts))
            replies.append(
                [agent.encode_reply(template.reply_text(format_bid(lv))) for lv in LEVELS]
            )

        def read_all(prompts=prompts, replies=replies) -> list[torch.Tensor]:
            return [
                engine.score_branches(agent, ids, agent_replies, 1.0, cfg.micro_batch_tokens)
                for agent, ids, agent_replies in zip(population, prompts, replies, strict=True)
            ]

        timings, scores = {}, {}
        for arm, min_head in (
            ("shared_head", policy_module.MIN_TRAINED_PROMPT_HEAD),
            ("full", 10**9),
        ):
            policy_module.MIN_TRAINED_PROMPT_HEAD = min_head
            scores[arm] = read_all()  # warm-up
            best = float("inf")
            for _ in range(args.repeats):
                started = time.perf_counter()
                read_all()
                best = min(best, time.perf_counter() - started)
            timings[arm] = best
            print(f"{args.model} {worlds} worlds, {arm}: {best:.2f} s", file=sys.stderr)
        policy_module.MIN_TRAINED_PROMPT_HEAD = 32
        head = population[0].prompt_head_length(prompts[0], with_gradient=False)
        gap = max(
            float((a - b).abs().max())
            for a, b in zip(scores["shared_head"], scores["full"], strict=True)
        )
        result.update(
            {
                f"{worlds}/shared_head_s": timings["shared_head"],
                f"{worlds}/full_s": timings["full"],
                f"{worlds}/speedup": timings["full"] / timings["shared_head"],
                f"{worlds}/head_tokens": float(head),
                f"{worlds}/mean_prompt_tokens": sum(map(len, prompts[0])) / worlds,
                f"{worlds}/max_logprob_gap": gap,
            }
        )
        print(
            f"{worlds} worlds: {result[f'{worlds}/speedup']:.2f}x (head {head} of "
            f"{result[f'{worlds}/mean_prompt_tokens']:.0f} prompt tokens; largest log-prob "
            f"gap {gap:.2e})",
            file=sys.stderr,
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
