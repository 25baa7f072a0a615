"""The bid channel and the market's health: readers, the expert_owner reference rule, the
health metrics, the valid-level mass probe and the bid anchor."""

from __future__ import annotations

import math
import random

import pytest
import torch

from bidswarm import metric_names as names
from bidswarm.coordination.auction import Auction
from bidswarm.coordination.base import Decision, Situation
from bidswarm.coordination.bid_readers import (
    READERS,
    Argmax,
    Expected,
    Sampled,
    balance,
    level_log_priors,
    make_reader,
)
from bidswarm.coordination.expert_owner import ExpertOwner
from bidswarm.coordination.fixed import RoundRobin
from bidswarm.envs import make_env
from bidswarm.envs.experts import expert_levels, expert_owners, play_expert_episode
from bidswarm.lit.bid_targets import bid_anchor_loss, calibrated_value_loss, level_mass_loss
from bidswarm.report.market import market_run_table, owner_gap_table
from bidswarm.report.reading import RunResult
from bidswarm.rollout.acting_values import (
    ActingValues,
    acting_values,
    regret,
    sample_states,
    value_targets,
)
from bidswarm.rollout.batches import (
    BidLabelBatch,
    BidLevelMassBatch,
    BidValueBatch,
    bid_label_batches,
    level_mass_batches,
)
from bidswarm.rollout.evaluation import evaluate
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.market import market_metrics, market_warnings, owner_auc
from bidswarm.rollout.records import Bid, Episode, Reply, StepRecord
from bidswarm.run.relabel import RoundTraining, mixed_precision, relabel_bids
from test_coordination import LEVELS, build_swarm, seeded, task

ROLES = ["logger", "miner", "smith"]


# -- readers -----------------------------------------------------------------------------------
def test_the_readers_are_registered_by_name():
    assert sorted(READERS) == ["argmax", "expected", "sampled"]
    assert not make_reader("sampled").reads_levels
    assert make_reader("argmax").reads_levels and make_reader("expected").reads_levels


def test_argmax_reads_the_most_likely_level_and_breaks_ties_low():
    logprobs = [math.log(p) for p in (0.1, 0.2, 0.3, 0.3, 0.1)]
    assert Argmax().read(logprobs, LEVELS, 1.0) == 0.4
    assert Argmax().read([-1.0, -5.0, -5.0, -5.0, -0.5], LEVELS, 1.0) == 0.8


def test_expected_is_the_mean_level_under_the_tempered_softmax():
    probs = [0.1, 0.0001, 0.2, 0.3, 0.3999]
    logprobs = [math.log(p) for p in probs]
    assert Expected().read(logprobs, LEVELS, 1.0) == pytest.approx(
        sum(p * level for p, level in zip(probs, LEVELS, strict=True))
    )
    # A colder softmax moves the expectation toward the most likely level, a hotter one to
    # the plain mean of the levels.
    assert Expected().read(logprobs, LEVELS, 0.05) == pytest.approx(0.8, abs=1e-3)
    assert Expected().read(logprobs, LEVELS, 1e6) == pytest.approx(sum(LEVELS) / 5, abs=1e-3)


def test_the_sampled_reader_reads_no_level_logprobs():
    with pytest.raises(TypeError, match="sampled replies"):
        Sampled().read([0.0] * 5, LEVELS, 1.0)


def test_a_level_reader_bids_from_the_level_replies_logprobs():
    swarm = build_swarm()
    swarm.reader = Argmax()
    envs = [make_env(task()) for _ in range(2)]
    for seed, env in enumerate(envs):
        env.reset(seed)
    bids = swarm.bid_many([0], [envs], seeded(0))[0]
    prompts = [bid.reply.prompt_ids for bid in bids]
    logprobs = swarm.level_logprobs(0, prompts)
    for bid, row in zip(bids, logprobs.tolist(), strict=True):
        assert bid.parsed and bid.level == Argmax().read(row, LEVELS, 1.0)
        assert bid.reply.text == f"{bid.level:.1f}"


