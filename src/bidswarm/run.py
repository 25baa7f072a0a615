"""One training run as named phases: build, cold start, evaluate, fit, finish.

Everything a resumed (or DDP child) process needs to pick the run up again lives in the run
folder: ``state.json`` (phases done, held-out results, MLflow run id), ``sft/`` (the population
after the cold start), ``checkpoints/last.ckpt`` (agents, optimizer, schedule position).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from bidswarm import tracking
from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate
from bidswarm.algorithms.credit import make_credit_rule
from bidswarm.coordination import RULES, make_coordination
from bidswarm.envs import make_env
from bidswarm.envs.base import MONOLITHIC, TextEnv
from bidswarm.envs.experts import Demonstration, play_expert_episode
from bidswarm.lit.callbacks import UpdateProgress
from bidswarm.lit.sft import run_sft
from bidswarm.lit.swarm_module import SwarmModule
from bidswarm.plots import plot_participation, plot_reward_vs_flops
from bidswarm.rollout.collector import Collector
from bidswarm.rollout.evaluation import evaluate
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.memory_credit import draw_example_tree
from bidswarm.rollout.records import Episode
from bidswarm.rollout.swarm import Swarm


def demonstrations_by_world(
    env: TextEnv, worlds: list[int], bid_levels: list[float]
) -> dict[int, list[Demonstration]]:
    """The scripted experts' demonstrations on each of ``worlds``, each world played once."""
    unique = dict.fromkeys(worlds)
    return {world: play_expert_episode(env, world, bid_levels).demonstrations for world in unique}


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
BUDGET_EPISODES = 16
"""Training worlds whose expert replies size the derived action-token budget."""


def budget_worlds(env: TextEnv) -> list[int]:
    """The first :data:`BUDGET_EPISODES` training worlds (the same for training and
    evaluation, whatever the seed)."""
    return env.train_seeds()[:BUDGET_EPISODES]


def start_demonstrations(
    env: TextEnv, cfg: DictConfig
) -> tuple[list[Demonstration], list[Demonstration]]:
    """The SFT demonstrations (:func:`demonstration_worlds`) and those that size the action
    budget (:func:`budget_worlds`), every world played once."""
    sft, budget = demonstration_worlds(env, cfg), budget_worlds(env)
    played = demonstrations_by_world(env, sft + budget, list(cfg.coordination.bid_levels))
    return [d for w in sft for d in played[w]], [d for w in budget for d in played[w]]


def action_token_budget(
    max_action_tokens: int | None,
    demonstrations: list[Demonstration],
    prompts: PromptTemplate,
    tokenizer: Any,
) -> int:
    """``max_action_tokens`` (``model.max_action_tokens``), or when None: the longest expert
    reply among ``demonstrations`` (those of :func:`budget_worlds`) in this tokenizer plus
    :data:`REPLY_TOKEN_MARGIN`.

    Replies are cut at this many tokens, so a budget below the longest expert reply makes
    some of the task's actions impossible to say.
    """
    if max_action_tokens is not None:
        return max_action_tokens
    replies = {prompts.reply_text(d.reply) for d in demonstrations if d.kind == "action"}
    longest = max(len(tokenizer(reply, add_special_tokens=False)["input_ids"]) for reply in replies)
    return longest + REPLY_TOKEN_MARGIN


def population_roles(cfg: DictConfig, env: TextEnv) -> list[str | None]:
    """Monolithic: one agent owning every role; otherwise one agent per role (times replicas)."""
    return [MONOLITHIC] if RULES[cfg.coordination.name].monolithic else list(env.roles)


