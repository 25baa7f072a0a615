"""How much who acts can matter on a task, measured with scripted policies before any training.

    PYTHONPATH=src .venv/bin/python scripts/choice_room.py [--task crafting_wooden_pickaxe]
        [--actions split shared] [--worlds 64] [--branches 4] [task.key=value ...]

Every policy below decides only *who* acts; the actor replies with its scripted expert's
action (``expert_action(actor)``; nothing, a wasted turn, when it has none). On the first
``--worlds`` held-out worlds of the task it plays

* ``expert owner``: the role whose expert bids highest acts (ties drawn as
  ``play_expert_episode`` draws them; every bid 0 skips the step);
* ``best fixed schedule``: a fixed map from the kind of the next step (``step_kind``: the
  crafting skill, the navigation command, the research tool the monolithic expert's next
  action needs) to a role, the same in every world; every map over the kinds met is played
  on every world and the one with the best mean is reported (chosen on these same worlds,
  which flatters it);
* ``best single agent``: one role acts at every step (the best of them by mean);
* ``round-robin``: the roles act in turn by decision index, as ``pettingzoo.round_robin``;
* ``one-step fork oracle``: at each step, each role acts from a snapshot and the episode goes
  on under the expert owner's continuation, ``--branches`` times (the world's random draws
  reseeded per branch, the same seeds for every role); the role with the best mean final
  reward acts (ties: the expert owner, else the first role).

``room`` is the oracle minus the best (by mean) of the fixed schedule, the single agent and
round-robin, paired over worlds; intervals are 95% Student-t over worlds
(``bidswarm.statistics``). ``>= 2 can progress`` is the share of the expert owner's steps at
which at least two roles have an action (their expert's) that shrinks the plan distance in at
least one branch: the crafting plan's length, else the monolithic expert's decisions left.
Tasks that draw nothing after ``reset`` (navigation, research) give every branch the same
future.
"""

from __future__ import annotations

import argparse
import itertools
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bidswarm.envs import make_env
from bidswarm.envs.base import TextEnv
from bidswarm.envs.crafting import shared as crafting_shared
from bidswarm.envs.experts import snap_to_level
from bidswarm.envs.navigation.actions import parse_action
from bidswarm.envs.research.tools import parse_call
from bidswarm.statistics import paired_difference, summarize

ROOT = Path(__file__).resolve().parents[1]
LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]
TASKS = ("crafting_wooden_pickaxe", "navigation_r2r", "research")

Chooser = Callable[[TextEnv], "str | None"]
"""Who acts now (None: the step is skipped)."""


def build_env(task: str, actions: str, overrides: list[str], worlds: int) -> TextEnv:
    """The env of ``task=<task> task.actions=<actions>`` as a run composes it, with at least
    ``worlds`` held-out worlds (``task.n_heldout_seeds`` raised where it has fewer)."""
    from bidswarm.config import register_configs

    register_configs()
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[f"task={task}", f"task.actions={actions}", *overrides])
    cfg.task.n_heldout_seeds = max(cfg.task.n_heldout_seeds, worlds)
    return make_env(OmegaConf.to_object(cfg.task))


# -- what a step is ------------------------------------------------------------------------------
def step_kind(env: TextEnv) -> str | None:
    """The kind of the step the monolithic expert would take now (None: it has none)."""
    action = env.expert_action(None)
    if action is None:
        return None
    name = env.config.name
    if name == "crafting":
        return crafting_shared.skill_of(action)
    if name == "navigation":
        command = parse_action(action)
        return None if command is None else command.kind.split("_")[0]
    if name == "research":
        call = parse_call(action)
        return call if isinstance(call, str) else call.tool
    return action


def plan_distance(env: TextEnv) -> float:
    """How far the expert's plan is from the goal: minus ``progress()`` where the task has one,
    else the decisions the monolithic expert needs to finish from here."""
    progress = env.progress()
    if progress is not None:
        return -progress
    state = env.snapshot()
    steps = 0
    while not env.done:
        env.step(None, env.expert_action(None) or "")
        steps += 1
    env.restore(state)
    return float(steps)


