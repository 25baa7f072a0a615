"""How a bid is read from an agent's model (``bids.reader``), and the ``bids`` config group.

A reader turns an agent's bid policy into a bid, the way a coordination rule turns bids into
an actor: a pure decision, registered by name (:func:`register_reader`), unit-tested without
a model. ``sampled`` is the paper's: sample a reply, parse it, an unparsed reply bids 0. The
level readers decide from the log-probs of each level's canonical reply (one teacher-forced
forward of every level's reply, on any engine that scores: ``Swarm.level_logprobs``): the most
likely level (``argmax``), or the expectation over the levels (``expected``) [ours]. There is
no scalar value head: ``expected`` is already a continuous bid from one forward pass, and a head
outside the language model would be a parameter no vLLM engine serves (README, "The bid
channel and the market's health").
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

from omegaconf import MISSING


class BidPrompt(str, Enum):
    """How the bid and action prompts are told apart (``bids.prompt``)."""

    paper = "paper"
    """One word apart at the prompt's start (compact: ``logger bid: ... ->`` against ``logger
    act: ... ->``; chat: the request before the observation)."""
    apart = "apart"
    """[ours] Also a marker of the reply wanted right before it (compact: ``... => bid:``
    against ``... => act:``; chat: a last line after the observation), so that the position
    where the model writes its reply says which reply it is: action updates then pull the
    bid replies less toward the action text."""

    __str__ = str.__str__


class BidLoss(str, Enum):
    """What a bid update trains the bids on (``bids.loss``)."""

    bradley_terry = "bradley_terry"
    """The paper's (Eq. 3): the winner's bid reply against its redraw below the runner-up's,
    preferred by which of the two branches earned more."""
    calibrated = "calibrated"
    """[ours] Every agent's bid toward its measured value of acting: at ``bids.value_states``
    sampled states of each episode (skipped steps included) every agent acts first in a fork
    of its own (``rollout/acting_values.py``, common random numbers across the agents), and its
    bid distribution over the levels moves toward its return there as a share of the reward
    still open, in bid units (two-hot cross-entropy, ``algorithms/calibration.py``). Winners,
    runners-up and agents that passed all learn from the same fork."""

    __str__ = str.__str__


class AnchorTarget(str, Enum):
    """What the bid anchor (``bids.anchor_coef``) trains each bid prompt's reply toward
    (``bids.anchor_target``)."""

    expert = "expert"
    """The task expert's bid label there (its ``expert_bid`` of the bidder's role)."""
    levels = "levels"
    """[ours] Any bid level: the probability that the reply is one of the levels' canonical
    replies, whichever. It keeps the replies bids, which is what the anchor is for, without
    teaching the labels' base rates (mostly passes for a role that owns few steps)."""

    __str__ = str.__str__


@dataclass
class BidsConfig:
    """The bid channel (``conf/bids/``): how bids are read, sampled, prompted and kept bids.

    ``bids=paper`` is the paper's channel exactly; every other value is [ours].
    """

    name: str = MISSING
    reader: str = "sampled"
    """The registered reader (:data:`READERS`): ``sampled``, ``argmax``, ``expected``. A level
    reader's fork draws the winner's level below the runner-up's from its level distribution
    (``rl.bid_resample`` ``weighted_below_runner_up``, or ``below_runner_up`` if set so)."""
    temperature: float | None = None
    """The bids' sampling temperature in training (the ``sampled`` reader's replies; a level
    reader's softmax over the levels, ``expected``); None: ``model.temperature``. The learner
    scores the sampled reader's bid replies at it."""
    eval_temperature: float | None = None
    """The same in held-out evaluation; None: ``temperature``."""
    prompt: BidPrompt = BidPrompt.paper
    anchor_coef: float = 0.0
    """[ours] Weight of the bid anchor in action updates: the negative log-likelihood of the
    task expert's bid label (its ``expert_bid`` of the bidder's role, snapped to a level) at the
    bid prompts of the update's own episodes, the swarm's states on and off the experts' path
    (DAgger-style labels, free: the expert reads any state). It keeps the bid replies bids
    while the action updates train the same weights, and labels the states the demonstrations
    never reached. 0: off (the paper)."""
    anchor_target: AnchorTarget = AnchorTarget.expert
    """What the anchor trains each reply toward (:class:`AnchorTarget`): the expert's label
    (``expert``) or any level ([ours] ``levels``)."""
    anchor_prompts: int = 64
    """[ours] The most bid prompts per agent the anchor trains on in one action update (evenly
    spaced over the update's episodes)."""
    relabel_rounds: int = 0
    """[ours] After the SFT cold start, rounds of: play the swarm on the demonstration worlds
    under its own rule, label every bidder's bid prompt at every state with the task expert's
    bid, fine-tune the bids on those labels for one epoch (the SFT learning rate and batch
    size): DAgger-style labels where the swarm goes, not only on the experts' path
    (``run/relabel.py``; counted in ``sft/flops``). 0: off (the paper)."""
    loss: BidLoss = BidLoss.bradley_terry
    value_states: int = 2
    """[ours] ``bids.loss=calibrated``: states per episode of a bid update where every agent
    acts in a fork of its own."""
    value_branches: int = 1
    """[ours] ``bids.loss=calibrated``: branches per agent and state (their mean return is the
    agent's value of acting there)."""
    explore: float = 0.0
    """[ours] In training, the auction picks the highest bid + ``explore`` x the bid's spread
    (the standard deviation of a level reader's distribution over the levels), so an unsure
    agent gets tried, rather than coin flips between tied bids; 0 in every held-out
    evaluation. The recorded (credited) bid stays the bid. Level readers only."""
    relabel_lr: float | None = None
    """[ours] The learning rate of the relabel rounds' fine-tuning (None: the SFT's)."""
    balanced: bool = False
    """[ours] A level reader reads each bid as a classifier trained on balanced labels would: it
    divides the probability of each level by how often the role's expert labels bid it (the
    experts' bid demonstrations on the first training worlds, :func:`level_log_priors`; the
    levels the role's labels never bid get none: a role whose labels are all passes always
    passes), then reads. A role that owns few steps (one an episode) otherwise bids its levels
    near their base rate wherever the model is unsure, and is outbid at the very steps its bids
    rank first. What the forks draw below the runner-up and what the learner scores stay the
    model's own distribution. Level readers only."""
    mass_probe_prompts: int = 64
    """Bid prompts per agent that ``bids/valid_level_mass`` reads in each update and each
    evaluation (a diagnostic, not counted in FLOPs; 0: not measured)."""