def test_balanced_bids_divide_each_level_by_its_share_of_the_roles_labels():
    # A role that owns one step in ten: its labels bid 0.8 once and 0 nine times.
    priors = level_log_priors([0.8] + [0.0] * 9, LEVELS)
    assert priors[0] == pytest.approx(math.log(0.9)) and priors[4] == pytest.approx(math.log(0.1))
    assert priors[1:4] == [-math.inf] * 3
    # Unsure at its own step (0.3 on 0.8): read at its base rate it bids 0.27; balanced, the
    # 0.8 weighs 0.3 / 0.1 against 0.7 / 0.9, and levels its labels never bid count for none.
    logprobs = [math.log(p) for p in (0.6, 0.05, 0.05, 0.0001, 0.2999)]
    assert Expected().read(logprobs, LEVELS, 1.0) == pytest.approx(0.27, abs=1e-3)
    weights = (0.6 / 0.9, 0.2999 / 0.1)
    balanced = balance(logprobs, priors, 1.0)
    assert Expected().read(balanced, LEVELS, 1.0) == pytest.approx(0.8 * weights[1] / sum(weights))
    assert Argmax().read(balanced, LEVELS, 1.0) == 0.8
    # At a temperature the shares are divided out of the tempered distribution.
    hot = Expected().read(balance(logprobs, priors, 2.0), LEVELS, 2.0)
    tempered = (0.6**0.5 / 0.9, 0.2999**0.5 / 0.1)
    assert hot == pytest.approx(0.8 * tempered[1] / sum(tempered))
    with pytest.raises(ValueError, match="not all among levels"):
        level_log_priors([0.5], LEVELS)
    with pytest.raises(ValueError, match="no bid labels"):
        level_log_priors([], LEVELS)


def test_a_balanced_swarm_reads_its_agents_levels_through_their_roles_shares():
    swarm = build_swarm()
    swarm.reader = Expected()
    env = make_env(task())
    env.reset(0)
    plain = swarm.bid_many([0], [[env]], seeded(0))[0][0]
    priors = level_log_priors([0.8, 0.0, 0.0, 0.0, 0.6], LEVELS)
    swarm.level_log_priors = {"logger": priors}
    balanced = swarm.bid_many([0], [[env]], seeded(0))[0][0]
    row = swarm.level_logprobs(0, [plain.reply.prompt_ids])[0].tolist()
    assert plain.level == pytest.approx(Expected().read(row, LEVELS, swarm.bid_temperature))
    assert balanced.level == pytest.approx(
        Expected().read(balance(row, priors, swarm.bid_temperature), LEVELS, swarm.bid_temperature)
    )
    assert balanced.level != pytest.approx(plain.level)


def test_level_logprobs_are_the_teacher_forced_logprobs_of_each_levels_reply():
    swarm = build_swarm()
    env = make_env(task())
    env.reset(3)
    policy = swarm.population.agents[1]
    prompt = policy.encode_prompts([swarm.prompts.bid("miner", env.observation("miner"))])
    found = swarm.level_logprobs(1, prompt)[0]
    for level, value in zip(LEVELS, found.tolist(), strict=True):
        with torch.no_grad():
            logp, mask = policy.reply_token_logprobs(prompt, [swarm.level_reply_ids(1, level)])
        assert value == pytest.approx(float((logp * mask).sum()), abs=1e-4)
    mass = swarm.level_mass(1, prompt)[0]
    assert mass == pytest.approx(float(found.exp().sum()), rel=1e-5) and 0.0 < mass < 1.0


# -- the expert_owner reference rule -----------------------------------------------------------
def test_expert_owner_lets_the_experts_choice_act_and_skips_with_it():
    rule = ExpertOwner()
    situations = [
        Situation(3, 0, expert_choice=frozenset({2})),
        Situation(3, 1, expert_choice=frozenset()),
        Situation(6, 2, expert_choice=frozenset({1, 4})),
    ]
    rng = random.Random(0)
    picks = [d.actor for d in rule.decide(situations * 20, rng)]
    assert picks[0::3] == [2] * 20 and picks[1::3] == [None] * 20
    assert set(picks[2::3]) == {1, 4}  # a replicated role: either copy


def test_a_swarm_under_expert_owner_always_agrees_with_the_expert():
    swarm = build_swarm()
    loop = RolloutLoop(lambda: make_env(task(12)), swarm, ExpertOwner())
    episodes = loop.run([0, 1, 2], random.Random(0), seeded(0))
    metrics = market_metrics(episodes, swarm.roles)
    assert metrics[names.EXPERT_OWNER_AGREEMENT] == 1.0
    assert all(step.expert_levels for e in episodes for step in e.steps)


