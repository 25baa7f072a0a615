"""One training run as named phases: start, cold start, evaluate, fit, finish (``bidswarm.train``
calls them in this order, skipping those the run's ``state.json`` says are done)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import Logger, MLFlowLogger
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from bidswarm import console, tracking, transcripts
from bidswarm import metric_names as names
from bidswarm.agents.population import LORA_BASE_FOLDER, Population
from bidswarm.algorithms.credit import CreditRule, make_credit
from bidswarm.coordination import make_coordination
from bidswarm.envs import make_env
from bidswarm.envs.base import TextEnv
from bidswarm.envs.experts import Demonstration
from bidswarm.lit.callbacks import (
    CrashSafeCheckpoint,
    RunInterrupted,
    UpdateProgress,
    resume_checkpoint,
)
from bidswarm.lit.collectives import gather_on_process_zero, process_group
from bidswarm.lit.sft import bid_parse_rate, run_sft
from bidswarm.lit.strategy import build_strategy
from bidswarm.lit.swarm_module import SwarmModule
from bidswarm.plots import plot_calibration, plot_participation, plot_reward_vs_flops
from bidswarm.rollout.collector import Collector
from bidswarm.rollout.evaluation import Evaluation, play_batches, summarize_evaluation
from bidswarm.rollout.forks import ForkExample
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.memory_credit import draw_example_tree
from bidswarm.rollout.records import Episode
from bidswarm.run import recording
from bidswarm.run.build import build_population, build_rollout_loop
from bidswarm.run.demonstrations import demonstration_worlds, start_demonstrations
from bidswarm.run.recording import RunLogger, make_logger
from bidswarm.run.references import play_references, record_references
from bidswarm.run.relabel import (
    RELABEL,
    RELABEL_DECISIONS,
    RoundTraining,
    relabel_bids,
    relabel_run_decisions,
)
from bidswarm.run.resume import load_state, run_folder, write_atomically


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
    """The run's credit rule, built once: the collector's, the transcripts' and the memory
    tree's."""
    state: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)

    # -- start ---------------------------------------------------------------------------------
    @classmethod
    def start(cls, cfg: DictConfig) -> Run:
        """Build the run of ``cfg`` in its folder (a new one, or the run it continues).

        ``cfg`` has passed :func:`bidswarm.run.preflight.preflight` (``resume=``,
        ``init_from=``, values, machine, tracking store): ``bidswarm.train.main`` sees to it.
        """
        run_dir = run_folder(cfg)
        run_dir.mkdir(parents=True, exist_ok=True)
        state = load_state(run_dir)
        env = make_env(OmegaConf.to_object(cfg.task))
        rule = make_coordination(OmegaConf.to_object(cfg.coordination))
        demos, action_limit_demos = start_demonstrations(env, cfg, rule)
        population = build_population(cfg, env, run_dir, state, demos)
        loop = build_rollout_loop(cfg, population, action_limit_demonstrations=action_limit_demos)
        logger = make_logger(cfg, run_dir, state.get("mlflow_run_id"))
        credit = make_credit(OmegaConf.to_object(cfg.credit))
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
                tracking.run_params(self.cfg, tracking.hydra_choices())
                | recording.population_params(self.population)
                | {"system/torch_threads": torch.get_num_threads()}
            )
            config_file = self.run_dir / "resolved_config.yaml"
            config_file.write_text(OmegaConf.to_yaml(self.cfg, resolve=True))
            self.log_artifact(config_file)
            hydra_folder = self.run_dir / ".hydra"  # config, hydra.yaml and overrides.yaml
            if hydra_folder.is_dir():
                self.log_artifact(hydra_folder)
        self.save_state()

    # -- phases --------------------------------------------------------------------------------
    def cold_start(self) -> None:
        """SFT on each role's own expert demonstrations (docs/method.md section 5), then save."""
        if self.cfg.sft.enabled:
            parse_rate_before = self.bid_parse_rate()
            result = run_sft(
                self.population,
                self.demonstrations,
                self.loop.swarm.prompts,
                self.cfg.sft,
                trainer_kwargs=self.trainer_kwargs(),
                logger=self.logger,
                seed=self.cfg.seed,
                progress=True,
            )
            if parse_rate_before is not None:
                result[f"{names.SFT_BID_PARSE_RATE}/before"] = parse_rate_before
                result[f"{names.SFT_BID_PARSE_RATE}/after"] = self.bid_parse_rate()
            if self.cfg.bids.relabel_rounds and self.loop.coordination.asks_bids:
                relabelled = self.relabel()
                result |= relabelled
                result[names.SFT_FLOPS] += relabelled[f"{RELABEL}/flops"]
            if self.cfg.coordination.get("relabel_rounds", 0):
                relabelled = relabel_run_decisions(
                    self.loop, self.env, self.cfg, self.demonstrations
                )
                result |= relabelled
                result[names.SFT_FLOPS] += relabelled[f"{RELABEL_DECISIONS}/flops"]
            self.state["sft"] = result
            # The SFT budget (tokens by demonstration kind, FLOPs) of the arm, for the report,
            # and how many of the agents' bid replies parse before and after SFT.
            logged = (*names.SFT_BUDGET, names.SFT_DECISION_TOKENS, names.SFT_BID_PARSE_RATE)
            logged += (RELABEL, RELABEL_DECISIONS)
            self.logger.log_metrics(
                {k: v for k, v in result.items() if k.startswith(logged)}, step=0
            )
        if rank_zero_only.rank == 0:
            self.population.save_pretrained(self.run_dir / "sft", self.lora_base_folder)
        self.state["sft_done"] = True
        self.save_state()

    def relabel(self) -> dict[str, float]:
        """``bids.relabel_rounds`` on the demonstration worlds (``run/relabel.py``), whose
        FLOPs (``sft/relabel/flops``) join the SFT budget; under a rule that reads no bids
        there is no bid channel to label and the rounds do not run (their epoch on the
        demonstrations would be SFT the other rules do not get)."""
        return relabel_bids(
            self.loop,
            self.demonstrations,
            demonstration_worlds(self.env, self.cfg),
            self.cfg.bids.relabel_rounds,
            RoundTraining.of_run(self.cfg, self.cfg.bids.relabel_lr),
            self.cfg.seed,
        )

    def bid_parse_rate(self) -> float | None:
        """The share of the agents' sampled bid replies that parse (:func:`bid_parse_rate`)."""
        swarm = self.loop.swarm
        return bid_parse_rate(
            swarm.bid_population,
            self.demonstrations,
            swarm.prompts,
            swarm.max_bid_tokens,
            swarm.temperature,
            self.cfg.seed,
            swarm.engine,
        )

    def evaluate_and_record(self, key: str, step: int | None = None) -> dict[str, float]:
        """Held-out mean, SE and 95% CI over worlds, logged under ``key/`` and kept in the
        run's state; the per-world mean rewards (to pair arms on the same worlds) go to the
        state's ``key_worlds`` and the artifact ``heldout/<key>_worlds.json``, the per-world
        pass@k of task success to ``heldout/<key>_pass_at_<k>_worlds.json``. Returns the
        metrics on process 0, nothing on the others.

        Every process of the run's process group plays its share of the evaluation's batches
        (``eval.batch_size`` episodes each) and process 0 gathers them
        (:func:`evaluate_over_processes`): the numbers of one process playing them all, while
        the other processes no longer wait idle for process 0 in their next collective."""
        evaluation = self.held_out(self.loop, self.cfg.eval.regret_states)
        references = play_references(self.loop, self.cfg.eval.reference_rules, self.held_out)
        if evaluation is None:
            return {}
        metrics = evaluation.metrics | {
            "tokens": float(evaluation.usage.rollout_tokens),
            "flops": evaluation.usage.rollout_flops,
        }
        # At the update where it was measured, on the training curves' axis: before RL at 0,
        # after RL at the number of updates made.
        at = 0 if key == names.EVAL_BEFORE else (len(self.history) if step is None else step)
        heldout = self.run_dir / "heldout"
        metrics |= record_references(
            self.logger, self.state, key, evaluation, references, at, heldout
        )
        self.logger.log_metrics({f"{key}/{k}": v for k, v in metrics.items()}, step=at)
        self.state[key] = metrics
        worlds = {str(world): reward for world, reward in evaluation.world_rewards.items()}
        self.state[f"{key}_worlds"] = worlds
        self.save_state()
        evaluation.write_worlds(heldout, key)
        self.log_artifact(heldout)  # a folder: MLflow keeps it as heldout/<key>*_worlds.json
        self.log_transcripts(key, evaluation.episodes)
        if self.credit.reads_memory:  # docs/memory.md: one example tree per evaluation
            self.log_artifact(self.draw_memory_tree(evaluation.episodes, key))
        console.say(
            f"[bidswarm] {key}: held-out reward {metrics['reward/mean']:.2f} "
            f"+- {metrics['reward/se']:.2f} (95% CI {metrics['reward/ci_low']:.2f} .. "
            f"{metrics['reward/ci_high']:.2f}) over {len(evaluation.world_rewards)} worlds",
        )
        return metrics

    def held_out(self, loop: RolloutLoop, regret_states: int = 0) -> Evaluation | None:
        """``loop`` on the held-out worlds (``eval``), over the run's processes, with the
        who-should-act regret at ``regret_states`` states per world; None on the processes but
        the first."""
        return evaluate_over_processes(
            loop,
            self.env.heldout_seeds()[: self.cfg.eval.max_seeds],
            self.cfg.eval.runs_per_seed,
            self.cfg.seed,
            self.cfg.eval.batch_size,
            progress=True,
            mass_probe_prompts=self.cfg.bids.mass_probe_prompts,
            regret_states=regret_states,
        )

    def fit(self) -> bool:
        """RL: the 4:1 schedule of action and bid updates, checkpointed every
        ``rl.checkpoint_every`` updates (:class:`CrashSafeCheckpoint`); continues from the run's
        last checkpoint.

        Returns whether the schedule is complete (``rl.stop_after`` can end the process early);
        raises :class:`RunInterrupted` after a stop signal, once the update in progress is
        done and checkpointed.
        """
        if self.cfg.rl.cycles == 0:  # SFT only: nothing to fit
            return True
        bids = OmegaConf.to_object(self.cfg.bids)
        collector = Collector(
            self.loop, self.cfg.rl, self.credit, self.env.train_seeds(), self.cfg.seed, bids
        )
        module = SwarmModule(
            self.population, collector, self.cfg.rl, self.cfg.model.temperature, bids
        )
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
        if rank_zero_only.rank == 0 and collector.last_calibration:
            top = max(self.loop.swarm.bid_levels)
            path = self.run_dir / "calibration.png"
            self.log_artifact(plot_calibration(collector.last_calibration, path, top))
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
        lora_base = self.lora_base_folder if self.population.is_lora else None
        recording.log_agents(self.logger, self.run_dir / "final", lora_base)
        self.print_summary()

    def close(self, status: str) -> None:
        """Shut the rollout engine down and end the tracking run as ``FINISHED``, ``FAILED``
        or ``KILLED`` (a stop signal)."""
        self.loop.swarm.engine.close()
        recording.end_tracking(self.logger, self.run_dir, status)

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

    def log_transcripts(self, key: str, episodes: list[Episode]) -> None:
        """A few of the evaluation's episodes, step by step: ``transcripts/<key>.html`` and one
        MLflow trace per episode (tagged ``bidswarm.evaluation=<key>``)."""
        written = recording.evaluation_transcripts(
            key, episodes, self.loop, self.credit, self.cfg.seed
        )
        heading = f"{key}: sampled held-out episodes"
        tags = {"bidswarm.evaluation": key}
        recording.write_transcripts(
            self.logger, self.cfg, self.run_dir, key, heading, written, tags
        )

    def draw_memory_tree(self, episodes: list[Episode], key: str) -> Path:
        """``memory_tree_<key>.png``: the contribution tree of one evaluation step."""
        return draw_example_tree(
            episodes,
            self.credit,
            self.loop.swarm.roles,
            self.loop.swarm.bid_levels,
            self.run_dir / f"memory_tree_{key}.png",
        )

    def log_fork_transcripts(self, forks: list[ForkExample]) -> None:
        """A few forks of the last bid update, the recorded branch against the counterfactual:
        ``transcripts/forks.html`` and one trace per branch (tagged ``bidswarm.forks``)."""
        written = transcripts.fork_transcripts(forks, self.loop.swarm.roles)
        heading = "forks of the last bid update"
        tags = {"bidswarm.forks": "last bid update"}
        recording.write_transcripts(
            self.logger, self.cfg, self.run_dir, "forks", heading, written, tags
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
            strategy=build_strategy(
                t.strategy, self.run_dir, t.gradient_clipping, t.collective_timeout_s
            ),
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
        recording.log_artifact(self.logger, path)

    def print_summary(self) -> None:
        """Where the run is and what it reached (:func:`recording.summary`)."""
        console.say(
            recording.summary(self.cfg, self.run_dir, self.state, self.logger, self.history)
        )


def evaluate_over_processes(
    loop: RolloutLoop,
    seeds: list[int],
    runs_per_seed: int,
    seed: int,
    batch_size: int,
    progress: bool = False,
    mass_probe_prompts: int = 0,
    regret_states: int = 0,
) -> Evaluation | None:
    """The held-out evaluation of ``seeds`` x ``runs_per_seed`` (``rollout/evaluation.py``), its
    batches of ``batch_size`` spread over the run's processes (``lit/collectives.py``): the
    whole evaluation on process 0, equal to one process playing every batch; None on the
    others. Before Lightning has made the process group (a run without SFT evaluates before
    RL's ``fit`` starts the other processes), process 0 plays every batch. ``progress``: process
    0's bar over its decisions (:func:`play_batches`)."""
    rank, processes = process_group()
    if rank != 0 and processes == 1:
        return None
    played = play_batches(
        loop, seeds, runs_per_seed, seed, batch_size, rank, processes, progress, regret_states
    )
    if processes > 1:
        played = played.without_token_ids()
    parts = gather_on_process_zero(played)
    if parts is None:
        return None
    return summarize_evaluation(parts, loop, runs_per_seed, mass_probe_prompts)


class PeriodicEvaluation(L.Callback):
    """Held-out evaluation every ``every`` RL updates (``eval.every``), logged as
    ``eval_during/*`` at the number of updates made; not after the last update, which
    ``eval_after`` measures. It calls back into :meth:`Run.evaluate_and_record`, so it lives
    beside :class:`Run`."""

    def __init__(self, run: Run, every: int, total_updates: int):
        self.run = run
        self.every = every
        self.total_updates = total_updates

    def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        updates = trainer.current_epoch + 1
        if updates % self.every == 0 and updates < self.total_updates:
            self.run.evaluate_and_record(names.EVAL_DURING, step=updates)
