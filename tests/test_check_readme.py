"""``scripts/check_readme.py``: README.md's headline parses, and a moved figure is found."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys

import pytest

from conftest import ROOT


def load_script():
    spec = importlib.util.spec_from_file_location("check_readme", ROOT / "scripts/check_readme.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


check_readme = load_script()


def test_the_readme_states_a_headline_the_check_reads_with_its_commit():
    headline, commit = check_readme.readme_headline((ROOT / "README.md").read_text())
    assert len(commit) >= 7
    assert headline.ci_low <= headline.difference <= headline.ci_high
    # the paired difference is of the same worlds' means: it equals after - before to rounding
    assert headline.difference == pytest.approx(headline.after - headline.before, abs=0.15)


def test_a_run_that_printed_the_readme_matches_and_one_that_moved_does_not():
    headline, _ = check_readme.readme_headline((ROOT / "README.md").read_text())
    log = (
        f"[bidswarm] eval_before: held-out reward {headline.before:.2f} +- "
        f"{headline.before_se:.2f} (95% CI 0.00 .. 1.00) over 32 worlds\n"
        f"[bidswarm] held-out reward after RL: {headline.after:.2f} +- {headline.after_se:.2f}\n"
        f"[bidswarm] after RL - before RL on the same 32 held-out worlds: "
        f"{headline.difference:+.2f} (95% CI {headline.ci_low:+.2f} .. {headline.ci_high:+.2f}): "
        f"{headline.verdict.replace('after SFT', 'before RL')}\n"
    )
    printed = check_readme.printed_headline(log)
    assert check_readme.differences(headline, printed, 0.0) == []
    moved = dataclasses.replace(printed, after=printed.after + 0.3)
    assert [p.split(":")[0] for p in check_readme.differences(headline, moved, 0.0)] == ["after"]
    assert check_readme.differences(headline, moved, 0.5) == []
    with pytest.raises(ValueError, match="paired-difference"):
        check_readme.printed_headline(log.splitlines()[0])
