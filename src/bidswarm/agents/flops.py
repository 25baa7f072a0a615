"""FLOPs per token of one agent (docs/method.md section 5, extended to LoRA): the one formula.

A forward costs 2 multiply-adds-as-FLOPs per weight and token over every weight it runs
through. A training token adds the backward: the gradient with respect to the activations
runs through every weight again (2 per weight, frozen ones included: the adapters sit inside the
base's layers) and the gradient with respect to the weights is computed for trained weights only
(2 per trained weight). So a fully fine-tuned agent of N weights costs 2N per forwarded token and
6N per trained one; a LoRA agent of base B (shared, frozen) and adapter A costs 2(B + A) and
4B + 6A. Only the agent's own adapter counts: the other agents' adapters in the shared model are
not on its path.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParameterCounts:
    """The weights a token of one agent runs through: ``frozen`` ones (a LoRA agent's shared
    base; 0 when fully fine-tuned) and ``trained`` ones (every weight, or the agent's adapter)."""

    frozen: int
    trained: int

    @property
    def forward_flops_per_token(self) -> float:
        """2 x every weight the forward runs through (generation, scoring)."""
        return 2.0 * (self.frozen + self.trained)

    @property
    def train_flops_per_token(self) -> float:
        """Forward (2 x all) + activation gradients (2 x all) + weight gradients (2 x trained)."""
        return 4.0 * (self.frozen + self.trained) + 2.0 * self.trained