def test_the_first_state_is_on_the_experts_path_and_a_wrong_actor_leaves_it():
    swarm = build_swarm()
    env = make_env(task(12))
    env.reset(0)
    owner = next(iter(expert_owners(expert_levels(env, LEVELS))))
    wrong = next(a for a in range(3) if swarm.role(a) != owner)

    class Wrong(ExpertOwner):
        def decide(self, situations, rng):
            return [Decision(actor=wrong) for _ in situations]

    loop = RolloutLoop(lambda: make_env(task(12)), swarm, Wrong())
    episode = loop.run([0], random.Random(0), seeded(0))[0]
    assert episode.steps[0].followed_expert is False
    assert episode.on_expert_path == [True] + [False] * (len(episode.steps) - 1)


def test_the_experts_own_play_stays_on_their_path():
    env = make_env(task(30))
    played = play_expert_episode(env, 5, LEVELS)
    assert played.decisions > 0
    # Replaying the experts' actions through the loop's bookkeeping: every step follows them.
    env.reset(5)
    steps = []
    while not env.done:
        levels = expert_levels(env, LEVELS)
        owners = expert_owners(levels)
        assert len(owners) <= 1, "the experts' top bids never tie"
        steps.append(StepRecord(env.decisions_made, Decision(actor=None), expert_levels=levels))
        steps[-1].followed_expert = True
        if owners:
            role = next(iter(owners))
            env.step(role, env.expert_action(role) or "")
        else:
            env.skip()
    assert all(Episode(5, steps).on_expert_path)


# -- health metrics ----------------------------------------------------------------------------
def bid(agent: int, level: float, parsed: bool = True) -> Bid:
    return Bid(level, Reply(agent, [1, 2], [3], f"{level:.1f}"), parsed)


def step(index, actor, levels, owner, runner_up_bid=0.0, followed=None, parsed=True) -> StepRecord:
    decision = Decision(actor=actor, runner_up=None, runner_up_bid=runner_up_bid, forkable=True)
    expert = {role: (0.8 if role == owner else 0.0) for role in ROLES}
    bids = {a: bid(a, level, parsed or a != 0) for a, level in enumerate(levels)}
    record = StepRecord(index, decision, bids, expert_levels=expert)
    record.followed_expert = followed
    return record


def test_health_metrics_of_hand_made_episodes():
    episode = Episode(
        0,
        [
            step(0, 0, [0.8, 0.2, 0.0], "logger", 0.2, followed=True),  # agrees, on path
            step(1, 2, [0.6, 0.0, 0.6], "logger", 0.6, followed=False),  # tie; disagrees, on path
            step(2, None, [0.0, 0.0, 0.0], None, parsed=False),  # skip, agrees (off path)
            step(3, None, [0.0, 0.0, 0.0], "smith"),  # skip, disagrees (off path)
            step(4, 2, [0.2, 0.0, 0.8], "smith", 0.2),  # agrees, off path
        ],
    )
    metrics = market_metrics([episode], ROLES)
    assert metrics[names.EXPERT_OWNER_AGREEMENT] == pytest.approx(3 / 5)
    assert metrics[f"{names.EXPERT_OWNER_AGREEMENT}/on_path"] == pytest.approx(1 / 2)
    assert metrics[f"{names.EXPERT_OWNER_AGREEMENT}/off_path"] == pytest.approx(2 / 3)
    # The logger owns steps 0 and 1 and acts at step 0; the smith owns 3 and 4, acts at 4; the
    # miner owns none (no recall to measure).
    assert metrics[f"{names.EXPERT_OWNER_RECALL}/logger"] == pytest.approx(1 / 2)
    assert metrics[f"{names.EXPERT_OWNER_RECALL}/smith"] == pytest.approx(1 / 2)
    assert f"{names.EXPERT_OWNER_RECALL}/miner" not in metrics
    # The logger acts once, at its own step; the smith twice, once at its own (step 4).
    assert metrics[f"{names.EXPERT_OWNER_PRECISION}/logger"] == 1.0
    assert metrics[f"{names.EXPERT_OWNER_PRECISION}/smith"] == pytest.approx(1 / 2)
    assert f"{names.EXPERT_OWNER_PRECISION}/miner" not in metrics
    # The logger bids 0.8, 0.6 at its steps and 0, 0, 0.2 at the others: every pair ranked.
    # The smith bids 0, 0.8 at its steps and 0, 0.6, 0 at the others: 0 ties two (1 pair),
    # 0.8 beats three: 4 of 6 pairs. The miner owns no step: no area to measure.
    assert metrics[f"{names.OWNER_AUC}/logger"] == 1.0
    assert metrics[f"{names.OWNER_AUC}/smith"] == pytest.approx(4 / 6)
    assert f"{names.OWNER_AUC}/miner" not in metrics
    assert metrics[f"{names.BID_PARSE_RATE}/logger"] == pytest.approx(4 / 5)
    assert metrics[f"{names.BID_PARSE_RATE}/miner"] == 1.0
    assert metrics[names.TOP_TIE_FRAC] == pytest.approx(1 / 5)
    assert metrics[names.SKIP_FRAC] == pytest.approx(2 / 5)
    assert metrics[names.SKIP_RUN_MAX] == 2.0
    # Acting: logger once, smith twice.
    assert metrics[names.WINNER_ENTROPY_BITS] == pytest.approx(
        -(1 / 3) * math.log2(1 / 3) - (2 / 3) * math.log2(2 / 3)
    )
    assert metrics[names.TOP_CONTESTED_WIN_SHARE] == pytest.approx(2 / 3)
    assert market_warnings(metrics) == []
    assert market_warnings({names.TOP_CONTESTED_WIN_SHARE: 0.95})


