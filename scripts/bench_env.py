"""Speed of the embedded crafting world next to one forward pass of a tiny language model.

    .venv/bin/python scripts/bench_env.py [--steps N] [--target iron_pickaxe]

Prints decision steps per second (step + observation), snapshot+restore time, and the time of one
forward of a tiny Llama (hidden 64, 2 layers, batch 32 x 96 tokens, fp32) in the same process;
the last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from bidswarm.envs.crafting import ROLE_INSTRUCTIONS, CraftingConfig, CraftingEnv

BATCH, TOKENS = 32, 96


def bench_steps(env: CraftingEnv, steps: int) -> float:
    """Decision steps per second with random instructions (1 in 10 invalid), resets included."""
    rng = random.Random(0)
    replies = [i for instructions in ROLE_INSTRUCTIONS.values() for i in instructions]
    replies.append("craft the moon")
    roles = [*env.roles, None]
    plan = [(rng.choice(roles), rng.choice(replies)) for _ in range(steps)]
    env.reset(0)
    episode = 0
    start = time.perf_counter()
    for role, reply in plan:
        if env.done:
            episode += 1
            env.reset(episode)
        env.step(role, reply)
        env.observation(role)
    return steps / (time.perf_counter() - start)


def bench_fork(env: CraftingEnv, repeats: int) -> float:
    """Seconds per snapshot() + restore() in a mid-episode state."""
    env.reset(1)
    for _ in range(20):
        role = env.roles[env.decisions_made % 3]
        env.step(role, env.expert_action(role) or "")
    start = time.perf_counter()
    for _ in range(repeats):
        env.restore(env.snapshot())
    return (time.perf_counter() - start) / repeats


def bench_forward(repeats: int) -> float:
    """Seconds per forward of the tiny Llama on a 32 x 96 batch (fp32, no grad)."""
    config = LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=512,
    )
    model = LlamaForCausalLM(config).eval()
    tokens = torch.randint(0, config.vocab_size, (BATCH, TOKENS))
    with torch.no_grad():
        model(input_ids=tokens)  # warm-up: first call allocates
        start = time.perf_counter()
        for _ in range(repeats):
            model(input_ids=tokens)
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--target", default="iron_pickaxe")
    parser.add_argument("--forward-repeats", type=int, default=20)
    args = parser.parse_args()
    env = CraftingEnv(CraftingConfig(target=args.target))
    steps_per_second = bench_steps(env, args.steps)
    fork_seconds = bench_fork(env, args.steps // 4)
    forward_seconds = bench_forward(args.forward_repeats)
    # One forward serves a batch of 32 envs: compare it with 32 env steps.
    ratio = forward_seconds / (BATCH / steps_per_second)
    print(f"env steps/s (step + observation): {steps_per_second:,.0f}")
    print(f"snapshot + restore: {fork_seconds * 1e6:.1f} us")
    print(f"tiny Llama forward, {BATCH} x {TOKENS} tokens fp32: {forward_seconds * 1e3:.2f} ms")
    print(f"one forward costs as much as {ratio:,.0f}x the {BATCH} env steps it feeds")
    print(
        json.dumps(
            {
                "env_steps_per_s": round(steps_per_second, 1),
                "snapshot_restore_us": round(fork_seconds * 1e6, 2),
                "tiny_forward_ms": round(forward_seconds * 1e3, 3),
                "forward_over_batch_steps": round(ratio, 1),
                "torch_threads": torch.get_num_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()
