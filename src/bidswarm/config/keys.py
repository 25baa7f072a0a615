"""The keys the config schemas define, and the key a misspelled one most likely meant: a
command-line override of a key no schema has (``rl.cycels=2``) is refused before Hydra composes,
with ``did you mean rl.cycles?`` (:func:`misspelled_keys`, ``config.refuse_misspelled_keys``);
``config.validate`` says the same of a key added with ``+``.

A group whose schema depends on the chosen option (``task``, ``coordination``, ``credit``) knows
the keys of every registered option's schema: a key none of them has is unknown whichever is
chosen.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any

from bidswarm.algorithms.credit import CREDIT_RULES, CreditConfig
from bidswarm.coordination import RULES, CoordinationConfig
from bidswarm.envs import TASKS, TaskConfig


def _variants(schema: type) -> list[type]:
    """``schema`` and, for a group schema, the schema of every registered option."""
    registered = {
        TaskConfig: [env.Config for env in TASKS.values()],
        CoordinationConfig: [rule.Config for rule in RULES.values()],
        CreditConfig: [rule.Config for rule in CREDIT_RULES.values()],
    }
    return [schema, *registered.get(schema, [])]


def _dataclass_of(hint: Any) -> type | None:
    """The dataclass a field's type hint names (``X``, ``X | None``), else None."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        found = [arg for arg in typing.get_args(hint) if dataclasses.is_dataclass(arg)]
        return found[0] if len(found) == 1 else None
    return None


def _fields(schema: type) -> dict[str, type | None]:
    """Key -> the dataclass below it (None: a leaf, or a value whose keys no schema fixes),
    over every variant of ``schema``."""
    fields: dict[str, type | None] = {}
    for variant in _variants(schema):
        hints = typing.get_type_hints(variant)
        for field in dataclasses.fields(variant):
            fields.setdefault(field.name, _dataclass_of(hints[field.name]))
    return fields


def close_key(key: str, root: type) -> str | None:
    """The key of ``root``'s schema that the dotted ``key`` most likely meant, when ``key`` is
    not one of its keys and one is close (``rl.cycels`` -> ``rl.cycles``); None when ``key`` is
    known, when no key is close, or below a value whose keys no schema fixes."""
    schema, path = root, []
    for part in key.split("."):
        fields = _fields(schema)
        if part not in fields:
            close = difflib.get_close_matches(part, fields, n=1)
            return ".".join([*path, close[0]]) if close else None
        below = fields[part]
        if below is None:
            return None
        schema, path = below, [*path, part]
    return None


def misspelled_keys(arguments: list[str], root: type, groups: tuple[str, ...]) -> list[str]:
    """``<key>: ... did you mean <known key>?`` for each ``key=value`` override of
    ``arguments`` whose key ``root``'s schema lacks while a known key is close to it: Hydra
    refuses it too, but names no key it could have meant. Additions (``+key=``), deletions,
    Hydra's own keys and choices of ``groups`` are left to Hydra (and ``validate``); so is an
    unknown key with no close one."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = [a for a in arguments if not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # Hydra reports malformed overrides itself
        return []
    found = []
    for override in parsed:
        key = override.key_or_group
        if override.is_add() or override.is_force_add() or override.is_delete():
            continue
        if override.package is not None or override.is_hydra_override() or "/" in key:
            continue
        meant = None if key in groups else close_key(key, root)
        if meant is not None:
            found.append(f"{key}: no such key in the config; did you mean {meant}?")
    return found
