"""The swarm as the collector sees it: batched bids, actions and scores per agent, counted.

Every call is batched per agent over many environments and asks the run's rollout engine
(``bidswarm.engines``, ``model.engine``) for the replies; bids of several agents go to the
engine in one call (:meth:`Swarm.bid_many`: LoRA agents of one base in one batch across their
adapters), and so do the actions of a decision step (:meth:`Swarm.act_many`). Scoring
(Graph-of-Agents' peer scores, the forks' draws below the runner-up) runs on the engine's
scoring model in forwards of at most ``token_budget`` tokens. Every call counts the tokens it
processed in the swarm's :class:`~bidswarm.rollout.usage.Usage` (docs/method.md section 5).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from bidswarm.agents.branching import branch_tokens
from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate, parse_bid
from bidswarm.algorithms.resampling import draw_below
from bidswarm.coordination.bid_readers import BidReader, Sampled, balance
from bidswarm.engines import Generation, PromptBatch, RolloutEngine
from bidswarm.envs.base import TextEnv
from bidswarm.envs.experts import format_bid, snap_to_level
from bidswarm.rollout.records import Bid, Reply
from bidswarm.rollout.usage import Usage


class Swarm:
    """Population + prompt templates + generation settings + the rollout engine + the usage
    ledger.

    engine: what generates the replies (``model.engine``; :mod:`bidswarm.engines`).
    token_budget: the most tokens one scoring forward may see (``model.micro_batch_tokens``;
    None: no limit).
    """

    def __init__(
        self,
        population: Population,
        prompts: PromptTemplate,
        max_bid_tokens: int,
        max_action_tokens: int,
        temperature: float,
        engine: RolloutEngine,
        bid_population: Population | None = None,
        token_budget: int | None = None,
        reader: BidReader | None = None,
        bid_temperature: float | None = None,
        eval_bid_temperature: float | None = None,
        explore: float = 0.0,
        level_log_priors: dict[str, list[float]] | None = None,
    ):
        """``reader``: how bids are read (``bids.reader``; default the paper's ``sampled``);
        ``bid_temperature`` / ``eval_bid_temperature``: the bids' temperature in training and
        in held-out evaluation (:meth:`evaluating`); None: ``temperature`` / the training one;
        ``level_log_priors``: per role, the log share of each bid level among its expert
        labels, divided out of a level reader's probabilities (``bids.balanced``)."""
        self.population = population
        self.bid_population = bid_population or population
        """Whose bid policies bid (the component ablation mixes checkpoints); default: the same."""
        self.prompts = prompts
        self.bid_levels = list(prompts.bid_levels)
        self.max_bid_tokens = max_bid_tokens
        self.max_action_tokens = max_action_tokens
        self.temperature = temperature
        self.engine = engine
        self.token_budget = token_budget
        self.usage = Usage()
        self.reader = reader or Sampled()
        self.level_log_priors = level_log_priors or {}
        self.explore = self.train_explore = explore
        """``bids.explore`` in training, 0 in held-out evaluation (:meth:`evaluating`)."""
        self.train_bid_temperature = bid_temperature or temperature
        self.eval_bid_temperature = eval_bid_temperature or self.train_bid_temperature
        self.bid_temperature = self.train_bid_temperature
        """The bids' temperature now: the training one, the evaluation one in :meth:`evaluating`."""
        self.weights_per_agent = [agent.parameter_counts() for agent in population.agents]
        """What each agent's tokens run through (its FLOPs per token; LoRA: base + own adapter)."""

    @property
    def n_agents(self) -> int:
        return len(self.population.agents)

    @property
    def roles(self) -> list[str | None]:
        return self.population.roles

    def role(self, agent: int) -> str | None:
        return self.population.agents[agent].role

    @contextmanager
    def separate_usage(self) -> Iterator[Usage]:
        """Count into a fresh ledger inside the block (held-out evaluation), then restore."""
        kept, self.usage = self.usage, Usage()
        try:
            yield self.usage
        finally:
            self.usage = kept

    @contextmanager
    def evaluating(self) -> Iterator[Usage]:
        """A held-out evaluation inside the block: its own ledger (:meth:`separate_usage`) and
        the bids at their evaluation temperature."""
        self.bid_temperature, self.explore = self.eval_bid_temperature, 0.0
        try:
            with self.separate_usage() as usage:
                yield usage
        finally:
            self.bid_temperature, self.explore = self.train_bid_temperature, self.train_explore

    def _generate(
        self,
        population: Population,
        agents: list[int],
        prompts: list[list[str]],
        max_new_tokens: int,
        generator: torch.Generator,
        temperature: float | None = None,
    ) -> list[list[Reply]]:
        """``population``'s agent ``agents[i]``'s reply to each of ``prompts[i]``, all in one
        call of the engine, counted as rollout tokens."""
        batches = [
            PromptBatch(population.agents[agent], population.agents[agent].encode_prompts(texts))
            for agent, texts in zip(agents, prompts, strict=True)
        ]
        with torch.no_grad():
            generations = self.engine.generate(
                batches, max_new_tokens, temperature or self.temperature, generator
            )
        return [
            self._replies(agent, agent_generations)
            for agent, agent_generations in zip(agents, generations, strict=True)
        ]

    def _replies(self, agent: int, generations: list[Generation]) -> list[Reply]:
        """``agent``'s generations (one batch) as replies, their tokens counted as rollout tokens:
        a prompt prefix the batch computed once is counted once."""
        self._count_rollout(agent, _generated_tokens(generations))
        return [Reply(agent, g.prompt_ids, g.reply_ids, g.text, g.logprobs) for g in generations]

    def _bid_prompts(self, agent: int, envs: list[TextEnv], copies: int = 1) -> list[str]:
        """``agent``'s bid prompt in each env, each ``copies`` times (consecutive)."""
        role = self.role(agent)
        prompts = [self.prompts.bid(role, env.observation(role)) for env in envs]
        return [prompt for prompt in prompts for _ in range(copies)]

    def _parse_bids(self, replies: list[Reply]) -> list[Bid]:
        """Bids read from bid replies; a malformed reply bids 0 and is counted."""
        bids = []
        for reply in replies:
            level, parsed = parse_bid(reply.text, self.bid_levels)
            bids.append(Bid(level, reply, parsed))
        self.usage.count_bids(bid.parsed for bid in bids)
        return bids

    def bid(
        self,
        agent: int,
        envs: list[TextEnv],
        generator: torch.Generator,
        copies: int = 1,
        temperature: float | None = None,
    ) -> list[Bid]:
        """``agent``'s bid in each env (each prompt ``copies`` times, consecutive), sampled at
        ``temperature`` (None: the swarm's). A malformed reply bids 0 and is counted."""
        prompts = self._bid_prompts(agent, envs, copies)
        replies = self._generate(
            self.bid_population,
            [agent],
            [prompts],
            self.max_bid_tokens,
            generator,
            temperature or self.bid_temperature,
        )[0]
        return self._parse_bids(replies)

    def bid_many(
        self, agents: list[int], envs: list[list[TextEnv]], generator: torch.Generator
    ) -> list[list[Bid]]:
        """Each ``agents[i]``'s bid in each of ``envs[i]``, read by the swarm's reader: sampled
        replies counted as :meth:`bid` counts them, in one call of the engine (LoRA agents of
        one base: one batch across their adapters; for the same ``generator`` their sampled
        bids differ from :meth:`bid`'s one by one); or a level reader's bids
        (:meth:`read_levels`)."""
        prompts = [
            self._bid_prompts(agent, agent_envs)
            for agent, agent_envs in zip(agents, envs, strict=True)
        ]
        if self.reader.reads_levels:
            pairs = zip(agents, prompts, strict=True)
            return [self.read_levels(agent, texts) for agent, texts in pairs]
        replies = self._generate(
            self.bid_population,
            agents,
            prompts,
            self.max_bid_tokens,
            generator,
            self.bid_temperature,
        )
        return [self._parse_bids(agent_replies) for agent_replies in replies]

    def read_levels(self, agent: int, prompts: list[str]) -> list[Bid]:
        """``agent``'s bid at each bid prompt by a level reader (``bids.reader``) from the
        log-probs of every level's canonical reply (:meth:`level_logprobs`, counted as rollout
        tokens). Its reply is the canonical text of the bid's nearest level: what a fork
        compares with the level drawn below the runner-up."""
        policy = self.bid_population.agents[agent]
        prompt_ids = policy.encode_prompts(prompts)
        with torch.no_grad():
            logprobs = self.level_logprobs(agent, prompt_ids).tolist()
        priors = self.level_log_priors.get(policy.role)
        bids = []
        for ids, row in zip(prompt_ids, logprobs, strict=True):
            if priors is not None:
                row = balance(row, priors, self.bid_temperature)
            value = self.reader.read(row, self.bid_levels, self.bid_temperature)
            text = format_bid(snap_to_level(value, self.bid_levels))
            reply = Reply(agent, ids, policy.encode_reply(self.prompts.reply_text(text)), text)
            bonus = 0.0
            if self.explore:
                bonus = self.explore * self.reader.spread(
                    row, self.bid_levels, self.bid_temperature
                )
            bids.append(Bid(value, reply, True, bonus))
        self.usage.count_bids(True for _ in bids)
        return bids

    def bid_below(
        self,
        agent: int,
        envs: list[TextEnv],
        ceilings: list[float],
        generator: torch.Generator,
        temperature: float | None = None,
    ) -> tuple[list[Reply], list[float]]:
        """``agent``'s bid in each env drawn from its policy restricted to the well-formed levels
        below ``ceilings[k]`` (each > the lowest level), and the policy's mass q on them.

        pi_T(reply) is the chance that :meth:`bid` at ``temperature`` (None: the swarm's)
        samples exactly the canonical reply of a level (``format_bid``, token by token at that
        temperature). The draw has P(level) = pi_T(level reply) / q with
        q = sum of pi_T over the levels below (:func:`draw_below`): what rejection sampling of
        bids "until one falls below" keeps, with unlimited tries, when only canonical replies
        count. q is the chance that one such resample succeeds; it leaves out replies that are
        not a canonical level string (malformed ones, and those that parse to a level below in
        another spelling). The candidate replies are scored in one batch, counted as rollout
        tokens."""
        role = self.role(agent)
        policy = self.bid_population.agents[agent]
        prompts = policy.encode_prompts(
            [self.prompts.bid(role, env.observation(role)) for env in envs]
        )
        candidates = [[level for level in self.bid_levels if level < top] for top in ceilings]
        if any(not levels for levels in candidates):
            raise ValueError(f"no bid level lies below each of {ceilings}")
        replies = {
            level: policy.encode_reply(self.prompts.reply_text(format_bid(level)))
            for level in self.bid_levels
        }
        rows = [(k, level) for k, levels in enumerate(candidates) for level in levels]
        prompt_ids = [prompts[k] for k, _ in rows]
        reply_ids = [replies[level] for _, level in rows]
        logprobs, _ = self.engine.score(
            policy, prompt_ids, reply_ids, temperature or self.bid_temperature, self.token_budget
        )
        self._count_rollout(agent, _tokens(prompt_ids, reply_ids))
        drawn, masses, start = [], [], 0
        for k, levels in enumerate(candidates):
            choice, mass = draw_below(logprobs[start : start + len(levels)], generator)
            level = levels[choice]
            drawn.append(Reply(agent, prompts[k], replies[level], format_bid(level)))
            masses.append(mass)
            start += len(levels)
        return drawn, masses

    def level_logprobs(
        self, agent: int, prompt_ids: list[list[int]], counted: bool = True
    ) -> torch.Tensor:
        """``[prompts, levels]``: the log-prob, at temperature 1, that ``agent``'s bid policy
        replies exactly each bid level's canonical text (``format_bid``, then end of sequence)
        to each bid prompt: each prompt computed once, then every level's reply
        (``engine.score_branches``), counted as rollout tokens unless ``counted`` is False (a
        diagnostic)."""
        policy = self.bid_population.agents[agent]
        replies = [self.level_reply_ids(agent, level) for level in self.bid_levels]
        logprobs = self.engine.score_branches(policy, prompt_ids, replies, 1.0, self.token_budget)
        if counted:
            self._count_rollout(agent, branch_tokens(policy, prompt_ids, replies))
        return logprobs.float()

    def level_reply_ids(self, agent: int, level: float) -> list[int]:
        """The canonical reply of bid ``level`` in ``agent``'s bid policy's tokens."""
        policy = self.bid_population.agents[agent]
        return policy.encode_reply(self.prompts.reply_text(format_bid(level)))

    def level_mass(self, agent: int, prompt_ids: list[list[int]]) -> list[float]:
        """The probability that ``agent``'s bid policy replies exactly one of the bid levels, per
        prompt (:meth:`level_logprobs`; not counted: a diagnostic)."""
        logprobs = self.level_logprobs(agent, prompt_ids, counted=False)
        return logprobs.exp().sum(dim=1).tolist()

    def act(self, agent: int, envs: list[TextEnv], generator: torch.Generator) -> list[Reply]:
        """``agent``'s action reply in each env."""
        prompts = self._action_prompts(agent, envs)
        return self._generate(
            self.population, [agent], [prompts], self.max_action_tokens, generator
        )[0]

    def act_many(
        self, agents: list[int], envs: list[list[TextEnv]], generator: torch.Generator
    ) -> list[list[Reply]]:
        """Each ``agents[i]``'s action reply in each of ``envs[i]``, in one call of the engine
        (LoRA agents of one base: one batch across their adapters; for the same ``generator``
        their sampled replies differ from :meth:`act`'s one by one; agents with their own
        weights sample what :meth:`act` samples one by one, in this order)."""
        prompts = [
            self._action_prompts(agent, agent_envs)
            for agent, agent_envs in zip(agents, envs, strict=True)
        ]
        return self._generate(self.population, agents, prompts, self.max_action_tokens, generator)

    def _action_prompts(self, agent: int, envs: list[TextEnv]) -> list[str]:
        """``agent``'s action prompt in each env."""
        role = self.role(agent)
        return [self.prompts.action(role, env.observation(role)) for env in envs]

    def score(self, agent: int, envs: list[TextEnv], replies: list[Reply]) -> list[float]:
        """Mean token log-prob of each reply as ``agent``'s own action in its env.

        ``replies[k]`` is scored in ``envs[k]`` under ``agent``'s action prompt, at the sampling
        temperature; an empty reply scores ``-inf``. Counted as rollout tokens and FLOPs.
        """
        policy = self.population.agents[agent]
        prompt_ids = policy.encode_prompts(self._action_prompts(agent, envs))
        reply_ids = [reply.reply_ids for reply in replies]
        sums, lengths = self.engine.score(
            policy, prompt_ids, reply_ids, self.temperature, self.token_budget
        )
        self._count_rollout(agent, _tokens(prompt_ids, reply_ids))
        means = sums / lengths.clamp(min=1)
        pairs = zip(means.tolist(), lengths.tolist(), strict=True)
        return [mean if n > 0 else float("-inf") for mean, n in pairs]

    def _count_rollout(self, agent: int, tokens: int) -> None:
        self.usage.count_rollout(self.weights_per_agent[agent], tokens)

    def count_trained(self, agent: int, tokens: int) -> None:
        """Tokens a learner forward of ``agent`` will train on (forward + backward FLOPs each,
        :class:`~bidswarm.agents.flops.ParameterCounts`)."""
        self.usage.count_trained(self.weights_per_agent[agent], tokens)


def _generated_tokens(generations: list[Generation]) -> int:
    """Tokens one generation batch processed: each row's prompt and reply, the prefix shared by
    all rows (computed once) once (padding not counted)."""
    shared = max((g.shared_prefix for g in generations), default=0)
    rows = sum(len(g.prompt_ids) - g.shared_prefix + len(g.reply_ids) for g in generations)
    return rows + shared


def _tokens(prompt_ids: list[list[int]], reply_ids: list[list[int]]) -> int:
    """Tokens a forward over these prompt + reply rows processes (padding not counted)."""
    return sum(len(p) + len(r) for p, r in zip(prompt_ids, reply_ids, strict=True))