class BidReader(abc.ABC):
    """Reads one bid from the log-probs of the levels' canonical replies (a level reader), or
    from a sampled reply (``reads_levels`` False: :class:`Sampled`)."""

    name: ClassVar[str]
    reads_levels: ClassVar[bool] = True
    """Whether the reader needs the level replies' log-probs (else a sampled reply)."""

    @abc.abstractmethod
    def read(self, logprobs: Sequence[float], levels: Sequence[float], temperature: float) -> float:
        """The bid, from ``logprobs[i]``, the log-prob at temperature 1 of replying exactly
        ``levels[i]``; ``temperature`` scales a reader that reads a distribution."""

    @staticmethod
    def spread(logprobs: Sequence[float], levels: Sequence[float], temperature: float) -> float:
        """The standard deviation of the level under softmax(log-prob / temperature): how
        unsure the bid is (``bids.explore`` adds a multiple of it in training)."""
        scaled = [lp / temperature for lp in logprobs]
        top = max(scaled)
        weights = [math.exp(s - top) for s in scaled]
        total = sum(weights)
        mean = sum(w * level for w, level in zip(weights, levels, strict=True)) / total
        second = sum(w * level * level for w, level in zip(weights, levels, strict=True)) / total
        return math.sqrt(max(second - mean * mean, 0.0))


READERS: dict[str, type[BidReader]] = {}
"""``bids.reader`` -> reader class (:func:`register_reader`)."""


def register_reader(name: str) -> Callable[[type[BidReader]], type[BidReader]]:
    def add(reader: type[BidReader]) -> type[BidReader]:
        reader.name = name
        READERS[name] = reader
        return reader

    return add


@register_reader("sampled")
class Sampled(BidReader):
    """The paper's: sample a bid reply at the bid temperature and parse its first number
    (snapped to a level; a reply that does not parse bids 0 and is counted)."""

    reads_levels = False

    def read(self, logprobs: Sequence[float], levels: Sequence[float], temperature: float) -> float:
        raise TypeError("the sampled reader reads sampled replies, not level log-probs")


@register_reader("argmax")
class Argmax(BidReader):
    """[ours] The most likely level (a tie goes to the lower level): no sampling noise, so the
    auction's ties are the policies' own."""

    def read(self, logprobs: Sequence[float], levels: Sequence[float], temperature: float) -> float:
        best = max(range(len(levels)), key=lambda i: (logprobs[i], -levels[i]))
        return float(levels[best])


@register_reader("expected")
class Expected(BidReader):
    """[ours] The expectation of the level under the bid policy restricted to the levels,
    softmax(log-prob / temperature): a continuous bid, so two agents almost never tie, and a
    less sure agent bids less."""

    def read(self, logprobs: Sequence[float], levels: Sequence[float], temperature: float) -> float:
        scaled = [lp / temperature for lp in logprobs]
        top = max(scaled)
        weights = [math.exp(s - top) for s in scaled]
        return sum(w * level for w, level in zip(weights, levels, strict=True)) / sum(weights)


def level_log_priors(labels: Sequence[float], levels: Sequence[float]) -> list[float]:
    """The log share of each of ``levels`` among one role's bid ``labels`` (each one of the
    levels), -inf for a level no label bids: what ``bids.balanced`` divides the level
    probabilities by. Raises on no labels (a role with no bids to balance)."""
    if not labels:
        raise ValueError("no bid labels to take the levels' shares from")
    counts = [sum(math.isclose(label, level) for label in labels) for level in levels]
    if sum(counts) != len(labels):
        raise ValueError(f"bid labels {sorted(set(labels))} are not all among levels {levels}")
    return [math.log(c / len(labels)) if c else -math.inf for c in counts]


def balance(
    logprobs: Sequence[float], log_priors: Sequence[float], temperature: float
) -> list[float]:
    """``logprobs`` with each level's share of the labels divided out at ``temperature``
    (softmax(result / T) is softmax(logprobs / T) / prior, renormalised), a level no label
    bids dropped (-inf): the input of any level reader under ``bids.balanced``."""
    return [
        -math.inf if prior == -math.inf else lp - temperature * prior
        for lp, prior in zip(logprobs, log_priors, strict=True)
    ]


def make_reader(name: str) -> BidReader:
    """The reader ``bids.reader`` names (checked by ``config.validate``)."""
    return READERS[name]()
