"""LoRA agents (``model.adapter=lora``): one frozen base, an adapter per agent."""

from __future__ import annotations

import pytest
import torch

from bidswarm.agents.population import LORA_BASE_FOLDER, Population
from bidswarm.algorithms.losses import reinforce_loss
from test_agents import ROLES, corpus, tiny_config

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
    generated = [a.generate(["logger bid: step 3 ->"], 4, 0.0) for a in (swarm[2], loaded[2])]
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