def build_rollout_loop(
    cfg: DictConfig,
    population: Population,
    bid_population: Population | None = None,
    budget_demonstrations: list[Demonstration] | None = None,
) -> RolloutLoop:
    """Prompts, swarm and coordination rule of ``cfg`` around ``population`` (which acts) and
    ``bid_population`` (which bids; default the same agents). ``budget_demonstrations``: the
    experts' demonstrations on :func:`budget_worlds` if the caller played them already."""
    task_config = OmegaConf.to_object(cfg.task)
    env = make_env(task_config)
    levels = list(cfg.coordination.bid_levels)
    tokenizer = population.agents[0].tokenizer
    prompts = PromptTemplate.for_env(env, cfg.model.prompt_style, tokenizer, levels)
    if budget_demonstrations is None and cfg.model.max_action_tokens is None:
        budget_demonstrations = expert_demonstrations(env, budget_worlds(env), levels)
    swarm = Swarm(
        population,
        prompts,
        cfg.model.max_bid_tokens,
        action_token_budget(
            cfg.model.max_action_tokens, budget_demonstrations or [], prompts, tokenizer
        ),
        cfg.model.temperature,
        bid_population=bid_population,
        token_budget=cfg.model.micro_batch_tokens,
    )
    coordination = make_coordination(OmegaConf.to_object(cfg.coordination))
    return RolloutLoop(lambda: make_env(task_config), swarm, coordination)


def make_logger(cfg: DictConfig, run_dir: Path, run_id: str | None) -> Logger:
    if cfg.logger.name == "csv":
        return CSVLogger(save_dir=str(run_dir), name="csv")
    uri = tracking.tracking_uri(cfg.logger.tracking_uri)
    tags = {"bidswarm.run_dir": str(run_dir.resolve())}
    parent = tracking.sweep_parent_run(uri, cfg.logger.experiment_name) if run_id is None else None
    if parent is not None:
        tags["mlflow.parentRunId"] = parent
    return MLFlowLogger(
        experiment_name=cfg.logger.experiment_name,
        run_name=tracking.run_name(),
        tracking_uri=uri,
        tags=tags,
        run_id=run_id,
    )


