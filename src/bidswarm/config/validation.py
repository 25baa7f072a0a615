"""Value checks that the schemas' types cannot express, on the config alone: :func:`validate`
reports every bad ``key=value`` with what is allowed, before any model loads or folder is made.

Each piece with its own parameters checks them itself and is asked here: the chosen
coordination rule and credit rule (``problems(config)``, from their declared parameters) and the
chosen task (``TaskConfig.problems``, in ``envs/<task>/config.py``). :func:`refuse_unknown_choices`
refuses a ``group=option`` that names no YAML. What the config asks of the machine is
``config/machine.py``'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from omegaconf import DictConfig, OmegaConf

from bidswarm.algorithms.credit import CREDIT_RULES
from bidswarm.checks import Problems, seed_range
from bidswarm.config.keys import close_key, misspelled_keys
from bidswarm.config.schemas import TrainConfig
from bidswarm.coordination import RULES
from bidswarm.coordination.bid_readers import READERS


def unknown_keys(node: Any, path: str = "") -> list[str]:
    """Keys present in ``node`` that its dataclass schema lacks (Hydra's ``+key=`` adds them)."""
    if not isinstance(node, DictConfig):
        return []
    schema = OmegaConf.get_type(node)
    names = (
        {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    )
    found = []
    for key in node:
        dotted = f"{path}{key}"
        if names is not None and key not in names:
            found.append(dotted)
        elif not OmegaConf.is_missing(node, key):
            found += unknown_keys(node._get_node(key), f"{dotted}.")
    return found


PRECISIONS = ("32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true")
STRATEGIES = (
    "auto",
    "ddp",
    "deepspeed_stage_2",
    "deepspeed_stage_2_offload",
    "deepspeed_stage_3",
    "deepspeed_stage_3_offload",
)
ACCELERATORS = ("cpu", "gpu", "cuda", "auto")
LOGGERS = ("mlflow", "csv")
TRACKING_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")
"""MLflow stores bidswarm accepts; MLflow 3 refuses the old ``file:`` store by default."""
GROUPS = ("task", "model", "coordination", "bids", "credit", "trainer", "logger")
OPTIONAL_GROUPS = ("ablation", "experiment", "debug")


class ConfigError(ValueError):
    """A config value that cannot work; the message names each key, value and what is allowed."""


def validate(cfg: Any) -> None:
    """Value checks that the schemas' types cannot express, on the config alone (no model, env
    or folder is made); raises :class:`ConfigError` listing every bad ``key=value`` with what is
    allowed. :func:`check_machine` checks what the config asks of this machine."""
    problems = Problems(
        f"{key}: not a field of the config schema{_did_you_mean(key)}" for key in unknown_keys(cfg)
    )
    problems.check("seed", cfg.seed, seed_range())
    _task_problems(cfg.task, problems)
    _model_problems(cfg.model, problems)
    _rule_problems("coordination", RULES, cfg.coordination, problems)
    rule = RULES.get(cfg.coordination.name)
    problems.require(
        rule is None or not rule.evaluation_only,
        "coordination",
        cfg.coordination.name,
        "a rule that can train a swarm; this one only evaluates a trained one "
        "(python -m bidswarm.evaluate run_dir=<run> coordination=...)",
    )
    _bids_problems(cfg, problems)
    _rule_problems("credit", CREDIT_RULES, cfg.credit, problems)
    _trainer_problems(cfg.trainer, problems)
    _logger_problems(cfg.logger, problems)
    _sft_problems(cfg, problems)
    _rl_problems(cfg, problems)
    _clipping_problems(cfg, problems)
    problems.at_least("eval.runs_per_seed", cfg.eval.runs_per_seed, 1)
    problems.at_least("eval.regret_states", cfg.eval.regret_states, 0)
    for name in cfg.eval.reference_rules:
        problems.require(
            name in RULES and not RULES[name].monolithic,
            "eval.reference_rules",
            name,
            f"a coordination rule of the roles' agents: one of "
            f"{sorted(n for n, r in RULES.items() if not r.monolithic)}",
        )
    if cfg.model.engine == "vllm":
        problems.require(
            not str(cfg.trainer.strategy).startswith("deepspeed"),
            "model.engine",
            cfg.model.engine,
            f"hf under trainer.strategy={cfg.trainer.strategy}: DeepSpeed writes the weights in "
            "its own buffers, so the engine would not see an update",
        )
        problems.positive("model.vllm.kv_cache_gib", cfg.model.vllm.kv_cache_gib)
        problems.require(
            0.0 < cfg.model.vllm.gpu_memory_utilization < 1.0,
            "model.vllm.gpu_memory_utilization",
            cfg.model.vllm.gpu_memory_utilization,
            "a share of the GPU's memory, between 0 and 1",
        )
        problems.positive("model.vllm.start_timeout_s", cfg.model.vllm.start_timeout_s)
        block = cfg.model.vllm.block_size
        problems.require(
            block is None or (block > 0 and block % 16 == 0),
            "model.vllm.block_size",
            block,
            "null (vLLM's own) or a positive multiple of 16 (on a CPU, of 32)",
        )
    if cfg.rl.importance_cap is not None:
        problems.positive("rl.importance_cap", cfg.rl.importance_cap)
    if cfg.model.rollout_dtype is not None:
        problems.require(
            not str(cfg.trainer.strategy).startswith("deepspeed"),
            "model.rollout_dtype",
            cfg.model.rollout_dtype,
            f"null under trainer.strategy={cfg.trainer.strategy}: DeepSpeed writes the "
            "weights in its own buffers, so the copy in the rollout dtype would not see an "
            "update; set model.dtype instead",
        )
    problems.require(
        cfg.init_from is None or not cfg.sft.enabled or cfg.sft.demonstrations != "all",
        "init_from",
        cfg.init_from,
        "starts from a trained population instead of the cold start: set sft.enabled=false "
        "(or sft.demonstrations=decisions: the rule's decision learned on top of it)",
    )
    if cfg.eval.max_seeds is not None:
        problems.require(
            cfg.eval.max_seeds >= 1, "eval.max_seeds", cfg.eval.max_seeds, ">= 1 or null"
        )
    if cfg.eval.every is not None:
        problems.require(cfg.eval.every >= 1, "eval.every", cfg.eval.every, ">= 1 or null")
    problems.at_least("eval.batch_size", cfg.eval.batch_size, 1)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def _did_you_mean(key: str) -> str:
    meant = close_key(key, TrainConfig)
    return f"; did you mean {meant}?" if meant else ""


def _task_problems(task: Any, problems: Problems) -> None:
    from bidswarm.envs import TASKS

    problems.one_of("task.name", task.name, TASKS)
    if not unknown_keys(task, "task."):  # an added key is reported; the class would refuse it
        problems += OmegaConf.to_object(task).problems()


def _model_problems(model: Any, problems: Problems) -> None:
    # model.source, model.dtype and model.prompt_style are enums: the schema checks them.
    if model.source == "gguf":
        for key in ("gguf_package", "gguf_file"):
            problems.require(bool(model[key]), f"model.{key}", model[key], "needed by source=gguf")
    if model.source == "hub":
        problems.require(bool(model.path), "model.path", model.path, "needed by source=hub")
    problems.at_least("model.micro_batch_tokens", model.micro_batch_tokens, 1)
    if model.source == "tiny":
        problems.require(
            model.prompt_style == "compact",
            "model.prompt_style",
            model.prompt_style,
            "compact (a tiny model's own tokenizer has no chat template)",
        )
        _tiny_problems(model, problems)
    problems.positive("model.temperature", model.temperature)
    problems.at_least("model.max_bid_tokens", model.max_bid_tokens, 1)
    if model.max_action_tokens is not None:
        problems.require(
            model.max_action_tokens >= 1,
            "model.max_action_tokens",
            model.max_action_tokens,
            ">= 1, or null (derived from the task)",
        )
    problems.at_least("model.max_prompt_tokens", model.max_prompt_tokens, 1)
    if model.compile_decode:
        problems.require(
            model.kv_cache != "dynamic",
            "model.kv_cache",
            model.kv_cache,
            "static or auto: model.compile_decode=true needs fixed shapes",
        )
    if model.torch_threads is not None:
        problems.require(
            model.torch_threads >= 1, "model.torch_threads", model.torch_threads, ">= 1 or null"
        )
    problems.at_least("model.sft_epochs", model.sft_epochs, 1)
    problems.positive("model.sft_lr", model.sft_lr)
    problems.positive("model.rl_lr", model.rl_lr)


def _tiny_problems(model: Any, problems: Problems) -> None:
    tiny = model.tiny
    for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "vocab_size"):
        problems.at_least(f"model.tiny.{name}", tiny[name], 1)
    if tiny.num_heads >= 1:
        problems.require(
            tiny.hidden_size % tiny.num_heads == 0,
            "model.tiny.hidden_size",
            tiny.hidden_size,
            f"must be a multiple of model.tiny.num_heads ({tiny.num_heads})",
        )
    longest = model.max_prompt_tokens + max(model.max_bid_tokens, model.max_action_tokens or 0)
    problems.require(
        tiny.max_position_embeddings > longest,
        "model.tiny.max_position_embeddings",
        tiny.max_position_embeddings,
        f"must exceed the longest sequence, max_prompt_tokens + reply tokens ({longest})",
    )


def _rule_problems(section: str, rules: Mapping[str, Any], node: Any, problems: Problems) -> None:
    """The chosen rule of ``section`` (``coordination`` or ``credit``) checks its own
    parameters, once its YAML's schema is the rule's (``<section>.name`` could name another)."""
    problems.one_of(f"{section}.name", node.name, rules)
    rule = rules.get(node.name)
    if rule is None:
        return
    schema = OmegaConf.get_type(node)
    if schema is not rule.Config:
        problems.require(
            False,
            f"{section}.name",
            node.name,
            f"its parameters are {rule.Config.__name__}'s, the {section} YAML's schema is "
            f"{schema.__name__}'s: select the rule with {section}={node.name}",
        )
        return
    problems += rule.problems(node)


def _trainer_problems(trainer: Any, problems: Problems) -> None:
    problems.one_of("trainer.accelerator", trainer.accelerator, ACCELERATORS)
    devices = trainer.devices
    if isinstance(devices, int):
        problems.require(devices >= 1 or devices == -1, "trainer.devices", devices, ">= 1 or -1")
    elif isinstance(devices, str):
        problems.require(devices == "auto", "trainer.devices", devices, "a number, a list, auto")
    problems.at_least("trainer.num_nodes", trainer.num_nodes, 1)
    problems.positive("trainer.collective_timeout_s", trainer.collective_timeout_s)
    problems.one_of("trainer.strategy", trainer.strategy, STRATEGIES)
    if str(trainer.strategy).startswith("deepspeed"):
        problems.require(
            trainer.accelerator in ("gpu", "cuda"),
            "trainer.accelerator",
            trainer.accelerator,
            f"gpu or cuda with trainer.strategy={trainer.strategy} (DeepSpeed runs on GPUs)",
        )
    problems.one_of("trainer.precision", trainer.precision, PRECISIONS)


def _logger_problems(logger: Any, problems: Problems) -> None:
    problems.one_of("logger.name", logger.name, LOGGERS)
    problems.require(
        bool(logger.experiment_name), "logger.experiment_name", logger.experiment_name, "a name"
    )
    if logger.tracking_uri is not None:
        problems += tracking_uri_problems("logger.tracking_uri", logger.tracking_uri)


def tracking_uri_problems(key: str, uri: str) -> list[str]:
    """Why MLflow cannot use ``uri`` (empty when it can)."""
    scheme = urlsplit(uri).scheme
    if scheme in TRACKING_SCHEMES and (scheme not in ("http", "https") or urlsplit(uri).netloc):
        return []
    return [
        f"{key}={uri!r}: a URI with one of the schemes {list(TRACKING_SCHEMES)}, e.g. "
        "http://127.0.0.1:5000 or sqlite:///outputs/mlflow.db (MLflow 3 refuses a plain path)"
    ]


def _sft_problems(cfg: Any, problems: Problems) -> None:
    sft = cfg.sft
    problems.at_least("sft.epochs", sft.epochs, 1)
    problems.positive("sft.lr", sft.lr)
    problems.at_least("sft.batch_size", sft.batch_size, 1)
    problems.non_negative("sft.weight_decay", sft.weight_decay)
    problems.require(
        1 <= sft.demo_episodes <= cfg.task.n_train_seeds,
        "sft.demo_episodes",
        sft.demo_episodes,
        f"must be in 1..task.n_train_seeds ({cfg.task.n_train_seeds})",
    )
    problems.unit_interval("sft.bid_fraction", sft.bid_fraction, low_open=True)
    problems.at_least("sft.micro_batch_tokens", sft.micro_batch_tokens, 1)
    if sft.demonstrations != "all":
        rule = RULES.get(cfg.coordination.name)
        learns = rule is not None and not rule.problems(cfg.coordination)
        learns = learns and bool(rule.from_config(cfg.coordination).decisions_learned)
        problems.require(
            learns,
            "sft.demonstrations",
            sft.demonstrations,
            f"all with coordination={cfg.coordination.name} as configured: it learns no "
            "decision of its own (coordination=router, graph_of_agents with scoring=trained, "
            "agentnet with router=trained do)",
        )


def _bids_problems(cfg: Any, problems: Problems) -> None:
    bids = cfg.bids
    problems.one_of("bids.reader", bids.reader, sorted(READERS))
    for key in ("temperature", "eval_temperature", "relabel_lr"):
        if bids[key] is not None:
            problems.positive(f"bids.{key}", bids[key])
    problems.non_negative("bids.anchor_coef", bids.anchor_coef)
    problems.at_least("bids.anchor_prompts", bids.anchor_prompts, 1)
    problems.at_least("bids.mass_probe_prompts", bids.mass_probe_prompts, 0)
    problems.at_least("bids.relabel_rounds", bids.relabel_rounds, 0)
    problems.at_least("bids.value_states", bids.value_states, 1)
    problems.non_negative("bids.explore", bids.explore)
    reader = READERS.get(bids.reader)
    problems.require(
        bids.explore == 0 or reader is None or reader.reads_levels,
        "bids.explore",
        bids.explore,
        f"0 with bids.reader={bids.reader}: only a level reader knows a bid's spread",
    )
    problems.require(
        not bids.balanced or reader is None or reader.reads_levels,
        "bids.balanced",
        bids.balanced,
        f"false with bids.reader={bids.reader}: only a level reader reads the levels' "
        "probabilities it divides by their shares",
    )
    problems.require(
        str(bids.anchor_target) == "expert" or bids.anchor_coef > 0,
        "bids.anchor_target",
        bids.anchor_target,
        "expert with bids.anchor_coef=0: there is no anchor to aim (set bids.anchor_coef > 0)",
    )
    problems.at_least("bids.value_branches", bids.value_branches, 1)
    rule = RULES.get(cfg.coordination.name)
    if bids.relabel_rounds > 0 and (rule is None or rule.asks_bids):
        # A rule that reads no bids has no bid channel: the bid presets leave it alone.
        problems.require(
            not str(cfg.trainer.strategy).startswith("deepspeed"),
            "bids.relabel_rounds",
            bids.relabel_rounds,
            "0 under a DeepSpeed strategy (bids=anchored, or bids=paper): the rounds train "
            "the agents' own weights, which DeepSpeed holds in its buffers",
        )


def _rl_problems(cfg: Any, problems: Problems) -> None:
    rl = cfg.rl
    problems.at_least("rl.cycles", rl.cycles, 0)
    problems.at_least("rl.action_updates", rl.action_updates, 0)
    problems.at_least("rl.bid_updates", rl.bid_updates, 0)
    problems.require(
        rl.action_updates + rl.bid_updates >= 1,
        "rl.action_updates",
        rl.action_updates,
        "rl.action_updates + rl.bid_updates must be >= 1",
    )
    problems.require(
        1 <= rl.envs_per_update <= cfg.task.n_train_seeds,
        "rl.envs_per_update",
        rl.envs_per_update,
        f"must be in 1..task.n_train_seeds ({cfg.task.n_train_seeds})",
    )
    if rl.bid_envs_per_update is not None:
        problems.require(
            1 <= rl.bid_envs_per_update <= cfg.task.n_train_seeds,
            "rl.bid_envs_per_update",
            rl.bid_envs_per_update,
            f"must be null or in 1..task.n_train_seeds ({cfg.task.n_train_seeds})",
        )
    problems.positive("rl.lr", rl.lr)
    problems.at_least("rl.warmup_updates", rl.warmup_updates, 0)
    problems.non_negative("rl.weight_decay", rl.weight_decay)
    problems.non_negative("rl.kl_coef", rl.kl_coef)
    problems.non_negative("rl.entropy_coef", rl.entropy_coef)
    problems.non_negative("rl.grad_clip", rl.grad_clip)
    problems.at_least("rl.micro_batch_tokens", rl.micro_batch_tokens, 1)
    problems.at_least("rl.fork_budget", rl.fork_budget, 0)
    problems.at_least("rl.max_bid_resamples", rl.max_bid_resamples, 1)
    problems.require(
        rl.bid_resample_samples >= rl.max_bid_resamples,
        "rl.bid_resample_samples",
        rl.bid_resample_samples,
        f">= rl.max_bid_resamples = {rl.max_bid_resamples} (the tries it estimates)",
    )
    problems.require(
        rl.malformed_resample == "failed_try"
        or rl.bid_resample in ("rejection", "sampled_below_runner_up"),
        "rl.malformed_resample",
        rl.malformed_resample,
        f"failed_try under rl.bid_resample={rl.bid_resample}: a draw among the canonical "
        "levels never meets a malformed reply (bid_zero needs rejection or "
        "sampled_below_runner_up)",
    )
    problems.at_least("rl.fork_branches", rl.fork_branches, 1)
    if rl.bid_resample_temperature is not None:
        problems.positive("rl.bid_resample_temperature", rl.bid_resample_temperature)
    problems.positive("rl.bt_beta", rl.bt_beta)
    problems.require(
        0.0 <= rl.control_forks <= 1.0,
        "rl.control_forks",
        rl.control_forks,
        "a share of the played forks, in [0, 1]",
    )
    problems.at_least("rl.checkpoint_every", rl.checkpoint_every, 1)
    if rl.stop_after is not None:
        problems.require(rl.stop_after >= 1, "rl.stop_after", rl.stop_after, ">= 1 or null")
    if rl.flop_budget is not None:
        problems.positive("rl.flop_budget", rl.flop_budget)


def _clipping_problems(cfg: Any, problems: Problems) -> None:
    """Under DeepSpeed, ZeRO keeps the gradients in its own partitioned buffers, not in
    ``p.grad``: the per-agent clip would find no gradient and clip nothing, so it is refused;
    DeepSpeed's global ``gradient_clipping`` (``trainer.gradient_clipping``) is what applies
    there, and only there."""
    strategy = str(cfg.trainer.strategy)
    problems.non_negative("trainer.gradient_clipping", cfg.trainer.gradient_clipping)
    if strategy.startswith("deepspeed"):
        problems.require(
            cfg.rl.grad_clip == 0,
            "rl.grad_clip",
            cfg.rl.grad_clip,
            f"must be 0 under trainer.strategy={strategy}: the per-agent clip reads p.grad, which "
            "DeepSpeed ZeRO leaves empty (its gradients live in its own buffers), so it would clip "
            "nothing. What applies there is DeepSpeed's global gradient_clipping, one norm over "
            "all agents together: set rl.grad_clip=0 and trainer.gradient_clipping=<norm>",
        )
    else:
        problems.require(
            cfg.trainer.gradient_clipping == 0,
            "trainer.gradient_clipping",
            cfg.trainer.gradient_clipping,
            f"is DeepSpeed's global clip and applies under a deepspeed strategy only "
            f"(trainer.strategy={strategy}): clip each agent with rl.grad_clip",
        )


def refuse_misspelled_keys(arguments: list[str]) -> None:
    """Refuse ``key=value`` overrides of keys the config lacks where a known key is close,
    naming it (``rl.cycels``: did you mean ``rl.cycles``?), before Hydra composes."""
    found = misspelled_keys(arguments, TrainConfig, GROUPS + OPTIONAL_GROUPS)
    if found:
        raise ConfigError("\n  ".join(["invalid config:", *found]))


def refuse_unknown_choices(arguments: list[str], conf_dir: Path) -> None:
    """Refuse ``group=option`` overrides that name no file of ``conf/<group>/``, listing the
    options (Hydra's own error also lists the groups' schemas, which are no choice).
    Skipped when the command adds config folders (``--config-dir``, ``hydra.searchpath``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = [a for a in arguments if not a.startswith("-")]
    if len(overrides) < len(arguments) and any(
        a.startswith(("--config-dir", "-cd", "--config-path", "-cp")) for a in arguments
    ):
        return
    if any(a.startswith("hydra.searchpath") for a in overrides):
        return
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # Hydra reports malformed overrides itself
        return
    for override in parsed:
        group = override.key_or_group
        if group not in GROUPS + OPTIONAL_GROUPS or override.is_delete():
            continue
        try:
            values = (
                list(override.sweep_string_iterator())
                if override.is_sweep_override()
                else [override.value()]
            )
        except Exception:  # glob() and friends: Hydra resolves those itself
            continue
        options = sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))
        for value in values:
            if value is None and group in OPTIONAL_GROUPS:
                continue
            if value not in options:
                raise ConfigError(
                    f"{group}={value}: no such option; choose one of {', '.join(options)}"
                )
