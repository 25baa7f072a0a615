"""The bid channel's table from training run folders (their ``state.json``), for runs spread
over several MLflow stores (worktrees at different commits): per run, the held-out reward and
the market after SFT and after RL; per arm, the gap between ``expert_owner`` and the arm's own
rule after RL over its (seed, world) cells; each arm minus the reference arm after RL; and per
run and role, who acts and whether the role's own bids see which steps are its.

    python scripts/market_table.py --arm paper=/wt/a/outputs/choice/paper_seed* \\
        --arm anchored=/wt/b/outputs/choice/anchored_seed* --reference paper

Intervals: 95%, two-way random effects over training seeds x held-out worlds where an arm has
several seeds (``bidswarm.statistics.paired_difference``), over worlds for one run. An arm's
who-should-act regret after RL is the mean of its runs' regrets with a t interval over the
runs (a run keeps its regret's mean, not its states), "–" where a run has none.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bidswarm import metric_names as names
from bidswarm.statistics import paired_difference, summarize

AGREE = names.EXPERT_OWNER_AGREEMENT
PARTICIPATION = "participation"  # participation/<role>: the role's share of the acting steps
SUCCESS = "task/success"  # the share of episodes that met the task's goal (tasks that have one)


def load(folder: Path) -> tuple[int, dict]:
    state = json.loads((folder / "state.json").read_text())
    config = (folder / "resolved_config.yaml").read_text()
    seed = next(int(line.split(":")[1]) for line in config.splitlines() if line.startswith("seed:"))
    return seed, state


def cells(runs: list[tuple[int, dict]], key: str) -> dict[tuple[int, int], float]:
    return {(seed, int(w)): r for seed, state in runs for w, r in state[key].items()}


def interval(d, digits: int) -> str:
    return f"{d.mean:+.{digits}f} ({d.ci_low:+.{digits}f} .. {d.ci_high:+.{digits}f})"


def agreement(before: dict, after: dict) -> str:
    """The actor = expert's choice cell ("–" for a run with no choice of actor: monolithic)."""
    if AGREE not in after:
        return "–"
    return (
        f"{100 * before.get(AGREE, 0):.0f}% → {100 * after[AGREE]:.0f}% "
        f"({100 * after.get(f'{AGREE}/on_path', 0):.0f}% / "
        f"{100 * after.get(f'{AGREE}/off_path', 0):.0f}%)"
    )


def run_row(arm: str, seed: int, state: dict, digits: int) -> str:
    before, after = state["eval_before"], state["eval_after"]
    mass = [v for k, v in after.items() if k.startswith(f"{names.VALID_LEVEL_MASS}/")]
    gap = expert_owner_gap([(seed, state)], "eval_after", digits)
    regret = after.get(f"{names.REGRET}/mean")
    return (
        f"| {arm} | {seed} | {before['reward/mean']:.{digits}f} → "
        f"{after['reward/mean']:.{digits}f} | {agreement(before, after)} "
        f"| {f'{min(mass):.2f}' if mass else '–'} | {gap} "
        f"| {'–' if regret is None else f'{regret:.{digits}f}'} |"
    )


def role_rows(arm: str, seed: int, state: dict) -> list[str]:
    """Per role of the run (SFT → RL, held-out): its share of the acting steps, its recall and
    precision of the expert's owner, and its bids' owner AUC ("–" where not measured)."""
    before, after = state["eval_before"], state["eval_after"]
    prefix = f"{PARTICIPATION}/"
    roles = sorted(k[len(prefix) :] for k in after if k.startswith(prefix) and k.count("/") == 1)

    def pair(key: str, role: str, percent: bool) -> str:
        shown = [
            "–"
            if f"{key}/{role}" not in m
            else (f"{100 * m[f'{key}/{role}']:.0f}%" if percent else f"{m[f'{key}/{role}']:.2f}")
            for m in (before, after)
        ]
        return " → ".join(shown)

    return [
        f"| {arm} | {seed} | {role} | {pair(PARTICIPATION, role, True)} "
        f"| {pair(names.EXPERT_OWNER_RECALL, role, True)} "
        f"| {pair(names.EXPERT_OWNER_PRECISION, role, True)} "
        f"| {pair(names.OWNER_AUC, role, False)} |"
        for role in roles
    ]


def expert_owner_gap(runs: list[tuple[int, dict]], evaluation: str, digits: int) -> str:
    """``expert_owner`` − the run's own rule at ``evaluation``, paired over seeds x worlds ("–"
    for runs with no rule to swap: the monolithic agent's)."""
    key = f"{evaluation}_expert_owner_worlds"
    if any(key not in state for _, state in runs):
        return "–"
    differences = paired_difference(cells(runs, key), cells(runs, f"{evaluation}_worlds"))
    return interval(differences, digits)


