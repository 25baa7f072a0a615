"""SFT cold start: each agent learns its own role's demonstrations; the monolithic agent makes
as many passes over each action demonstration as its role's agent (or, with ``sft.match=tokens``,
matches the role agents' tokens)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate
from bidswarm.config import ModelConfig, SFTConfig, SFTMatch, TinyArchConfig
from bidswarm.engines import PromptBatch
from bidswarm.envs.experts import Demonstration, format_bid
from bidswarm.lit.sft import (
    SFTModule,
    bid_parse_rate,
    encode_demonstrations,
    plan_sft,
    run_sft,
    sft_budget,
)
from conftest import hf_engine

LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]
ROLES = ["logger", "miner", "smith"]
ACTIONS = {"logger": "chop a tree", "miner": "mine stone", "smith": "craft a wooden pickaxe"}


def expert_demonstrations(n_steps: int, seed: int = 0) -> list[Demonstration]:
    """A hand-made crafting-like world: the role whose input is missing bids 0.8 and acts.

    Logs are chopped until 3, then the smith crafts a pickaxe, then the miner mines stone;
    the other roles bid 0.0 or 0.2 (could help a little) by a fixed rule.
    """
    rng = random.Random(seed)
    demos = []
    for step in range(n_steps):
        logs, pickaxe = rng.randint(0, 5), rng.random() < 0.5
        actor = "logger" if logs < 3 else ("miner" if pickaxe else "smith")
        tools = "1 wooden pickaxe" if pickaxe else "nothing else"
        observation = f"step {step % 40} of 40. inventory: {logs} oak log, {tools}. near: forest."
        for role in ROLES:
            level = 0.8 if role == actor else (0.2 if role == "smith" and logs >= 3 else 0.0)
            demos.append(Demonstration("bid", role, observation, format_bid(level)))
        demos.append(Demonstration("action", actor, observation, ACTIONS[actor]))
        demos.append(Demonstration("action", None, observation, ACTIONS[actor]))
    return demos


def tiny_config() -> ModelConfig:
    arch = TinyArchConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128)
    return ModelConfig(name="tiny", source="tiny", prompt_style="compact", tiny=arch)


def build(roles, demos) -> tuple[Population, PromptTemplate]:
    descriptions = {
        role: f"{role} can {ACTIONS.get(role, 'do anything')}" for role in [*ROLES, None]
    }
    corpus_template = PromptTemplate("compact", "get a pickaxe", descriptions, tuple(LEVELS))
    corpus = [
        (corpus_template.bid if d.kind == "bid" else corpus_template.action)(d.role, d.observation)
        + corpus_template.reply_text(d.reply)
        for d in demos
    ]
    torch.manual_seed(0)
    population = Population.build(tiny_config(), roles, replicas=1, corpus=corpus)
    template = PromptTemplate(
        "compact", "get a pickaxe", descriptions, tuple(LEVELS), population[0].tokenizer
    )
    return population, template


def greedy_match_rate(population, template, demos, role_of_demos=None) -> dict[int, float]:
    """Per agent: the fraction of its demonstrations whose greedy reply equals the expert's."""
    rates = {}
    for index, agent in enumerate(population):
        own = [d for d in demos if d.role == (role_of_demos or agent.role)]
        if agent.role is None:
            own = [d for d in own if d.kind == "action"]
        prompts = [
            template.bid(d.role, d.observation)
            if d.kind == "bid"
            else template.action(d.role, d.observation)
            for d in own
        ]
        replies = hf_engine().generate(
            [PromptBatch(agent, agent.encode_prompts(prompts))], 6, 0.0, None
        )[0]
        rates[index] = sum(r.text == d.reply for r, d in zip(replies, own, strict=True)) / len(own)
    return rates