def test_the_owner_auc_ranks_owned_steps_against_the_others():
    assert owner_auc([(0.8, True), (0.2, False)]) == 1.0
    assert owner_auc([(0.2, True), (0.8, False)]) == 0.0
    # A constant bid does not see whose step it is, however high.
    assert owner_auc([(0.7, True), (0.7, False), (0.7, False)]) == 0.5
    assert owner_auc([(0.5, True), (0.1, True)]) is None


def test_the_monolithic_agent_has_no_agreement_to_measure():
    record = StepRecord(0, Decision(actor=0))
    metrics = market_metrics([Episode(0, [record])], [None])
    assert names.EXPERT_OWNER_AGREEMENT not in metrics
    assert metrics[names.WINNER_ENTROPY_BITS] == 0.0


# -- the bid anchor's labels -------------------------------------------------------------------
def test_anchor_labels_are_the_experts_level_for_each_bidders_role():
    episode = Episode(
        0, [step(0, 0, [0.8, 0.2, 0.0], "logger"), step(1, 2, [0.2, 0.0, 0.8], "smith")]
    )
    batches = bid_label_batches([episode], ROLES, lambda agent, level: [agent, int(level * 10)], 64)
    assert [b.agent for b in batches] == [0, 1, 2]
    assert batches[0].reply_ids == [[0, 8], [0, 0]]  # the logger's label: 0.8, then 0
    assert batches[2].reply_ids == [[2, 0], [2, 8]]
    capped = bid_label_batches([episode] * 10, ROLES, lambda a, level: [a], limit=3)
    assert all(len(b.prompt_ids) == 3 for b in capped)


def logger_bid_prompts():
    """A fresh swarm, its logger's bid prompts in four worlds' first states and the expert's
    label there (each the level's canonical reply)."""
    swarm = build_swarm()
    envs = [make_env(task()) for _ in range(4)]
    for seed, env in enumerate(envs):
        env.reset(seed)
    prompts = swarm.population.agents[0].encode_prompts(
        [swarm.prompts.bid("logger", e.observation("logger")) for e in envs]
    )
    labels = [swarm.level_reply_ids(0, expert_levels(e, LEVELS)["logger"]) for e in envs]
    return swarm, prompts, labels


def test_the_anchor_moves_the_bid_policy_onto_the_experts_levels():
    swarm, prompts, labels = logger_bid_prompts()
    policy = swarm.population.agents[0]
    batch = BidLabelBatch(0, prompts, labels)
    mass_before = sum(swarm.level_mass(0, prompts)) / len(prompts)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        optimizer.zero_grad()
        loss = bid_anchor_loss(policy, batch, 1.0, 256, lambda agent, term: term.backward())
        optimizer.step()
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0]
    assert sum(swarm.level_mass(0, prompts)) / len(prompts) > mass_before


