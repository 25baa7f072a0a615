"""One training run as named phases: build, cold start, evaluate, fit, finish.

Everything a resumed (or DDP child) process needs to pick the run up again lives in the run
folder: ``state.json`` (phases done, held-out results, MLflow run id), ``sft/`` (the population
after the cold start; LoRA agents: their adapters, on the frozen base in ``base/``),
``checkpoints/last.ckpt`` (agents or their LoRA adapters, optimizer, RNG, schedule position,
counters, MLflow run id). Both files are replaced atomically, so a kill at any moment leaves
the last complete ones (docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
from hydra.experimental.callback import Callback
from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from bidswarm import console, tracking, transcripts
from bidswarm import metric_names as names
from bidswarm.agents.population import (
    LORA_BASE_FOLDER,
    POPULATION_FILE,
    Population,
    agent_folder_name,
)
from bidswarm.agents.prompts import PromptTemplate
from bidswarm.algorithms.credit import CreditRule, make_credit
from bidswarm.config import check_machine, validate
from bidswarm.coordination import RULES, make_coordination
from bidswarm.envs import env_class, make_env
from bidswarm.envs.base import MONOLITHIC, TextEnv, role_name
from bidswarm.envs.experts import Demonstration, play_expert_episode
from bidswarm.lit.callbacks import (
    CheckpointError,
    CrashSafeCheckpoint,
    RunInterrupted,
    UpdateProgress,
    resume_checkpoint,
)
from bidswarm.lit.sft import run_sft
from bidswarm.lit.strategy import build_strategy
from bidswarm.lit.swarm_module import SwarmModule
from bidswarm.plots import plot_participation, plot_reward_vs_flops
from bidswarm.rollout.collector import Collector
from bidswarm.rollout.evaluation import evaluate
from bidswarm.rollout.forks import ForkExample
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


class RunLogger(MLFlowLogger):
    """Lightning's MLflow logger without Lightning's bookkeeping metric ``epoch`` (an update
    is a step: ``epoch`` would repeat it), sampling MLflow's system metrics (``system/*``:
    CPU, memory, GPU) while :meth:`start_system_metrics` ... :meth:`stop_system_metrics`."""

    BOOKKEEPING = ("epoch",)
    SYSTEM_METRICS_INTERVAL_S = 5
    RUN_END_STATUSES = ("FINISHED", "FAILED", "KILLED")
    """What :meth:`Run.close` ends the run with; Lightning's own ``finalize("success")`` at the
    end of each fit (SFT, then RL) would mark the run finished while it goes on."""

    _system_monitor: Any = None

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        kept = {key: value for key, value in metrics.items() if key not in self.BOOKKEEPING}
        if kept:
            super().log_metrics(kept, step)

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        if status in self.RUN_END_STATUSES:
            super().finalize(status)

    @rank_zero_only
    def start_system_metrics(self) -> None:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        if self._system_monitor is None:
            self._system_monitor = SystemMetricsMonitor(
                self.run_id,
                sampling_interval=self.SYSTEM_METRICS_INTERVAL_S,
                resume_logging=True,
                tracking_uri=self._tracking_uri,
            )
            self._system_monitor.start()

    @rank_zero_only
    def stop_system_metrics(self) -> None:
        if self._system_monitor is not None:
            self._system_monitor.finish()
            self._system_monitor = None


def make_logger(cfg: DictConfig, run_dir: Path, run_id: str | None) -> Logger:
    if cfg.logger.name == "csv":
        return CSVLogger(save_dir=str(run_dir), name="csv")
    from mlflow.tracking import MlflowClient

    uri = tracking.tracking_uri(cfg.logger.tracking_uri)
    tags = {
        "bidswarm.run_dir": str(run_dir.resolve()),
        tracking.OVERRIDES_TAG: tracking.hydra_overrides(),
    }
    parent = tracking.sweep_parent_run(uri, cfg.logger.experiment_name) if run_id is None else None
    if parent is not None:
        tags["mlflow.parentRunId"] = parent
    # Made here, not by the logger: artifacts under outputs/, the UI's model-training view.
    tracking.experiment_id(MlflowClient(uri), cfg.logger.experiment_name)
    return RunLogger(
        experiment_name=cfg.logger.experiment_name,
        run_name=tracking.run_name(),
        tracking_uri=uri,
        tags=tags,
        run_id=run_id,
    )


class ResumeError(ValueError):
    """``resume=`` names no run, or a run this config cannot continue."""


METHOD_KEYS = ("task", "model", "coordination", "credit", "seed", "sft", "rl", "init_from")
"""Config sections that define the method: a resumed run must keep them."""
RESUMABLE_CHANGES = (
    "rl.cycles",
    "rl.stop_after",
    "rl.flop_budget",
    "rl.checkpoint_every",
    "model.torch_threads",
)
"""Keys of those sections a resumed run may change (length of the schedule, speed)."""


def check_resume(cfg: DictConfig) -> None:
    """``resume=`` must name a folder that holds a run (its ``state.json``) trained with the
    same method as ``cfg``, whose last checkpoint (if any) is complete; raises
    :class:`ResumeError` naming the path or the keys (:class:`CheckpointError` naming the
    checkpoint). Creates nothing."""
    if cfg.resume is None:
        return
    folder = Path(cfg.resume)
    if not folder.is_dir():
        raise ResumeError(f"resume={cfg.resume}: no such folder; pass the folder of a run")
    if not (folder / "state.json").is_file():
        raise ResumeError(
            f"resume={cfg.resume}: the folder holds no run (no state.json); pass the folder of "
            "a run (outputs/runs/<day>/<time>)"
        )
    check_same_method(cfg, folder)
    # A truncated checkpoint is named before anything loads (fit checks every record).
    resume_checkpoint(folder / "checkpoints", full=False)


class InitFromError(ValueError):
    """``init_from=`` names no finished run, or one whose agents this config cannot start from."""


def init_population_folder(cfg: DictConfig) -> Path | None:
    """The ``final/`` population that ``init_from=`` starts the run from (None without it)."""
    return None if cfg.init_from is None else Path(cfg.init_from) / "final"


def check_init_from(cfg: DictConfig) -> None:
    """``init_from=`` must name a finished run (its ``final/population.json``) of the same model
    whose roles are this config's (one agent per role, or the monolithic agent); raises
    :class:`InitFromError` naming the key and what differs. Loads no model."""
    folder = init_population_folder(cfg)
    if folder is None:
        return
    meta_file = folder / POPULATION_FILE
    if not meta_file.is_file():
        raise InitFromError(
            f"init_from={cfg.init_from}: no finished run there (no {meta_file}); pass the "
            "folder of a training run that saved its final/ population"
        )
    roles = json.loads(meta_file.read_text())["roles"]
    rule = RULES[cfg.coordination.name]
    wanted = [MONOLITHIC] if rule.monolithic else list(env_class(cfg.task.name).roles)
    if roles != wanted:
        raise InitFromError(
            f"init_from={cfg.init_from}: its agents have roles {roles}, coordination="
            f"{cfg.coordination.name} on task {cfg.task.name} needs {wanted} (one agent per "
            "role; replicas are copied from it)"
        )
    saved_file = Path(cfg.init_from) / "resolved_config.yaml"
    if saved_file.is_file():
        saved_model = OmegaConf.load(saved_file).model.name
        if saved_model != cfg.model.name:
            raise InitFromError(
                f"init_from={cfg.init_from}: trained model.name={saved_model!r}, this run "
                f"has model.name={cfg.model.name!r}"
            )


def check_same_method(cfg: DictConfig, folder: Path) -> None:
    """Refuse to continue the run of ``folder`` with a config whose method differs."""
    saved_file = folder / "resolved_config.yaml"
    if not saved_file.is_file():
        return
    saved = OmegaConf.load(saved_file)
    changed = method_changes(saved, cfg)
    if changed:
        raise ResumeError(
            f"resume={folder}: the run was trained with other values of keys that change the "
            "method:\n  " + "\n  ".join(changed) + "\nresume with the run's values, or start "
            "a new run without resume="
        )


def method_changes(saved: DictConfig, cfg: DictConfig) -> list[str]:
    """``key: saved -> now`` for each method key (:data:`METHOD_KEYS`) both configs have whose
    value differs, except :data:`RESUMABLE_CHANGES`. Keys only one of them has are skipped (a
    field added to a schema after the run started)."""
    before = _flat({key: _resolved(saved, key) for key in METHOD_KEYS if key in saved})
    now = _flat({key: _resolved(cfg, key) for key in METHOD_KEYS})
    return [
        f"{key}: {before[key]!r} -> {now[key]!r}"
        for key in sorted(before.keys() & now.keys())
        if before[key] != now[key] and key not in RESUMABLE_CHANGES
    ]


def _resolved(cfg: DictConfig, key: str) -> Any:
    node = cfg[key]
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat |= _flat(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def load_state(run_dir: Path) -> dict[str, Any]:
    """The run's ``state.json`` (empty for a new run); a clear error naming a damaged one."""
    path = run_dir / "state.json"
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ResumeError(f"{path} is damaged ({error}); it is not a run state") from None


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` so that a kill at any moment leaves the old or the new file."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def preflight(cfg: DictConfig) -> None:
    """Everything that can be refused before a folder, a model or an env is made: config
    values, what they ask of this machine, ``resume=``, the tracking store."""
    validate(cfg)
    check_machine(cfg)
    check_resume(cfg)
    check_init_from(cfg)
    if cfg.logger.name == "mlflow":
        tracking.check_store(tracking.tracking_uri(cfg.logger.tracking_uri))


class Preflight(Callback):
    """Hydra callback (``hydra.callbacks`` of ``conf/train.yaml``): :func:`preflight` before
    Hydra creates the run's output folder, so that a bad value leaves nothing behind."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            preflight(OmegaConf.masked_copy(config, [k for k in config if k != "hydra"]))
        except (ValueError, CheckpointError, tracking.TrackingUnavailable) as error:
            # Hydra turns a callback's exceptions into warnings and goes on: exit here.
            sys.exit(f"Error: {error}")


class PeriodicEvaluation(L.Callback):
    """Held-out evaluation every ``every`` RL updates (``eval.every``), logged as
    ``eval_during/*`` at the number of updates made; not after the last update, which
    ``eval_after`` measures."""

    def __init__(self, run: Run, every: int, total_updates: int):
        self.run = run
        self.every = every
        self.total_updates = total_updates

    def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        updates = trainer.current_epoch + 1
        if updates % self.every == 0 and updates < self.total_updates:
            self.run.evaluate_and_record(names.EVAL_DURING, step=updates)


AGENTS_ARTIFACT_LIMIT_MB = 500
"""Trained agents up to this size are copied into the MLflow artifact store (a tiny population
is ~2 MB, SmolLM2-135M x 3 ~1.6 GB): larger ones stay in the run folder only."""


@dataclass
class Run:
    cfg: DictConfig
    run_dir: Path
    env: TextEnv
    population: Population
    loop: RolloutLoop
    demonstrations: list[Demonstration]
    logger: Logger
    credit: CreditRule
    state: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)

    # -- build ---------------------------------------------------------------------------------
    @classmethod
    def start(cls, cfg: DictConfig) -> Run:
        check_resume(cfg)
        run_dir = Path(cfg.resume or cfg.output_dir)
        # Without resume=, a folder that already holds a run continues it (a requeued SLURM
        # job restarts in its own folder): only with the same method.
        if cfg.resume is None and (run_dir / "state.json").is_file():
            check_same_method(cfg, run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        state = load_state(run_dir)
        env = make_env(OmegaConf.to_object(cfg.task))
        levels = list(cfg.coordination.bid_levels)
        demos, budget_demos = start_demonstrations(env, cfg)
        if state.get("sft_done"):
            population = Population.from_pretrained(run_dir / "sft")
        elif cfg.init_from is not None:
            check_init_from(cfg)
            source = Population.from_pretrained(init_population_folder(cfg))
            population = source.replicate(cfg.coordination.replicas)
        else:
            texts = PromptTemplate.for_env(env, "compact", None, levels)
            corpus = [env.task_description] + [env.role_description(r) for r in env.roles]
            corpus += texts.demonstration_texts(demos) + env.vocabulary_texts()
            population = Population.build(
                cfg.model, population_roles(cfg, env), cfg.coordination.replicas, corpus
            )
        loop = build_rollout_loop(cfg, population, budget_demonstrations=budget_demos)
        logger = make_logger(cfg, run_dir, state.get("mlflow_run_id"))
        credit = make_credit(OmegaConf.to_object(cfg.credit))  # built once, used everywhere
        run = cls(cfg, run_dir, env, population, loop, demos, logger, credit, state)
        run.record_start()
        return run

    def record_start(self) -> None:
        if isinstance(self.logger, MLFlowLogger):
            self.state["mlflow_run_id"] = self.logger.run_id
        if isinstance(self.logger, RunLogger):
            self.logger.start_system_metrics()
        if "started" not in self.state:
            self.state["started"] = time.strftime("%Y-%m-%d %H:%M:%S")
            self.logger.log_hyperparams(
                tracking.run_params(self.cfg, tracking.hydra_choices()) | self.population_params()
            )
            config_file = self.run_dir / "resolved_config.yaml"
            config_file.write_text(OmegaConf.to_yaml(self.cfg, resolve=True))
            self.log_artifact(config_file)
            hydra_folder = self.run_dir / ".hydra"  # config, hydra.yaml and overrides.yaml
            if hydra_folder.is_dir():
                self.log_artifact(hydra_folder)
        self.save_state()

    def population_params(self) -> dict[str, Any]:
        """``agents/roles`` and ``agents/<agent>/params`` (parameter count of each agent)."""
        params: dict[str, Any] = {
            "agents/roles": ",".join(role_name(r) for r in self.population.roles)
        }
        for index, agent in enumerate(self.population.agents):
            name = agent_folder_name(index, agent.role)
            params[f"agents/{name}/params"] = sum(p.numel() for p in agent.parameters())
        return params

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
            # The SFT budget (tokens by demonstration kind, FLOPs) of the arm, for the report.
            budget = {k: v for k, v in result.items() if k.startswith(names.SFT_BUDGET)}
            self.logger.log_metrics(budget, step=0)
        if rank_zero_only.rank == 0:
            self.population.save_pretrained(self.run_dir / "sft", self.lora_base_folder)
        self.state["sft_done"] = True
        self.save_state()

    def evaluate_and_record(self, key: str, step: int | None = None) -> dict[str, float]:
        """Held-out mean, SE and 95% CI over worlds, logged under ``key/`` and kept in the
        run's state; the per-world mean rewards (to pair arms on the same worlds) go to the
        state's ``key_worlds`` and the artifact ``heldout/<key>_worlds.json``."""
        if rank_zero_only.rank != 0:
            return {}
        seeds = self.env.heldout_seeds()[: self.cfg.eval.max_seeds]
        evaluation = evaluate(self.loop, seeds, self.cfg.eval.runs_per_seed, self.cfg.seed)
        metrics = evaluation.metrics | {
            "tokens": float(evaluation.usage.rollout_tokens),
            "flops": evaluation.usage.rollout_flops,
        }
        # At the update where it was measured, on the training curves' axis: before RL at 0,
        # after RL at the number of updates made.
        if step is None:
            step = 0 if key == names.EVAL_BEFORE else len(self.history)
        self.logger.log_metrics({f"{key}/{k}": v for k, v in metrics.items()}, step=step)
        self.state[key] = metrics
        worlds = {str(world): reward for world, reward in evaluation.world_rewards.items()}
        self.state[f"{key}_worlds"] = worlds
        self.save_state()
        heldout = self.run_dir / "heldout"
        heldout.mkdir(exist_ok=True)
        (heldout / f"{key}_worlds.json").write_text(json.dumps(worlds, indent=1) + "\n")
        self.log_artifact(heldout)  # a folder: MLflow keeps it as heldout/<key>_worlds.json
        self.log_transcripts(key, evaluation.episodes)
        if self.credit.reads_memory:  # docs/memory.md: one example tree per evaluation
            self.log_artifact(self.draw_memory_tree(evaluation.episodes, key))
        console.say(
            f"[bidswarm] {key}: held-out reward {metrics['reward/mean']:.2f} "
            f"+- {metrics['reward/se']:.2f} (95% CI {metrics['reward/ci_low']:.2f} .. "
            f"{metrics['reward/ci_high']:.2f}) over {len(seeds)} worlds",
        )
        return metrics

    def fit(self) -> bool:
        """RL: the 4:1 schedule of action and bid updates, checkpointed every
        ``rl.checkpoint_every`` updates (:class:`CrashSafeCheckpoint`); continues from the run's
        last checkpoint.

        Returns whether the schedule is complete (``rl.stop_after`` can end the process early);
        raises :class:`RunInterrupted` after a stop signal, once the update in progress is
        done and checkpointed.
        """
        collector = Collector(
            self.loop, self.cfg.rl, self.credit, self.env.train_seeds(), self.cfg.seed
        )
        module = SwarmModule(self.population, collector, self.cfg.rl, self.cfg.model.temperature)
        checkpoint = CrashSafeCheckpoint(
            self.run_dir / "checkpoints",
            self.cfg.rl.checkpoint_every,
            module.total_updates,
            {"mlflow_run_id": self.state.get("mlflow_run_id")},
        )
        trainer = L.Trainer(
            max_epochs=module.total_updates,
            callbacks=[
                checkpoint,
                UpdateProgress(module.total_updates),
                *self.periodic_evaluation(module.total_updates),
            ],
            enable_checkpointing=True,
            enable_progress_bar=False,
            **self.trainer_kwargs(),
        )
        start = resume_checkpoint(checkpoint.folder)
        trainer.fit(module, ckpt_path=str(start) if start else None)
        if rank_zero_only.rank == 0 and collector.last_forks:
            self.log_fork_transcripts(collector.last_forks)
        self.state["rl_world_size"] = trainer.world_size
        self.save_state()
        self.history = module.history
        if checkpoint.stop_signal is not None:
            raise RunInterrupted(checkpoint.stop_signal, checkpoint.last, checkpoint.updates_saved)
        return module.finished

    def finish(self) -> None:
        """Save the trained agents, plot, and print where to look."""
        if rank_zero_only.rank != 0:
            return
        self.population.save_pretrained(self.run_dir / "final", self.lora_base_folder)
        name = tracking.run_name()
        sft_flops = self.sft_flops()
        rl_flops = self.history[-1]["flops/total"] if self.history else 0.0
        evaluations = {
            f"held-out {label}": (
                sft_flops + at,
                self.state[key]["reward/mean"],
                self.state[key]["reward/se"],
            )
            for key, label, at in (
                (names.EVAL_BEFORE, "before RL", 0.0),
                (names.EVAL_AFTER, "after RL", rl_flops),
            )
            if key in self.state
        }
        plots = [
            plot_reward_vs_flops(
                self.history, self.run_dir / "reward_vs_flops.png", name, sft_flops, evaluations
            ),
            plot_participation(self.history, self.run_dir / "participation.png", name),
        ]
        for path in plots:
            self.log_artifact(path)
        self.log_artifact(self.run_dir / "state.json")
        self.log_agents(self.run_dir / "final")
        self.print_summary()

    # -- helpers -------------------------------------------------------------------------------
    def periodic_evaluation(self, total_updates: int) -> list[L.Callback]:
        """``eval.every``: the callback that evaluates during RL (none when unset)."""
        if not self.cfg.eval.enabled or self.cfg.eval.every is None:
            return []
        return [PeriodicEvaluation(self, self.cfg.eval.every, total_updates)]

    def sft_flops(self) -> float:
        """SFT's training FLOPs (``sft/flops``, :func:`bidswarm.lit.sft.sft_budget`; 0 without
        SFT)."""
        return self.state.get("sft", {}).get(names.SFT_FLOPS, 0.0)

    @property
    def lora_base_folder(self) -> Path:
        """Where LoRA agents' frozen base model is written, once per run (``base/``): the
        run's populations (``sft/``, ``final/``) name it instead of each holding a copy."""
        return self.run_dir / LORA_BASE_FOLDER

    def log_agents(self, folder: Path) -> None:
        """The trained agents (``final/``, with the run's LoRA ``base/`` it names) as the
        artifacts ``final/`` (and ``base/``), unless larger than
        :data:`AGENTS_ARTIFACT_LIMIT_MB` (then the tag ``bidswarm.final`` says where they are)."""
        folders = [folder]
        if self.population.is_lora:
            folders.append(self.lora_base_folder)
        files = [f for part in folders for f in part.rglob("*") if f.is_file()]
        size_mb = sum(f.stat().st_size for f in files) / 2**20
        if size_mb <= AGENTS_ARTIFACT_LIMIT_MB:
            for part in folders:
                self.log_artifact(part)
        elif isinstance(self.logger, MLFlowLogger):
            limit = AGENTS_ARTIFACT_LIMIT_MB
            note = f"{folder.resolve()} ({size_mb:.0f} MB, over the {limit} MB limit)"
            self.logger.experiment.set_tag(self.logger.run_id, "bidswarm.final", note)

    def log_fork_transcripts(self, forks: list[ForkExample]) -> None:
        """A few forks of the last bid update, the recorded branch against the counterfactual:
        ``transcripts/forks.html`` and one trace per branch (tagged ``bidswarm.forks``)."""
        written = transcripts.fork_transcripts(forks, self.loop.swarm.roles)
        self.write_transcripts(
            "forks", "forks of the last bid update", written, {"bidswarm.forks": "last bid update"}
        )

    def write_transcripts(
        self, name: str, heading: str, written: list[transcripts.Transcript], tags: dict[str, str]
    ) -> None:
        """``transcripts/<name>.html`` and one MLflow trace per transcript (with ``tags``)."""
        folder = self.run_dir / "transcripts"
        folder.mkdir(exist_ok=True)
        (folder / f"{name}.html").write_text(transcripts.render_html(heading, written))
        self.log_artifact(folder)
        if isinstance(self.logger, MLFlowLogger):
            import mlflow

            uri = tracking.tracking_uri(self.cfg.logger.tracking_uri)
            if mlflow.get_tracking_uri() != uri:
                mlflow.set_tracking_uri(uri)
            transcripts.log_traces(self.logger.experiment_id, self.logger.run_id, written, tags)

    def log_transcripts(self, key: str, episodes: list[Episode]) -> None:
        """A few of the evaluation's episodes, step by step: ``transcripts/<key>.html`` and one
        MLflow trace per episode (tagged ``bidswarm.evaluation=<key>``)."""
        sampled = transcripts.sample_episodes(
            episodes, transcripts.EPISODES_PER_EVALUATION, self.cfg.seed
        )
        levels = self.loop.swarm.bid_levels
        written = [
            transcripts.transcript(
                episode,
                f"{key} episode {n}",
                self.loop.swarm.roles,
                transcripts.credits_of(episode, self.credit, levels, self.cfg.seed),
            )
            for n, episode in enumerate(sampled)
        ]
        heading = f"{key}: sampled held-out episodes"
        self.write_transcripts(key, heading, written, {"bidswarm.evaluation": key})

    def draw_memory_tree(self, episodes: list[Episode], key: str) -> Path:
        """``memory_tree_<key>.png``: the contribution tree of one evaluation step."""
        return draw_example_tree(
            episodes,
            self.credit,
            self.loop.swarm.roles,
            self.loop.swarm.bid_levels,
            self.run_dir / f"memory_tree_{key}.png",
        )

    def trainer_kwargs(self) -> dict[str, Any]:
        t = self.cfg.trainer
        # Lightning's SLURM auto-requeue saves a checkpoint from inside its signal handler, in
        # the middle of an update; bidswarm checkpoints at the next update boundary instead.
        plugins = [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else None
        return dict(
            accelerator=t.accelerator,
            devices=t.devices,
            num_nodes=t.num_nodes,
            strategy=build_strategy(t.strategy, self.run_dir),
            precision=t.precision,
            deterministic=t.deterministic,
            logger=self.logger,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            log_every_n_steps=1,
            use_distributed_sampler=False,
            default_root_dir=str(self.run_dir),
            plugins=plugins,
        )

    def save_state(self) -> None:
        if rank_zero_only.rank == 0:
            write_atomically(self.run_dir / "state.json", json.dumps(self.state, indent=1))

    def log_artifact(self, path: Path) -> None:
        if isinstance(self.logger, MLFlowLogger) and rank_zero_only.rank == 0:
            self.logger.experiment.log_artifact(self.logger.run_id, str(path))

    def close(self, status: str) -> None:
        """End the tracking run as ``FINISHED``, ``FAILED`` or ``KILLED`` (a stop signal)."""
        if isinstance(self.logger, RunLogger):
            self.logger.stop_system_metrics()
        if (self.run_dir / "train.log").is_file():  # Hydra's job log: ours and the libraries'
            self.log_artifact(self.run_dir / "train.log")
        if isinstance(self.logger, MLFlowLogger):
            self.logger.finalize(status)  # MLflow's own status names
        else:
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
            url = tracking.run_url(uri, self.logger.experiment_id, self.logger.run_id)
            serve = tracking.ui_command(uri)
            lines.append(
                f"[bidswarm] MLflow run: {url}" + (f"  (after `{serve}`)" if serve else "")
            )
        console.say("\n".join(lines))