def test_sft_teaches_each_agent_its_own_role():
    train = expert_demonstrations(96, seed=0)
    heldout = expert_demonstrations(24, seed=1)
    population, template = build([*ROLES, None], train)
    before_weights = [[p.detach().clone() for p in agent.parameters()] for agent in population]
    before = greedy_match_rate(population, template, heldout)
    # 16 epochs: the smith's reply needs more than 12 with the tokenizer trained on this corpus
    # since the monolithic agent's prompts say "monolithic" (they said "team").
    cfg = SFTConfig(epochs=16, lr=3e-3, batch_size=16)
    result = run_sft(population, train, template, cfg, trainer_kwargs={"accelerator": "cpu"})
    after = greedy_match_rate(population, template, heldout)
    assert max(before.values()) < 0.2
    assert all(rate >= 0.8 for rate in after.values()), after
    for index, agent in enumerate(population):
        changed = any(
            not torch.equal(old, new)
            for old, new in zip(before_weights[index], agent.parameters(), strict=True)
        )
        assert changed, f"agent {index} did not change"
        assert result[f"sft/final_loss/agent{index}_{agent.role or 'monolithic'}"] < 0.5
    # The logger never learnt the smith's reply: it is not among its greedy answers.
    logger = population[0]
    smith_prompts = [template.action("smith", d.observation) for d in heldout if d.role == "smith"]
    batch = PromptBatch(logger, logger.encode_prompts(smith_prompts))
    assert all(g.text != ACTIONS["smith"] for g in hf_engine().generate([batch], 6, 0.0, None)[0])


def test_the_bid_parse_rate_before_and_after_sft():
    """The cold start's probe (``sft/bid_parse_rate/before|after``): sampled bid replies to the
    agents' own bid prompts, read by the auction's parser. Seeded by its own streams: the same
    probe twice gives the same rate. A swarm without bids (monolithic) has none."""
    train = expert_demonstrations(96, seed=0)
    population, template = build(ROLES, train)

    def rate() -> float | None:
        return bid_parse_rate(population, train, template, 3, 1.0, seed=0, engine=hf_engine())

    before = rate()
    assert rate() == before
    cfg = SFTConfig(epochs=16, lr=3e-3, batch_size=16)
    run_sft(population, train, template, cfg, trainer_kwargs={"accelerator": "cpu"})
    after = rate()
    assert before < 0.3 and after > 0.8, (before, after)
    monolithic, template = build([None], train)
    assert bid_parse_rate(monolithic, train, template, 3, 1.0, 0, hf_engine()) is None


def action_copies(demos: list[Demonstration]) -> list[tuple[str, int, int]]:
    """Each action demonstration and its monolithic copy as (role, index among the role's
    demonstrations, index among the monolithic ones): the plans' example indices."""
    seen: Counter = Counter()
    copies, last_action = [], None
    for d in demos:
        if d.role is None:
            copies.append((*last_action, seen[None]))
        elif d.kind == "action":
            last_action = (d.role, seen[d.role])
        seen[d.role] += 1
    return copies


def test_action_passes_give_the_monolithic_agent_each_action_as_often_as_its_role_agent():
    demos = expert_demonstrations(30)
    population, template = build([*ROLES, None], demos)
    cfg = SFTConfig(epochs=3, lr=1e-3, batch_size=8)
    assert cfg.match == SFTMatch.action_passes  # the default
    plans = plan_sft(population, demos, template, cfg, seed=0)
    passes = [Counter(plan.stream) for plan in plans]
    copies = action_copies(demos)
    assert len(copies) == 30
    for role, index, copy in copies:
        role_plan = plans[ROLES.index(role)]
        assert role_plan.examples[index].kind == "action"
        assert plans[3].examples[copy].reply_ids == role_plan.examples[index].reply_ids
        assert passes[3][copy] == passes[ROLES.index(role)][index] == 3
    # The monolithic agent learns no bid; each role agent sees each of its bids epochs times.
    assert {e.kind for e in plans[3].examples} == {"action"}
    for plan in plans[:3]:
        bids = [i for i, e in enumerate(plan.examples) if e.kind == "bid"]
        assert len(bids) == 30 and all(Counter(plan.stream)[i] == 3 for i in bids)
    budget = sft_budget(population, plans, None)
    for index, plan in enumerate(plans):
        name = f"agent{index}_{population[index].role or 'monolithic'}"
        tokens = budget[f"sft/action_tokens/{name}"] + budget[f"sft/bid_tokens/{name}"]
        assert tokens == plan.trained_tokens > 0
        params = sum(p.numel() for p in population[index].parameters())
        assert plan.forward_tokens(population[index], None) == plan.trained_tokens  # no head
        assert budget[f"sft/flops/{name}"] == 6.0 * params * plan.trained_tokens
    assert budget["sft/bid_tokens/agent3_monolithic"] == 0
    assert budget["sft/bid_tokens"] == sum(plan.trained_tokens_of("bid") for plan in plans)
    assert budget["sft/flops"] == sum(v for k, v in budget.items() if k.startswith("sft/flops/"))


