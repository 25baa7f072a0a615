"""Does `make train` still print what README.md says it prints?

Runs the main job (``python -m bidswarm.train``, the embedded default, seed 0; logged to CSV in
a temporary folder so that nothing lands in the user's MLflow store), reads its final figures
(held-out reward after SFT and after RL with their SE, the paired difference after RL − after
SFT with its 95% CI and verdict) and compares them, at the README's precision, with the
headline under "What `make train` does". Exits 1 and prints both where they differ, so a
change that moves the main job's result is found on purpose, not by a new user.

    .venv/bin/python scripts/check_readme.py                 # re-run the main job (~10 min)
    .venv/bin/python scripts/check_readme.py --log train.log # compare a log already written

The README's figures were measured on one 2-core CPU; another CPU's float rounding can change
sampled episodes, so a difference here on other hardware is a reason to look, not a failure
of the code (``--tolerance`` allows one in reward points).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"[+−-]?\d+(?:\.\d+)?"
ROUNDING = 0.05
"""Half the README's last decimal: a printed 6.85 is the README's 6.8 or 6.9."""


@dataclass(frozen=True)
class Headline:
    """The main job's result as the README states it and as a run prints it."""

    before: float
    before_se: float
    after: float
    after_se: float
    difference: float
    ci_low: float
    ci_high: float
    verdict: str


def number(text: str) -> float:
    return float(text.replace("−", "-"))


def readme_headline(readme: str) -> tuple[Headline, str]:
    """The headline of README.md's "What `make train` does" and the commit it names."""
    pattern = (
        rf"at `(?P<commit>[0-9a-f]{{7,40}})` \(seed 0, the default\): held-out reward\s+"
        rf"\*\*(?P<before>{NUMBER}) ± (?P<before_se>{NUMBER}) after SFT → "
        rf"(?P<after>{NUMBER}) ± (?P<after_se>{NUMBER}) after RL, paired difference\s+"
        rf"(?P<difference>{NUMBER}) \(95% CI (?P<ci_low>{NUMBER}) \.\. (?P<ci_high>{NUMBER})\):"
        r"\s+(?P<verdict>[^*]+?)\*\*"
    )
    found = re.search(pattern, readme)
    if found is None:
        raise ValueError(
            "README.md: no headline of the form 'at `<commit>` (seed 0, the default): held-out "
            "reward **A ± a after SFT → B ± b after RL, paired difference +D (95% CI +L .. +H): "
            "<verdict>**'"
        )
    values = {k: number(v) for k, v in found.groupdict().items() if k not in ("commit", "verdict")}
    return Headline(**values, verdict=" ".join(found["verdict"].split())), found["commit"]


def printed_headline(log: str) -> Headline:
    """The same figures from the lines the main job prints at its end."""
    before = re.search(rf"eval_before: held-out reward ({NUMBER}) \+- ({NUMBER})", log)
    after = re.search(rf"held-out reward after RL: ({NUMBER}) \+- ({NUMBER})", log)
    paired = re.search(
        rf"after RL - before RL on the same \d+ held-out worlds: ({NUMBER}) "
        rf"\(95% CI ({NUMBER}) \.\. ({NUMBER})\): (.+)",
        log,
    )
    if before is None or after is None or paired is None:
        raise ValueError("the run's output has no eval_before / after RL / paired-difference line")
    return Headline(
        before=number(before[1]),
        before_se=number(before[2]),
        after=number(after[1]),
        after_se=number(after[2]),
        difference=number(paired[1]),
        ci_low=number(paired[2]),
        ci_high=number(paired[3]),
        verdict=paired[4].strip(),
    )


def differences(readme: Headline, printed: Headline, tolerance: float) -> list[str]:
    """Where the printed figures (two decimals) and the README's (one) differ by more than
    the README's rounding and ``tolerance``."""
    out = []
    for key, stated in asdict(readme).items():
        measured = asdict(printed)[key]
        if key == "verdict":
            # the run says "after RL > before RL"; the README says "after SFT" for "before RL"
            if measured.replace("before RL", "after SFT") != stated:
                out.append(f"verdict: README {stated!r}, run {measured!r}")
        elif abs(measured - stated) > tolerance + ROUNDING + 1e-9:
            out.append(f"{key}: README {stated:g}, run {measured:.2f}")
    return out


def run_main_job(extra: list[str]) -> str:
    """The main job as `make train` runs it (its log on the console as it goes)."""
    with tempfile.TemporaryDirectory(prefix="check_readme_") as folder:
        command = [
            sys.executable,
            "-m",
            "bidswarm.train",
            "logger=csv",
            f"hydra.run.dir={folder}/run",
            *extra,
        ]
        print("$ " + " ".join(command), flush=True)
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        lines = []
        for line in process.stdout:
            print(line, end="", flush=True)
            lines.append(line)
        if process.wait() != 0:
            raise SystemExit(f"the main job failed (exit {process.returncode})")
        return "".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", type=Path, help="a main-job log to compare instead of a run")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument(
        "--tolerance", type=float, default=0.0, help="allowed difference, reward points"
    )
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for the run")
    args = parser.parse_args(argv)
    stated, commit = readme_headline(args.readme.read_text())
    log = args.log.read_text() if args.log else run_main_job(args.overrides)
    printed = printed_headline(log)
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    print(f"README (measured at {commit}): {stated}")
    source = f"the log {args.log}" if args.log else f"this run (at {head or 'unknown'})"
    print(f"{source}: {printed}")
    problems = differences(stated, printed, args.tolerance)
    if problems:
        print("README.md's headline does not match the main job:\n  " + "\n  ".join(problems))
        return 1
    print("README.md's headline matches the main job.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
