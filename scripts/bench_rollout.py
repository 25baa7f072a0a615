"""Decisions per second of batched rollouts versus a naive loop, and SmolLM2 prefill FLOP/s.

One decision: every agent bids for every live environment, the highest bid acts (argmax, ties
to the first agent), its action is generated, the environment steps. The batched path asks
each agent once per decision step for all environments (one batch, left padding, KV cache,
shared prompt prefix computed once); the naive path asks one prompt at a time.

    .venv/bin/python scripts/bench_rollout.py                       # default, ~3 min on 2 cores
    .venv/bin/python scripts/bench_rollout.py --tiny-envs 64 --smollm-envs 32 --smollm-rounds 3

Progress goes to stderr; the last line of stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bidswarm.agents.policy import AgentPolicy, left_pad, positions_from_mask
from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate, parse_bid
from bidswarm.config import ModelConfig
from bidswarm.envs.crafting import CraftingEnv
from bidswarm.envs.crafting.config import CraftingConfig
from bidswarm.envs.experts import play_expert_episode
from bidswarm.run import action_token_budget, budget_worlds, expert_demonstrations

CONF = Path(__file__).resolve().parents[1] / "conf"
LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def model_config(name: str) -> ModelConfig:
    raw = OmegaConf.load(CONF / "model" / f"{name}.yaml")
    raw.pop("defaults", None)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), raw))


def tokenizer_corpus(env: CraftingEnv, template: PromptTemplate, episodes: int) -> list[str]:
    texts = [env.task_description] + [env.role_description(role) for role in env.roles]
    for seed in range(episodes):
        demos = play_expert_episode(env, seed, LEVELS).demonstrations
        texts += template.demonstration_texts(demos)
    return texts


class Bench:
    """A population, its prompts and ``n_envs`` crafting worlds, played in lock-step."""

    def __init__(
        self,
        population: Population,
        template: PromptTemplate,
        cfg: ModelConfig,
        max_action_tokens: int,
    ):
        self.population = population
        self.template = template
        self.cfg = cfg
        self.max_action_tokens = max_action_tokens
        self.generator = torch.Generator().manual_seed(0)
        self.next_seed = 0

    def fresh_envs(self, n_envs: int) -> list[CraftingEnv]:
        envs = []
        for _ in range(n_envs):
            env = CraftingEnv(CraftingConfig())
            env.reset(self.next_seed)
            self.next_seed += 1
            envs.append(env)
        return envs

    def _renew(self, env: CraftingEnv) -> None:
        if env.done:
            env.reset(self.next_seed)
            self.next_seed += 1

    def _bids(self, agent: AgentPolicy, envs: list[CraftingEnv]) -> list[float]:
        prompts = [self.template.bid(agent.role, env.observation(agent.role)) for env in envs]
        replies = agent.generate(
            prompts, self.cfg.max_bid_tokens, self.cfg.temperature, self.generator
        )
        return [parse_bid(reply.text, LEVELS)[0] for reply in replies]

    def _act(self, agent: AgentPolicy, envs: list[CraftingEnv]) -> None:
        prompts = [self.template.action(agent.role, env.observation(agent.role)) for env in envs]
        replies = agent.generate(
            prompts, self.max_action_tokens, self.cfg.temperature, self.generator
        )
        for env, reply in zip(envs, replies, strict=True):
            env.step(agent.role, reply.text)
            self._renew(env)

    def batched_step(self, envs: list[CraftingEnv]) -> int:
        """One decision in every env; each agent generates once for all envs."""
        bids = [self._bids(agent, envs) for agent in self.population]
        winners = [max(range(len(bids)), key=lambda a: (bids[a][e], -a)) for e in range(len(envs))]
        for index, agent in enumerate(self.population):
            mine = [env for env, winner in zip(envs, winners, strict=True) if winner == index]
            if mine:
                self._act(agent, mine)
        return len(envs)

    def naive_step(self, envs: list[CraftingEnv]) -> int:
        """One decision in every env, one prompt at a time."""
        for env in envs:
            bids = [self._bids(agent, [env])[0] for agent in self.population]
            winner = max(range(len(bids)), key=lambda a: (bids[a], -a))
            self._act(self.population[winner], [env])
        return len(envs)


def compare_paths(bench: Bench, n_envs: int, naive_envs: int, rounds: int) -> tuple[float, float]:
    """Decisions per second of the batched and the naive path, measured in alternating rounds
    so that both see the same load on a shared machine."""
    batched_envs, naive_envs_list = bench.fresh_envs(n_envs), bench.fresh_envs(naive_envs)
    seconds = {"batched": 0.0, "naive": 0.0}
    decisions = {"batched": 0, "naive": 0}
    for _ in range(rounds):
        for path, step, envs in [
            ("batched", bench.batched_step, batched_envs),
            ("naive", bench.naive_step, naive_envs_list),
        ]:
            start = time.perf_counter()
            decisions[path] += step(envs)
            seconds[path] += time.perf_counter() - start
    return decisions["batched"] / seconds["batched"], decisions["naive"] / seconds["naive"]


def bench_model(name: str, n_envs: int, rounds: int, naive_envs: int) -> dict[str, float]:
    cfg = model_config(name)
    env = CraftingEnv(CraftingConfig())
    torch.manual_seed(0)
    started = time.perf_counter()
    corpus = None
    if cfg.source == "tiny":
        corpus = tokenizer_corpus(
            env, PromptTemplate.for_env(env, cfg.prompt_style, None, LEVELS), 8
        )
    population = Population.build(cfg, list(env.roles), 1, corpus)
    population.eval()
    template = PromptTemplate.for_env(env, cfg.prompt_style, population[0].tokenizer, LEVELS)
    progress(f"{name}: built {len(population)} agents in {time.perf_counter() - started:.1f}s")
    demos = expert_demonstrations(env, budget_worlds(env), LEVELS)
    budget = action_token_budget(cfg.max_action_tokens, demos, template, population[0].tokenizer)
    bench = Bench(population, template, cfg, budget)
    bench.batched_step(bench.fresh_envs(2))  # warm-up (allocator, kernels)
    batched, naive = compare_paths(bench, n_envs, naive_envs, rounds)
    progress(f"{name}: batched {batched:.2f} decisions/s ({n_envs} envs x {rounds} rounds)")
    progress(f"{name}: naive {naive:.2f} decisions/s ({naive_envs} envs x {rounds} rounds)")
    result = {
        f"{name}/envs": float(n_envs),
        f"{name}/batched_decisions": float(n_envs * rounds),
        f"{name}/naive_decisions": float(naive_envs * rounds),
        f"{name}/batched_decisions_per_s": batched,
        f"{name}/naive_decisions_per_s": naive,
        f"{name}/speedup": batched / naive,
    }
    if cfg.source != "tiny":
        result.update(prefill_efficiency(name, population[0], template, bench, n_envs))
    return result


def matmul_peak_flops(sizes: tuple[int, ...] = (512, 1024, 2048, 3072), repeats: int = 8) -> float:
    """Best fp32 FLOP/s of square matmuls of several sizes on this machine, as torch runs now."""
    best = 0.0
    for size in sizes:
        a, b = torch.randn(size, size), torch.randn(size, size)
        torch.mm(a, b)
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2 * size**3 / (time.perf_counter() - start))
    return best


def prefill_efficiency(
    name: str, agent: AgentPolicy, template: PromptTemplate, bench: Bench, n_envs: int
) -> dict[str, float]:
    """Achieved FLOP/s of one batched prompt forward (2 * params * tokens) vs the matmul peak."""
    envs = bench.fresh_envs(n_envs)
    prompts = [template.bid(agent.role, env.observation(agent.role)) for env in envs]
    ids = agent.encode_prompts(prompts)
    input_ids, mask = left_pad(ids, agent.pad_id, agent.device)
    params = sum(p.numel() for p in agent.parameters())
    embedding = agent.model.get_input_embeddings().weight.numel()
    tokens = int(mask.sum())
    best = float("inf")
    with torch.no_grad():
        for _ in range(3):
            start = time.perf_counter()
            agent.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions_from_mask(mask),
                use_cache=False,
                logits_to_keep=1,
            )
            best = min(best, time.perf_counter() - start)
    achieved = 2 * params * tokens / best
    peak = matmul_peak_flops()
    progress(
        f"{name}: prefill {tokens} tokens in {best:.2f}s = {achieved / 1e9:.1f} GFLOP/s; "
        f"fp32 matmul peak {peak / 1e9:.1f} GFLOP/s ({achieved / peak:.0%})"
    )
    return {
        f"{name}/prefill_tokens": float(tokens),
        f"{name}/prefill_flops_per_s": achieved,
        f"{name}/matmul_peak_flops_per_s": peak,
        f"{name}/prefill_fraction_of_peak": achieved / peak,
        # Without the embedding table (a lookup, not a matmul; the head runs on one position).
        f"{name}/prefill_fraction_of_peak_non_embedding": 2
        * (params - embedding)
        * tokens
        / best
        / peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny-envs", type=int, default=32)
    parser.add_argument("--tiny-rounds", type=int, default=3, help="decision steps per path")
    parser.add_argument("--tiny-naive-envs", type=int, default=8, help="envs of the naive loop")
    parser.add_argument("--smollm-envs", type=int, default=16)
    parser.add_argument("--smollm-rounds", type=int, default=1)
    parser.add_argument("--smollm-naive-envs", type=int, default=2)
    parser.add_argument("--skip-smollm", action="store_true")
    parser.add_argument(
        "--tiny-threads",
        type=int,
        default=1,
        help="torch threads for the tiny model (its ops are too small to split; extra threads "
        "only spin-wait on a shared machine)",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads for SmolLM2 (0: all)")
    args = parser.parse_args()
    default_threads = torch.get_num_threads()
    torch.set_num_threads(args.tiny_threads)
    figures: dict[str, float] = {"tiny/threads": float(args.tiny_threads)}
    figures.update(bench_model("tiny", args.tiny_envs, args.tiny_rounds, args.tiny_naive_envs))
    if not args.skip_smollm:
        torch.set_num_threads(args.threads or default_threads)
        figures["smollm2_135m/threads"] = float(torch.get_num_threads())
        figures.update(
            bench_model(
                "smollm2_135m", args.smollm_envs, args.smollm_rounds, args.smollm_naive_envs
            )
        )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
