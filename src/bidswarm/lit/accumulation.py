"""Gradient accumulation over micro-batches, with one gradient all-reduce per optimizer step.

The learners (RL and SFT) forward each agent's batch in micro-batches of at most a token
budget and call ``backward`` on each, so the peak memory of a step is set by the budget. In
one process the gradients simply add up. Under DDP the processes may hold different numbers of
micro-batches: every backward runs inside ``no_sync`` (no all-reduce), and :meth:`synchronize`
then makes one synchronised backward on every process, which averages the accumulated
gradients. Agents without data on any process keep ``grad = None``, so AdamW leaves them alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import lightning as L
import torch
from torch.nn.parallel import DistributedDataParallel

Backward = Callable[[int, torch.Tensor], None]
"""``backward(agent, loss)``: add the gradient of a micro-batch's share of an agent's loss."""


class GradientAccumulator:
    """Backward passes of micro-batch losses of ``agents`` (one param group each), then one
    synchronisation per optimizer step."""

    def __init__(self, module: L.LightningModule, agents: Sequence[torch.nn.Module]):
        self.module = module
        self.agents = agents
        self.has_gradient = [False] * len(agents)

    @property
    def _distributed(self) -> bool:
        return isinstance(self.module.trainer.strategy.model, DistributedDataParallel)

    @contextmanager
    def _local(self) -> Iterator[None]:
        """No gradient all-reduce inside (DDP's ``no_sync``); nothing to do in one process."""
        if self._distributed:
            with self.module.trainer.strategy.block_backward_sync():
                yield
        else:
            yield

    def backward(self, agent: int, loss: torch.Tensor) -> None:
        """Add the gradient of ``loss`` (a micro-batch's share of ``agent``'s loss)."""
        with self._local():
            self.module.manual_backward(loss)
        self.has_gradient[agent] = True

    def synchronize(self) -> bool:
        """Under DDP, average the accumulated gradients over the processes; returns whether any
        agent has a gradient (on any process), i.e. whether an optimizer step is due."""
        if not self._distributed:
            return any(self.has_gradient)
        device = next(self.agents[0].parameters()).device
        flags = torch.tensor([float(flag) for flag in self.has_gradient], device=device)
        flags = self.module.trainer.strategy.reduce(flags, reduce_op="sum")
        active = [agent for agent, flag in zip(self.agents, flags.tolist(), strict=True) if flag]
        if not active:
            return False
        # A zero loss on exactly the agents with data somewhere: every process's backward then
        # all-reduces those agents' accumulated gradients (its own may be none: zeros).
        touch = sum(
            p.reshape(-1)[0] * 0.0 for agent in active for p in agent.trainable_parameters()
        )
        self.module.manual_backward(touch)
        return True