def test_the_level_anchor_takes_each_bidders_prompts_with_every_level():
    episode = Episode(
        0, [step(0, 0, [0.8, 0.2, 0.0], "logger"), step(1, 2, [0.2, 0.0, 0.8], "smith")]
    )
    batches = level_mass_batches([episode], [0.0, 0.4, 0.8], lambda a, lv: [a, int(lv * 10)], 64)
    assert [b.agent for b in batches] == [0, 1, 2]
    assert all(len(b.prompt_ids) == 2 for b in batches)  # every bid prompt, no label needed
    assert batches[1].level_ids == [[1, 0], [1, 4], [1, 8]]
    capped = level_mass_batches([episode] * 10, [0.0, 0.8], lambda a, level: [a], limit=3)
    assert all(len(b.prompt_ids) == 3 for b in capped)


def within_levels(swarm, prompts) -> torch.Tensor:
    """The logger's distribution over the levels given that it replies one, per prompt."""
    return swarm.level_logprobs(0, prompts, counted=False).softmax(dim=1)


def test_the_level_anchor_raises_the_level_mass_and_leaves_the_choice_to_the_model():
    """[ours] bids.anchor_target=levels: its loss is -log of the level mass the swarm reads;
    training on it raises that mass, and moves the odds between the levels less than the
    label anchor, trained alike, moves them toward the expert's labels."""
    moved = {}
    for target in ("levels", "expert"):
        swarm, prompts, labels = logger_bid_prompts()
        policy = swarm.population.agents[0]
        level_ids = [swarm.level_reply_ids(0, level) for level in LEVELS]
        mass_before = torch.tensor(swarm.level_mass(0, prompts))
        choice_before = within_levels(swarm, prompts)
        optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
        for update in range(8):
            optimizer.zero_grad()
            if target == "levels":
                batch = BidLevelMassBatch(0, prompts, level_ids)
                loss = level_mass_loss(policy, batch, 1.0, 256, lambda a, term: term.backward())
                if update == 0:  # the learner's loss is what the swarm reads, by another path
                    assert float(loss) == pytest.approx(float(-mass_before.log().mean()), rel=1e-4)
            else:
                batch = BidLabelBatch(0, prompts, labels)
                bid_anchor_loss(policy, batch, 1.0, 256, lambda a, term: term.backward())
            optimizer.step()
        if target == "levels":
            mass_after = torch.tensor(swarm.level_mass(0, prompts))
            # from ~1e-12 (a fresh tiny model) up by orders of magnitude on every prompt
            assert bool((mass_after.log() - mass_before.log() > 5.0).all()), (
                mass_before,
                mass_after,
            )
        # total variation between the choice among the levels before and after, per prompt
        moved[target] = float(
            (within_levels(swarm, prompts) - choice_before).abs().sum(1).mean() / 2
        )
    assert moved["levels"] < moved["expert"], moved


# -- the report's market sections -------------------------------------------------------------
def run_result(seed: int, own: dict[int, float], reference: dict[int, float]) -> RunResult:
    market = {
        names.EXPERT_OWNER_AGREEMENT: 0.5,
        f"{names.VALID_LEVEL_MASS}/logger": 0.95,
        "gap_to_expert_owner/mean": 1.0,
        "gap_to_expert_owner/ci_low": -1.0,
        "gap_to_expert_owner/ci_high": 3.0,
    }
    return RunResult(
        f"run{seed}",
        "default",
        sum(own.values()) / len(own),
        None,
        None,
        training_seed=seed,
        world_rewards=own,
        before_world_rewards=own,
        market={"before": market, "after": market},
        reference_world_rewards={"after_expert_owner": reference},
    )


def test_the_owner_gap_is_paired_over_seed_and_world_cells():
    runs = [
        run_result(
            seed, {w: 10.0 * w + seed for w in range(4)}, {w: 10.0 * w + seed + 5 for w in range(4)}
        )
        for seed in range(3)
    ]
    table = owner_gap_table({"default": runs})
    row = next(line for line in table.splitlines() if line.startswith("| default | after RL"))
    cells = [c.strip() for c in row.split("|")]
    assert cells[3] == "3" and cells[6] == "+5.0"
    assert "| default | after SFT" not in table  # no reference was logged after SFT
    assert owner_gap_table({"default": [RunResult("r", "default", 1.0, None, None)]}) == ""


