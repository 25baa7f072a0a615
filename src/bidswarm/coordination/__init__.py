"""Coordination rules: who acts each step, as pure decisions (see ``coordination/base.py``).

``RULES`` maps the ``coordination.name`` of a YAML in ``conf/coordination/`` to its rule class.
"""

from __future__ import annotations

from bidswarm.coordination.agentnet import AgentNet
from bidswarm.coordination.auction import Auction
from bidswarm.coordination.base import CoordinationConfig, CoordinationRule, Decision, Situation
from bidswarm.coordination.fixed import Monolithic, RoundRobin
from bidswarm.coordination.graph_of_agents import GraphOfAgents

RULES: dict[str, type[CoordinationRule]] = {
    "auction": Auction,
    "round_robin": RoundRobin,
    "monolithic": Monolithic,
    "graph_of_agents": GraphOfAgents,
    "agentnet": AgentNet,
}


def make_coordination(config: CoordinationConfig) -> CoordinationRule:
    """The rule that ``config.name`` names (checked by ``config.validate``), configured by it."""
    return RULES[config.name].from_config(config)


__all__ = [
    "RULES",
    "CoordinationConfig",
    "CoordinationRule",
    "Decision",
    "Situation",
    "make_coordination",
]