def test_matched_tokens_give_the_monolithic_agent_the_role_agents_tokens_bids_included():
    demos = expert_demonstrations(20)
    population, template = build([*ROLES, None], demos)
    cfg = SFTConfig(epochs=2, lr=1e-3, batch_size=8, match=SFTMatch.tokens)
    plans = plan_sft(population, demos, template, cfg, seed=0)
    role_tokens = sum(plan.trained_tokens for plan in plans[:3])
    own = encode_demonstrations(population[0], [d for d in demos if d.role == "logger"], template)
    assert plans[0].trained_tokens == 2 * sum(e.tokens for e in own)
    longest = max(e.tokens for e in plans[3].examples)
    assert role_tokens <= plans[3].trained_tokens < role_tokens + longest
    # Each role agent's examples are exactly its own role's demonstrations.
    assert len(plans[1].examples) == sum(d.role == "miner" for d in demos)
    assert len(plans[3].examples) == sum(d.role is None for d in demos)
    assert all(e.reply_ids[-1] == population[0].eos_id for e in plans[0].examples)
    # Bid tokens bought extra passes over the actions: far more than a role agent's 2.
    passes = Counter(plans[3].stream)
    assert min(passes[copy] for _, _, copy in action_copies(demos)) > 2 * 2


def test_bid_fraction_keeps_every_action_and_a_share_of_bids_with_matched_monolithic_budget():
    demos = expert_demonstrations(200)
    population, template = build([*ROLES, None], demos)
    cfg = SFTConfig(epochs=1, lr=1e-3, batch_size=8, bid_fraction=0.25, match=SFTMatch.tokens)
    plans = plan_sft(population, demos, template, cfg, seed=0)
    replies = {template.reply_text(d.reply) for d in demos if d.kind == "action"}
    reply_ids = {tuple(population[0].encode_reply(text)) for text in replies}
    for plan, role in zip(plans[:3], ROLES, strict=True):
        actions = [e for e in plan.examples if tuple(e.reply_ids) in reply_ids]
        assert len(actions) == sum(d.role == role and d.kind == "action" for d in demos)
        bids = len(plan.examples) - len(actions)
        assert 0.15 * 200 < bids < 0.35 * 200  # 200 bids of this role, a quarter kept
    # The monolithic agent matches the role agents' (now smaller) token total.
    role_tokens = sum(plan.trained_tokens for plan in plans[:3])
    longest = max(e.tokens for e in plans[3].examples)
    assert role_tokens <= plans[3].trained_tokens < role_tokens + longest


