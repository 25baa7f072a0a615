"""The generation interface: what the collector asks of a rollout engine, whichever runs.

A request is a batch of prompts (token ids) of one agent (:class:`PromptBatch`); a call may
hold the batches of several agents (every bidder's bids of a decision step), which an engine
may run as one batch (LoRA agents of one base: one batch across their adapters). The reply to
each prompt is a :class:`Generation`: the reply's token ids, its text and the engine's
log-prob of each sampled token at the sampling temperature. The learner never trains on those
log-probs: it recomputes them with its own weights (the training signal), and
``engine/logprob_gap_*`` says how far the two are apart.

An engine serves the weights of the last update: it sees a change of an agent's trainable
weights (each tensor's address and in-place version, :func:`weights_version`) before it
generates for that agent again.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor

from bidswarm import metric_names as names
from bidswarm.agents.branching import branch_logprobs
from bidswarm.agents.models import torch_dtype
from bidswarm.agents.policy import AgentPolicy


@dataclass(frozen=True)
class Generation:
    """One sampled reply: its text, the (truncated) prompt tokens and the reply tokens.

    ``reply_ids`` end with the end-of-sequence token when the model produced one.
    ``logprobs``: the engine's log-prob of each reply token (at the sampling temperature), as
    the engine computed it; the learner's own are the training signal.
    ``shared_prefix``: the first tokens of the prompt, shared by every row of the generation
    batch, that the batch computed once for all its rows (0: none). Like ``logprobs`` it says
    how the reply was computed, not what it is: two generations with the same tokens are equal.
    """

    text: str
    prompt_ids: list[int]
    reply_ids: list[int]
    logprobs: tuple[float, ...] = field(default=(), compare=False)
    shared_prefix: int = field(default=0, compare=False)


class PromptBatch(NamedTuple):
    """Prompts (token ids, already cut to the agent's ``max_prompt_tokens``) of one agent."""

    policy: AgentPolicy
    prompt_ids: list[list[int]]


def finished_generations(
    policy: AgentPolicy,
    prompt_ids: Sequence[list[int]],
    rows: Sequence[Sequence[int]],
    logprobs: Sequence[Sequence[float]],
    shared_prefix: int = 0,
) -> list[Generation]:
    """Each row of sampled tokens cut after its first stop token (kept), decoded to text."""
    stop = set(policy.stop_ids)
    generations = []
    for prompt, row, row_logprobs in zip(prompt_ids, rows, logprobs, strict=True):
        end = next((i + 1 for i, token in enumerate(row) if token in stop), len(row))
        reply = list(row[:end])
        text = policy.tokenizer.decode(reply, skip_special_tokens=True).strip()
        kept = tuple(float(x) for x in row_logprobs[:end])
        generations.append(Generation(text, list(prompt), reply, kept, shared_prefix))
    return generations


def rollout_dtype(model_cfg: Any) -> torch.dtype | None:
    """``model.rollout_dtype`` as a torch dtype (None: generation in the weights' dtype)."""
    return None if model_cfg.rollout_dtype is None else torch_dtype(model_cfg.rollout_dtype)


def weights_version(policy: AgentPolicy) -> tuple[tuple[int, int], ...]:
    """What changes when ``policy``'s trainable weights change: each tensor's address and
    in-place version (an optimizer step, ``load_state_dict``, a move to another device or
    dtype; a write through ``.data`` is not seen, and nothing here writes that way)."""
    return tuple((p.data_ptr(), p._version) for p in policy.trainable_parameters())


@dataclass
class PromptTokens:
    """Prompt tokens an engine was given and those of them it computed, since the last
    :meth:`read` (``engine/prefix_cached_frac``: the share it did not compute)."""

    given: int = 0
    computed: int = 0

    def add(self, given: int, computed: int) -> None:
        self.given += given
        self.computed += computed

    def read(self) -> dict[str, float]:
        """``engine/prefix_cached_frac`` of the prompts since the last reading (nothing when
        there were none), and a fresh count."""
        given, computed = self.given, self.computed
        self.given = self.computed = 0
        if not given:
            return {}
        return {names.ENGINE_PREFIX_CACHED_FRAC: 1.0 - computed / given}


class RolloutEngine(abc.ABC):
    """Generates the agents' replies at rollout time (``model.engine``)."""

    name: str

    @abc.abstractmethod
    def generate(
        self,
        batches: Sequence[PromptBatch],
        max_new_tokens: int,
        temperature: float,
        generator: torch.Generator | None,
    ) -> list[list[Generation]]:
        """One reply per prompt of each batch, ``batches[i]``'s replies at ``[i]``; each stops
        at its first stop token or after ``max_new_tokens``; ``temperature`` 0 is greedy.
        ``generator`` (on the agents' device) is the only source of randomness."""

    def score(
        self,
        policy: AgentPolicy,
        prompt_ids: list[list[int]],
        reply_ids: list[list[int]],
        temperature: float,
        token_budget: int | None,
    ) -> tuple[Tensor, Tensor]:
        """Summed log-prob of each reply given its prompt and its length, both [B], no
        gradient, on the model the rollouts are scored with (default: the learner's weights,
        :meth:`AgentPolicy.sequence_logprobs`)."""
        return policy.sequence_logprobs(prompt_ids, reply_ids, temperature, token_budget)

    def score_branches(
        self,
        policy: AgentPolicy,
        prompt_ids: list[list[int]],
        replies: list[list[int]],
        temperature: float,
        token_budget: int | None,
    ) -> Tensor:
        """``[prompts, replies]``: the summed log-prob of each of ``replies`` after each prompt,
        no gradient, each prompt computed once (:func:`bidswarm.agents.branching
        .branch_logprobs`), on the model the rollouts are scored with (default: the learner's
        weights)."""
        return branch_logprobs(policy, prompt_ids, replies, temperature, token_budget)

    def close(self) -> None:
        """Release what the engine holds (processes, files); generating again restarts it."""
        return None

    def metrics(self) -> dict[str, float]:
        """What the engine measured of itself (``time/engine_*`` since it started,
        ``engine/prefix_cached_frac`` since the last call); default none."""
        return {}
