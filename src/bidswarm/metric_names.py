"""Names of the logged metrics that more than one module writes or reads (README's metric
table defines every metric). The names ``bidswarm.report`` reads from MLflow (``reward/mean``,
``flops/total``, ``participation/*``, ``eval_after/*``, ``eval_before/*``) are unchanged since
the first stores, so older stores (``outputs/results.db``) still report."""

from __future__ import annotations

REWARD = "reward/mean"
"""Mean episode reward (environment reward summed over an episode)."""
REWARD_SE = "reward/se"
UPDATE = "update"
UPDATE_IS_BID = "update_is_bid"
BOOKKEEPING = (UPDATE, UPDATE_IS_BID)
"""Kept in the run's history (plots, progress bar, checkpoints), never logged: the update is
the MLflow step of every RL metric, and ``time/update_bid_s`` says which kind it was."""
UPDATES_ACTION = "updates/action"
"""Action updates made so far (logged at every update: the last value is the run's total)."""
UPDATES_BID = "updates/bid"
"""Bid updates made so far (0 for a rule without contested steps)."""
SFT_ACTION_TOKENS = "sft/action_tokens"
"""Prompt + reply tokens of action demonstrations trained on in SFT, all agents (``/<agent>``:
one agent's); logged at step 0."""
SFT_BID_TOKENS = "sft/bid_tokens"
"""Prompt + reply tokens of bid demonstrations trained on in SFT (all agents; ``/<agent>``)."""
SFT_DECISION_TOKENS = "sft/decision_tokens"
"""[ours] Prompt + reply tokens of a learned decision's demonstrations (peers' usefulness
scores, routes) trained on in SFT, all agents and the decider (``/<agent>``); logged only by a
rule that learns its decision (``CoordinationRule.decisions_learned``)."""
SFT_FLOPS = "sft/flops"
"""SFT's training FLOPs, 6 x parameters x trained tokens (all agents; ``/<agent>``)."""
SFT_BUDGET = (SFT_ACTION_TOKENS, SFT_BID_TOKENS, SFT_FLOPS)
"""The SFT budget a run logs, each as a total and per agent."""
KL_ACTION = "loss_action/kl"
"""[ours] The KL penalty's term (k3 estimator) on action tokens, mean over the agents with data,
before ``rl.kl_coef``; logged only when ``rl.kl_coef`` > 0."""
KL_BID = "loss_bid/kl"
"""[ours] The KL penalty's term on bid tokens (both replies of each pair), mean over the agents
with pairs; logged only when ``rl.kl_coef`` > 0."""
ENTROPY = "entropy"
"""[ours] Entropy of the action tokens' full-vocabulary distributions, normalised as the
REINFORCE loss, mean over the agents with data; logged only when ``rl.entropy_coef`` > 0."""
LEARNING_RATE = "lr"
"""[ours] The RL learning rate of the update; logged only with ``rl.lr_schedule`` other than
constant or ``rl.warmup_updates`` > 0."""
WINNING_BIDS = "bids/winning"
"""``bids/winning/<role>/<level>``: share of the role's acting steps won at that bid level;
``bids/winning/<role>/mean``: the role's mean winning bid (rules that record winning bids)."""
PEER_SCORES = "peer_scores"
"""[ours] What peer scoring sees (rules that ask for proposals, e.g. Graph-of-Agents):
``peer_scores/received/<role>``, the mean score (mean token log-prob under the scorer's own
action prompt) that the role's proposals got from the other present agents;
``peer_scores/margin``, the mean gap between the best and the second-best proposal's mean peer
score at a step; ``peer_scores/near_tie``, the share of steps with a gap under
:data:`bidswarm.rollout.metrics.PEER_SCORE_NEAR_TIE` nats. Under Graph-of-Agents' learned
scores (``coordination.scoring=trained``) a score is the expected usefulness level instead
(0 .. the top bid level), where the same 0.1 threshold is half a step between levels."""
BID_PARSE_RATE = "bids/parse_rate"
"""[ours] Share of the bid replies the coordination rule read (every bidder's, at every step of
the episodes) that parsed to a bid level; a malformed one bids 0. Per update and per held-out
evaluation, for rules that ask for bids (``parse_failures/bid`` counts training's failures,
forks' resamples included)."""
SFT_BID_PARSE_RATE = "sft/bid_parse_rate"
"""[ours] ``sft/bid_parse_rate/before`` and ``/after``: share of sampled bid replies that parse
(at the model's temperature), to the prompts of each bidding agent's own bid demonstrations
(up to :data:`bidswarm.lit.sft.PARSE_PROBE_PROMPTS` per agent), before and after the SFT cold
start (:func:`bidswarm.lit.sft.bid_parse_rate`)."""
ENGINE_START_S = "time/engine_start_s"
ENGINE_WEIGHT_LOADS = "time/engine_weight_loads"
ENGINE_SYNC_S = "time/engine_sync_s"
ENGINE_LOAD_S = "time/engine_load_s"
"""The rollout engine process's start-up, weight loads and sync seconds since it started
(``model.engine=vllm``): a resumed run's process starts anew, so they sit with the timings."""
ENGINE_LOGPROB_GAP_MEAN = "engine/logprob_gap_mean"
"""Mean |learner - engine| log-prob per sampled token the update trained on (the engine's
log-probs as it sampled; ``lit/sampler_mismatch.py``)."""
ENGINE_LOGPROB_GAP_MAX = "engine/logprob_gap_max"
"""The largest |learner - engine| log-prob of a sampled token the update trained on."""
ENGINE_PREFIX_CACHED_FRAC = "engine/prefix_cached_frac"
"""[ours] The share of the prompt tokens given to the rollout engine since the update before
that it did not compute: served from its cache of earlier prompts (vLLM's prefix cache, the
``hf`` engine's kept prompt heads) or computed once for all the rows of a batch that share
them (the ``hf`` engine's shared prompt head). What the engine had cached before the update
(an evaluation on the same weights) counts, so it is a speed figure, not a result."""
EVAL_BEFORE = "eval_before"
"""Held-out evaluation after SFT, before RL: logged at step 0."""
EVAL_AFTER = "eval_after"
"""Held-out evaluation after RL: logged at the step of the number of updates made."""
EVAL_DURING = "eval_during"
"""Held-out evaluation every ``eval.every`` updates during RL: logged at the updates made."""


