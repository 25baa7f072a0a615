"""Compare strategies from MLflow: a markdown table and plots of a sweep or an experiment.

    python scripts/report.py --experiment tables --out outputs/reports/tables \
        --results docs/results.md
    python scripts/report.py --parent <sweep parent run id> --out outputs/reports/sweep
    python scripts/report.py --experiment fork_labels_iron iron_reward_to_go --out outputs/reports/x
    MLFLOW_TRACKING_URI=sqlite:////tmp/x.db python -m bidswarm.report --experiment bidswarm

Writes ``report.md`` and the figures that have data (:data:`bidswarm.report.figures.FIGURES`)
into ``--out`` and prints the tables; a report of an experiment is also logged to MLflow as a
run of its own (:func:`log_report`), and ``--results`` splices it into a markdown file such as
``docs/results.md`` (:func:`update_results`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from mlflow.tracking import MlflowClient

from bidswarm import tracking
from bidswarm.report.figures import (
    FIGURES,
    plot_outcomes,
    plot_participation_at,
    plot_participation_per_strategy,
    plot_reward_vs_flops_per_strategy,
    plot_winning_bids,
)
from bidswarm.report.market import decision_table, market_run_table, owner_gap_table
from bidswarm.report.provenance import provenance
from bidswarm.report.reading import (
    DEFAULT_STRATEGY,
    KIND_TAG,
    REPORT_KIND,
    find_runs,
    group_by_strategy,
    read_run,
)
from bidswarm.report.strategies import paired_differences, reference_strategy, strategy_rows
from bidswarm.report.tables import (
    budget_table,
    catch_up_table,
    difference_table,
    evaluation_behaviour_table,
    markdown_table,
    milestone_table,
    outcome_table,
    participation_at_table,
    participation_table,
    rl_gain_table,
    run_table,
    success_gain_table,
    verdict,
    winning_bid_table,
)


def write_report(
    client: MlflowClient,
    parent: str | None,
    experiments: Sequence[str],
    out: Path,
    reference: str | None = None,
    pair_by: Sequence[str] = (),
) -> str:
    """Tables (strategies; paired differences to ``reference``, paired by ``pair_by``'s keys
    when given: ``paired_with``) + verdict + plots of the sweep ``parent``, or of the runs of
    ``experiments``, into ``out``; returns the markdown."""
    runs = find_runs(client, parent, experiments)
    if not runs:
        raise SystemExit("no runs found (is the tracking URI right?)")
    groups = group_by_strategy([read_run(client, run) for run in runs])
    rows = strategy_rows(groups)
    out.mkdir(parents=True, exist_ok=True)
    named = ", ".join(f"`{experiment}`" for experiment in experiments)
    source = (
        f"sweep parent run `{parent}`"
        if parent
        else f"experiment{'s' * (len(experiments) > 1)} {named}"
    )
    sections = [
        f"# Strategy comparison ({source})",
        provenance(runs),
        markdown_table(rows),
        verdict(rows),
    ]
    if len(rows) > 1:
        reference = reference_strategy(rows, reference, pair_by)
        differences = paired_differences(rows, reference, pair_by)
        sections.append(difference_table(differences, reference, pair_by))
        if efficiency := catch_up_table(groups, reference):
            sections.append(efficiency)
    tables = (
        budget_table(groups),
        rl_gain_table(groups),
        run_table(groups),
        owner_gap_table(groups),
        market_run_table(groups),
        decision_table(groups),
        success_gain_table(groups),
        participation_table(groups),
        participation_at_table(groups),
        milestone_table(groups),
        winning_bid_table(groups),
        outcome_table(groups, reference, pair_by),
        evaluation_behaviour_table(groups),
    )
    sections += [table for table in tables if table]
    for name in FIGURES:  # figures of an earlier report into ``out`` must not linger
        (out / name).unlink(missing_ok=True)
    drawn = [
        plot_outcomes(rows, groups, out / "outcomes.png"),
        plot_participation_at(groups, out / "participation_at.png"),
        plot_reward_vs_flops_per_strategy(groups, out / "reward_vs_flops.png"),
        plot_participation_per_strategy(groups, out / "participation.png"),
        plot_winning_bids(groups, out / "winning_bids.png"),
    ]
    sections += [f"![{FIGURES[path.name]}]({path.name})" for path in drawn if path is not None]
    text = "\n\n".join(sections)
    (out / "report.md").write_text(text + "\n")
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--parent", help="run id of a sweep's parent run")
    which.add_argument(
        "--experiment",
        nargs="+",
        help="MLflow experiment name; several (one store): their runs compared and paired as one",
    )
    parser.add_argument("--out", type=Path, default=Path("outputs/reports/latest"))
    parser.add_argument(
        "--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI, else the project store"
    )
    parser.add_argument(
        "--reference",
        default=None,
        help=f"strategy the others are paired against (default: {DEFAULT_STRATEGY!r} when "
        "present, else the best), or one setting of strategies named by several "
        "(ablation=initial_bids): each strategy is then paired with the one that differs from "
        "it only in that setting",
    )
    parser.add_argument(
        "--pair-by",
        nargs="+",
        default=(),
        metavar="KEY",
        help="with a setting as --reference: pair each strategy with the one that has that "
        "setting and the same value of these keys, whatever their other settings (--reference "
        "ablation=monolithic --pair-by dropout: every arm against the monolithic agent at the "
        "same dropout)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="also put the report into this markdown file (e.g. docs/results.md), replacing "
        "its section for this experiment or sweep; figures are copied beside it",
    )
    args = parser.parse_args(argv)
    # MLflow draws a progress bar for every artifact it downloads: two per run read here.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    client = MlflowClient(tracking.tracking_uri(args.tracking_uri))
    experiments = args.experiment or []
    text = write_report(client, args.parent, experiments, args.out, args.reference, args.pair_by)
    print(text)
    print(f"\n[bidswarm] report written to {args.out}/report.md")
    if experiments:
        run_id = log_report(client, experiments[0], args.out)
        print(f"[bidswarm] report and figures logged to MLflow run {run_id} of {experiments[0]!r}")
    if args.results is not None:
        name = "+".join(experiments) or f"sweep-{args.parent}"
        update_results(args.results, name, text, args.out, " ".join(sys.argv))
        print(f"[bidswarm] section {name!r} of {args.results} updated")


def update_results(results: Path, name: str, text: str, figures: Path, command: str) -> None:
    """Replace (or append) the section of ``name`` in ``results``: the report's markdown, its
    figures copied to ``results``'s folder as ``<name>_<figure>.png``, the command, the date."""
    results.parent.mkdir(parents=True, exist_ok=True)
    for figure in figures.glob("*.png"):
        target = results.parent / "results" / f"{name}_{figure.name}"
        target.parent.mkdir(exist_ok=True)
        shutil.copyfile(figure, target)
        text = text.replace(f"]({figure.name})", f"](results/{target.name})")
    text = text.replace("# Strategy comparison", "## Strategy comparison", 1)
    begin, end = f"<!-- report:{name} -->", f"<!-- /report:{name} -->"
    section = f"{begin}\n{text}\n\nMade {time.strftime('%Y-%m-%d')} by `{command}`.\n{end}"
    current = results.read_text() if results.exists() else ""
    if begin in current and end in current:
        head, rest = current.split(begin, 1)
        current = head + section + rest.split(end, 1)[1]
    else:
        current = current.rstrip() + ("\n\n" if current else "") + section + "\n"
    results.write_text(current)


def log_report(client: MlflowClient, experiment: str, out: Path) -> str:
    """The report's markdown and PNG figures as the artifacts of a run of ``experiment``
    (tagged as a report, so the next report leaves it out)."""
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    run = client.create_run(
        experiment_id,
        run_name=f"report {time.strftime('%Y-%m-%d %H:%M')}",
        tags={KIND_TAG: REPORT_KIND},
    )
    for path in [*sorted(out.glob("*.png")), out / "report.md"]:
        client.log_artifact(run.info.run_id, str(path), "report")
    client.set_terminated(run.info.run_id)
    return run.info.run_id
