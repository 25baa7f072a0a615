"""The RolloutLoop: lock-step episodes over many environments, batched per agent.

Each decision step, over the live environments: the loop gathers what the coordination rule
declares it decides from (the bids of the agents it names, the routes of the routers it names,
or every agent's action proposal and the peers' scores of them, by the scoring it declares),
one generation or scoring batch per agent; the rule decides
(each decision saying, or leaving to the rule's declaration, whether its bids were read and
whether it may be forked: ``CoordinationRule.settle``); the actors' actions are generated, one
batch per actor; the environments step. The rule itself
never sees a model or an environment (``coordination/base.py``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

import torch

from bidswarm.coordination.base import USEFULNESS, CoordinationRule, Decision, Situation
from bidswarm.envs.base import MONOLITHIC, TextEnv
from bidswarm.envs.experts import expert_levels, expert_owners
from bidswarm.rollout.decisions import DecisionReader, peer_rows
from bidswarm.rollout.keyed import group_by
from bidswarm.rollout.records import Bid, Episode, Reply, StepRecord
from bidswarm.rollout.swarm import Swarm


class RolloutLoop:
    """Runs a swarm in many environments at once; one generation batch per agent per phase."""

    def __init__(
        self,
        make_env: Callable[[], TextEnv],
        swarm: Swarm,
        coordination: CoordinationRule,
        dropout: float = 0.0,
    ):
        """``dropout``: the probability that each agent is absent at each decision step of each
        env, drawn independently from the loop's ``rng`` (0: never drawn, so the rollouts are
        exactly those without dropout). Absent agents neither bid, propose nor act."""
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"dropout={dropout}: must lie in [0, 1]")
        self.make_env = make_env
        self.swarm = swarm
        self.coordination = coordination
        self.dropout = dropout
        self.decisions = DecisionReader(swarm)
        """Reads the decisions a rule learned (routes, usefulness scores)."""
        self._pool: list[TextEnv] = []

    def with_rule(self, coordination: CoordinationRule) -> RolloutLoop:
        """The same swarm, dropout and environment objects under another rule."""
        other = RolloutLoop(self.make_env, self.swarm, coordination, self.dropout)
        other._pool = self._pool
        return other

    def envs(self, n: int) -> list[TextEnv]:
        """``n`` environment objects, reused across calls (building one can be costly)."""
        while len(self._pool) < n:
            self._pool.append(self.make_env())
        return self._pool[:n]

    def run(
        self,
        seeds: list[int],
        rng: random.Random,
        generator: torch.Generator,
        keep_snapshots: bool = False,
        on_decision: Callable[[], None] | None = None,
        snapshot_every_step: bool = False,
    ) -> list[Episode]:
        """Play one episode per seed, all in lock-step; snapshots of contested steps if asked
        (of every step with ``snapshot_every_step``: forks where every agent acts,
        ``rollout/acting_values.py``); ``on_decision`` is called after each lock-step decision
        (a progress bar)."""
        envs = self.envs(len(seeds))
        for env, seed in zip(envs, seeds, strict=True):
            env.reset(seed)
        episodes = [Episode(seed=seed) for seed in seeds]
        self.play(
            envs,
            episodes,
            rng,
            generator,
            keep_snapshots,
            on_decision=on_decision,
            snapshot_every_step=snapshot_every_step,
        )
        for env, episode in zip(envs, episodes, strict=True):
            episode.metrics = env.episode_metrics()
            if keep_snapshots:
                episode.final_progress = env.progress()
        return episodes

    @property
    def horizon(self) -> int:
        """The decision budget of an episode (``task.max_decisions``)."""
        return self.envs(1)[0].config.max_decisions

    def play(
        self,
        envs: list[TextEnv],
        episodes: list[Episode],
        rng: random.Random,
        generator: torch.Generator,
        keep_snapshots: bool = False,
        first_actors: list[int] | None = None,
        on_decision: Callable[[], None] | None = None,
        snapshot_every_step: bool = False,
    ) -> None:
        """Step every env to its end, appending to ``episodes``. ``first_actors`` forces who
        acts first (a fork's branches); the rule decides every later step. ``on_decision``:
        called after each lock-step decision."""
        live = [i for i, env in enumerate(envs) if not env.done]
        while live:
            live_envs = [envs[i] for i in live]
            live_episodes = [episodes[i] for i in live]
            experts = [self._expert_levels(env) for env in live_envs]
            situations: list[Situation] | None = None
            if first_actors is not None:
                # A branch's forced first actor: no bids decided it, and it is no fork point.
                decisions = [
                    Decision(actor=first_actors[i], bids_read=False, forkable=False) for i in live
                ]
                bids: list[dict[int, Bid]] = [{} for _ in live]
                actions: list[Reply | None] = [None] * len(live)
                first_actors = None
            else:
                situations, bids, proposals = self._gather(
                    live_envs, live_episodes, generator, rng, experts
                )
                decisions = self.coordination.settle(self.coordination.decide(situations, rng))
                actions = self._proposed_actions(decisions, proposals)
            self._generate_actions(live_envs, decisions, actions, generator)
            rewards = []
            scores = [s.proposal_scores for s in situations] if situations else [{}] * len(live)
            for env_index, env, decision, step_bids, action, step_scores, levels in zip(
                live, live_envs, decisions, bids, actions, scores, experts, strict=True
            ):
                record = StepRecord(env.decisions_made, decision, step_bids, action)
                record.proposal_scores = step_scores
                record.expert_levels = levels
                if levels and _reaches_expert_state(env, episodes[env_index]):
                    record.followed_expert = self._follows_expert(env, record)
                self._step(env, record, keep_snapshots, snapshot_every_step)
                episodes[env_index].steps.append(record)
                rewards.append(record.reward)
            if situations is not None:
                self.coordination.record_outcomes(situations, decisions, rewards)
            live = [i for i in live if not envs[i].done]
            if on_decision is not None:
                on_decision()

    # -- what the rule decides from ------------------------------------------------------------
    def absent_agents(self, rng: random.Random) -> frozenset[int]:
        """The agents that drop out at one step of one env (each with probability
        ``dropout``); draws nothing from ``rng`` without dropout."""
        if self.dropout == 0.0:
            return frozenset()
        return frozenset(a for a in range(self.swarm.n_agents) if rng.random() < self.dropout)

    def _gather(
        self,
        envs: list[TextEnv],
        episodes: list[Episode],
        generator: torch.Generator,
        rng: random.Random,
        experts: list[dict[str, float]] | None = None,
    ) -> tuple[list[Situation], list[dict[int, Bid]], list[list[Reply | None]]]:
        """The rule's situation in each env (``experts``: each env's expert levels, for a rule
        that asks for the expert's choice), the bids sampled for it, and (for rules that ask
        for proposals) every present agent's proposed action in each env, ``[env][agent]``
        (None for an absent agent)."""
        rule = self.coordination
        situations = [
            Situation(
                n_agents=self.swarm.n_agents,
                decision=env.decisions_made,
                previous_actor=episode.steps[-1].actor if episode.steps else None,
                observation=env.observation(MONOLITHIC) if rule.reads_observations else "",
                absent=self.absent_agents(rng),
            )
            for env, episode in zip(envs, episodes, strict=True)
        ]
        if rule.asks_expert:
            experts = experts or [self._expert_levels(env) for env in envs]
            situations = [
                replace(s, expert_choice=self.expert_choice(levels, s.present))
                for s, levels in zip(situations, experts, strict=True)
            ]
        bids: list[dict[int, Bid]] = [{} for _ in envs]
        if rule.asks_bids:
            bids = self._sample_bids(envs, [rule.bidders(s) for s in situations], generator)
            situations = [
                replace(
                    s,
                    bids={agent: bid.level for agent, bid in env_bids.items()},
                    bid_bonus={a: bid.bonus for a, bid in env_bids.items() if bid.bonus},
                )
                for s, env_bids in zip(situations, bids, strict=True)
            ]
        if rule.asks_routes:
            present = [s.present for s in situations]
            routes = self.decisions.routes(envs, [rule.routers(s) for s in situations], present)
            situations = [
                replace(s, routes=env_routes)
                for s, env_routes in zip(situations, routes, strict=True)
            ]
        proposals: list[list[Reply | None]] = [[] for _ in envs]
        if rule.asks_proposals:
            present = [s.present for s in situations]
            proposals, scores = self._propose(
                envs, present, generator, rule.proposal_scoring, rule.scores_own_proposal
            )
            situations = [
                replace(s, peer_scores=env_scores, own_scores=rule.scores_own_proposal)
                for s, env_scores in zip(situations, scores, strict=True)
            ]
        return situations, bids, proposals

    def _sample_bids(
        self, envs: list[TextEnv], bidders: list[list[int]], generator: torch.Generator
    ) -> list[dict[int, Bid]]:
        """The bid of each named agent in each env: one generation batch per agent, or one
        for all LoRA agents (:meth:`Swarm.bid_many`)."""
        bids: list[dict[int, Bid]] = [{} for _ in envs]
        wanted = [(agent, pos) for pos, agents in enumerate(bidders) for agent in agents]
        groups = group_by(wanted, lambda request: request[0])
        agents = [agent for agent, _ in groups]
        positions = [[pos for _, pos in requests] for _, requests in groups]
        sampled = self.swarm.bid_many(
            agents,
            [[envs[pos] for pos in agent_positions] for agent_positions in positions],
            generator,
        )
        for agent, agent_positions, agent_bids in zip(agents, positions, sampled, strict=True):
            for pos, bid in zip(agent_positions, agent_bids, strict=True):
                bids[pos][agent] = bid
        return bids

    def _propose(
        self,
        envs: list[TextEnv],
        present: list[list[int]],
        generator: torch.Generator,
        scoring: str,
        own: bool = False,
    ) -> tuple[list[list[Reply | None]], list[tuple[tuple[float, ...], ...]]]:
        """Every present agent's proposed action in every env (``present[env]``; one call of
        the engine, :meth:`Swarm.act_many`), and per env the scores ``[scorer][proposer]`` of
        every proposal by every other present agent (one scoring batch per scorer; a lone agent
        scores its own; with ``own`` each agent only its own): the mean token log-prob under
        the scorer's action prompt, or with ``scoring`` :data:`USEFULNESS` the scorer's
        usefulness level (:class:`DecisionReader`)."""
        n = self.swarm.n_agents
        proposals: list[list[Reply | None]] = [[None] * n for _ in envs]
        wanted = [
            (agent, [e for e in range(len(envs)) if agent in present[e]]) for agent in range(n)
        ]
        wanted = [(agent, positions) for agent, positions in wanted if positions]
        replies = self.swarm.act_many(
            [agent for agent, _ in wanted],
            [[envs[e] for e in positions] for _, positions in wanted],
            generator,
        )
        for (agent, positions), agent_replies in zip(wanted, replies, strict=True):
            for e, reply in zip(positions, agent_replies, strict=True):
                proposals[e][agent] = reply
        if scoring == USEFULNESS:
            return proposals, self.decisions.usefulness(envs, present, proposals, own)
        scores = [[[0.0] * n for _ in range(n)] for _ in envs]
        for scorer in range(n):
            rows = peer_rows(present, scorer, own)
            if not rows:
                continue
            values = self.swarm.score(
                scorer, [envs[e] for e, _ in rows], [proposals[e][p] for e, p in rows]
            )
            for (e, p), value in zip(rows, values, strict=True):
                scores[e][scorer][p] = value
        return proposals, [tuple(tuple(row) for row in env_scores) for env_scores in scores]

    # -- acting --------------------------------------------------------------------------------
    @staticmethod
    def _proposed_actions(
        decisions: list[Decision], proposals: list[list[Reply | None]]
    ) -> list[Reply | None]:
        """The acting proposal of each env, when the rule asked for proposals."""
        return [
            env_proposals[d.actor] if env_proposals and d.actor is not None else None
            for d, env_proposals in zip(decisions, proposals, strict=True)
        ]

    def _generate_actions(
        self,
        envs: list[TextEnv],
        decisions: list[Decision],
        actions: list[Reply | None],
        generator: torch.Generator,
    ) -> None:
        """Fill in each actor's missing action: every acting agent's in one call of the engine
        (:meth:`Swarm.act_many`: one generation batch per agent, or one for all LoRA agents)."""
        missing = [
            (d.actor, pos)
            for pos, (d, action) in enumerate(zip(decisions, actions, strict=True))
            if d.actor is not None and action is None
        ]
        groups = group_by(missing, lambda request: request[0])
        positions = [[pos for _, pos in requests] for _, requests in groups]
        replies = self.swarm.act_many(
            [agent for agent, _ in groups],
            [[envs[pos] for pos in agent_positions] for agent_positions in positions],
            generator,
        )
        for agent_positions, agent_replies in zip(positions, replies, strict=True):
            for pos, reply in zip(agent_positions, agent_replies, strict=True):
                actions[pos] = reply

    # -- the experts' view (what the market's health is measured against) ---------------------
    def _expert_levels(self, env: TextEnv) -> dict[str, float]:
        """Every role's expert bid in ``env`` now (``envs.experts.expert_levels``); none for the
        monolithic agent, who has no role to pick."""
        if None in self.swarm.roles:
            return {}
        return expert_levels(env, self.swarm.bid_levels)

    def _follows_expert(self, env: TextEnv, record: StepRecord) -> bool:
        """Whether the step about to be taken is the experts' own (read before the env steps)."""
        owners = record.expert_owners
        if record.actor is None:
            return not owners
        role = self.swarm.role(record.actor)
        if role not in owners or record.action is None:
            return False
        return record.action.text.strip() == (env.expert_action(role) or "").strip()

    def expert_choice(self, levels: dict[str, float], present: list[int]) -> frozenset[int]:
        """The present agents whose role the task's expert would let act (empty: it skips)."""
        owners = expert_owners(levels)
        return frozenset(agent for agent in present if self.swarm.role(agent) in owners)

    # -- stepping ------------------------------------------------------------------------------
    def _step(
        self, env: TextEnv, record: StepRecord, keep_snapshots: bool, every_step: bool = False
    ) -> None:
        """Take the decided step in ``env``, filling in ``record`` (with the state before it
        when the step is contested and ``keep_snapshots``, or ``every_step``)."""
        decision, action = record.decision, record.action
        if (keep_snapshots and record.contested) or every_step:
            record.snapshot = env.snapshot()
            record.open_reward = env.open_reward()
        if decision.actor is None:
            result = env.skip()
        else:
            assert action is not None, "every actor's action is generated before the step"
            result = env.step(self.swarm.role(decision.actor), action.text)
            self.swarm.usage.count_action(result.valid)
        record.reward = result.reward
        record.valid_action = result.valid
        record.memory = result.memory
        record.message = result.message


def _reaches_expert_state(env: TextEnv, episode: Episode) -> bool:
    """Whether ``env``'s state is one the experts' own play reaches: the episode's start, or
    every step so far followed them (a fork branch starts mid-episode: not known, False)."""
    if not episode.steps:
        return env.decisions_made == 0
    return episode.steps[-1].followed_expert is True
