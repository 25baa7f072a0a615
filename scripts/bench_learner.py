"""Seconds per learner step of SmolLM2 agents on the main job's real prompts, side by side:
every row's prompt forwarded in full against the prompt head shared by the rows computed once
(``AgentPolicy.prompt_head_length``), in float32 and under bfloat16 autocast
(``trainer.precision=bf16-mixed``), for a fully fine-tuned agent and a LoRA one.

One step: the reply log-probs of ``--rows`` rows (bid or action prompts of the wooden-pickaxe
world at several decisions, with the experts' replies) and the backward of their sum, in
micro-batches of at most ``--micro-batch-tokens`` tokens (the model's ``micro_batch_tokens``),
as the learners do. Each variant runs ``--repeats`` times on the same rows, interleaved, and
the best time counts; the log-prob gap to the full float32 forward says what each computes.

    .venv/bin/python scripts/bench_learner.py                  # ~10 min on 2 cores
    .venv/bin/python scripts/bench_learner.py --rows 32 --threads 1 --skip-lora

Progress goes to stderr; the last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import torch
from omegaconf import OmegaConf

from bidswarm.agents import policy as policy_module
from bidswarm.agents.models import load_model_and_tokenizer
from bidswarm.agents.policy import AgentPolicy, micro_batches
from bidswarm.agents.population import with_lora_adapters
from bidswarm.agents.prompts import PromptTemplate
from bidswarm.config import ModelConfig
from bidswarm.envs.crafting import CraftingConfig, CraftingEnv
from bidswarm.envs.experts import format_bid, snap_to_level

LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]
ROLE = "miner"


def smollm2_config() -> ModelConfig:
    raw = OmegaConf.load("conf/model/smollm2_135m.yaml")
    raw.pop("defaults")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), raw))


def rows_of(agent: AgentPolicy, kind: str, count: int) -> tuple[list[list[int]], list[list[int]]]:
    """``count`` prompts of ``kind`` (bid or action) from expert episodes, with the experts'
    replies (an action prompt gets the miner's action where the expert has one)."""
    env = CraftingEnv(CraftingConfig(max_decisions=30))
    template = PromptTemplate.for_env(env, "chat", agent.tokenizer, LEVELS)
    prompts, replies, seed = [], [], 0
    while len(prompts) < count:
        env.reset(seed)
        seed += 1
        while not env.done and len(prompts) < count:
            observation = env.observation(ROLE)
            if kind == "bid":
                prompts.append(template.bid(ROLE, observation))
                replies.append(format_bid(snap_to_level(env.expert_bid(ROLE), LEVELS)))
            else:
                prompts.append(template.action(ROLE, observation))
                replies.append(env.expert_action(ROLE) or "mine 1 oak log")
            actor = max(env.roles, key=env.expert_bid)
            env.step(actor, env.expert_action(actor) or "")
    return agent.encode_prompts(prompts), [agent.encode_reply(r) for r in replies]


def learner_step(agent: AgentPolicy, prompts, replies, budget: int, bf16: bool) -> torch.Tensor:
    """Log-probs and the backward of their sum, micro-batch by micro-batch; the log-probs."""
    agent.model.zero_grad(set_to_none=True)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    rows = []
    for part in micro_batches(agent.forward_row_tokens(prompts, replies), budget):
        with autocast:
            logprobs, mask = agent.reply_token_logprobs(
                [prompts[i] for i in part], [replies[i] for i in part]
            )
        (logprobs * mask).sum().backward()
        rows += list(((logprobs * mask).sum(1)).detach().float())
    return torch.stack(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--micro-batch-tokens", type=int, default=None)
    parser.add_argument("--skip-lora", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = smollm2_config()
    budget = args.micro_batch_tokens or cfg.micro_batch_tokens
    model, tokenizer = load_model_and_tokenizer(cfg, corpus=None)
    agents = {"full": AgentPolicy(model, tokenizer, ROLE, cfg.max_prompt_tokens)}
    if not args.skip_lora:
        import copy

        shared = with_lora_adapters(copy.deepcopy(model), cfg.lora, ["agent0"])
        agents["lora"] = AgentPolicy(
            shared, tokenizer, ROLE, cfg.max_prompt_tokens, adapter="agent0"
        )
    figures: dict[str, float] = {"rows": args.rows, "threads": args.threads}
    for kind in ("bid", "action"):
        prompts, replies = rows_of(agents["full"], kind, args.rows)
        head = agents["full"].prompt_head_length(prompts)
        figures[f"{kind}/prompt_tokens_mean"] = sum(map(len, prompts)) / len(prompts)
        figures[f"{kind}/prompt_head"] = head
        for adapter, agent in agents.items():
            variants = {
                f"{precision}/{layout}": (precision == "bf16", layout == "head_once")
                for precision in ("fp32", "bf16")
                for layout in ("every_row", "head_once")
            }
            best = {name: float("inf") for name in variants}
            logprobs: dict[str, torch.Tensor] = {}
            for repeat in range(args.repeats):
                for name, (bf16, head_once) in variants.items():
                    floor = policy_module.MIN_TRAINED_PROMPT_HEAD if head_once else 10**9
                    saved, policy_module.MIN_TRAINED_PROMPT_HEAD = (
                        policy_module.MIN_TRAINED_PROMPT_HEAD,
                        floor,
                    )
                    start = time.perf_counter()
                    logprobs[name] = learner_step(agent, prompts, replies, budget, bf16)
                    best[name] = min(best[name], time.perf_counter() - start)
                    policy_module.MIN_TRAINED_PROMPT_HEAD = saved
                    print(
                        f"{kind} {adapter} {name} repeat {repeat}: {best[name]:.1f} s",
                        file=sys.stderr,
                        flush=True,
                    )
            base = best["fp32/every_row"]
            for name in variants:
                key = f"{kind}/{adapter}/{name}"
                figures[f"{key}/s"] = best[name]
                figures[f"{key}/speedup"] = base / best[name]
                gap = (logprobs[name] - logprobs["fp32/every_row"]).abs().max()
                figures[f"{key}/max_logprob_gap"] = float(gap)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
