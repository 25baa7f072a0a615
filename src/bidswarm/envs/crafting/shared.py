"""[ours] The crafting task with shared actions (``task.actions=shared``): every role may give
every instruction, and whose instruction works depends on skills drawn per world.

Each instruction needs one skill (:func:`skill_of`): woodcutting, mining, handcrafting (the 2x2
recipes), toolmaking (the recipes that need a crafting table) or smelting. Each world (its seed)
draws, per skill, one role ``skilled``, one ``unable`` and the third ``novice`` or ``unable``
(even odds), in a random order: every role has the same chance to be the only one who can do a
kind of step, so no role, and no fixed assignment of roles to kinds of step, is right in every
world. A role sees only its own skills (``your skills: ...``); the history shows who failed.

A ``novice``'s instruction works with probability :data:`NOVICE_SUCCESS` (then the skill
model's own odds apply, as for a skilled role); else it fails and wastes the step. An
``unable`` role's instruction fails, and a craft or smelt it tries spoils its ingredients (one
batch) when they are at hand. The monolithic agent sees every role's skills and acts with the
best of them: it is the whole team in one agent, as in the split variant it owns every role's
instructions.

The competence-aware experts bid by their own skill at the plan's next step: ``skilled`` 0.8,
``novice`` one level below (0.6 under ``graded`` bids, 0.4 under ``two_level``), ``unable`` 0.
Exactly one role is skilled at each skill, so the top bid never ties; every role's expert
replies the plan's next step.
"""

from __future__ import annotations

import random
from typing import Any

from bidswarm.envs.crafting import expert, techtree

SKILLS = ("woodcutting", "mining", "handcrafting", "toolmaking", "smelting")
SKILLED, NOVICE, UNABLE = "skilled", "novice", "unable"
NOVICE_SUCCESS = 0.4
"""Chance that a novice's instruction works at all (a skilled role's always does)."""
SKILL_BIDS = {"graded": {SKILLED: 0.8, NOVICE: 0.6}, "two_level": {SKILLED: 0.8, NOVICE: 0.4}}
"""The experts' bid by their skill at the plan's next step, per ``task.expert_bids``."""

GATHERING = {
    "chop a tree": "woodcutting",
    "find trees": "woodcutting",
    "go to the surface": "woodcutting",
    "dig down": "mining",
    "mine stone": "mining",
    "mine coal": "mining",
    "mine iron ore": "mining",
    "explore the cave": "mining",
}
CRAFTED = {instruction: item for item, instruction in expert.CRAFT_INSTRUCTION.items()}
"""Crafting instruction -> the item it makes."""
SMELTED = {instruction: source for source, instruction in expert.SMELT_INSTRUCTION.items()}
"""Smelting instruction -> the item it smelts."""


def skill_of(instruction: str) -> str:
    """The skill ``instruction`` needs; a crafting instruction needs toolmaking when its recipe
    needs a crafting table, else handcrafting."""
    if instruction in GATHERING:
        return GATHERING[instruction]
    if instruction in SMELTED:
        return "smelting"
    return "toolmaking" if techtree.recipe(CRAFTED[instruction]).needs_table else "handcrafting"


class Skills:
    """The skills of one world: skill -> each role's level, in the task's role order."""

    def __init__(self, seed: int, roles: tuple[str, ...]):
        """Draw the skills of world ``seed`` (module docstring) from a stream of their own, so
        the world's trees, depths and ores are those of the split variant."""
        rng = random.Random(f"crafting-skills-{seed}")
        self.roles = roles
        self.levels: dict[str, tuple[str, ...]] = {}
        for skill in SKILLS:
            drawn = [SKILLED, rng.choice([NOVICE, UNABLE]), *[UNABLE] * (len(roles) - 2)]
            rng.shuffle(drawn)
            self.levels[skill] = tuple(drawn)

    def level(self, role: str | None, skill: str) -> str:
        """``role``'s level at ``skill``; the monolithic agent (None) has the team's best."""
        levels = self.levels[skill]
        if role is None:
            return min(levels, key=(SKILLED, NOVICE, UNABLE).index)
        return levels[self.roles.index(role)]

    def text(self, role: str | None, shown: list[str]) -> str:
        """What ``role`` sees of the skills of ``shown``: its own levels; the monolithic
        agent's line lists every role's (``skills: woodcutting miner skilled logger novice``)."""
        if role is not None:
            own = ", ".join(f"{skill} {self.level(role, skill)}" for skill in shown)
            return f" your skills: {own}."
        team = []
        for skill in shown:
            pairs = zip(self.roles, self.levels[skill], strict=True)
            able = [f"{r} {level}" for r, level in pairs if level != UNABLE]
            team.append(f"{skill} {' '.join(able)}")
        return f" skills: {'; '.join(team)}."

    def failure(self, role: str | None, instruction: str, env: Any) -> str:
        """Why ``role``'s ``instruction`` fails in ``env`` ("" when it goes ahead to the skill
        model): a novice's attempt draws from the world's ``env.rng``; an unable role's craft
        or smelt spoils its ingredients in ``env.inventory`` (module docstring)."""
        skill = skill_of(instruction)
        level = self.level(role, skill)
        if level == NOVICE:
            return "" if env.rng.random() < NOVICE_SUCCESS else f"failed, a novice at {skill}"
        if level == SKILLED:
            return ""
        ingredients: tuple[tuple[str, int], ...] = ()
        if instruction in CRAFTED:
            ingredients = techtree.recipe(CRAFTED[instruction]).ingredients
        elif instruction in SMELTED:
            ingredients = ((SMELTED[instruction], 1),)
        return f"failed, no {skill} skill" + spoil(env.inventory, ingredients)

    def expert_bid(self, role: str, env: Any) -> float:
        """The competence-aware expert's bid: by ``role``'s skill at the plan's next step."""
        steps = expert.plan(env)
        if not steps:
            return 0.0
        level = self.level(role, skill_of(steps[0][1]))
        return SKILL_BIDS[env.config.expert_bids].get(level, 0.0)


def spoil(inventory: dict[str, int], ingredients: tuple[tuple[str, int], ...]) -> str:
    """Take ``ingredients`` out of ``inventory`` when all are at hand; the text that says what
    was lost ("" when nothing was)."""
    if not ingredients or any(inventory.get(item, 0) < n for item, n in ingredients):
        return ""
    for item, count in ingredients:
        inventory[item] -= count
    lost = ", ".join(f"{count} {techtree.display_name(item)}" for item, count in ingredients)
    return f", {lost} spoilt"


def skills_needed(env: Any) -> list[str]:
    """The skills the plan from ``env``'s state needs, in :data:`SKILLS` order (what the
    observations list, computed once per config from a fresh episode)."""
    needed = {skill_of(instruction) for _, instruction in expert.plan(env)}
    return [skill for skill in SKILLS if skill in needed]


def describe(role: str | None, instructions: list[str]) -> str:
    """The role description under shared actions: every instruction, and what skills do."""
    who = "You" if role is None else f"You are the {role}. You"
    skills = (
        "You act with the team's best skill at each kind of instruction."
        if role is None
        else "Your skill at each kind of instruction is drawn per world (your skills): an "
        "unable member's instruction fails and spoils what it uses, a novice's often fails."
    )
    return f"{who} may reply with exactly one of: {'; '.join(instructions)}. {skills}"
