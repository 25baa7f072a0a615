"""Where a report's runs came from: the one command that makes them all again and the commits
their code was at (the tags every training and evaluation run records,
``bidswarm.tracking.OVERRIDES_TAG`` and ``COMMIT_TAG``)."""

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
    recorded = [r for r in runs if tracking.OVERRIDES_TAG in r.data.tags]
    for run in sorted(recorded, key=lambda r: r.info.start_time or 0):
        for part in _split(run.data.tags[tracking.OVERRIDES_TAG]):
            key, _, value = part.partition("=")
            known = values.setdefault(key, [])
            if value not in known:
                known.append(value)
    return values


def sweep_command(runs: list[Run]) -> str | None:
    """``python -m bidswarm.train -m k=v1,v2 ...``: every override the runs were started with,
    each key once with its values in the order the runs first used them, so that one sweep
    remakes every run (seeds and arms that ran as separate sweeps included). Evaluation runs
    give ``python -m bidswarm.evaluate -m``; several folders (``run_dir``) are counted here
    and listed by :func:`folder_lists`. None when no run recorded its overrides."""
    values = recorded_overrides(runs)
    if not values:
        return None
    parts = []
    for key, known in values.items():
        if key in FOLDER_KEYS and len(known) > 1:
            parts.append(f"{key}={tracking.folders_label(known)}")
        else:
            parts.append(f"{key}=" + ",".join(_quoted(v) for v in known))
    recorded = [r for r in runs if tracking.OVERRIDES_TAG in r.data.tags]
    kinds = {r.data.tags.get(KIND_TAG) for r in recorded}
    entry = "bidswarm.evaluate" if kinds == {"evaluate"} else "bidswarm.train"
    return " ".join(["python -m", entry, "-m", *parts])


def folder_lists(runs: list[Run]) -> list[str]:
    """Per folder override that :func:`sweep_command` counted, a line naming its folders
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
    command = sweep_command(runs)
    found = commits(runs)
    at = (
        "at " + ", ".join(f"`{c}`" for c in found)
        if found
        else "at a commit the runs did not record"
    )
    if command is None:
        return f"Runs {at}; their command line was not recorded."
    unrecorded = sum(tracking.OVERRIDES_TAG not in r.data.tags for r in runs)
    tail = f" ({unrecorded} of {len(runs)} runs recorded no command)" if unrecorded else ""
    folders = "".join(f"\n\n{line}" for line in folder_lists(runs))
    return f"Reproduce {at}{tail}:\n\n```bash\n{command}\n```{folders}"
