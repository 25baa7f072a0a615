"""[ours] The research task with shared actions (``task.actions=shared``): every role may call
every tool, and whose call works is drawn per world.

Each world (its seed) draws, for every tool (``browser.search``, ``browser.open``,
``browser.find``, ``answer``), the one role whose call of it works; another role's call is a
wasted turn (``the opener's browser.search does not work in this world``). A role sees the
tools that work for it (``Tools: ...``); no role, and no fixed assignment of roles to tools,
has every tool in every world. The monolithic agent's tools all work, as in the split variant
it owns every tool.

The experts: the role whose tool the next step of the chain needs bids 0.8 and replies that
step (a note written with the memory on goes with ``browser.find``); the others bid 0. One
role's call of each tool works, so the top bid never ties.
"""

from __future__ import annotations

import random

from bidswarm.envs.research.tools import TOOL_OWNERS, ToolCall, parse_call

TOOLS = tuple(TOOL_OWNERS)


def draw_tools(seed: int, roles: tuple[str, ...]) -> dict[str, str]:
    """Tool -> the role whose call of it works, in the world of ``seed``."""
    rng = random.Random(f"research-tools-{seed}")
    return {tool: rng.choice(roles) for tool in TOOLS}


def tools_line(tools: dict[str, str], role: str) -> str:
    """What ``role`` sees of the draw: the tools that work for it."""
    own = [tool for tool in TOOLS if tools[tool] == role]
    return f"Tools: {', '.join(own) or 'none'}."


def broken(role: str, tool: str) -> str:
    """The message of a call that does not work for ``role``."""
    return f"the {role}'s {tool} does not work in this world"


def tool_of(reply: str) -> str:
    """The tool an expert's reply calls (a note alone goes with ``browser.find``)."""
    call = parse_call(reply)
    return call.tool if isinstance(call, ToolCall) else "browser.find"
