"""The swarm: one :class:`AgentPolicy` per role and replica, each with its own parameters, and
for a rule that needs one (``CoordinationRule.needs_decider``) a decider: one more model of the
agents' architecture that routes and never acts (``Population.decider``)."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from bidswarm.agents.models import build_tiny_model, load_model_and_tokenizer, torch_dtype
from bidswarm.agents.policy import AgentPolicy
from bidswarm.config import Adapter, LoraSettings, ModelConfig, ModelSource
from bidswarm.coordination.base import DECIDER_NAME
from bidswarm.envs.base import role_name

POPULATION_FILE = "population.json"
LORA_BASE_FOLDER = "base"
DECIDER_FOLDER = f"decider_{DECIDER_NAME}"
"""The decider's folder in a saved population (``population.json`` names it)."""


def agent_folder_name(index: int, role: str | None) -> str:
    """``agent0_logger``, ``agent3_monolithic``, ..."""
    return f"agent{index}_{role_name(role)}"


class Population(torch.nn.Module):
    """``agents[i]`` is an :class:`AgentPolicy`; ``roles[i]`` its role (None: monolithic).

    Agents are ordered role by role, the replicas of a role next to each other. ``decider``
    (None: none) is not an agent: it has the role :data:`DECIDER_NAME`, is never indexed,
    iterated or trained by RL with the agents, and is saved in its own folder; it is a
    submodule, so it moves to the agents' device and lives in their checkpoints.
    """

    def __init__(self, agents: list[AgentPolicy], decider: AgentPolicy | None = None):
        super().__init__()
        if not agents:
            raise ValueError("a population needs at least one agent")
        self.agents = torch.nn.ModuleList(agents)
        self.decider = decider

    @property
    def roles(self) -> list[str | None]:
        return [agent.role for agent in self.agents]

    @property
    def is_lora(self) -> bool:
        """Whether the agents are LoRA adapters on one shared frozen base model."""
        return self.agents[0].adapter is not None

    def __len__(self) -> int:
        return len(self.agents)

    def __iter__(self):
        return iter(self.agents)

    def __getitem__(self, index: int) -> AgentPolicy:
        return self.agents[index]

    def agents_of(self, role: str | None) -> list[int]:
        """Indices of the agents (replicas) of ``role``."""
        return [index for index, agent_role in enumerate(self.roles) if agent_role == role]

    @classmethod
    def build(
        cls,
        model_cfg: ModelConfig,
        roles: list[str | None],
        replicas: int,
        corpus: list[str] | None,
        decider: bool = False,
    ) -> Population:
        """``len(roles) * replicas`` agents from ``model_cfg``, and a decider if asked
        (:meth:`with_decider`, built after the agents: their weights are those without it).

        Pretrained sources are loaded once and copied. ``tiny`` agents share one tokenizer
        (trained once on ``corpus``); each role gets its own random initialisation (from the
        caller's torch seed). Replicas of a role start from the same weights, in separate copies.
        """
        population = cls._build_agents(model_cfg, roles, replicas, corpus)
        return population.with_decider(model_cfg) if decider else population

    @classmethod
    def _build_agents(
        cls,
        model_cfg: ModelConfig,
        roles: list[str | None],
        replicas: int,
        corpus: list[str] | None,
    ) -> Population:
        if replicas < 1:
            raise ValueError(f"coordination.replicas={replicas} must be >= 1")
        if len(set(roles)) != len(roles):
            raise ValueError(f"roles must be distinct, got {roles}; use replicas to copy a role")
        model, tokenizer = load_model_and_tokenizer(model_cfg, corpus)
        if model_cfg.adapter == Adapter.lora:
            agent_roles = [role for role in roles for _ in range(replicas)]
            names = [f"agent{i}" for i in range(len(agent_roles))]
            shared = with_lora_adapters(model, model_cfg.lora, names)
            budget = model_cfg.max_prompt_tokens
            return cls(
                [
                    AgentPolicy(shared, tokenizer, role, budget, adapter=name)
                    for name, role in zip(names, agent_roles, strict=True)
                ]
            )
        agents = []
        for role_index, role in enumerate(roles):
            if role_index == 0:
                role_model = model
            elif model_cfg.source == ModelSource.tiny:
                role_model = build_tiny_model(model_cfg.tiny, tokenizer)
                role_model = role_model.to(torch_dtype(model_cfg.dtype))
            else:
                role_model = copy.deepcopy(model)
            for replica in range(replicas):
                replica_model = role_model if replica == 0 else copy.deepcopy(role_model)
                agents.append(
                    AgentPolicy(replica_model, tokenizer, role, model_cfg.max_prompt_tokens)
                )
        return cls(agents)

    def with_decider(self, model_cfg: ModelConfig) -> Population:
        """This population with a new decider (kept if it has one): a fresh ``tiny`` model on
        the agents' tokenizer (random weights from the caller's torch seed), a fresh copy of
        the pretrained source, or one more LoRA adapter on the agents' shared base (starting
        as the base). The agents are the same objects."""
        if self.decider is not None:
            return self
        first = self.agents[0]
        budget = first.max_prompt_tokens
        if self.is_lora:
            shared = first.model
            shared.add_adapter(DECIDER_NAME, shared.peft_config[first.adapter])
            for name, parameter in shared.named_parameters():
                parameter.requires_grad_("lora_" in name)
            decider = AgentPolicy(shared, first.tokenizer, DECIDER_NAME, budget, DECIDER_NAME)
        else:
            if model_cfg.source == ModelSource.tiny:
                model = build_tiny_model(model_cfg.tiny, first.tokenizer)
                model = model.to(dtype=first.model.dtype, device=first.device)
            else:
                model, _ = load_model_and_tokenizer(model_cfg, None)
                model = model.to(device=first.device)
            decider = AgentPolicy(model, first.tokenizer, DECIDER_NAME, budget)
        return Population(list(self.agents), decider)

    def replicate(self, replicas: int) -> Population:
        """This population with each agent copied ``replicas`` times (population scaling of a
        trained swarm): the copies start from the agent's weights in separate parameters and
        are ordered role by role, as :meth:`build` orders them. ``replicas=1`` returns self.

        Fully fine-tuned agents are deep copies. LoRA agents stay on their one shared base: the
        copies are adapters of the same peft model, named ``agent0``, ``agent1``, ... as
        :meth:`build` names them. That renames the adapters in place, so this population must
        not be used afterwards: use the returned one."""
        if replicas < 1:
            raise ValueError(f"coordination.replicas={replicas} must be >= 1")
        if replicas == 1:
            return self
        if not self.is_lora:
            return Population(
                [copy.deepcopy(agent) for agent in self.agents for _ in range(replicas)],
                self.decider,
            )
        return self._replicate_adapters(replicas)

    def _replicate_adapters(self, replicas: int) -> Population:
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        shared = self.agents[0].model
        sources = [
            {name: t.detach().clone() for name, t in state.items()}
            for state in (
                get_peft_model_state_dict(shared, adapter_name=agent.adapter)
                for agent in self.agents
            )
        ]
        config = shared.peft_config[self.agents[0].adapter]
        agents = []
        for index in range(len(self.agents) * replicas):
            source = self.agents[index // replicas]
            name = f"agent{index}"
            if name not in shared.peft_config:
                shared.add_adapter(name, config)
            set_peft_model_state_dict(shared, sources[index // replicas], adapter_name=name)
            agents.append(
                AgentPolicy(
                    shared,
                    source.tokenizer,
                    source.role,
                    source.max_prompt_tokens,
                    adapter=name,
                )
            )
        for name, parameter in shared.named_parameters():
            parameter.requires_grad_("lora_" in name)
        return Population(agents, self.decider)

    def save_pretrained(self, directory: str | Path, base_folder: str | Path | None = None) -> None:
        """One HF folder per agent (``agent0_logger/``, ...) and ``population.json``.

        LoRA agents write their adapters only. The frozen base model they share goes to
        ``base_folder`` (default ``directory/base``), unless that folder exists already (the
        base is frozen: what is there is this base), and ``population.json`` names it by its
        path relative to ``directory`` (``"base": "../base"``). A training run passes one
        ``base_folder`` for all its populations (``sft/``, ``final/``): the base is written
        once per run, and a population folder is moved or copied together with its base.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        meta: dict[str, object] = {}
        if self.is_lora:
            base = Path(base_folder) if base_folder is not None else directory / LORA_BASE_FOLDER
            if not base.is_dir():
                save_lora_base(self.agents[0].model, base)
            meta["base"] = os.path.relpath(base.resolve(), directory.resolve())
        folders = []
        for index, agent in enumerate(self.agents):
            folder = agent_folder_name(index, agent.role)
            agent.save_pretrained(directory / folder)
            folders.append(folder)
        meta = {"agents": folders, "roles": self.roles} | meta
        if self.decider is not None:
            self.decider.save_pretrained(directory / DECIDER_FOLDER)
            meta["decider"] = DECIDER_FOLDER
        (directory / POPULATION_FILE).write_text(json.dumps(meta, indent=2) + "\n")

    @classmethod
    def from_pretrained(cls, directory: str | Path, dtype: torch.dtype = torch.float32):
        """The population saved by :meth:`save_pretrained` (agents in their saved order); LoRA
        adapters are loaded onto the base model that ``population.json`` names."""
        directory = Path(directory)
        meta_path = directory / POPULATION_FILE
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        if "agents" in meta:
            folders = meta["agents"]
        else:
            found = [p.name for p in directory.iterdir() if re.fullmatch(r"agent\d+_.+", p.name)]
            folders = sorted(found, key=lambda name: int(name[5:].split("_")[0]))
        if not folders:
            raise FileNotFoundError(f"{directory} holds no saved agents")
        base_folder = directory / meta.get("base", LORA_BASE_FOLDER)
        if "base" in meta and not base_folder.is_dir():
            raise FileNotFoundError(
                f"{directory} holds LoRA adapters of the base model in {base_folder}, which is "
                "missing: keep a population folder beside its base (a run's base/)"
            )
        base = None
        if base_folder.is_dir():
            base = AutoModelForCausalLM.from_pretrained(base_folder, dtype=dtype)
        agents = []
        for folder in folders:
            agent = AgentPolicy.from_pretrained(directory / folder, dtype, lora_base=base)
            base = agent.model if agent.adapter is not None else base
            agents.append(agent)
        decider = None
        if "decider" in meta:
            decider = AgentPolicy.from_pretrained(directory / meta["decider"], dtype, base)
        return cls(agents, decider)


def with_lora_adapters(model: PreTrainedModel, lora: LoraSettings, names: list[str]):
    """``model`` frozen, wrapped in a peft model holding one LoRA adapter per name (the
    agents'). Each adapter starts as the identity (B = 0), so every agent starts as the base."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        target_modules=list(lora.target_modules),
        lora_dropout=0.0,  # log-probs recomputed for training must be those sampled
    )
    model.requires_grad_(False)
    shared = get_peft_model(model, config, adapter_name=names[0])
    for name in names[1:]:
        shared.add_adapter(name, config)
    for name, parameter in shared.named_parameters():
        parameter.requires_grad_("lora_" in name)
    return shared


def save_lora_base(shared: torch.nn.Module, folder: Path) -> None:
    """The frozen base model of a peft model, as a plain HF folder (LoRA layers stripped).
    Written beside ``folder`` and renamed into place: ``folder`` exists only when complete."""
    base = shared.get_base_model()
    state = lora_base_state(shared)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(base.config, dtype=base.dtype)
    plain.load_state_dict(state, assign=True)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    plain.save_pretrained(partial)
    os.replace(partial, folder)


def lora_base_state(shared: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The frozen base model's weights of a peft model under the plain model's names (LoRA
    layers stripped): what :func:`save_lora_base` writes and a rollout engine serves."""
    return {
        name.replace(".base_layer", ""): tensor
        for name, tensor in shared.get_base_model().state_dict().items()
        if "lora_" not in name
    }
