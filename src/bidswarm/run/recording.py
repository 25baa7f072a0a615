"""What a run records for its readers besides the metrics its phases log: the MLflow logger
(:class:`RunLogger`), artifacts, transcripts, the trained agents, the
run's end status and the summary it prints (docs/mlflow.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig

from bidswarm import metric_names as names
from bidswarm import tracking, transcripts
from bidswarm.agents.population import Population, agent_folder_name
from bidswarm.algorithms.credit import CreditRule
from bidswarm.envs.base import role_name
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.market import market_warnings
from bidswarm.rollout.records import Episode


class RunLogger(MLFlowLogger):
    """Lightning's MLflow logger without Lightning's bookkeeping metric ``epoch`` (an update
    is a step: ``epoch`` would repeat it), sampling MLflow's system metrics (``system/*``:
    CPU, memory, GPU) while :meth:`start_system_metrics` ... :meth:`stop_system_metrics`.

    A resumed run (``run_id`` of the run it continues) logs each metric once per step: it redoes
    what came after its last checkpoint (updates, an evaluation), whose metrics the killed
    process may already have logged, so a metric is not logged again at a step at or before the
    last step the run already holds for it. The values kept are the first ones (a resumed run on
    CPU replays them exactly; on a GPU they may differ in the last bits)."""

    BOOKKEEPING = ("epoch",)
    SYSTEM_METRICS_INTERVAL_S = 5
    RUN_END_STATUSES = ("FINISHED", "FAILED", "KILLED")
    """What :func:`end_tracking` ends the run with; Lightning's own ``finalize("success")`` at
    the end of each fit (SFT, then RL) would mark the run finished while it goes on."""

    _system_monitor: Any = None

    def __init__(self, *args, run_id: str | None = None, **kwargs) -> None:
        super().__init__(*args, run_id=run_id, **kwargs)
        self._last_logged_step: dict[str, int] | None = None if run_id is None else {}
        """Per metric, the last step the continued run held when it was resumed (None: a new
        run, which holds none); read from MLflow once per metric, when it is first logged."""

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        kept = {key: value for key, value in metrics.items() if key not in self.BOOKKEEPING}
        if self._last_logged_step is not None and step is not None:
            kept = {key: value for key, value in kept.items() if step > self._logged_until(key)}
        if kept:
            super().log_metrics(kept, step)

    def _logged_until(self, key: str) -> int:
        """The last step of ``key`` in the continued run before this process logged (-1: none)."""
        if key not in self._last_logged_step:
            history = self.experiment.get_metric_history(self.run_id, key)
            self._last_logged_step[key] = max((m.step for m in history), default=-1)
        return self._last_logged_step[key]

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
    uri = tracking.tracking_uri(cfg.logger.tracking_uri)
    tags = {
        "bidswarm.run_dir": str(run_dir.resolve()),
        **tracking.provenance_tags(),
    }
    parent = tracking.sweep_parent_run(uri, cfg.logger.experiment_name) if run_id is None else None
    if parent is not None:
        tags["mlflow.parentRunId"] = parent
    # Made here, not by the logger: artifacts under outputs/, the UI's model-training view.
    tracking.open_experiment(uri, cfg.logger.experiment_name)
    return RunLogger(
        experiment_name=cfg.logger.experiment_name,
        run_name=tracking.run_name(),
        tracking_uri=uri,
        tags=tags,
        run_id=run_id,
    )


def log_artifact(logger: Logger, path: Path) -> None:
    """``path`` (a file or a folder) as an artifact of the MLflow run (rank 0; none with CSV)."""
    if isinstance(logger, MLFlowLogger) and rank_zero_only.rank == 0:
        logger.experiment.log_artifact(logger.run_id, str(path))


def population_params(population: Population) -> dict[str, Any]:
    """``agents/roles`` and ``agents/<agent>/params`` (parameter count of each agent)."""
    params: dict[str, Any] = {"agents/roles": ",".join(role_name(r) for r in population.roles)}
    for index, agent in enumerate(population.agents):
        name = agent_folder_name(index, agent.role)
        params[f"agents/{name}/params"] = sum(p.numel() for p in agent.parameters())
    return params


AGENTS_ARTIFACT_LIMIT_MB = 500
"""Trained agents up to this size are copied into the MLflow artifact store (a tiny population
is ~2 MB, SmolLM2-135M x 3 ~1.6 GB): larger ones stay in the run folder only."""


def log_agents(logger: Logger, folder: Path, lora_base_folder: Path | None) -> None:
    """The trained agents (``folder``: ``final/``, with the run's LoRA ``base/`` it names when
    ``lora_base_folder`` is given) as the artifacts ``final/`` (and ``base/``), unless larger
    than :data:`AGENTS_ARTIFACT_LIMIT_MB` (then the tag ``bidswarm.final`` says where they
    are)."""
    folders = [folder]
    if lora_base_folder is not None:
        folders.append(lora_base_folder)
    files = [f for part in folders for f in part.rglob("*") if f.is_file()]
    size_mb = sum(f.stat().st_size for f in files) / 2**20
    if size_mb <= AGENTS_ARTIFACT_LIMIT_MB:
        for part in folders:
            log_artifact(logger, part)
    elif isinstance(logger, MLFlowLogger):
        limit = AGENTS_ARTIFACT_LIMIT_MB
        note = f"{folder.resolve()} ({size_mb:.0f} MB, over the {limit} MB limit)"
        logger.experiment.set_tag(logger.run_id, "bidswarm.final", note)


def write_transcripts(
    logger: Logger,
    cfg: DictConfig,
    run_dir: Path,
    name: str,
    heading: str,
    written: list[transcripts.Transcript],
    tags: dict[str, str],
) -> None:
    """``transcripts/<name>.html`` and one MLflow trace per transcript (with ``tags``)."""
    folder = run_dir / "transcripts"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.html").write_text(transcripts.render_html(heading, written))
    log_artifact(logger, folder)
    if isinstance(logger, MLFlowLogger):
        import mlflow

        uri = tracking.tracking_uri(cfg.logger.tracking_uri)
        if mlflow.get_tracking_uri() != uri:
            mlflow.set_tracking_uri(uri)
        transcripts.log_traces(logger.experiment_id, logger.run_id, written, tags)


def evaluation_transcripts(
    key: str, episodes: list[Episode], loop: RolloutLoop, rule: CreditRule, seed: int
) -> list[transcripts.Transcript]:
    """A few of the evaluation ``key``'s episodes (drawn with ``seed``), step by step, with the
    credit ``rule`` gives each acting step."""
    sampled = transcripts.sample_episodes(episodes, transcripts.EPISODES_PER_EVALUATION, seed)
    levels = loop.swarm.bid_levels
    return [
        transcripts.transcript(
            episode,
            f"{key} episode {n}",
            loop.swarm.roles,
            transcripts.credits_of(episode, rule, levels, seed),
        )
        for n, episode in enumerate(sampled)
    ]


def end_tracking(logger: Logger, run_dir: Path, status: str) -> None:
    """End the tracking run as ``FINISHED``, ``FAILED`` or ``KILLED`` (a stop signal), with
    Hydra's job log ``train.log`` as an artifact."""
    if isinstance(logger, RunLogger):
        logger.stop_system_metrics()
    if (run_dir / "train.log").is_file():  # Hydra's job log: ours and the libraries'
        log_artifact(logger, run_dir / "train.log")
    if isinstance(logger, MLFlowLogger):
        logger.finalize(status)  # MLflow's own status names
    else:
        logger.finalize("success" if status == "FINISHED" else "failed")