@dataclass
class Run:
    cfg: DictConfig
    run_dir: Path
    env: TextEnv
    population: Population
    loop: RolloutLoop
    demonstrations: list[Demonstration]
    logger: Logger
    state: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)

    # -- build ---------------------------------------------------------------------------------
    @classmethod
    def start(cls, cfg: DictConfig) -> Run:
        run_dir = Path(cfg.resume or cfg.output_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        state_path = run_dir / "state.json"
        state = json.loads(state_path.read_text()) if state_path.exists() else {}
        env = make_env(OmegaConf.to_object(cfg.task))
        levels = list(cfg.coordination.bid_levels)
        demos, budget_demos = start_demonstrations(env, cfg)
        if state.get("sft_done"):
            population = Population.from_pretrained(run_dir / "sft")
        else:
            texts = PromptTemplate.for_env(env, "compact", None, levels)
            corpus = [env.task_description] + [env.role_description(r) for r in env.roles]
            corpus += texts.demonstration_texts(demos) + env.vocabulary_texts()
            population = Population.build(
                cfg.model, population_roles(cfg, env), cfg.coordination.replicas, corpus
            )
        loop = build_rollout_loop(cfg, population, budget_demonstrations=budget_demos)
        logger = make_logger(cfg, run_dir, state.get("mlflow_run_id"))
        run = cls(cfg, run_dir, env, population, loop, demos, logger, state)
        run.record_start()
        return run

    def record_start(self) -> None:
        if isinstance(self.logger, MLFlowLogger):
            self.state["mlflow_run_id"] = self.logger.run_id
        if "started" not in self.state:
            self.state["started"] = time.strftime("%Y-%m-%d %H:%M:%S")
            self.logger.log_hyperparams(OmegaConf.to_container(self.cfg, resolve=True))
            config_file = self.run_dir / "resolved_config.yaml"
            config_file.write_text(OmegaConf.to_yaml(self.cfg, resolve=True))
            self.log_artifact(config_file)
        self.save_state()

    # -- phases --------------------------------------------------------------------------------
    def cold_start(self) -> None:
        """SFT on each role's own expert demonstrations (PAPER.md section 5), then save."""
        if self.cfg.sft.enabled:
            result = run_sft(
                self.population,
                self.demonstrations,
                self.loop.swarm.prompts,
                self.cfg.sft,
                trainer_kwargs=self.trainer_kwargs() | {"enable_progress_bar": True},
                logger=self.logger,
                seed=self.cfg.seed,
            )
            self.state["sft"] = result
        if rank_zero_only.rank == 0:
            self.population.save_pretrained(self.run_dir / "sft")
        self.state["sft_done"] = True
        self.save_state()

    def evaluate_and_record(self, key: str) -> dict[str, float]:
        """Held-out mean, SE and 95% CI over worlds, logged under ``key/`` and kept in the
        run's state; the per-world mean rewards (to pair arms on the same worlds) go to the
        state's ``key_worlds`` and the artifact ``heldout/<key>_worlds.json``."""
        if rank_zero_only.rank != 0:
            return {}
        seeds = self.env.heldout_seeds()[: self.cfg.eval.max_seeds]
        evaluation = evaluate(self.loop, seeds, self.cfg.eval.runs_per_seed, self.cfg.seed)
        metrics = evaluation.metrics | {
            "eval_tokens": float(evaluation.usage.rollout_tokens),
            "eval_flops": evaluation.usage.rollout_flops,
        }
        self.logger.log_metrics({f"{key}/{k}": v for k, v in metrics.items()})
        self.state[key] = metrics
        worlds = {str(world): reward for world, reward in evaluation.world_rewards.items()}
        self.state[f"{key}_worlds"] = worlds
        self.save_state()
        heldout = self.run_dir / "heldout"
        heldout.mkdir(exist_ok=True)
        (heldout / f"{key}_worlds.json").write_text(json.dumps(worlds, indent=1) + "\n")
        self.log_artifact(heldout)  # a folder: MLflow keeps it as heldout/<key>_worlds.json
        if self.cfg.credit.name == "memory_tree":  # docs/memory.md: one example tree per evaluation
            self.log_artifact(self.draw_memory_tree(evaluation.episodes, key))
        print(
            f"[bidswarm] {key}: held-out reward {metrics['reward/mean']:.2f} "
            f"+- {metrics['reward/se']:.2f} (95% CI {metrics['reward/ci_low']:.2f} .. "
            f"{metrics['reward/ci_high']:.2f}) over {len(seeds)} worlds",
            flush=True,
        )
        return metrics

    def fit(self) -> bool:
        """RL: the 4:1 schedule of action and bid updates, checkpointed every update.

        Returns whether the schedule is complete (``rl.stop_after`` can end the process early).
        """
        credit = OmegaConf.to_container(self.cfg.credit)
        collector = Collector(
            self.loop,
            self.cfg.rl,
            credit.pop("name"),
            self.env.train_seeds(),
            self.cfg.seed,
            credit_parameters=credit,
        )
        module = SwarmModule(self.population, collector, self.cfg.rl, self.cfg.model.temperature)
        checkpoints = self.run_dir / "checkpoints"
        last = checkpoints / "last.ckpt"
        trainer = L.Trainer(
            max_epochs=module.total_updates,
            callbacks=[
                ModelCheckpoint(
                    dirpath=checkpoints,
                    save_last=True,
                    save_top_k=0,
                    every_n_epochs=self.cfg.rl.checkpoint_every,
                ),
                UpdateProgress(module.total_updates),
            ],
            enable_checkpointing=True,
            enable_progress_bar=False,
            **self.trainer_kwargs(),
        )
        trainer.fit(module, ckpt_path=str(last) if last.exists() else None)
        self.state["rl_world_size"] = trainer.world_size
        self.save_state()
        self.history = module.history
        return module.finished

    def finish(self) -> None:
        """Save the trained agents, plot, and print where to look."""
        if rank_zero_only.rank != 0:
            return
        self.population.save_pretrained(self.run_dir / "final")
        plots = [
            plot_reward_vs_flops(self.history, self.run_dir / "reward_vs_flops.png"),
            plot_participation(self.history, self.run_dir / "participation.png"),
        ]
        for path in plots:
            self.log_artifact(path)
        self.log_artifact(self.run_dir / "state.json")
        self.print_summary()

    # -- helpers -------------------------------------------------------------------------------
    def draw_memory_tree(self, episodes: list[Episode], key: str) -> Path:
        """``memory_tree_<key>.png``: the contribution tree of one evaluation step."""
        return draw_example_tree(
            episodes,
            make_credit_rule(**OmegaConf.to_container(self.cfg.credit)),
            self.loop.swarm.roles,
            self.loop.swarm.bid_levels,
            self.run_dir / f"memory_tree_{key}.png",
        )

    def trainer_kwargs(self) -> dict[str, Any]:
        t = self.cfg.trainer
        strategy = t.strategy
        if strategy == "ddp":
            # Agents that did not act this update have no gradient: let DDP skip them.
            strategy = DDPStrategy(find_unused_parameters=True)
        return dict(
            accelerator=t.accelerator,
            devices=t.devices,
            num_nodes=t.num_nodes,
            strategy=strategy,
            precision=t.precision,
            deterministic=t.deterministic,
            logger=self.logger,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            log_every_n_steps=1,
            use_distributed_sampler=False,
            default_root_dir=str(self.run_dir),
        )

    def save_state(self) -> None:
        if rank_zero_only.rank == 0:
            (self.run_dir / "state.json").write_text(json.dumps(self.state, indent=1))

    def log_artifact(self, path: Path) -> None:
        if isinstance(self.logger, MLFlowLogger) and rank_zero_only.rank == 0:
            self.logger.experiment.log_artifact(self.logger.run_id, str(path))

    def close(self, status: str) -> None:
        self.logger.finalize("success" if status == "FINISHED" else "failed")

    def print_summary(self) -> None:
        """Where the run is; held-out reward before and after RL, and after RL minus before
        RL paired on the same held-out worlds (95% CI, verdict)."""
        from bidswarm.statistics import paired_difference

        before = self.state.get("eval_before", {}).get("reward/mean")
        after = self.state.get("eval_after", {}).get("reward/mean")
        lines = ["", f"[bidswarm] run folder: {self.run_dir}"]
        if before is not None:
            lines.append(f"[bidswarm] held-out reward before RL (after SFT): {before:.2f}")
        if after is not None:
            result = self.state["eval_after"]
            line = f"[bidswarm] held-out reward after RL: {after:.2f} +- {result['reward/se']:.2f}"
            if "reward/ci_low" in result:  # absent from runs evaluated before CIs existed
                line += f" (95% CI {result['reward/ci_low']:.2f} .. {result['reward/ci_high']:.2f})"
            lines.append(line)
        worlds_before = self.state.get("eval_before_worlds")
        worlds_after = self.state.get("eval_after_worlds")
        if worlds_before and worlds_after:
            diff = paired_difference(worlds_after, worlds_before, "after RL", "before RL")
            lines.append(
                f"[bidswarm] after RL - before RL on the same {diff.n} held-out worlds: "
                f"{diff.mean:+.2f} (95% CI {diff.ci_low:+.2f} .. {diff.ci_high:+.2f}): "
                f"{diff.verdict}"
            )
        if isinstance(self.logger, MLFlowLogger):
            uri = tracking.tracking_uri(self.cfg.logger.tracking_uri)
            lines.append(
                f"[bidswarm] MLflow: mlflow ui --backend-store-uri {uri}  "
                f"(run {self.logger.run_id})"
            )
        print("\n".join(lines), flush=True)