def versus_reference(
    runs: list[tuple[int, dict]], reference: list[tuple[int, dict]], evaluation: str, digits: int
) -> str:
    """The arm − the reference arm at ``evaluation`` over the seeds both ran, paired per
    (seed, world)."""
    shared = {s for s, _ in runs} & {s for s, _ in reference}
    key = f"{evaluation}_worlds"
    mine = {k: v for k, v in cells(runs, key).items() if k[0] in shared}
    difference = paired_difference(mine, cells(reference, key))
    return f"{interval(difference, digits)} ({len(shared)} seeds)"


def success(runs: list[tuple[int, dict]]) -> str:
    """Each run's share of held-out episodes that met the task's goal, after SFT → after RL."""

    def shares(evaluation: str) -> str:
        found = [state[evaluation].get(SUCCESS) for _, state in runs]
        return ", ".join("–" if share is None else f"{100 * share:.0f}%" for share in found)

    return f"{shares('eval_before')} → {shares('eval_after')}"


def regret_over_runs(runs: list[tuple[int, dict]], digits: int) -> str:
    """The mean of the runs' who-should-act regrets after RL and its t interval over the runs."""
    regrets = [state["eval_after"].get(f"{names.REGRET}/mean") for _, state in runs]
    if not regrets or None in regrets:
        return "–"
    r = summarize(regrets)
    return f"{r.mean:.{digits}f} ({r.ci_low:.{digits}f} .. {r.ci_high:.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", action="append", nargs="+", required=True, metavar="NAME=DIR")
    parser.add_argument("--reference", help="the arm the others are compared with after RL")
    parser.add_argument(
        "--digits", type=int, default=1, help="decimals of rewards (research, up to 1.0: 2)"
    )
    args = parser.parse_args()
    digits = args.digits
    arms: dict[str, list[tuple[int, dict]]] = {}
    folders: dict[str, list[Path]] = {}
    for spec in args.arm:
        # NAME=DIR DIR ... (a shell's glob), or NAME=DIR NAME=DIR ... (its brace expansion)
        name = spec[0].split("=", 1)[0]
        for item in spec:
            head, _, tail = item.partition("=")
            if tail and "/" not in head:
                name, item = head, tail
            folders.setdefault(name, []).append(Path(item))
    for name, paths in folders.items():
        missing = [str(p) for p in paths if not (p / "state.json").is_file()]
        if missing:
            parser.error(f"--arm {name}: no state.json in {', '.join(missing)}")
        runs = [load(p) for p in paths]
        finished = ["eval_after" in state for _, state in runs]
        unfinished = [str(p) for p, done in zip(paths, finished, strict=True) if not done]
        if unfinished:  # a run still training, or stopped: its row would be a guess
            parser.error(f"--arm {name}: no evaluation after RL in {', '.join(unfinished)}")
        arms[name] = sorted(runs)
    print(
        "| arm | seed | held-out reward SFT → RL | actor = expert's choice SFT → RL "
        "(on / off its path) | lowest valid bid mass after RL | expert_owner − own after RL "
        "(95% CI) | regret after RL |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, runs in arms.items():
        for seed, state in runs:
            print(run_row(name, seed, state, digits))
    print()
    print(
        "| arm | seeds | expert_owner − own after SFT | after RL | arm − reference after SFT "
        "| after RL | success SFT → RL (per seed) | regret after RL (over runs) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    reference = arms.get(args.reference, [])
    for name, runs in arms.items():
        before = expert_owner_gap(runs, "eval_before", digits)
        after = expert_owner_gap(runs, "eval_after", digits)
        versus = {key: "–" for key in ("eval_before", "eval_after")}
        if reference and name != args.reference:
            for key in versus:
                versus[key] = versus_reference(runs, reference, key, digits)
        regret = regret_over_runs(runs, digits)
        print(
            f"| {name} | {len(runs)} | {before} | {after} | {versus['eval_before']} "
            f"| {versus['eval_after']} | {success(runs)} | {regret} |"
        )
    rows = [row for name, runs in arms.items() for s, st in runs for row in role_rows(name, s, st)]
    if rows:
        print()
        print(
            "| arm | seed | role | acts SFT → RL | recall of its steps | precision of its wins "
            "| its bids' owner AUC |"
        )
        print("|---|---|---|---|---|---|---|")
        print("\n".join(rows))


if __name__ == "__main__":
    main()