def market_lines(metrics: dict[str, float], label: str) -> list[str]:
    """The market's health in a held-out evaluation's ``metrics`` (``rollout/market.py``), a
    line or two, and a warning where one agent won almost every contest."""
    agree = metrics.get(names.EXPERT_OWNER_AGREEMENT)
    if agree is None and names.SKIP_FRAC not in metrics:
        return []
    parts = []
    if agree is not None:
        on = metrics.get(f"{names.EXPERT_OWNER_AGREEMENT}/on_path")
        off = metrics.get(f"{names.EXPERT_OWNER_AGREEMENT}/off_path")
        where = ", ".join(
            f"{name} {value:.0%}"
            for name, value in (("on its path", on), ("off", off))
            if value is not None
        )
        parts.append(f"actor = expert's choice {agree:.0%}" + (f" ({where})" if where else ""))
    for name, title, fmt in (
        (names.VALID_LEVEL_MASS, "valid bid mass", ".2f"),
        (names.BID_PARSE_RATE, "bids parsed", ".2f"),
    ):
        roles = {k.rsplit("/", 1)[1]: v for k, v in metrics.items() if k.startswith(f"{name}/")}
        if roles:
            parts.append(f"{title} " + " ".join(f"{r} {v:{fmt}}" for r, v in sorted(roles.items())))
    if names.TOP_TIE_FRAC in metrics:
        parts.append(f"top ties {metrics[names.TOP_TIE_FRAC]:.0%}")
    if names.SKIP_FRAC in metrics:
        parts.append(
            f"skipped {metrics[names.SKIP_FRAC]:.0%} (longest run "
            f"{metrics.get(names.SKIP_RUN_MAX, 0):.0f})"
        )
    if names.WINNER_ENTROPY_BITS in metrics:
        parts.append(f"who acts {metrics[names.WINNER_ENTROPY_BITS]:.2f} bits")
    if f"{names.REGRET}/mean" in metrics:
        parts.append(
            f"who-should-act regret {metrics[f'{names.REGRET}/mean']:.2f} (95% CI "
            f"{metrics[f'{names.REGRET}/ci_low']:.2f} .. {metrics[f'{names.REGRET}/ci_high']:.2f})"
            f" of the best agent's {metrics.get(f'{names.REGRET}/oracle', float('nan')):.2f}"
        )
    lines = [f"[bidswarm] market {label}: " + "; ".join(parts)]
    for key in sorted(k for k in metrics if k.startswith("gap_to_") and k.endswith("/mean")):
        rule = key[len("gap_to_") : -len("/mean")]
        low, high = metrics[f"gap_to_{rule}/ci_low"], metrics[f"gap_to_{rule}/ci_high"]
        lines.append(
            f"[bidswarm]   the same agents under coordination={rule}: "
            f"{metrics[key]:+.2f} held-out reward (95% CI {low:+.2f} .. {high:+.2f})"
        )
    lines += [f"[bidswarm]   warning: {w}" for w in market_warnings(metrics)]
    return lines


