"""The package's layers read bottom-up and no import closes a circle (read from the source with
``ast``: every import, also the ones inside functions, counts).

Bottom: ``checks`` (the ``key=value: what is allowed`` lines every config check writes); then
``algorithms`` (pure math), ``statistics``, ``plots``; then ``envs`` (a task's PettingZoo view
runs the auction of ``algorithms``); then the coordination rules
(pure decisions: they import no collector, no model, no torch); ``config`` (its schemas and
validation import no torch either); ``agents`` and ``tracking``; ``engines`` (what generates
rollouts with the agents' weights); ``rollout`` (the collector);
``lit`` (the learners); ``run``, ``train``, ``evaluate`` and ``report`` on top. A module may
import its own layer's package or any lower layer. A package is one layer whatever its modules
(``run/``: phases, preflight, resume, build, demonstrations, recording, threads).
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "src" / "bidswarm"
LAYERS = {
    "checks": 0,
    "algorithms": 1,
    "statistics": 1,
    "plots": 1,
    "metric_names": 1,
    "console": 1,
    "envs": 2,
    "coordination": 3,
    "config": 4,
    "agents": 5,
    "tracking": 5,
    "engines": 6,  # rollout engines: generate with the agents' weights
    "rollout": 7,
    "lit": 8,
    "transcripts": 8,
    "run": 9,  # the package: its phases and the checks, builders and records they use
    "train": 10,
    "evaluate": 10,
    "report": 10,
    "sweep": 11,
}
"""The layer of each top-level module or package of ``bidswarm``."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """The ``bidswarm`` modules ``path`` imports, anywhere in it; importing ``a.b.c`` also runs
    the packages ``a.b`` and ``a``, so those count too."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith("bidswarm."):
                parts = name.split(".")
                found |= {".".join(parts[:i]) for i in range(2, len(parts) + 1)}
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imports_of(path) & modules.keys() - {name} for name, path in modules.items()}


def layer_of(module: str) -> str:
    return module.split(".")[1]


def test_every_module_has_a_layer():
    assert {layer_of(m) for m in graph() if m != "bidswarm"} <= LAYERS.keys()


def test_each_layer_imports_only_its_own_package_or_lower_layers():
    wrong = [
        f"{a} -> {b}"
        for a, targets in graph().items()
        if a != "bidswarm"
        for b in targets
        if layer_of(a) != layer_of(b) and LAYERS[layer_of(a)] <= LAYERS[layer_of(b)]
    ]
    assert not wrong, "imports against the layer order:\n" + "\n".join(sorted(wrong))


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (import circles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return circles


def test_no_import_closes_a_circle():
    # A package's own __init__ re-exporting its modules is not a circle of the design.
    edges = {a: {b for b in targets if not a.startswith(f"{b}.")} for a, targets in graph().items()}
    assert strongly_connected(edges) == []


def third_party(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_coordination_rules_are_pure_decisions_and_algorithms_pure_math():
    for path in (PACKAGE / "coordination").glob("*.py"):
        assert not third_party(path) & {"torch", "transformers", "lightning"}, path.name
    for path in (PACKAGE / "algorithms").rglob("*.py"):
        assert not third_party(path) & {"transformers", "lightning", "hydra"}, path.name


def test_config_schemas_and_validation_import_no_torch():
    # Only the machine check (config/machine.py) asks torch itself.
    for path in (PACKAGE / "config").glob("*.py"):
        assert "torch" not in third_party(path) or path.name == "machine.py", path.name


def test_the_learner_never_reaches_into_the_collector():
    tree = ast.parse((PACKAGE / "lit" / "swarm_module.py").read_text())
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert not attributes & {"loop", "swarm", "coordination", "count_trained", "run"}


def test_only_the_environment_wrappers_import_pettingzoo_and_gymnasium():
    # The optional `envs` extra: nothing else may need it (tests/test_envs_wrappers.py also
    # imports the package and checks that neither library was loaded).
    wrappers = {"interop.py", "pettingzoo.py", "gymnasium.py"}
    importers = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if third_party(path) & {"pettingzoo", "gymnasium"}
    }
    assert importers == {f"envs/{name}" for name in wrappers}
