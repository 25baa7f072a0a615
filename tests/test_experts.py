"""Every task's scripted experts decide only from what an agent's observation shows.

SFT teaches each agent to imitate its role's expert from that role's observation. An expert that
reads hidden state (the true ore depth, the gold reasoning chain, the exact pose) demonstrates
replies that no agent can work out from its context; the same observation would then carry two
different targets. This check plays the experts jointly, as ``play_expert_episode`` does, and
records every role's decision at every step.

It can only catch a hidden input where observations repeat across worlds (crafting's do). The
navigation and research observations hold the world's own instruction or question, so they
seldom or never repeat; there the per-task tests that read every expert decision back off the
observation text (``test_navigation.py``, ``test_research.py``, ``test_crafting.py``) are the
strong checks.
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from bidswarm.envs import TASKS, TextEnv, env_class

EPISODES = 300
"""Training worlds played per task: enough for observations to repeat across worlds (the same
inventory and depth, say) so that a hidden input shows up as a conflict (about 2 s a task)."""
EXAMPLES_SHOWN = 3

Decision = tuple[float | None, str | None]
"""(expert bid, expert action) of one role at one step; the monolithic agent has no bid."""


def make_task_env(name: str) -> TextEnv:
    cls = env_class(name)
    return cls(cls.Config(name=name))


def expert_decisions(env: TextEnv, seeds: list[int]) -> dict[tuple[str, str | None], set]:
    """(observation, role) -> every decision the experts took there, over joint expert play.

    The monolithic agent (role None) is included: it learns every action from its own view.
    """
    seen: dict[tuple[str, str | None], set[Decision]] = defaultdict(set)
    for seed in seeds:
        rng = random.Random(seed)
        env.reset(seed)
        while not env.done:
            bids = {role: env.expert_bid(role) for role in env.roles}
            for role in env.roles:
                seen[(env.observation(role), role)].add((bids[role], env.expert_action(role)))
            seen[(env.observation(None), None)].add((None, env.expert_action(None)))
            top = max(bids.values())
            if top <= 0.0:
                env.skip()
                continue
            actor = rng.choice([role for role, bid in bids.items() if bid == top])
            env.step(actor, env.expert_action(actor) or "")
    return seen


@pytest.mark.parametrize("name", sorted(TASKS))
def test_the_experts_decisions_are_a_function_of_the_observation(name: str) -> None:
    """No (observation, role) is ever answered with two different (bid, action) decisions."""
    env = make_task_env(name)
    seen = expert_decisions(env, env.train_seeds()[:EPISODES])
    conflicts = {key: decisions for key, decisions in seen.items() if len(decisions) > 1}
    examples = "\n\n".join(
        f"role {role}: {sorted(decisions, key=str)}\n{observation}"
        for (observation, role), decisions in list(conflicts.items())[:EXAMPLES_SHOWN]
    )
    assert not conflicts, (
        f"{name}: {len(conflicts)} of {len(seen)} (observation, role) pairs got different "
        f"expert decisions, e.g.\n{examples}"
    )
