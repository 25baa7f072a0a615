"""Coordination rules: who acts each step. ``make_coordination`` maps config names to rules."""

from __future__ import annotations

from bidswarm.coordination.agentnet import AgentNet
from bidswarm.coordination.auction import Auction
from bidswarm.coordination.base import CoordinationRule, Decision
from bidswarm.coordination.fixed import Monolithic, RoundRobin
from bidswarm.coordination.graph_of_agents import GraphOfAgents

RULES: dict[str, type[CoordinationRule]] = {
    "auction": Auction,
    "round_robin": RoundRobin,
    "monolithic": Monolithic,
    "graph_of_agents": GraphOfAgents,
    "agentnet": AgentNet,
}


def make_coordination(name: str) -> CoordinationRule:
    if name not in RULES:
        raise ValueError(f"coordination.name={name!r} is unknown; choose one of {sorted(RULES)}")
    return RULES[name]()


__all__ = ["RULES", "CoordinationRule", "Decision", "make_coordination"]
