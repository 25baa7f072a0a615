"""Where a report's runs came from: the commands that make them all again (one per sweep
shape) and the commits their code was at (the tags every training and evaluation run
records, ``bidswarm.tracking.OVERRIDES_TAG`` and ``COMMIT_TAG``)."""

from __future__ import annotations

import os
import shlex

from mlflow.entities import Run

from bidswarm import tracking
from bidswarm.report.reading import KIND_TAG

FOLDER_KEYS = ("run_dir",)
"""Overrides whose values are one machine's folders: a command shows how many, not which."""


def _quoted(value: str) -> str:
    return f"'{value}'" if any(c in value for c in ",= ") else value


def recorded_overrides(runs: list[Run]) -> dict[str, list[str]]:
    """Override key -> its values in the order the runs first used them (runs that recorded
    their overrides)."""
    values: dict[str, list[str]] = {}
    for run in _recorded(runs):
        for key, value in _overrides(run):
            known = values.setdefault(key, [])
            if value not in known:
                known.append(value)
    return values


def sweep_commands(runs: list[Run]) -> list[str]:
    """``python -m bidswarm.train -m k=v1,v2 ...``, one per sweep shape: runs started with the
    same override keys (in any order) share a command, each key once with its values in the
    order the runs first used them, so that one sweep remakes those runs (seeds and arms that
    ran as separate sweeps of the same keys included); arms that set other keys
    (``rl.fork_tie_break=...`` in one sweep, ``rl.fork_selection=...`` in another) get a
    command each, in the order the runs first used them. Evaluation runs give ``python -m
    bidswarm.evaluate -m``; several folders (``run_dir``) are counted here and listed by
    :func:`folder_lists`. Empty when no run recorded its overrides."""
    shapes: dict[frozenset[str], list[Run]] = {}
    for run in _recorded(runs):
        shapes.setdefault(frozenset(key for key, _ in _overrides(run)), []).append(run)
    return [_command(group) for group in shapes.values()]


def _command(runs: list[Run]) -> str:
    parts = []
    for key, known in recorded_overrides(runs).items():
        if key in FOLDER_KEYS and len(known) > 1:
            parts.append(f"{key}={tracking.folders_label(known)}")
        else:
            parts.append(f"{key}=" + ",".join(_quoted(v) for v in known))
    kinds = {r.data.tags.get(KIND_TAG) for r in runs}
    entry = "bidswarm.evaluate" if kinds == {"evaluate"} else "bidswarm.train"
    return " ".join(["python -m", entry, "-m", *parts])


def _recorded(runs: list[Run]) -> list[Run]:
    """The runs that recorded their overrides, in the order they started."""
    recorded = [r for r in runs if tracking.OVERRIDES_TAG in r.data.tags]
    return sorted(recorded, key=lambda r: r.info.start_time or 0)


def _overrides(run: Run) -> list[tuple[str, str]]:
    """``(key, value)`` of each override ``run`` recorded, in its order."""
    return [
        (key, value)
        for key, _, value in (
            p.partition("=") for p in _split(run.data.tags[tracking.OVERRIDES_TAG])
        )
    ]


def folder_lists(runs: list[Run]) -> list[str]:
    """Per folder override that :func:`sweep_commands` counted, a line naming its folders
    (under their common parent), so the command can be remade exactly."""
    lines = []
    for key, known in recorded_overrides(runs).items():
        if key in FOLDER_KEYS and len(known) > 1:
            label = tracking.folders_label(known)
            try:
                parent = os.path.commonpath(known)
                names = [os.path.relpath(folder, parent) for folder in known]
            except ValueError:
                names = known
            listed = ", ".join(f"`{name}`" for name in names)
            lines.append(f"`{key}={label}`, quoted and comma-separated: {listed}.")
    return lines


def _split(overrides: str) -> list[str]:
    """Hydra's overrides as the runs recorded them, space-separated, quotes removed (a quoted
    value may hold spaces, ``=`` and ``,``)."""
    try:
        parts = shlex.split(overrides)
    except ValueError:  # an unbalanced quote: split on spaces
        parts = overrides.split()
    return [p for p in parts if "=" in p]


def commits(runs: list[Run]) -> list[str]:
    """The short commits the runs' code was at, in first-use order (``-dirty``: with
    uncommitted changes)."""
    seen: list[str] = []
    for run in sorted(runs, key=lambda r: r.info.start_time or 0):
        commit = run.data.tags.get(tracking.COMMIT_TAG)
        if commit:
            sha = commit.removesuffix("-dirty")
            short = sha[:7] + commit[len(sha) :]  # keeps "-dirty"
            if short not in seen:
                seen.append(short)
    return seen


def provenance(runs: list[Run]) -> str:
    """The report's first lines: the command, and the commit(s) it ran at."""
    commands = sweep_commands(runs)
    found = commits(runs)
    at = (
        "at " + ", ".join(f"`{c}`" for c in found)
        if found
        else "at a commit the runs did not record"
    )
    if not commands:
        return f"Runs {at}; their command line was not recorded."
    unrecorded = sum(tracking.OVERRIDES_TAG not in r.data.tags for r in runs)
    tail = f" ({unrecorded} of {len(runs)} runs recorded no command)" if unrecorded else ""
    folders = "".join(f"\n\n{line}" for line in folder_lists(runs))
    lines = "\n".join(commands)
    return f"Reproduce {at}{tail}:\n\n```bash\n{lines}\n```{folders}"