def test_sft_logs_per_agent_losses_and_fails_without_data(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    demos = expert_demonstrations(8)
    population, template = build(["logger", "miner"], demos)
    logger = CSVLogger(save_dir=str(tmp_path), name="sft")
    cfg = SFTConfig(epochs=1, lr=1e-3, batch_size=4)
    result = run_sft(population, demos, template, cfg, {"accelerator": "cpu"}, logger=logger)
    assert result["sft/steps"] == max(
        -(-sum(d.role == role for d in demos) // 4) for role in ["logger", "miner"]
    )
    logger.finalize("success")
    header = next((tmp_path / "sft").rglob("metrics.csv")).read_text().splitlines()[0]
    assert "sft/loss/agent0_logger" in header and "sft/loss/agent1_miner" in header
    with pytest.raises(ValueError, match="no demonstrations"):
        run_sft(population, [], template, cfg, {"accelerator": "cpu"})


def test_sft_on_crafting_experts_generalises_to_heldout_worlds():
    """Tiny agents after a short SFT on two expert episodes, scored on a held-out world."""
    from bidswarm.envs.crafting import CraftingEnv
    from bidswarm.envs.crafting.config import CraftingConfig
    from bidswarm.envs.experts import play_expert_episode

    env = CraftingEnv(CraftingConfig())

    def demos(seeds) -> list[Demonstration]:
        return [d for s in seeds for d in play_expert_episode(env, s, LEVELS).demonstrations]

    train, heldout = demos(env.train_seeds()[:2]), demos(env.heldout_seeds()[:1])
    plain = PromptTemplate.for_env(env, "compact", None, LEVELS)
    corpus = [env.task_description] + [
        (plain.bid if d.kind == "bid" else plain.action)(d.role, d.observation)
        + plain.reply_text(d.reply)
        for d in train
    ]
    torch.manual_seed(0)
    population = Population.build(tiny_config(), [*env.roles, None], 1, corpus)
    template = PromptTemplate.for_env(env, "compact", population[0].tokenizer, LEVELS)
    before = greedy_match_rate(population, template, heldout)
    run_sft(population, train, template, SFTConfig(epochs=12, lr=3e-3, batch_size=16), {})
    after = greedy_match_rate(population, template, heldout)
    assert max(before.values()) <= 0.1, before
    assert min(after[i] for i in range(3)) >= 0.6, after
    # With as many passes over each action as the role agents (sft.match=action_passes), the
    # monolithic agent, which must also tell the roles apart, generalises less: measured 0.37
    # here (0.57 with 24 epochs, 0.70 with 48; it reached 0.6 when bid tokens bought it ~4x the
    # passes, sft.match=tokens).
    assert after[3] >= 0.3, after


def test_sft_micro_batches_give_the_same_gradient_and_stay_within_the_budget():
    """A step's batch is forwarded in micro-batches of at most ``sft.micro_batch_tokens``; the
    gradient (and the loss) equal those of one forward over the whole batch."""
    demos = expert_demonstrations(12)
    population, template = build(ROLES, demos)
    agent = population[0]
    examples = encode_demonstrations(agent, [d for d in demos if d.role == "logger"], template)
    widest = max(e.tokens for e in examples)

    def gradient(budget: int | None) -> tuple[torch.Tensor, list[int]]:
        module = SFTModule(population, [], SFTConfig(micro_batch_tokens=budget))
        seen: list[int] = []
        hook = agent.model.register_forward_pre_hook(
            lambda mod, args, kwargs: seen.append(kwargs["input_ids"].numel()), with_kwargs=True
        )
        population.zero_grad(set_to_none=True)
        loss = module.agent_loss(0, agent, examples, lambda index, part: part.backward())
        hook.remove()
        flat = torch.cat([p.grad.flatten() for p in agent.parameters()] + [loss.reshape(1)])
        population.zero_grad(set_to_none=True)
        return flat, seen

    whole, whole_forwards = gradient(10**9)
    split, forwards = gradient(3 * widest)
    assert len(whole_forwards) == 1 and len(forwards) > 1 and max(forwards) <= 3 * widest
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-6)


def test_sft_shows_its_progress_on_stderr(capfd):
    """A run's SFT bar (``progress=True``) goes to stderr through tqdm, which a log file shows
    as it moves (Lightning's own bar writes to stdout, held back by a log file's buffer)."""
    train = expert_demonstrations(8, seed=0)
    population, template = build(ROLES, train)
    cfg = SFTConfig(epochs=2, lr=3e-3, batch_size=16)
    result = run_sft(population, train, template, cfg, {"accelerator": "cpu"}, progress=True)
    out, err = capfd.readouterr()
    steps = int(result["sft/steps"])
    assert steps > 1 and "SFT: 100%" in err and f"{steps}/{steps}" in err, err[-500:]
    assert "sft/loss=" in err and "SFT" not in out