def draws_after_reset(env: TextEnv) -> bool:
    """Whether the world draws at random after ``reset`` (crafting's ``rng``); the other tasks'
    futures are fixed by the state, so one branch says what any number would."""
    return isinstance(getattr(env, "rng", None), random.Random)


def reseed(env: TextEnv, key: str) -> None:
    """Give a branch its own random future: the world's RNG reseeded (where it has one)."""
    if draws_after_reset(env):
        env.rng.seed(key)


# -- policies ------------------------------------------------------------------------------------
def expert_owner(rng: random.Random) -> Chooser:
    """The highest expert bid acts, ties drawn from ``rng``; all bids 0 skip."""

    def choose(env: TextEnv) -> str | None:
        bids = {role: snap_to_level(env.expert_bid(role), LEVELS) for role in env.roles}
        top = max(bids.values())
        if top <= 0.0:
            return None
        return rng.choice([role for role, bid in bids.items() if bid == top])

    return choose


def play(env: TextEnv, choose: Chooser) -> float:
    """Play on to the end with ``choose``; the episode's reward."""
    while not env.done:
        actor = choose(env)
        if actor is None:
            env.skip()
        else:
            env.step(actor, env.expert_action(actor) or "")
    return env.episode_metrics()["reward"]


def play_world(env: TextEnv, seed: int, choose: Chooser) -> float:
    env.reset(seed)
    return play(env, choose)


def round_robin(env: TextEnv) -> str:
    return env.roles[env.decisions_made % len(env.roles)]


def fixed_schedules(env: TextEnv, seed: int) -> list[tuple[dict, float]]:
    """Every (kind -> role) map this world can tell apart, as (the kinds it met, reward)."""
    leaves: list[tuple[dict, float]] = []

    def explore(assigned: dict) -> None:
        while not env.done:
            kind = step_kind(env)
            if kind not in assigned:
                state = env.snapshot()
                for role in env.roles:
                    env.restore(state)
                    explore({**assigned, kind: role})
                return
            env.step(assigned[kind], env.expert_action(assigned[kind]) or "")
        leaves.append((assigned, env.episode_metrics()["reward"]))

    env.reset(seed)
    explore({})
    return leaves


def best_fixed_schedule(
    env: TextEnv, seeds: list[int]
) -> tuple[dict, dict[int, float], dict[str, dict[int, float]]]:
    """The best (kind -> role) map by mean over ``seeds``, its rewards per world, and each
    single agent's rewards per world (a single agent is the map sending every kind to it)."""
    per_world = {seed: fixed_schedules(env, seed) for seed in seeds}
    kinds = sorted({k for leaves in per_world.values() for a, _ in leaves for k in a}, key=str)

    def reward(seed: int, schedule: dict) -> float:
        return next(r for a, r in per_world[seed] if all(schedule[k] == v for k, v in a.items()))

    best, best_rewards = None, None
    for roles in itertools.product(env.roles, repeat=len(kinds)):
        schedule = dict(zip(kinds, roles, strict=True))
        rewards = {seed: reward(seed, schedule) for seed in seeds}
        if best_rewards is None or sum(rewards.values()) > sum(best_rewards.values()):
            best, best_rewards = schedule, rewards
    singles = {
        role: {seed: reward(seed, dict.fromkeys(kinds, role)) for seed in seeds}
        for role in env.roles
    }
    return best, best_rewards, singles


def oracle_episode(env: TextEnv, seed: int, branches: int) -> float:
    """The one-step fork oracle on world ``seed`` (module docstring)."""
    env.reset(seed)
    owner = expert_owner(random.Random(seed))
    while not env.done:
        state = env.snapshot()
        step = env.decisions_made
        values = {}
        for role in env.roles:
            total = 0.0
            for branch in range(branches):
                env.restore(state)
                reseed(env, f"oracle/{seed}/{step}/{branch}")
                env.step(role, env.expert_action(role) or "")
                total += play(env, expert_owner(random.Random(f"{seed}/{step}/{branch}")))
            values[role] = total / branches
        env.restore(state)
        preferred = owner(env)
        best = max(values.values())
        tied = [role for role in env.roles if values[role] == best]
        actor = preferred if preferred in tied else tied[0]
        env.step(actor, env.expert_action(actor) or "")
    return env.episode_metrics()["reward"]


