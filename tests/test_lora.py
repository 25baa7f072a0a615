"""LoRA agents (``model.adapter=lora``): one frozen base, an adapter per agent."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from bidswarm.agents.population import LORA_BASE_FOLDER, POPULATION_FILE, Population
from bidswarm.agents.prompts import PromptTemplate
from bidswarm.algorithms.credit import CreditConfig, make_credit
from bidswarm.algorithms.losses import reinforce_loss
from bidswarm.config import RLConfig
from bidswarm.coordination.auction import Auction
from bidswarm.engines.hf import HFDecoder
from bidswarm.envs.crafting import CraftingConfig, CraftingEnv
from bidswarm.evaluate import build_loop
from bidswarm.lit.callbacks import LAST
from bidswarm.lit.swarm_module import SwarmModule
from bidswarm.rollout.collector import Collector
from bidswarm.rollout.evaluation import evaluate
from bidswarm.rollout.loop import RolloutLoop
from bidswarm.rollout.swarm import Swarm
from conftest import hf_engine
from test_agents import ROLES, corpus, tiny_config
from test_evaluate import evaluation_config
from test_train import run_cli

pytest.importorskip("peft")

PROMPTS = [[5, 6, 7, 8, 9], [9, 8, 7]]
REPLIES = [[10, 11, 12], [13, 14]]


@pytest.fixture
def swarm() -> Population:
    torch.manual_seed(0)
    return Population.build(tiny_config(adapter="lora"), ROLES, replicas=2, corpus=corpus())


def reply_logprobs(population: Population) -> list[torch.Tensor]:
    with torch.no_grad():
        return [agent.reply_token_logprobs(PROMPTS, REPLIES)[0] for agent in population]


def snapshot(population: Population) -> dict[str, torch.Tensor]:
    shared = population[0].model
    return {name: p.detach().clone() for name, p in shared.named_parameters()}


def test_agents_share_one_frozen_base_and_train_only_their_adapter(swarm):
    assert len({id(agent.model) for agent in swarm}) == 1
    groups = [{"params": agent.trainable_parameters()} for agent in swarm]
    optimizer = torch.optim.AdamW(groups, lr=1e-2)  # refuses a parameter in two groups
    assert all(groups) and all(p.requires_grad for g in groups for p in g["params"])
    start = snapshot(swarm)
    before = reply_logprobs(swarm)
    assert all(torch.equal(before[0], other) for other in before)  # adapters start at B = 0

    learner = swarm[3]
    for _ in range(3):
        logp, mask = learner.reply_token_logprobs(PROMPTS, REPLIES)
        reinforce_loss(logp, mask, torch.tensor([1.0, -1.0]), "token_mean")[
            "loss_action"
        ].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    changed = {n for n, p in swarm[0].model.named_parameters() if not torch.equal(p, start[n])}
    assert changed and all(".lora_" in n and ".agent3." in n for n in changed)
    after = reply_logprobs(swarm)
    assert not torch.equal(after[3], before[3])
    assert all(torch.equal(after[i], before[i]) for i in range(len(swarm)) if i != 3)


def test_a_lora_population_saves_adapters_and_loads_back(swarm, tmp_path):
    randomize_adapters(swarm)
    expected = reply_logprobs(swarm)
    swarm.save_pretrained(tmp_path)
    for index in range(len(swarm)):
        folder = next(tmp_path.glob(f"agent{index}_*"))
        assert (folder / "adapter_model.safetensors").is_file()
        assert not (folder / "model.safetensors").exists()
    assert (tmp_path / LORA_BASE_FOLDER / "config.json").is_file()

    loaded = Population.from_pretrained(tmp_path)
    assert loaded.roles == swarm.roles
    assert [agent.adapter for agent in loaded] == [agent.adapter for agent in swarm]
    assert len({id(agent.model) for agent in loaded}) == 1
    for want, got in zip(expected, reply_logprobs(loaded), strict=True):
        torch.testing.assert_close(got, want)
    generated = [
        HFDecoder(a, "auto", False, None).generate(
            a.encode_prompts(["logger bid: step 3 ->"]), 4, 0.0
        )
        for a in (swarm[2], loaded[2])
    ]
    assert generated[0] == generated[1]


def randomize_adapters(population: Population) -> None:
    """Give every adapter its own non-zero weights (they start at B = 0, all equal)."""
    with torch.no_grad():
        for name, p in population[0].model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)


def test_replicas_of_lora_agents_are_new_adapters_on_the_same_base(swarm):
    randomize_adapters(swarm)
    sources = [[p.detach().clone() for p in agent.trainable_parameters()] for agent in swarm]
    expected = reply_logprobs(swarm)
    base_storage = {p.data_ptr() for n, p in swarm[0].model.named_parameters() if "lora_" not in n}

    replicated = swarm.replicate(2)
    assert replicated.roles == [role for role in swarm.roles for _ in range(2)]
    assert [agent.adapter for agent in replicated] == [f"agent{i}" for i in range(12)]
    assert len({id(agent.model) for agent in replicated}) == 1
    shared = replicated[0].model
    assert {p.data_ptr() for n, p in shared.named_parameters() if "lora_" not in n} == base_storage
    for index, agent in enumerate(replicated):
        weights = agent.trainable_parameters()
        assert len(weights) == len(sources[index // 2])
        for got, want in zip(weights, sources[index // 2], strict=True):
            assert torch.equal(got, want)
    for index, got in enumerate(reply_logprobs(replicated)):
        torch.testing.assert_close(got, expected[index // 2])

    first, second = replicated[6].trainable_parameters(), replicated[7].trainable_parameters()
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(first, second, strict=True))
    with torch.no_grad():
        first[-1].add_(1.0)
    assert not torch.equal(first[-1], second[-1])
    groups = [{"params": agent.trainable_parameters()} for agent in replicated]
    torch.optim.AdamW(groups)  # refuses a parameter in two groups


def test_populations_of_one_run_share_one_saved_base(swarm, tmp_path):
    """A run's ``sft/`` and ``final/`` name one ``base/``: the frozen base is written once."""
    base = tmp_path / LORA_BASE_FOLDER
    randomize_adapters(swarm)
    after_sft = reply_logprobs(swarm)
    swarm.save_pretrained(tmp_path / "sft", base)
    written = {path: path.stat().st_mtime_ns for path in base.rglob("*")}
    randomize_adapters(swarm)  # "RL" changes the adapters, never the base
    after_rl = reply_logprobs(swarm)
    swarm.save_pretrained(tmp_path / "final", base)

    assert {path: path.stat().st_mtime_ns for path in base.rglob("*")} == written
    for folder, expected in (("sft", after_sft), ("final", after_rl)):
        assert not (tmp_path / folder / LORA_BASE_FOLDER).exists()
        meta = json.loads((tmp_path / folder / POPULATION_FILE).read_text())
        assert meta["base"] == f"../{LORA_BASE_FOLDER}"
        for want, got in zip(
            expected, reply_logprobs(Population.from_pretrained(tmp_path / folder)), strict=True
        ):
            torch.testing.assert_close(got, want)

    shutil.rmtree(base)
    with pytest.raises(FileNotFoundError, match="missing"):
        Population.from_pretrained(tmp_path / "final")


