"""Redrawing the winner's bid in a fork (docs/method.md section 4): a draw below the runner-up's
bid, and the weight that gives such draws the expectation of the paper's rejection sampling.

The paper resamples the winner's bid up to K = 3 times until it falls below the runner-up's and
drops the step when every try fails. With q the chance that one resample lands below, a step is
kept with probability 1 - (1 - q)^K, and a kept bid is distributed as the policy restricted to
the levels below. Drawing from that restricted policy directly and weighting the fork by
1 - (1 - q)^K gives every sum over forks the same expectation, while no fork is wasted.

q is not known exactly: a reply that parses below in another spelling than a level's canonical
string (``0.20``, ``0``) is kept by rejection too, and scoring only the canonical strings
(:func:`draw_below`) leaves it out. :func:`keep_probability_estimate` estimates the chance
that K tries keep a fork from m sampled replies instead, without bias whatever the replies.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def draw_below(logprobs: Tensor, generator: torch.Generator | None = None) -> tuple[int, float]:
    """One candidate reply drawn from the policy restricted to the candidates, and their mass.

    Args:
        logprobs: log-probability of each candidate bid reply (the levels below the runner-up's)
            under the sampling policy, at its sampling temperature, shape [C] with C >= 1.
        generator: the random stream of the draw.

    Returns:
        (index of the drawn candidate, q = sum_c exp(logprobs_c) in [0, 1]): the draw has
        P(c) = exp(logprobs_c) / q; q is the chance that one sample of the policy is one of the
        candidates (computed in float64 and capped at 1 against rounding).
    """
    if logprobs.dim() != 1 or logprobs.shape[0] == 0:
        raise ValueError(f"logprobs must have shape [C] with C >= 1, got {tuple(logprobs.shape)}")
    weights = torch.softmax(logprobs, dim=0)
    choice = int(torch.multinomial(weights, 1, generator=generator))
    mass = float(torch.logsumexp(logprobs.detach().double(), dim=0).exp())
    return choice, min(mass, 1.0)


def rejection_keep_probability(q: float, tries: int) -> float:
    """1 - (1 - q)^tries: the chance that rejection sampling with ``tries`` independent tries,
    each a success with probability ``q``, succeeds (docs/method.md section 4: 3 tries). As the
    weight of a fork drawn below the runner-up (:func:`draw_below`) it makes the weighted forks
    an unbiased stand-in for the forks rejection sampling keeps. Accurate for tiny ``q`` too
    (about ``tries * q``)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be a probability in [0, 1], got {q!r}")
    if tries < 1:
        raise ValueError(f"tries must be >= 1, got {tries!r}")
    if q == 1.0:
        return 1.0
    return -math.expm1(tries * math.log1p(-q))


def keep_probability_estimate(kept: int, samples: int, tries: int) -> float:
    """1 - C(m - c, K) / C(m, K), with c = ``kept`` of m = ``samples`` independent resamples
    kept by rejection and K = ``tries``: the unbiased estimate of 1 - (1 - q)^K (the chance
    that K tries keep a fork, :func:`rejection_keep_probability`) from m samples, as pass@k
    is (Chen et al. 2021). Needs m >= K. Given c >= 1, the first kept sample is distributed as
    a kept try's bid, independently of c, so a fork played with it and weighted by this
    estimate has the expectation of the fork rejection sampling keeps.

    Example: m = 8, K = 3: c = 0 -> 0, c = 1 -> 1 - 35/56 = 0.375, c >= 6 -> 1.
    """
    if tries < 1:
        raise ValueError(f"tries must be >= 1, got {tries!r}")
    if samples < tries:
        raise ValueError(f"samples must be >= tries = {tries}, got {samples!r}")
    if not 0 <= kept <= samples:
        raise ValueError(f"kept must lie in [0, {samples}], got {kept!r}")
    return 1.0 - math.comb(samples - kept, tries) / math.comb(samples, tries)
