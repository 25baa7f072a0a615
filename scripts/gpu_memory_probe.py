"""Peak GPU memory of the learner at the issue's target: agents of a real-shaped model, an
action update and a bid update shaped like 32 envs x 120 decisions, on one GPU.

It runs what ``SwarmModule.learn`` runs for each agent (micro-batches of at most
``model.micro_batch_tokens`` tokens, REINFORCE or Bradley-Terry, backward, one AdamW step with
a param group per agent) on batches of made-up tokens of the target's shape, outside Lightning,
so that only the learner's memory is measured; weights, gradients and AdamW states are in the
model's dtype (``bf16-true``; ``bf16-mixed`` keeps fp32 weights: see docs/performance.md).

    .venv/bin/python scripts/gpu_memory_probe.py                          # 3 x llama_4b
    .venv/bin/python scripts/gpu_memory_probe.py --agents 12 --adapter lora

The last line of stdout is one JSON object; an out-of-memory error is recorded, not raised.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from bench_rollout import model_config
from bidswarm.agents.policy import micro_batches
from bidswarm.agents.population import Population
from bidswarm.algorithms.losses import bradley_terry_loss, reinforce_loss
from bidswarm.lit.memory import gpu_memory


def progress(message: str) -> None:
    print(f"[probe] {message}", file=sys.stderr, flush=True)


def action_update(population, rows, prompt, reply, budget, generator) -> None:
    for agent in population:
        device = agent.device
        credits = torch.rand(rows, generator=generator).to(device)
        for part in micro_batches([prompt + reply] * rows, budget):
            ids = torch.randint(
                5, len(agent.tokenizer), (len(part), prompt + reply), generator=generator
            ).tolist()
            logp, mask = agent.reply_token_logprobs(
                [r[:prompt] for r in ids], [r[prompt:] for r in ids]
            )
            terms = reinforce_loss(
                logp, mask, credits[part.start : part.stop], "token_mean",
                baseline=credits.mean(), normalizer=float(rows * reply),
            )  # fmt: skip
            terms["loss_action"].backward()


def bid_update(population, pairs, prompt, reply, budget, generator) -> None:
    for agent in population:
        for part in micro_batches([prompt + reply] * pairs, budget // 2):
            ids = torch.randint(
                5, len(agent.tokenizer), (len(part), prompt + 2 * reply), generator=generator
            )
            prompts = [r[:prompt] for r in ids.tolist()] * 2
            replies = [r[prompt : prompt + reply] for r in ids.tolist()]
            replies += [r[prompt + reply :] for r in ids.tolist()]
            logp, mask = agent.reply_token_logprobs(prompts, replies)
            summed = (logp * mask).sum(dim=1)
            n = len(part)
            terms = bradley_terry_loss(summed[:n], summed[n:], 1.0, normalizer=float(pairs))
            terms["loss_bid"].backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama_4b")
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--adapter", default="full", help="full or lora")
    parser.add_argument("--envs", type=int, default=32)
    parser.add_argument("--decisions", type=int, default=120)
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--action-tokens", type=int, default=12)
    parser.add_argument("--bid-tokens", type=int, default=3)
    parser.add_argument("--pairs-per-agent", type=int, default=256)
    parser.add_argument("--micro-batch-tokens", type=int, default=None, help="default: config")
    parser.add_argument("--no-checkpointing", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = model_config(args.model)
    cfg.adapter = args.adapter
    cfg.gradient_checkpointing = not args.no_checkpointing
    budget = args.micro_batch_tokens or cfg.micro_batch_tokens
    roles = [f"role{i}" for i in range(args.agents)]
    corpus = [" ".join(str(i) for i in range(300))] * 4
    figures: dict[str, float | str] = {
        "model": args.model, "agents": float(args.agents), "adapter": args.adapter,
        "envs": float(args.envs), "decisions": float(args.decisions),
        "micro_batch_tokens": float(budget), "checkpointing": float(cfg.gradient_checkpointing),
    }  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    phase = "weights"
    try:
        with gpu_memory(figures, "weights", device), torch.device(device):
            population = Population.build(cfg, roles, 1, corpus)
        population.train()
        groups = [{"params": agent.trainable_parameters()} for agent in population]
        optimizer = torch.optim.AdamW(groups, lr=1e-6)
        # Each agent acts at about 1 in `agents` decisions of every env.
        rows = args.envs * args.decisions // args.agents
        for phase, run, size, reply in [
            ("update_action", action_update, rows, args.action_tokens),
            ("update_bid", bid_update, args.pairs_per_agent, args.bid_tokens),
        ]:
            start = time.perf_counter()
            with gpu_memory(figures, phase, device):
                run(population, size, args.prompt_tokens, reply, budget, generator)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            figures[f"time/{phase}_s"] = time.perf_counter() - start
            progress(f"{phase}: {figures.get(f'memory/peak_gpu_gib/{phase}', 0):.1f} GiB peak")
    except torch.OutOfMemoryError as error:
        figures["oom_in"] = phase
        figures["oom_message"] = str(error).splitlines()[0][:400]
        progress(f"out of memory in {phase}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
