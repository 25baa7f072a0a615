"""Evaluate a trained swarm on held-out worlds with any coordination rule; log mean +- SE
and the 95% CI over worlds, and the per-world mean rewards (to pair arms).

    python -m bidswarm.evaluate run_dir=outputs/runs/<day>/<time>                 # as trained
    python -m bidswarm.evaluate run_dir=... coordination=round_robin              # swap the rule
    python -m bidswarm.evaluate run_dir=... bids_from=sft                          # mix checkpoints
    python -m bidswarm.evaluate -m run_dir=... coordination=auction,round_robin,graph_of_agents

``task``, ``model`` and ``coordination`` default to the training run's own (its
``resolved_config.yaml``); pass a group (``coordination=agentnet``, ``task=crafting_torch``) to
change one. The bid and action policies may come from different populations of the run
(``final``, ``sft``) or any saved population folder.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import MISSING, DictConfig, OmegaConf

from bidswarm import console, tracking
from bidswarm.agents.population import Population
from bidswarm.config import (
    CoordinationConfig,
    LoggerConfig,
    ModelConfig,
    register_configs,
    unknown_keys,
)
from bidswarm.coordination import RULES
from bidswarm.coordination.bid_readers import BidsConfig
from bidswarm.envs import TASKS, env_class
from bidswarm.envs.base import MONOLITHIC
from bidswarm.rollout.evaluation import evaluate
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.run.build import build_rollout_loop
from bidswarm.run.threads import threads_per_job

CHECKPOINTS = ("final", "sft")
"""Populations every finished training run folder holds (after RL, after the cold start)."""


@dataclass
class EvaluateConfig:
    """The root of ``conf/evaluate.yaml``; ``task``/``model``/``coordination`` None: the run's."""

    run_dir: str = MISSING
    bids_from: str = "final"
    """``final``, ``sft`` (populations in ``run_dir``) or the path of a saved population."""
    actions_from: str = "final"
    runs_per_seed: int = 3
    max_seeds: int | None = None
    pass_k: int | None = None
    """Report pass@1..pass@k of task success (unbiased estimator, 95% CI over worlds); the
    worlds are played max(runs_per_seed, pass_k) times (None: pass@1..runs_per_seed)."""
    replicas: int = 1
    """[ours] Copies of each trained agent (population scaling without training: 3 agents x
    replicas); the copies are separate agents in the coordination rule."""
    dropout: float = 0.0
    """[ours] Probability that each agent is absent at each decision step (it neither bids nor
    acts; the rule routes around it; a monolithic agent's absence wastes the step)."""
    batch_size: int = 64
    """Episodes played in lock-step at once."""
    regret_states: int = 1
    """[ours] States per world where every agent acts in a fork: the rule's who-should-act
    regret against that one-step oracle (``eval/auction/regret/*``); 0: not measured."""
    seed: int = 0
    device: str = "cpu"
    task: Any = None
    model: Any = None
    coordination: Any = None
    bids: Any = None
    """The bid channel (``conf/bids/``); None: the run's (its reader and prompts must be those
    it was trained with; ``+bids.eval_temperature=...`` changes only the evaluation's, and
    ``+bids.balanced=true`` reads the same trained bids balanced)."""
    logger: LoggerConfig = MISSING
    verbose: bool = False
    """Show the libraries' console output too (otherwise it goes to the job's log file only)."""
    output_dir: str = "${hydra:runtime.output_dir}"


def register_evaluate_config() -> None:
    register_configs()
    ConfigStore.instance().store(name="evaluate_schema", node=EvaluateConfig)


register_evaluate_config()


def population_folder(run_dir: Path, source: str) -> Path:
    """``final`` / ``sft`` inside the run folder, or ``source`` itself as a path."""
    folder = run_dir / source if source in CHECKPOINTS else Path(source)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"no saved population at {folder} (from {source!r}); a finished training run "
            f"folder holds {' and '.join(CHECKPOINTS)}/"
        )
    return folder


