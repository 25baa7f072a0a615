"""The scripted experts' demonstrations a run starts from: the SFT data (worlds drawn from the
run's seed) and the replies that set the longest action a model may say (fixed worlds)."""

from __future__ import annotations

import random
from typing import Any

from omegaconf import DictConfig

from bidswarm.agents.prompts import PromptTemplate
from bidswarm.config import SFTActionRoles
from bidswarm.coordination import CoordinationRule
from bidswarm.envs.base import TextEnv
from bidswarm.envs.experts import Demonstration, play_expert_episode
from bidswarm.run.decision_demonstrations import with_learned_decisions


def demonstrations_by_world(
    env: TextEnv, worlds: list[int], bid_levels: list[float], same_reply: bool = False
) -> dict[int, list[Demonstration]]:
    """The scripted experts' demonstrations on each of ``worlds``, each world played once
    (``same_reply``: :func:`~bidswarm.envs.experts.play_expert_episode`'s)."""
    unique = dict.fromkeys(worlds)
    return {
        world: play_expert_episode(env, world, bid_levels, same_reply=same_reply).demonstrations
        for world in unique
    }


def expert_demonstrations(
    env: TextEnv, seeds: list[int], bid_levels: list[float]
) -> list[Demonstration]:
    """The scripted experts' demonstrations on training worlds (SFT data, tokenizer corpus)."""
    played = demonstrations_by_world(env, seeds, bid_levels)
    return [demo for seed in seeds for demo in played[seed]]


def demonstration_worlds(env: TextEnv, cfg: DictConfig) -> list[int]:
    """The ``sft.demo_episodes`` training worlds the experts play for SFT: a draw that depends
    on the run's seed, so runs with different seeds start from different demonstrations."""
    rng = random.Random(f"demonstrations/{cfg.seed}")
    return rng.sample(env.train_seeds(), cfg.sft.demo_episodes)


REPLY_TOKEN_MARGIN = 4
"""Tokens allowed beyond the longest expert reply when ``model.max_action_tokens`` is null."""
ACTION_LIMIT_WORLDS = 16
"""Training worlds whose expert replies set the derived action-token limit."""


def action_limit_worlds(env: TextEnv) -> list[int]:
    """The first :data:`ACTION_LIMIT_WORLDS` training worlds (the same for training and
    evaluation, whatever the seed)."""
    return env.train_seeds()[:ACTION_LIMIT_WORLDS]


def start_demonstrations(
    env: TextEnv, cfg: DictConfig, rule: CoordinationRule | None = None
) -> tuple[list[Demonstration], list[Demonstration]]:
    """The SFT demonstrations (:func:`demonstration_worlds`; with those of the decisions the
    run's ``rule`` learns, :func:`with_learned_decisions`) and those that set the action-token
    limit (:func:`action_limit_worlds`), every world played once."""
    sft, limit = demonstration_worlds(env, cfg), action_limit_worlds(env)
    levels = list(cfg.coordination.bid_levels)
    same_reply = cfg.sft.action_roles == SFTActionRoles.same_reply
    played = demonstrations_by_world(env, sft + limit, levels, same_reply)
    demos = [d for w in sft for d in played[w]]
    if rule is not None:
        demos = with_learned_decisions(demos, env, sft, levels, rule)
    return demos, [d for w in limit for d in played[w]]


def action_token_limit(
    max_action_tokens: int | None,
    demonstrations: list[Demonstration],
    prompts: PromptTemplate,
    tokenizer: Any,
) -> int:
    """``max_action_tokens`` (``model.max_action_tokens``), or when None: the longest expert
    reply among ``demonstrations`` (those of :func:`action_limit_worlds`) in this tokenizer
    plus :data:`REPLY_TOKEN_MARGIN`.

    Replies are cut at this many tokens, so a limit below the longest expert reply makes
    some of the task's actions impossible to say.
    """
    if max_action_tokens is not None:
        return max_action_tokens
    replies = {prompts.reply_text(d.reply) for d in demonstrations if d.kind == "action"}
    longest = max(len(tokenizer(reply, add_special_tokens=False)["input_ids"]) for reply in replies)
    return longest + REPLY_TOKEN_MARGIN
