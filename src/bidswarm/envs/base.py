"""The text-environment interface every task implements, and the fork contract.

A task is a text world shared by a swarm of role-specialised agents. Each decision step at most
one agent acts (the auction picks it); the environment turns that agent's reply into a change of
the world and a reward. The rollout loop, the scripted experts and the fork machinery only ever
talk to a task through this interface.

The fork contract (docs/architecture.md, "The task contract"): ``snapshot()`` returns plain
data that holds **everything** that decides the future (world, inventory or pose, decision
counter, metric state, RNG state, the shared memory's notes), shares no mutable object with the
live environment, and ``restore(state)`` brings the environment back to exactly that point, so
that replaying the same actions gives the same observations and rewards.

The shared memory (``task.memory``, ``envs/memory.py``) lives here, once for every task: a task
draws what a role sees (``screen``) and carries out a reply (``act``); ``observation`` adds the
notes the memory shows, ``step`` takes the note off the reply, records the step's reads and
write, and spends a reply that is only a note as a turn (``note_turn``).

The task contract, beyond the fork contract: every episode reports the metrics of
:data:`EPISODE_METRICS` (what the collector and the evaluation read), and a task registers its
environment class under its ``task.name`` with :func:`register_task`, beside its own code.
``envs/conformance.py`` checks both contracts on every registered task
(``tests/test_fork_contract.py``).
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from bidswarm.checks import Problems
from bidswarm.envs.memory import (
    MemoryConfig,
    MemoryTrace,
    SharedMemory,
    memory_problems,
    split_note,
)

MONOLITHIC = None
"""``actor_role`` of a single agent that owns every role's actions (the monolithic baseline)."""
MONOLITHIC_NAME = "monolithic"
"""How prompts, messages, metrics, folders and ``coordination.name`` spell that agent."""


class EpisodeNotRunning(RuntimeError):
    """``step()`` (or ``skip()``) with no episode running: before the first ``reset(seed)`` (or
    ``restore``), or after the episode ended. Raised before anything changes, by every task
    and every wrapper, with the message :meth:`TextEnv.require_running` writes."""


def world_seed(seed: Any) -> int:
    """``seed`` as the ``int`` that names a world: any integer-like (``int``, ``numpy.int64``,
    anything with ``__index__``) that is >= 0. Every task's ``reset`` and every wrapper's reads a
    seed through here, so ``1.5``, ``"3"``, ``True`` or ``-1`` fail the same way everywhere."""
    if isinstance(seed, bool):
        raise TypeError(f"seed={seed!r}: a world seed is an integer >= 0, not a bool")
    try:
        value = operator.index(seed)
    except TypeError:
        raise TypeError(
            f"seed={seed!r}: a world seed is an integer >= 0, not {type(seed).__name__}"
        ) from None
    if value < 0:
        raise ValueError(f"seed={seed!r}: a world seed is an integer >= 0")
    return value


EPISODE_METRICS: dict[str, str] = {
    "success": "1.0 when the episode reached the task's goal, else 0.0 (pass@k of the held-out "
    "evaluation, rollout/evaluation.py)",
    "reward": "the episode's reward so far: the sum of its steps' StepResult.reward",
    "decisions": "decision steps taken so far, skipped steps included (decisions_made)",
}
"""The keys every task's :meth:`TextEnv.episode_metrics` reports, whatever else it adds, with
what each must hold (``envs/conformance.py`` checks them on every registered task)."""


ACTIONS = ("split", "shared")
"""The values of ``task.actions`` (:attr:`TaskConfig.actions`)."""


def role_name(role: str | None) -> str:
    """``role``, or :data:`MONOLITHIC_NAME` for the monolithic agent."""
    return MONOLITHIC_NAME if role is MONOLITHIC else role


@dataclass(frozen=True)
class StepResult:
    """What one decision step returned.

    reward:  environment reward of this step (milestones, progress, ...).
    done:    the episode ended (target reached, or the decision budget is spent).
    valid:   the reply parsed to an action the acting role owns; an invalid reply is a wasted
             turn, never an exception.
    message: feedback shown in the next observation ("'craft stone' is not an instruction ...").
    memory:  the notes the actor read and the note it wrote (None when the memory is off).
    """

    reward: float
    done: bool
    valid: bool = True
    message: str = ""
    memory: MemoryTrace | None = None