def progress_share(env: TextEnv, seed: int, branches: int) -> float:
    """The share of the expert owner's steps on world ``seed`` where >= 2 roles can shrink the
    plan distance (module docstring)."""
    env.reset(seed)
    owner = expert_owner(random.Random(seed))
    counted = steps = 0
    while not env.done:
        state = env.snapshot()
        before = plan_distance(env)
        able = 0
        for role in env.roles:
            for branch in range(branches):
                env.restore(state)
                reseed(env, f"progress/{seed}/{env.decisions_made}/{branch}")
                env.step(role, env.expert_action(role) or "")
                if plan_distance(env) < before:
                    able += 1
                    break
        env.restore(state)
        counted += able >= 2
        steps += 1
        actor = owner(env)
        if actor is None:
            env.skip()
        else:
            env.step(actor, env.expert_action(actor) or "")
    return counted / steps


# -- the table -----------------------------------------------------------------------------------
@dataclass
class Room:
    """What :func:`measure` found on one task and variant."""

    rewards: dict[str, dict[int, float]]
    """Policy -> world -> reward."""
    schedule: dict
    single: str
    baseline: str
    room_mean: float
    room_low: float
    room_high: float
    share: dict[int, float]


def measure(env: TextEnv, seeds: list[int], branches: int) -> Room:
    schedule, fixed, singles = best_fixed_schedule(env, seeds)
    single = max(env.roles, key=lambda role: sum(singles[role].values()))
    rewards = {
        "expert owner": {s: play_world(env, s, expert_owner(random.Random(s))) for s in seeds},
        "best fixed schedule": fixed,
        "best single agent": singles[single],
        "round-robin": {s: play_world(env, s, round_robin) for s in seeds},
        "one-step fork oracle": {s: oracle_episode(env, s, branches) for s in seeds},
    }
    contenders = ("best fixed schedule", "best single agent", "round-robin")
    baseline = max(contenders, key=lambda name: sum(rewards[name].values()))
    room = paired_difference(rewards["one-step fork oracle"], rewards[baseline], "oracle", baseline)
    share = {s: progress_share(env, s, branches) for s in seeds}
    return Room(rewards, schedule, single, baseline, room.mean, room.ci_low, room.ci_high, share)


def table(name: str, room: Room) -> str:
    lines = [f"{name} | mean | 95% CI", "--- | ---: | ---"]
    for policy, rewards in room.rewards.items():
        s = summarize(list(rewards.values()))
        lines.append(f"{policy} | {s.mean:.3g} | {s.ci_low:.3g} .. {s.ci_high:.3g}")
    lines.append(
        f"**room** (oracle - {room.baseline}) | **{room.room_mean:.3g}** | "
        f"{room.room_low:.3g} .. {room.room_high:.3g}"
    )
    s = summarize(list(room.share.values()))
    share = f"{s.mean:.2f} | {s.ci_low:.2f} .. {s.ci_high:.2f}"
    lines.append(f">= 2 can progress (share of steps) | {share}")
    shown = ", ".join(f"{kind} {role}" for kind, role in room.schedule.items())
    lines.append(f"(best fixed schedule: {shown}; best single agent: {room.single})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", nargs="+", default=["crafting_wooden_pickaxe"], choices=TASKS)
    parser.add_argument("--actions", nargs="+", default=["split", "shared"])
    parser.add_argument("--worlds", type=int, default=64, help="first N held-out worlds")
    parser.add_argument("--branches", type=int, default=4, help="K branches of the oracle")
    parser.add_argument("overrides", nargs="*", help="task.key=value overrides")
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    print(f"commit {commit}: {' '.join(sys.argv[1:])}")
    for task in args.task:
        for actions in args.actions:
            start = time.perf_counter()
            env = build_env(task, actions, args.overrides, args.worlds)
            seeds = env.heldout_seeds()[: args.worlds]
            branches = args.branches if draws_after_reset(env) else 1
            room = measure(env, seeds, branches)
            name = f"{task} task.actions={actions} ({len(seeds)} worlds, K={branches})"
            print(f"\n{table(name, room)}\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