def test_the_market_run_table_has_a_row_per_run_with_its_health():
    result = run_result(0, {0: 1.0}, {0: 2.0})
    table = market_run_table({"default": [result]})
    row = table.splitlines()[-1]
    assert (
        row.startswith("| default | 0 | 50% → 50%")
        and "0.95" in row
        and "+1.0 (-1.0 .. +3.0)" in row
        and row.endswith("| – |")  # no regret measured
    )
    regret = {"mean": 2.5, "ci_low": 0.5, "ci_high": 4.5, "oracle": 30.0}
    result.market["after"] = result.market["after"] | {
        f"{names.REGRET}/{k}": v for k, v in regret.items()
    }
    assert market_run_table({"default": [result]}).endswith("| 2.5 (0.5 .. 4.5) of 30.0 |")


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [("bf16-mixed", torch.bfloat16), ("32-true", torch.float32), ("16-mixed", torch.float32)],
)
def test_the_rounds_forwards_run_in_the_trainers_autocast(precision, dtype):
    layer = torch.nn.Linear(4, 4)
    with mixed_precision(precision, "cpu"):
        assert layer(torch.ones(1, 4)).dtype == dtype


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_relabel_rounds_teach_the_bids_the_experts_choice_where_the_swarm_goes(precision):
    """Also under the trainer's bfloat16 autocast (``trainer.precision=bf16-mixed``, which the
    pretrained presets train in): the rounds train outside Lightning, in its precision."""
    swarm = build_swarm()
    swarm.reader = Argmax()
    loop = RolloutLoop(lambda: make_env(task(12)), swarm, Auction())
    training = RoundTraining(1e-2, 8, 4096, precision)
    found = relabel_bids(loop, [], [0, 1, 2, 3], 3, training, seed=0)
    before, after = found["sft/relabel/0/agreement"], found["sft/relabel/2/agreement"]
    assert after > before + 0.2, found
    assert found["sft/relabel/flops"] > 0


# -- every agent's value of acting, and the regret against that one-step oracle ----------------
def test_acting_values_fork_every_agent_reproducibly_and_regret_is_never_negative():
    swarm = build_swarm()
    loop = RolloutLoop(lambda: make_env(task(10)), swarm, Auction())
    episodes = loop.run([0, 1], random.Random(0), seeded(0), snapshot_every_step=True)
    assert all(s.snapshot is not None for e in episodes for s in e.steps)
    states = sample_states(episodes, 2, random.Random(1))
    assert len(states) == 4 and all(e.steps.count(s) == 1 for e, s in states)
    first = acting_values(loop, states, 2, random.Random(2), seeded(3))
    again = acting_values(loop, states, 2, random.Random(2), seeded(3))
    assert [f.returns for f in first] == [f.returns for f in again]
    for forks in first:
        assert len(forks.returns) == 3 and all(len(r) == 2 for r in forks.returns)
        found = regret(forks)
        assert found is None if forks.step.actor is None else found >= 0.0


def acting(values: list[float], actor: int | None, open_reward: float | None) -> ActingValues:
    record = StepRecord(0, Decision(actor=actor), open_reward=open_reward)
    return ActingValues(Episode(0, [record]), record, tuple((v,) for v in values))


def test_value_targets_are_shares_of_the_tasks_reward_in_bid_units():
    assert value_targets(acting([70.0, 35.0, 0.0], 0, 140.0), 0.8) == pytest.approx([0.4, 0.2, 0])
    # Later in an episode the scale stays the reward open at its start: values-to-go.
    start = StepRecord(0, Decision(actor=0), open_reward=140.0)
    later = StepRecord(5, Decision(actor=1), open_reward=35.0)
    forks = ActingValues(Episode(0, [start, later]), later, ((35.0,), (0.0,), (7.0,)))
    assert value_targets(forks, 0.8) == pytest.approx([0.2, 0.0, 0.04])
    # Where the task does not say what is open, the best agent's value is the scale.
    assert value_targets(acting([2.0, 1.0, 0.5], 0, None), 0.8) == pytest.approx([0.8, 0.4, 0.2])
    assert value_targets(acting([0.0, 0.0, 0.0], 0, None), 0.8) == [0.0, 0.0, 0.0]
    assert regret(acting([5.0, 9.0, 1.0], 0, None)) == 4.0
    assert regret(acting([5.0, 9.0, 1.0], None, None)) is None