def learner_of(population: Population) -> SwarmModule:
    env = CraftingEnv(CraftingConfig(max_decisions=6))
    levels = [0.0, 0.5, 1.0]
    prompts = PromptTemplate.for_env(env, "compact", population[0].tokenizer, levels)
    loop = RolloutLoop(
        lambda: CraftingEnv(CraftingConfig(max_decisions=6)),
        Swarm(population, prompts, 3, 6, 1.0, hf_engine()),
        Auction(),
    )
    collector = Collector(
        loop, RLConfig(), make_credit(CreditConfig("bucket_brigade")), env.train_seeds(), seed=0
    )
    return SwarmModule(population, collector, RLConfig(), temperature=1.0)


def test_a_lora_checkpoint_holds_the_adapters_only_and_must_hold_them_all(swarm):
    learner = learner_of(swarm)
    checkpoint = {"state_dict": learner.state_dict()}
    learner.on_save_checkpoint(checkpoint)

    saved = checkpoint["state_dict"]
    adapters = {id(p) for agent in swarm for p in agent.trainable_parameters()}
    assert len(saved) == len(adapters)  # each adapter once, though every agent holds the model
    assert all(".lora_" in key for key in saved)
    learner.on_load_checkpoint(checkpoint)

    incomplete = dict(checkpoint, state_dict=dict(list(saved.items())[1:]))
    with pytest.raises(RuntimeError, match="missing 1 keys"):
        learner.on_load_checkpoint(incomplete)
    base_weight = next(k for k in learner.state_dict() if k not in saved)
    unexpected = dict(checkpoint, state_dict=saved | {base_weight: torch.zeros(1)})
    with pytest.raises(RuntimeError, match="unexpected 1 keys"):
        learner.on_load_checkpoint(unexpected)