def seconds(phase: str) -> str:
    """``time/<phase>_s``: wall-clock seconds of a named phase of one update."""
    return f"time/{phase}_s"


EXPERT_OWNER_AGREEMENT = "auction/expert_owner_agreement"
"""[ours] Share of the decision steps whose actor is the agent the task's scripted expert would
let act (the owner of its next step; both skipping agrees), over every step with the expert's
view (not the monolithic agent's); ``/on_path`` and ``/off_path``: over the states the experts'
own play reaches and the others (``Episode.on_expert_path``), where the bid demonstrations
exist and where they do not."""
EXPERT_OWNER_RECALL = "auction/expert_owner_recall"
"""[ours] ``auction/expert_owner_recall/<role>``: of the decision steps whose expert owner is
``role`` (the experts' auction would let it act), the share where an agent of ``role`` acted
(e.g. the smith's: how often the smith acts where crafting is next); per role that owns steps."""
EXPERT_OWNER_PRECISION = "auction/expert_owner_precision"
"""[ours] ``auction/expert_owner_precision/<role>``: of the decision steps where an agent of
``role`` acted (with the expert's view), the share whose expert owner is ``role``: how often a
win was the role's to take (recall's other half: a role that wins at random has a low one)."""
OWNER_AUC = "bids/owner_auc"
"""[ours] ``bids/owner_auc/<role>``: how well the role's own bids tell the steps the expert
gives it from the others, whoever won: the probability that its bid at a step it owns is above
its bid at a step it does not (ties half; the area under the ROC curve), over every bid with
the expert's view. 1: the bid ranks every owned step first; 0.5: the bid does not see whose
step it is, whatever the reader makes of it."""
VALID_LEVEL_MASS = "bids/valid_level_mass"
"""[ours] ``bids/valid_level_mass/<role>``: the model's probability (temperature 1, no
constraint) of replying exactly one of the bid levels, mean over the role's bid prompts of
the episodes (at most ``bids.mass_probe_prompts`` of them, evenly spaced): 1 when the bid
channel only ever writes bids, lower as its replies drift to other text."""
TOP_TIE_FRAC = "auction/top_tie_frac"
"""[ours] Share of the steps with bids where two or more agents bid the top (non-zero) level:
the auction's winner was a coin flip."""
SKIP_FRAC = "auction/skip_frac"
"""[ours] Share of the decision steps that nobody acted at (all bids 0, or the rule skipped)."""
SKIP_RUN_MAX = "auction/skip_run_max"
"""[ours] The longest run of consecutive skipped steps in any episode."""
WINNER_ENTROPY_BITS = "auction/winner_entropy_bits"
"""[ours] Entropy in bits of which role acts, over the acting steps (0: one role acts always;
log2 of the roles: each as often)."""
TOP_CONTESTED_WIN_SHARE = "auction/top_contested_win_share"
"""[ours] The largest share of the contested steps won by one agent; above
:data:`bidswarm.rollout.market.DOMINANT_SHARE` the run warns that one agent wins almost every
contest."""
MARKET_HEALTH = (
    "auction/regret",
    EXPERT_OWNER_AGREEMENT,
    EXPERT_OWNER_RECALL,
    EXPERT_OWNER_PRECISION,
    OWNER_AUC,
    VALID_LEVEL_MASS,
    BID_PARSE_RATE,
    TOP_TIE_FRAC,
    SKIP_FRAC,
    SKIP_RUN_MAX,
    WINNER_ENTROPY_BITS,
    TOP_CONTESTED_WIN_SHARE,
)
"""The market's health: what every run logs per update and per evaluation and prints at its
end (``rollout/market.py``)."""
BID_ANCHOR = "loss_bid_anchor"
"""[ours] The bid anchor's loss in an action update (``bids.anchor_coef`` > 0): the negative
log-likelihood per token of the task expert's bid labels at the update's bid prompts
(``bids.anchor_target=levels``: -log of the probability that the reply is a level, mean over the
prompts), before the coefficient; ``/<agent>`` per agent, the bare name the mean over the agents."""
REGRET = "auction/regret"
"""[ours] Who-should-act regret against a one-step fork oracle, per held-out evaluation
(``eval.regret_states`` states per world): at a sampled state every agent acts first in a fork
of its own and the swarm plays on with its own rule and policies; the regret is the best
agent's return from there minus that of the agent the rule let act (reward units, acting
states only). ``/mean``, ``/ci_low``, ``/ci_high`` over the worlds' mean regrets, ``/states``
the states measured, ``/oracle`` the best agent's return there (mean over worlds): a regret
reads against it, since a swarm that earns nothing from any state has regret 0."""
CALIBRATION_ERROR = "bids/calibration_error"
"""[ours] ``bids.loss=calibrated``: mean |bid - value target| over the agents' bids at the
states a bid update forked (``rollout/acting_values.py``): how far the bids are from pricing
each agent's measured value of acting (bid units)."""
BID_CALIBRATION = "loss_bid_calibrated"
"""[ours] ``bids.loss=calibrated``: the bid update's cross-entropy of each agent's distribution
over the levels toward its two-hot value targets; ``/<agent>`` per agent, the bare name the
mean over the agents."""
