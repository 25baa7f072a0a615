"""What a run is made of: its population (new, after SFT, or from ``init_from=``) and the
rollout loop around it (also what ``bidswarm.evaluate`` plays checkpoints with)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate
from bidswarm.coordination import RULES, make_coordination
from bidswarm.coordination.bid_readers import level_log_priors, make_reader
from bidswarm.engines import make_engine
from bidswarm.envs import make_env
from bidswarm.envs.base import MONOLITHIC, TextEnv
from bidswarm.envs.experts import Demonstration, parse_bid
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.swarm import Swarm
from bidswarm.run.demonstrations import (
    action_limit_worlds,
    action_token_limit,
    expert_demonstrations,
)
from bidswarm.run.resume import init_population_folder


def population_roles(cfg: DictConfig, env: TextEnv) -> list[str | None]:
    """Monolithic: one agent owning every role; otherwise one agent per role (times replicas)."""
    return [MONOLITHIC] if RULES[cfg.coordination.name].monolithic else list(env.roles)


def build_population(
    cfg: DictConfig,
    env: TextEnv,
    run_dir: Path,
    state: dict[str, Any],
    demonstrations: list[Demonstration],
) -> Population:
    """The run's agents: those saved after SFT (``state`` says ``sft_done``), else the
    ``init_from=`` run's final agents (checked by :func:`bidswarm.run.preflight.preflight`),
    else new ones whose tokenizer (tiny models) reads the task, its roles and
    ``demonstrations``; with a decider beside them when the rule needs one
    (``CoordinationRule.needs_decider``: a new one where the source has none)."""
    decider = RULES[cfg.coordination.name].needs_decider
    if state.get("sft_done"):
        return Population.from_pretrained(run_dir / "sft")
    if cfg.init_from is not None:
        source = Population.from_pretrained(init_population_folder(cfg))
        population = source.replicate(cfg.coordination.replicas)
        return population.with_decider(cfg.model) if decider else population
    texts = PromptTemplate.for_env(
        env, "compact", None, list(cfg.coordination.bid_levels), cfg.bids.prompt
    )
    corpus = [env.task_description] + [env.role_description(r) for r in env.roles]
    # The bid and action demonstrations only: a rule's learned decisions (``score``,
    # ``route``) leave the tokenizer, and so the agents' initial weights, the auction's.
    plain = [d for d in demonstrations if d.kind in ("bid", "action")]
    corpus += texts.demonstration_texts(plain) + env.vocabulary_texts()
    return Population.build(
        cfg.model, population_roles(cfg, env), cfg.coordination.replicas, corpus, decider
    )


def served_models(population: Population) -> int:
    """How many models an engine serves for ``population``: one per fully fine-tuned agent,
    one base for LoRA agents."""
    return 1 if population.is_lora else len(population)


def role_level_priors(
    demonstrations: list[Demonstration], levels: list[float]
) -> dict[str, list[float]]:
    """Per role with bid demonstrations, the log share of each bid level among its labels
    (``bids.balanced``; :func:`~bidswarm.coordination.bid_readers.level_log_priors`)."""
    labels: dict[str, list[float]] = {}
    for demo in demonstrations:
        if demo.kind == "bid" and demo.role is not None:
            labels.setdefault(demo.role, []).append(parse_bid(demo.reply, levels)[0])
    return {role: level_log_priors(bids, levels) for role, bids in labels.items()}


def build_rollout_loop(
    cfg: DictConfig,
    population: Population,
    bid_population: Population | None = None,
    action_limit_demonstrations: list[Demonstration] | None = None,
) -> RolloutLoop:
    """Prompts, swarm and coordination rule of ``cfg`` around ``population`` (which acts) and
    ``bid_population`` (which bids; default the same agents). ``action_limit_demonstrations``:
    the experts' demonstrations on :func:`action_limit_worlds` if the caller played them
    already."""
    task_config = OmegaConf.to_object(cfg.task)
    env = make_env(task_config)
    levels = list(cfg.coordination.bid_levels)
    tokenizer = population.agents[0].tokenizer
    prompts = PromptTemplate.for_env(
        env, cfg.model.prompt_style, tokenizer, levels, cfg.bids.prompt
    )
    needs_demonstrations = cfg.model.max_action_tokens is None or cfg.bids.balanced
    if action_limit_demonstrations is None and needs_demonstrations:
        action_limit_demonstrations = expert_demonstrations(env, action_limit_worlds(env), levels)
    max_action_tokens = action_token_limit(
        cfg.model.max_action_tokens, action_limit_demonstrations or [], prompts, tokenizer
    )
    engine = make_engine(
        cfg.model,
        cfg.model.max_prompt_tokens + max(cfg.model.max_bid_tokens, max_action_tokens),
        served_models(population)
        + (0 if bid_population is None else served_models(bid_population)),
        cfg.seed,
    )
    swarm = Swarm(
        population,
        prompts,
        cfg.model.max_bid_tokens,
        max_action_tokens,
        cfg.model.temperature,
        engine,
        bid_population=bid_population,
        token_budget=cfg.model.micro_batch_tokens,
        reader=make_reader(cfg.bids.reader),
        bid_temperature=cfg.bids.temperature,
        eval_bid_temperature=cfg.bids.eval_temperature,
        explore=cfg.bids.explore,
        level_log_priors=(
            role_level_priors(action_limit_demonstrations or [], levels)
            if cfg.bids.balanced
            else None
        ),
    )
    coordination = make_coordination(OmegaConf.to_object(cfg.coordination))
    return RolloutLoop(lambda: make_env(task_config), swarm, coordination)