def test_an_evaluation_reports_the_regret_over_worlds_without_counting_its_forks():
    swarm = build_swarm()  # untrained: its bids all skip, so a rule that always lets one act
    loop = RolloutLoop(lambda: make_env(task(8)), swarm, RoundRobin())
    plain = evaluate(loop, [0, 1, 2], 1, seed=0)
    measured = evaluate(loop, [0, 1, 2], 1, seed=0, regret_states=1)
    assert names.REGRET + "/mean" not in plain.metrics
    assert measured.metrics[names.REGRET + "/mean"] >= 0.0
    assert measured.metrics[names.REGRET + "/states"] <= 3
    # the oracle's value is what the regret reads against: never below the regret
    assert measured.metrics[names.REGRET + "/oracle"] >= measured.metrics[names.REGRET + "/mean"]
    # The regret's forks change neither the evaluation's episodes nor its counted cost.
    assert measured.metrics["reward/mean"] == plain.metrics["reward/mean"]
    assert measured.usage.rollout_tokens == plain.usage.rollout_tokens


# -- exploration without coin flips ----------------------------------------------------------
def test_exploration_orders_by_bid_plus_bonus_and_records_the_bids():
    situation = Situation(3, 0, bids={0: 0.6, 1: 0.5, 2: 0.0}, bid_bonus={1: 0.2, 2: 0.9})
    decision = Auction().decide([situation], random.Random(0))[0]
    assert (decision.actor, decision.winning_bid) == (1, 0.5)
    assert (decision.runner_up, decision.runner_up_bid) == (0, 0.6)  # a pass stays a pass
    assert (
        Auction()
        .decide([Situation(3, 0, bids={0: 0.6, 1: 0.5, 2: 0.0})], random.Random(0))[0]
        .actor
        == 0
    )


def test_the_spread_is_the_level_distributions_std_and_evaluation_turns_exploration_off():
    logprobs = [math.log(p) for p in (0.5, 1e-9, 1e-9, 1e-9, 0.5)]
    assert Expected.spread(logprobs, LEVELS, 1.0) == pytest.approx(0.4, abs=1e-6)
    swarm = build_swarm()
    swarm.reader, swarm.explore = Expected(), 1.0
    swarm.train_explore = 1.0
    env = make_env(task())
    env.reset(0)
    assert all(bid.bonus > 0 for bid in swarm.bid_many([0], [[env]], seeded(0))[0])
    with swarm.evaluating():
        assert all(bid.bonus == 0 for bid in swarm.bid_many([0], [[env]], seeded(0))[0])
    assert swarm.explore == 1.0


def test_the_calibrated_loss_moves_an_agents_expected_bid_toward_its_value():
    swarm = build_swarm()
    envs = [make_env(task()) for _ in range(3)]
    for seed, env in enumerate(envs):
        env.reset(seed)
    policy = swarm.population.agents[2]
    prompts = policy.encode_prompts(
        [swarm.prompts.bid("smith", e.observation("smith")) for e in envs]
    )
    values = [0.7, 0.1, 0.4]
    replies = [swarm.level_reply_ids(2, level) for level in LEVELS]
    batch = BidValueBatch(2, prompts, values, list(LEVELS), replies)

    def expected_bids() -> list[float]:
        return [
            Expected().read(row, LEVELS, 1.0) for row in swarm.level_logprobs(2, prompts).tolist()
        ]

    error_before = sum(abs(b - v) for b, v in zip(expected_bids(), values, strict=True))
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    for _ in range(30):
        optimizer.zero_grad()
        calibrated_value_loss(policy, batch, 64, lambda agent, term: term.backward())
        optimizer.step()
    error_after = sum(abs(b - v) for b, v in zip(expected_bids(), values, strict=True))
    assert error_after < 0.3 * error_before, (error_before, error_after)