def summary(
    cfg: DictConfig,
    run_dir: Path,
    state: dict[str, Any],
    logger: Logger,
    history: list[dict[str, float]] = (),
) -> str:
    """Where the run is; the training reward of each RL update (``history``, its logged
    metrics: the mean over the update's training worlds); held-out reward before and after RL,
    and after RL minus before RL paired on the same held-out worlds (95% CI, verdict); the
    MLflow run's address."""
    from bidswarm.statistics import paired_difference

    before = state.get("eval_before", {}).get("reward/mean")
    after = state.get("eval_after", {}).get("reward/mean")
    lines = ["", f"[bidswarm] run folder: {run_dir}"]
    if history:
        rewards = ", ".join(
            f"{m['reward/mean']:.2f}" + (" (bid)" if m.get(names.UPDATE_IS_BID) else "")
            for m in history
        )
        lines.append(f"[bidswarm] training reward per RL update (mean over its worlds): {rewards}")
    if before is not None:
        lines.append(f"[bidswarm] held-out reward before RL (after SFT): {before:.2f}")
    if after is not None:
        result = state["eval_after"]
        trained = "after RL" if cfg.rl.cycles else "after SFT only (rl.cycles=0)"
        line = f"[bidswarm] held-out reward {trained}: {after:.2f} +- {result['reward/se']:.2f}"
        if "reward/ci_low" in result:  # absent from runs evaluated before CIs existed
            line += f" (95% CI {result['reward/ci_low']:.2f} .. {result['reward/ci_high']:.2f})"
        lines.append(line)
    worlds_before = state.get("eval_before_worlds")
    worlds_after = state.get("eval_after_worlds")
    if worlds_before and worlds_after:
        diff = paired_difference(worlds_after, worlds_before, "after RL", "before RL")
        lines.append(
            f"[bidswarm] after RL - before RL on the same {diff.n} held-out worlds: "
            f"{diff.mean:+.2f} (95% CI {diff.ci_low:+.2f} .. {diff.ci_high:+.2f}): "
            f"{diff.verdict}"
        )
    after = "after RL" if cfg.rl.cycles else "after SFT only"
    for key, label in (("eval_before", "after SFT"), ("eval_after", after)):
        if key in state:
            lines += market_lines(state[key], label)
    if isinstance(logger, MLFlowLogger):
        uri = tracking.tracking_uri(cfg.logger.tracking_uri)
        url = tracking.run_url(uri, logger.experiment_id, logger.run_id)
        serve = tracking.ui_command(uri)
        lines.append(f"[bidswarm] MLflow run: {url}" + (f"  (after `{serve}`)" if serve else ""))
    return "\n".join(lines)