@dataclass
class TaskConfig:
    """Fields every task config has; each task extends it with its own dataclass."""

    name: str = "???"
    max_decisions: int = 120
    n_train_seeds: int = 1000
    n_heldout_seeds: int = 32
    heldout_seed_offset: int = 1_000_000
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    actions: str = "split"
    """Who may issue which action (docs/environments.md, "Who acts is a choice"): ``split``
    (the paper's) gives each role its own disjoint set; ``shared`` [ours] lets every role issue
    every action, and the roles differ in a competence or information drawn per world, which
    each task defines."""

    def problems(self) -> list[str]:
        """``task.<key>=<value>: what is allowed`` for each field whose value cannot work, from
        the config alone (no env is built). Each task's config extends it with its own fields
        (``envs/<task>/config.py``); ``config.validate`` asks it before any model loads, and
        :class:`TextEnv` refuses to build on any."""
        problems = Problems()
        problems.at_least("task.max_decisions", self.max_decisions, 1)
        problems.at_least("task.n_train_seeds", self.n_train_seeds, 1)
        problems.at_least("task.n_heldout_seeds", self.n_heldout_seeds, 1)
        problems.one_of("task.actions", self.actions, ACTIONS)
        problems.require(
            self.heldout_seed_offset >= self.n_train_seeds,
            "task.heldout_seed_offset",
            self.heldout_seed_offset,
            f"must be >= task.n_train_seeds ({self.n_train_seeds}): held-out worlds are disjoint",
        )
        return problems + memory_problems(self.memory)