def test_the_market_table_script_reads_run_folders_and_pairs_the_gap(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    def run_folder(
        name: str, seed: int, own: float, reference: float, regret=None, success=None
    ) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "resolved_config.yaml").write_text(f"task:\n  seed: 9\nseed: {seed}\n")
        metrics = {
            names.EXPERT_OWNER_AGREEMENT: 0.5,
            f"{names.VALID_LEVEL_MASS}/logger": 0.9,
            "participation/logger": 0.25,
            f"{names.EXPERT_OWNER_RECALL}/logger": 0.5,
            f"{names.OWNER_AUC}/logger": 0.75,
        }
        if regret is not None:
            metrics[f"{names.REGRET}/mean"] = regret
        worlds = {str(w): own + w for w in range(4)}
        later = {str(w): own + 2 * w for w in range(4)}  # RL changes the arm's worlds
        shares = {} if success is None else {"task/success": success}
        state = {
            "eval_before": {"reward/mean": own} | metrics,
            "eval_after": {"reward/mean": own} | metrics | shares,
            "eval_before_worlds": worlds,
            "eval_after_worlds": later,
            "eval_before_expert_owner_worlds": {w: r + reference - own for w, r in worlds.items()},
            "eval_after_expert_owner_worlds": {w: r + reference - own for w, r in later.items()},
        }
        (folder / "state.json").write_text(json.dumps(state))
        return folder

    folders = [run_folder(f"a{s}", s, 10.0 + s, 15.0 + s, regret=2.0 + 2 * s) for s in range(2)]
    script = Path(__file__).resolve().parents[1] / "scripts" / "market_table.py"
    out = subprocess.run(
        [sys.executable, str(script), "--arm", *[f"a={f}" for f in folders]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "| a | 0 | 10.0 → 10.0 | 50% → 50%" in out
    # the regret over runs: mean 3.0, t interval with one degree of freedom (12.71 x SE 1.0)
    assert (
        "| a | 2 | +5.0 (+5.0 .. +5.0) | +5.0 (+5.0 .. +5.0) | – | – | –, – → –, – "
        "| 3.0 (-9.7 .. 15.7) |"
    ) in out
    # arms named item by item within one --arm, each against the reference; a folder that
    # holds no run is an error naming it, not a row left out
    other = run_folder("b0", 0, 20.0, 22.0, success=0.25)
    items = [f"a={folders[0]}", f"b={other}"]
    both = subprocess.run(
        [sys.executable, str(script), "--arm", *items, "--reference", "a"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "| b | 0 | 20.0 → 20.0" in both and "| a | 0 | 10.0 → 10.0" in both
    assert "| b | 1 | +2.0 (+2.0 .. +2.0) | +2.0 (+2.0 .. +2.0) | +10.0" in both
    # b − a paired per world after SFT (10 + w against 20 + w) and after RL (10 + 2w, 20 + 2w);
    # b's share of successful episodes after RL (none logged after SFT); b has no regret
    assert (
        "| +10.0 (+10.0 .. +10.0) (1 seeds) | +10.0 (+10.0 .. +10.0) (1 seeds) | – → 25% | – |"
    ) in both
    # per run and role: its share of the acting steps, recall, precision (none logged), AUC
    assert "| b | 0 | logger | 25% → 25% | 50% → 50% | – → – | 0.75 → 0.75 |" in both
    missing = subprocess.run(
        [sys.executable, str(script), "--arm", f"a={tmp_path / 'nothing'}"],
        capture_output=True,
        text=True,
    )
    assert missing.returncode != 0 and "nothing" in missing.stderr
    # a run that has not finished RL (no evaluation after it) is named, not left out
    training = run_folder("t0", 0, 10.0, 15.0)
    state = json.loads((training / "state.json").read_text())
    del state["eval_after"]
    (training / "state.json").write_text(json.dumps(state))
    unfinished = subprocess.run(
        [sys.executable, str(script), "--arm", f"a={folders[0]}", str(training)],
        capture_output=True,
        text=True,
    )
    assert unfinished.returncode != 0 and "t0" in unfinished.stderr
    # a run with no choice of actor (the monolithic agent: no bids, no rule to swap) gets "–"
    # where the market's cells would be, and its reward still pairs with the reference's
    alone = tmp_path / "m0"
    alone.mkdir()
    (alone / "resolved_config.yaml").write_text("seed: 0\n")
    worlds = {str(w): 30.0 + w for w in range(4)}
    after = {"reward/mean": 31.5}
    (alone / "state.json").write_text(
        json.dumps(
            {
                "eval_before": after,
                "eval_after": after,
                "eval_before_worlds": worlds,
                "eval_after_worlds": worlds,
            }
        )
    )
    mono = subprocess.run(
        [sys.executable, str(script), "--arm", f"a={folders[0]}", f"m={alone}", "--reference", "a"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "| m | 0 | 31.5 → 31.5 | – | – | – | – |" in mono
    assert "| m | 1 | – | – | +20.0 (+20.0 .. +20.0) (1 seeds) | +18.5 (" in mono