def resolve_from_run(cfg: DictConfig) -> DictConfig:
    """The evaluation config with ``task``/``model``/``coordination``/``bids`` filled and typed.

    A group left at None takes the training run's section; keys given without the group (a
    section without ``name``: ``+model.engine=vllm``) change the training run's section; every
    section is checked against its schema so a wrong key fails here, naming it.
    """
    run_dir = Path(cfg.run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run_dir={run_dir} is not a folder")
    trained_path = run_dir / "resolved_config.yaml"
    trained = OmegaConf.load(trained_path) if trained_path.is_file() else None
    sections = {}
    for key in ("task", "model", "coordination", "bids"):
        section = cfg[key]
        if section is None or "name" not in section:
            if trained is None:
                raise FileNotFoundError(f"{trained_path} is missing: pass {key}=... explicitly")
            # A run trained before the bid channel was a group read its bids as the paper's.
            own = trained[key] if key in trained else OmegaConf.create({"name": "paper"})
            section = own if section is None else OmegaConf.merge(own, section)
        sections[key] = section
    if sections["task"].name not in TASKS:
        raise ValueError(f"task.name={sections['task'].name!r}: unknown; known: {sorted(TASKS)}")
    rule = RULES.get(sections["coordination"].name)  # an unknown name fails validation
    schemas = {
        "task": env_class(sections["task"].name).Config,
        "model": ModelConfig,
        "coordination": rule.Config if rule else CoordinationConfig,
        "bids": BidsConfig,
    }
    resolved = OmegaConf.to_container(cfg, resolve=True)
    for key, schema in schemas.items():
        typed = OmegaConf.merge(OmegaConf.structured(schema), sections[key])
        resolved[key] = OmegaConf.to_container(typed, resolve=True)
    out = OmegaConf.create(resolved)
    for key, schema in schemas.items():
        out[key] = OmegaConf.merge(OmegaConf.structured(schema), out[key])
    return out


def validate_evaluation(cfg: DictConfig) -> None:
    """Value checks; each error names the key."""
    problems = [f"{key}: not a field of the config schema" for key in unknown_keys(cfg)]
    if cfg.coordination.name not in RULES:
        problems.append(
            f"coordination.name={cfg.coordination.name!r}: unknown; known: {sorted(RULES)}"
        )
    if cfg.runs_per_seed < 1:
        problems.append(f"runs_per_seed={cfg.runs_per_seed}: must be >= 1")
    if cfg.max_seeds is not None and cfg.max_seeds < 1:
        problems.append(f"max_seeds={cfg.max_seeds}: must be >= 1 (or null for all)")
    if cfg.batch_size < 1:
        problems.append(f"batch_size={cfg.batch_size}: must be >= 1")
    if cfg.regret_states < 0:
        problems.append(f"regret_states={cfg.regret_states}: must be >= 0 (0: not measured)")
    if cfg.pass_k is not None and cfg.pass_k < 1:
        problems.append(f"pass_k={cfg.pass_k}: must be >= 1 (or null)")
    if cfg.replicas < 1:
        problems.append(f"replicas={cfg.replicas}: must be >= 1")
    if not 0.0 <= cfg.dropout <= 1.0:
        problems.append(f"dropout={cfg.dropout}: must lie in [0, 1]")
    if problems:
        raise ValueError("invalid config:\n  " + "\n  ".join(problems))


def build_loop(cfg: DictConfig) -> RolloutLoop:
    """Populations (actions and bids possibly from different checkpoints) -> swarm -> loop."""
    run_dir = Path(cfg.run_dir)
    device = torch.device(cfg.device)
    actions = Population.from_pretrained(population_folder(run_dir, cfg.actions_from)).to(device)
    bids = actions
    if cfg.bids_from != cfg.actions_from:
        bids = Population.from_pretrained(population_folder(run_dir, cfg.bids_from)).to(device)
        if bids.roles != actions.roles:
            raise ValueError(
                f"bids_from={cfg.bids_from!r} has roles {bids.roles}, actions_from="
                f"{cfg.actions_from!r} has {actions.roles}: they must be the same population"
            )
    monolithic = actions.roles == [MONOLITHIC]
    rule = RULES[cfg.coordination.name]
    if rule.monolithic and not monolithic:
        raise ValueError(
            f"coordination=monolithic needs the single monolithic agent; run {run_dir} has "
            f"roles {actions.roles}"
        )
    if monolithic and rule.asks_expert:
        raise ValueError(
            f"run {run_dir} trained one monolithic agent: coordination={cfg.coordination.name} "
            "picks among the roles' agents"
        )
    if monolithic and rule.asks_bids:
        raise ValueError(
            f"run {run_dir} trained one monolithic agent, which has no bid policy: "
            f"coordination={cfg.coordination.name} needs bids"
        )
    if cfg.replicas > 1:
        replicated = actions.replicate(cfg.replicas)
        bids = replicated if bids is actions else bids.replicate(cfg.replicas)
        actions = replicated
    loop = build_rollout_loop(cfg, actions, bid_population=bids)
    loop.dropout = cfg.dropout
    return loop


def source_run_id(run_dir: Path) -> str | None:
    """The MLflow run id of the training run (kept in its ``state.json``)."""
    state = run_dir / "state.json"
    return json.loads(state.read_text()).get("mlflow_run_id") if state.is_file() else None


def evaluation_run_name(run_dir: Path, own: str) -> str:
    """``eval `` + the overrides the source training run was started with (its arm:
    ``ablation=monolithic``, ``task=crafting_furnace``; from its ``.hydra/overrides.yaml``) that
    the evaluation's own overrides ``own`` (``coordination=round_robin,replicas=4``; ``default``:
    none) do not set, then ``own``'s. So evaluations of different arms stay different
    strategies in the report, whatever folders they read."""
    own_parts = [] if own == "default" else own.split(",")
    own_keys = {part.split("=", 1)[0] for part in own_parts}
    overrides_file = run_dir / ".hydra" / "overrides.yaml"
    source = (
        [str(part) for part in OmegaConf.load(overrides_file)] if overrides_file.is_file() else []
    )
    inherited = [part for part in source if "=" in part and part.split("=", 1)[0] not in own_keys]
    return "eval " + (",".join(inherited + own_parts) or "default")


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (MLflow params are flat)."""
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out |= flatten(value, f"{prefix}{key}.")
    return out


def log_to_mlflow(cfg: DictConfig, metrics: dict[str, float], world_files: list[Path]) -> str:
    """One MLflow run tagged with its source training run (a sweep's jobs under one parent);
    the per-world ``world_files`` become its artifacts ``heldout/<name>``."""
    from mlflow.entities import Metric, Param

    uri = tracking.tracking_uri(cfg.logger.tracking_uri)
    parent = tracking.sweep_parent_run(uri, cfg.logger.experiment_name)
    client, experiment_id = tracking.open_experiment(uri, cfg.logger.experiment_name)
    run_dir = Path(cfg.run_dir).resolve()
    tags = {
        "bidswarm.kind": "evaluate",
        "bidswarm.source_run_dir": str(run_dir),
        "bidswarm.bids_from": cfg.bids_from,
        "bidswarm.actions_from": cfg.actions_from,
        **tracking.provenance_tags(),
    }
    source = source_run_id(run_dir)
    if source is not None:
        tags["bidswarm.source_run"] = source
    if parent is not None:
        tags["mlflow.parentRunId"] = parent
    run = client.create_run(
        experiment_id, run_name=evaluation_run_name(run_dir, tracking.run_name()), tags=tags
    )
    params = flatten(OmegaConf.to_container(cfg, resolve=True))
    client.log_batch(
        run.info.run_id,
        metrics=[Metric(f"eval/{k}", float(v), 0, 0) for k, v in metrics.items()],
        params=[Param(k, str(v)[:6000]) for k, v in params.items()],
    )
    for path in world_files:
        client.log_artifact(run.info.run_id, str(path), "heldout")
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def run_evaluation(cfg: DictConfig) -> dict[str, float]:
    """Held-out seeds x ``runs_per_seed`` episodes; returns the metrics (``reward/mean`` ...,
    over worlds) and writes them to ``evaluation.json``, the per-world mean rewards to
    ``heldout/eval_worlds.json`` and each world's pass@k to ``heldout/eval_pass_at_<k>_worlds.json``
    (world ids as keys), so that arms can be paired."""
    loop = build_loop(cfg)
    env = loop.make_env()
    seeds = env.heldout_seeds()[: cfg.max_seeds]
    runs = max(cfg.runs_per_seed, cfg.pass_k or 0)
    started = time.perf_counter()
    try:
        evaluation = evaluate(
            loop,
            seeds,
            runs,
            cfg.seed,
            cfg.batch_size,
            progress=True,
            mass_probe_prompts=cfg.bids.mass_probe_prompts,
            regret_states=cfg.regret_states,
        )
    finally:
        loop.swarm.engine.close()
    wall = time.perf_counter() - started
    decisions = max(sum(len(e.steps) for e in evaluation.episodes), 1)
    metrics = (
        evaluation.metrics
        | {
            "seeds": float(len(seeds)),
            "runs_per_seed": float(runs),
            "agents": float(loop.swarm.n_agents),
            # a rule's per-step cost (Table 2): the wall clock's depends on the machine's load
            "flops_per_decision": evaluation.usage.rollout_flops / decisions,
            "tokens_per_decision": evaluation.usage.rollout_tokens / decisions,
            "seconds_per_decision": wall / decisions,
        }
        | evaluation.usage.as_metrics()
    )
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "evaluation.json").write_text(json.dumps(metrics, indent=1) + "\n")
    world_files = evaluation.write_worlds(out_dir / "heldout", "eval")
    if cfg.logger.name == "mlflow":
        log_to_mlflow(cfg, metrics, world_files)
    console.say(
        f"[bidswarm] held-out reward {metrics['reward/mean']:.2f} +- {metrics['reward/se']:.2f} "
        f"(95% CI {metrics['reward/ci_low']:.2f} .. {metrics['reward/ci_high']:.2f}) "
        f"over {len(seeds)} worlds x {runs} runs (coordination="
        f"{cfg.coordination.name}, bids={cfg.bids_from}, actions={cfg.actions_from}, "
        f"{loop.swarm.n_agents} agents, dropout {cfg.dropout:g})"
    )
    for k in range(1, runs + 1):
        console.say(
            f"[bidswarm] pass@{k} {metrics[f'pass_at_{k}/mean']:.3f} (95% CI "
            f"{metrics[f'pass_at_{k}/ci_low']:.3f} .. {metrics[f'pass_at_{k}/ci_high']:.3f})"
        )
    return metrics


@hydra.main(version_base="1.3", config_path="../../conf", config_name="evaluate")
def main(cfg: DictConfig) -> float:
    console.configure(cfg.verbose)
    cfg = resolve_from_run(cfg)
    validate_evaluation(cfg)
    threads = cfg.model.torch_threads or threads_per_job(HydraConfig.get())
    if threads:
        torch.set_num_threads(threads)
    return run_evaluation(cfg)["reward/mean"]


if __name__ == "__main__":
    sys.exit(main())