class TextEnv(abc.ABC):
    """A multi-role text environment with restorable state (see the module docstring)."""

    Config: ClassVar[type[TaskConfig]] = TaskConfig
    roles: tuple[str, ...] = ()

    def __init__(self, config: TaskConfig):
        problems = config.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.config = config
        self.memory = SharedMemory(config.memory)
        self.episode_started = False
        """Whether an episode was started (``reset``) or restored; ``step`` refuses before."""

    # -- seeds ---------------------------------------------------------------------------------
    def train_seeds(self) -> list[int]:
        """World seeds used for training; disjoint from :meth:`heldout_seeds`."""
        return list(range(self.config.n_train_seeds))

    def heldout_seeds(self) -> list[int]:
        """World seeds reserved for held-out evaluation."""
        off = self.config.heldout_seed_offset
        return list(range(off, off + self.config.n_heldout_seeds))

    # -- text for prompts ----------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def task_description(self) -> str:
        """One paragraph: the team's goal, shown to every agent."""

    @abc.abstractmethod
    def role_description(self, role: str | None) -> str:
        """What ``role`` can do and the exact reply format of its actions (None: all roles)."""

    @property
    def memory_hint(self) -> str:
        """What a role description adds when the memory is on: how to write a note."""
        if not self.memory.enabled:
            return ""
        return (
            f" You may end a reply with a note for the team (at most "
            f"{self.config.memory.note_words} words): note: <text>."
        )

    def vocabulary_texts(self) -> list[str]:
        """Text a tokenizer trained on the task's demonstrations should also know (default none).

        A task whose observations show words the demonstrations may never contain (e.g. the
        names in a document corpus) returns them here, so a tokenizer built for a model
        trained from scratch gives them pieces of their own.
        """
        return []

    # -- episode -------------------------------------------------------------------------------
    @abc.abstractmethod
    def reset(self, seed: int) -> None:
        """Start a new episode in the world of ``seed``; begins with :meth:`begin_episode`."""

    def begin_episode(self, seed: Any) -> int:
        """What every task's ``reset`` does first: ``seed`` read by :func:`world_seed` (an odd
        seed fails here, before anything changes), and the env marked as playing an episode."""
        seed = world_seed(seed)
        self.episode_started = True
        return seed

    def require_started(self, call: str) -> None:
        """Raise :class:`EpisodeNotRunning` before the first ``reset`` (or ``restore``);
        ``call`` names what was asked, e.g. ``"observation()"``."""
        if not self.episode_started:
            raise EpisodeNotRunning(
                f"{self.config.name}: {call} before reset(); call reset(seed) first"
            )

    def require_running(self, call: str) -> None:
        """:meth:`require_started`, and raise :class:`EpisodeNotRunning` once the episode has
        ended (``call``: e.g. ``"step()"``)."""
        self.require_started(call)
        if self.done:
            made, budget = self.decisions_made, self.config.max_decisions
            raise EpisodeNotRunning(
                f"{self.config.name}: {call} after the episode ended (decision {made} of "
                f"{budget}); call reset(seed) to play another"
            )

    def observation(self, role: str | None) -> str:
        """The local context text of ``role`` (None: the monolithic agent) at this step: its
        screen, then the notes the shared memory shows for it."""
        self.require_started("observation()")
        screen = self.screen(role)
        if not self.memory.enabled:
            return screen
        shown = self.memory.show(self.memory.read(screen))
        return f"{screen}\n{shown}" if shown else screen

    def step(self, actor_role: str | None, action: str) -> StepResult:
        """Carry out ``action`` (raw model reply) by an agent of ``actor_role``.

        With the memory on, a ``note:`` is taken off the reply and written after the action
        (a reply that is only a note is a :meth:`note_turn`); the result's ``memory`` holds the
        notes the actor's observation showed and the note written. Before ``reset`` or after
        the episode ended it raises :class:`EpisodeNotRunning` and changes nothing.
        """
        self.require_running("step()")
        if not self.memory.enabled:
            return self.act(actor_role, action)
        reads = self.memory.read(self.screen(actor_role))
        step_index = self.decisions_made
        action, note = split_note(action)
        if note is not None and not action:
            result = self.note_turn(actor_role)
        else:
            result = self.act(actor_role, action)
        wrote, cut = None, False
        if note is not None:
            wrote, cut = self.memory.write(step_index, role_name(actor_role), note)
        return replace(result, memory=MemoryTrace(reads, wrote, cut))

    @abc.abstractmethod
    def screen(self, role: str | None) -> str:
        """What ``role`` sees of the world now, without the memory's notes."""

    @abc.abstractmethod
    def act(self, actor_role: str | None, action: str) -> StepResult:
        """Carry out ``action`` (the reply without its note) by an agent of ``actor_role``."""

    @abc.abstractmethod
    def note_turn(self, actor_role: str | None) -> StepResult:
        """A reply that was only a note: the world does not advance, the budget does; a valid
        turn (writing is every role's action)."""

    @abc.abstractmethod
    def skip(self) -> StepResult:
        """A step with no actor (every bid was 0): the world does not advance, the budget does;
        :meth:`require_running` first."""

    @property
    @abc.abstractmethod
    def decisions_made(self) -> int:
        """Decision steps taken in this episode, skipped steps included."""

    @property
    @abc.abstractmethod
    def done(self) -> bool:
        """Whether the episode has ended."""

    @abc.abstractmethod
    def episode_metrics(self) -> dict[str, float]:
        """Task metrics of the episode so far, all floats: every key of :data:`EPISODE_METRICS`
        (``success``, ``reward``, ``decisions``) and the task's own (milestones reached, ...)."""

    def open_reward(self) -> float | None:
        """The reward the episode can still earn from this state (the milestones not yet
        reached), known without playing on (``rl.fork_selection=open_reward``); None: the task
        does not say."""
        return None

    def progress(self) -> float | None:
        """How far this state has come toward the task's goal, higher further, comparable
        between states of one world (``rl.fork_tie_break`` compares tied branches' final
        states by it); None: the task has no such score."""
        return None

    # -- fork contract -------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The task's :meth:`fork_state`, marked with the task's name (``config.name``)."""
        return {"task_name": self.config.name, "state": self.fork_state()}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Return to ``snapshot`` (from :meth:`snapshot` of an env of this task); it stays reusable
        (restore twice gives the same future). A snapshot of another task, or anything else, is
        a ValueError naming both, raised before anything changes. A restored env plays an
        episode (``episode_started``), also one never reset."""
        self.check_snapshot(snapshot)
        self.load_fork_state(snapshot["state"])
        self.episode_started = True

    def check_snapshot(self, snapshot: Any) -> None:
        """Raise ValueError, naming both tasks, unless ``snapshot`` is one of this task's."""
        if not (isinstance(snapshot, Mapping) and snapshot.keys() == {"task_name", "state"}):
            raise ValueError(
                f"restore() of a {self.config.name!r} env takes what snapshot() of such an env "
                f"returned, not this {type(snapshot).__name__}"
            )
        if snapshot["task_name"] != self.config.name:
            raise ValueError(
                f"a snapshot of task {snapshot['task_name']!r} cannot restore an env of task "
                f"{self.config.name!r}"
            )

    @abc.abstractmethod
    def fork_state(self) -> Any:
        """Plain data holding everything that decides the future; shares nothing with ``self``."""

    @abc.abstractmethod
    def load_fork_state(self, state: Any) -> None:
        """Return to ``state`` (from :meth:`fork_state`); ``state`` stays reusable."""

    # -- scripted experts ----------------------------------------------------------------------
    @abc.abstractmethod
    def expert_action(self, role: str | None) -> str | None:
        """A sensible reply for ``role`` now, using only its own actions; None: nothing useful."""

    @abc.abstractmethod
    def expert_bid(self, role: str) -> float:
        """The hand-written bidding rule of the scripted experts, a value in [0, 1]."""


TASKS: dict[str, type[TextEnv]] = {}
"""``task.name`` -> environment class, filled by :func:`register_task` as each task's package is
imported (``envs/__init__.py`` imports every sub-package of ``envs``)."""


def register_task(name: str) -> Callable[[type[TextEnv]], type[TextEnv]]:
    """Class decorator: the environment that ``task.name=<name>`` builds. Its ``Config`` (a
    :class:`TaskConfig` subclass whose ``name`` defaults to ``name``) becomes the Hydra schema
    ``task/<name>_schema`` (``config/schemas.py``)."""

    def add(env: type[TextEnv]) -> type[TextEnv]:
        if name in TASKS and TASKS[name] is not env:
            raise ValueError(f"two tasks are registered as {name!r}")
        if env.Config is TaskConfig or not issubclass(env.Config, TaskConfig):
            raise ValueError(f"task {name!r}: {env.__name__}.Config must extend TaskConfig")
        default = env.Config.__dataclass_fields__["name"].default
        if default != name:
            raise ValueError(
                f"task {name!r}: {env.Config.__name__}.name defaults to {default!r}, "
                f"not the name it is registered under"
            )
        TASKS[name] = env
        return env

    return add