def adapter_weights(folder: Path) -> list[torch.Tensor]:
    return [p for agent in Population.from_pretrained(folder) for p in agent.trainable_parameters()]


@pytest.mark.slow
def test_a_lora_run_checkpoints_adapters_resumes_and_is_evaluated(tmp_path):
    """A LoRA run stopped after one update checkpoints the adapters only; resumed, it ends with
    the adapters of an uninterrupted run; evaluation (with replicas) loads them back."""
    common = (
        "debug=smoke",
        "model.adapter=lora",
        "rl.cycles=1",
        "eval.before_rl=false",
        "logger=csv",
        # The tiny swarm earns no reward in a smoke run, so its policy gradients are zero;
        # weight decay still moves every adapter that acted, so a resume that lost the
        # checkpoint's adapters (or their optimizer state) would end elsewhere.
        "rl.weight_decay=0.5",
        "rl.lr=0.01",
    )
    whole = run_cli(tmp_path, *common, name="whole")
    stopped = run_cli(tmp_path, *common, "rl.stop_after=1", name="stopped")

    saved = torch.load(stopped / "checkpoints" / LAST, weights_only=False)["state_dict"]
    assert saved and all(".lora_" in key for key in saved)
    sft = Population.from_pretrained(stopped / "sft")[0].model.named_parameters()
    at_sft = {f"population.agents.0.model.{name}": p for name, p in sft if ".lora_" in name}
    assert saved.keys() == at_sft.keys()
    assert any(not torch.equal(saved[key], at_sft[key]) for key in saved)  # the update's
    assert (stopped / LORA_BASE_FOLDER / "config.json").is_file()
    assert not (stopped / "sft" / LORA_BASE_FOLDER).exists()

    run_cli(tmp_path, *common, f"resume={stopped}", name="resumed")
    assert not (stopped / "final" / LORA_BASE_FOLDER).exists()
    trained = adapter_weights(whole / "final")
    assert any(
        not torch.equal(a, b) for a, b in zip(adapter_weights(whole / "sft"), trained, strict=True)
    )
    for want, got in zip(trained, adapter_weights(stopped / "final"), strict=True):
        torch.testing.assert_close(got, want)

    loop = build_loop(evaluation_config(stopped, tmp_path, "replicas=2"))
    agents, final = loop.swarm.population, Population.from_pretrained(stopped / "final")
    assert len(agents) == 2 * len(final) and len({id(agent.model) for agent in agents}) == 1
    for index, agent in enumerate(agents):
        source = final[index // 2].trainable_parameters()
        pairs = zip(agent.trainable_parameters(), source, strict=True)
        assert all(torch.equal(got, want) for got, want in pairs)
    result = evaluate(loop, loop.make_env().heldout_seeds()[:1], runs_per_seed=1, seed=0)
    assert result.episodes


def test_a_lora_agents_kl_reference_is_the_base_without_adapters(swarm):
    """``rl.kl_coef``'s reference of a LoRA agent: no copy, the shared base with every adapter
    disabled; the agent's own adapter is active again afterwards."""
    from bidswarm.agents.policy import FrozenReference

    with torch.no_grad():
        base = swarm[0].reply_token_logprobs(PROMPTS, REPLIES)[0]  # adapters start at B = 0
    randomize_adapters(swarm)
    adapted = reply_logprobs(swarm)
    assert not torch.allclose(adapted[0], base)
    references = [FrozenReference(agent) for agent in swarm]
    assert all(reference.copy is None for reference in references)
    for reference in references:
        torch.testing.assert_close(reference.reply_token_logprobs(PROMPTS, REPLIES), base)
    for before, after in zip(adapted, reply_logprobs(swarm), strict=True):
        torch.testing.assert_close(after, before)
