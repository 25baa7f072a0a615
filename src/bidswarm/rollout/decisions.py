"""The decisions a coordination rule learned, read from the swarm's models for the collector.

A rule that asks for routes (``CoordinationRule.asks_routes``) names its routers; a rule whose
peers score proposals by usefulness (``proposal_scoring`` :data:`USEFULNESS`) has every agent
score the others' proposals. Both are read the way a level reader reads a bid: one
teacher-forced forward of each prompt, then the log-prob of every possible reply after it
(``engine.score_branches``; the roles' names, or the usefulness levels' canonical texts), at
temperature 1, on the model the rollouts are scored with, counted as rollout tokens and FLOPs
of the model that read them (the decider's own parameters for the decider).

While :meth:`DecisionReader.labelling` is open, every prompt read is also kept with the task
expert's answer in that state (the owner's role; the top level for the owner's proposal, the
lowest for any other; for an agent's own proposal its role's expert bid): the labels in the
swarm's own states that ``run/relabel.py`` trains on.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from bidswarm.agents.branching import branch_tokens
from bidswarm.agents.policy import AgentPolicy
from bidswarm.coordination.base import DECIDER, DECIDER_NAME
from bidswarm.coordination.bid_readers import Expected
from bidswarm.envs.base import MONOLITHIC, TextEnv
from bidswarm.envs.experts import expert_levels, expert_owners, format_bid
from bidswarm.rollout.records import Reply
from bidswarm.rollout.swarm import Swarm


@dataclass(frozen=True)
class DecisionLabel:
    """A decision prompt a model read in the swarm's own state, with the expert's reply there."""

    policy: AgentPolicy
    prompt_ids: list[int]
    reply_ids: list[int]


class DecisionReader:
    """Reads routes and usefulness scores from ``swarm``'s agents and decider."""

    def __init__(self, swarm: Swarm):
        self.swarm = swarm
        self.labels: list[DecisionLabel] | None = None

    @contextmanager
    def labelling(self) -> Iterator[list[DecisionLabel]]:
        """Inside the block every prompt read is kept with the expert's label (the list)."""
        self.labels = []
        try:
            yield self.labels
        finally:
            self.labels = None

    def policy(self, reader: int) -> AgentPolicy:
        """The model of ``reader``: an agent, or the population's decider (:data:`DECIDER`)."""
        if reader != DECIDER:
            return self.swarm.population.agents[reader]
        decider = self.swarm.population.decider
        if decider is None:
            raise ValueError(
                "the rule routes by the population's decider, but these agents have none: "
                "a decider is trained with its run (python -m bidswarm.train "
                "coordination=router, or init_from=<run> coordination=router)"
            )
        return decider

    def _read(self, policy: AgentPolicy, prompts: list[str], replies: list[str]) -> torch.Tensor:
        """``[prompts, replies]``: the log-prob that ``policy`` replies exactly each reply (then
        end of sequence) to each prompt, at temperature 1, counted as rollout tokens."""
        prompt_ids = policy.encode_prompts(prompts)
        reply_ids = [policy.encode_reply(self.swarm.prompts.reply_text(r)) for r in replies]
        with torch.no_grad():
            logprobs = self.swarm.engine.score_branches(
                policy, prompt_ids, reply_ids, 1.0, self.swarm.token_budget
            )
        tokens = branch_tokens(policy, prompt_ids, reply_ids)
        self.swarm.usage.count_rollout(policy.parameter_counts(), tokens)
        return logprobs.float()

    def _keep(self, policy: AgentPolicy, prompt: str, reply: str) -> None:
        if self.labels is not None:
            prompt_ids = policy.encode_prompts([prompt])[0]
            reply_ids = policy.encode_reply(self.swarm.prompts.reply_text(reply))
            self.labels.append(DecisionLabel(policy, prompt_ids, reply_ids))

    def _owners(self, env: TextEnv) -> frozenset[str]:
        return expert_owners(expert_levels(env, self.swarm.bid_levels))

    def routes(
        self, envs: list[TextEnv], routers: list[list[int]], present: list[list[int]]
    ) -> list[dict[int, dict[int, float]]]:
        """Per env, ``{router: {agent: log-prob}}``: for each router named in ``routers[env]``
        the log-prob that its route prompt's reply is each present agent's role (an agent
        reads its own role's observation, the decider the whole world's); one batch per
        router over the envs that ask it."""
        swarm = self.swarm
        names = swarm.prompts.route_replies
        found: list[dict[int, dict[int, float]]] = [{} for _ in envs]
        for router in sorted({r for asked in routers for r in asked}):
            positions = [e for e, asked in enumerate(routers) if router in asked]
            policy = self.policy(router)
            name = DECIDER_NAME if router == DECIDER else swarm.role(router)
            view = MONOLITHIC if router == DECIDER else name
            prompts = [swarm.prompts.route(name, envs[e].observation(view)) for e in positions]
            logprobs = self._read(policy, prompts, names)
            for row, e in enumerate(positions):
                column = {role: logprobs[row, k].item() for k, role in enumerate(names)}
                found[e][router] = {a: column[swarm.role(a)] for a in present[e]}
                owners = self._owners(envs[e])
                if len(owners) == 1:
                    self._keep(policy, prompts[row], next(iter(owners)))
        return found

    def usefulness(
        self,
        envs: list[TextEnv],
        present: list[list[int]],
        proposals: list[list[Reply | None]],
        own: bool = False,
    ) -> list[tuple[tuple[float, ...], ...]]:
        """Per env, ``[scorer][proposer]``: the expected usefulness level (softmax at
        temperature 1 over the levels' replies) of each present agent's proposal to each other
        present agent's score prompt (a lone agent scores its own; with ``own`` every agent
        only its own, :func:`peer_rows`); one batch per scorer."""
        swarm = self.swarm
        n, levels = swarm.n_agents, swarm.bid_levels
        texts = [format_bid(level) for level in levels]
        useful, useless = format_bid(max(levels)), format_bid(min(levels))
        scores = [[[0.0] * n for _ in range(n)] for _ in envs]
        for scorer in range(n):
            rows = peer_rows(present, scorer, own)
            if not rows:
                continue
            role = swarm.role(scorer)
            policy = swarm.population.agents[scorer]
            prompts = [
                swarm.prompts.score(role, envs[e].observation(role), proposals[e][p].text, own)
                for e, p in rows
            ]
            logprobs = self._read(policy, prompts, texts)
            for (e, p), prompt, row in zip(rows, prompts, logprobs.tolist(), strict=True):
                scores[e][scorer][p] = Expected().read(row, levels, 1.0)
                if self.labels is None:
                    continue
                expert = expert_levels(envs[e], levels)
                owners = expert_owners(expert)
                if own and owners:
                    self._keep(policy, prompt, format_bid(expert[role]))
                elif not own and owners:
                    self._keep(policy, prompt, useful if swarm.role(p) in owners else useless)
        return [tuple(tuple(row) for row in env_scores) for env_scores in scores]


def peer_rows(present: list[list[int]], scorer: int, own: bool = False) -> list[tuple[int, int]]:
    """(env, proposer) of every proposal ``scorer`` scores: in each env where it is present,
    every other present agent's (a lone agent scores its own); with ``own``, its own only."""
    return [
        (e, p)
        for e, agents in enumerate(present)
        if scorer in agents
        for p in agents
        if (p == scorer if own else p != scorer or len(agents) == 1)
    ]
