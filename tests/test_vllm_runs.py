"""Training runs with ``model.engine=vllm`` (the real CLI, a tiny model vLLM's CPU attention
computes): a run ends with its engine gone and logs how far the engine's log-probs are from
the learner's; a fixed seed gives the same run again, and one SIGKILLed in the middle of an
update resumes to the same numbers; SIGTERM stops it at the update boundary and leaves no
engine process behind. Tier ``vllm`` (``make test-vllm``, CI)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from bidswarm import metric_names as names
from bidswarm.lit.callbacks import LAST
from test_reliability import (
    DRIVER,
    cli_env,
    finish,
    run_cli,
    saved_updates,
    start_cli,
    trace,
    wait_for,
)

pytestmark = pytest.mark.vllm

VLLM = ("model.engine=vllm", "model.tiny.num_heads=2")  # head size 32: vLLM's CPU attention
COMMON = ("debug=smoke", "rl.cycles=2", "eval.before_rl=false", "logger=csv", *VLLM)


def engine_processes() -> list[int]:
    """Pids of the vLLM engine processes on this machine (``engines/vllm_server.py``)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command = status.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(b"vllm_server.py") for part in command):
            found.append(int(status.parent.name))
    return found


def gone(pids: list[int], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}").exists() for pid in pids):
            return True
        time.sleep(0.2)
    return False


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[dict, list[dict]]:
    root = tmp_path_factory.mktemp("vllm_run")
    assert engine_processes() == []
    run_cli(root / "run", *COMMON, env=cli_env(root))
    history = torch.load(root / "run" / "checkpoints" / LAST, weights_only=False)
    return trace(root / "run"), history["bidswarm"]["history"]


def test_a_run_logs_the_engines_logprob_gap_and_leaves_no_engine(uninterrupted):
    _, history = uninterrupted
    assert len(history) == 4
    # An action update trains on engine-sampled action replies; a bid update on the sampled bid
    # of each preference pair, when its forks gave any (all tie where no branch earns reward).
    trained = [u for u in history if "forks/pairs" not in u or u["forks/pairs"] > 0]
    assert trained and all(names.ENGINE_LOGPROB_GAP_MEAN in u for u in trained), history
    gaps = [update[names.ENGINE_LOGPROB_GAP_MEAN] for update in trained]
    largest = [update[names.ENGINE_LOGPROB_GAP_MAX] for update in trained]
    # float32 on both sides: the engine's kernels against the learner's, float noise
    assert all(0.0 <= gap < 1e-3 for gap in gaps) and all(g < 1e-2 for g in largest), history
    assert gone(engine_processes(), timeout=5)


def test_a_run_killed_in_an_update_resumes_to_the_same_numbers(tmp_path, uninterrupted):
    expected, _ = uninterrupted
    run_dir, env = tmp_path / "run", cli_env(tmp_path)
    driver = start_cli(run_dir, *COMMON, env=env, driver=(DRIVER, "update", "2"))
    code, output = finish(driver)
    assert code == -signal.SIGKILL, output[-4000:]
    assert gone(engine_processes()), "the killed run's engine outlived it"
    run_cli(tmp_path / "resumed", *COMMON, f"resume={run_dir}", env=env)
    assert trace(run_dir) == expected  # the same seed gives the same run, resumed or not
    assert gone(engine_processes(), timeout=5)


def generating_run(tmp_path: Path):
    """A long run started in ``tmp_path``, past its first checkpoint: (its folder, its process,
    the pids of its engine processes)."""
    run_dir = tmp_path / "run"
    process = start_cli(run_dir, *COMMON, "rl.cycles=20", env=cli_env(tmp_path))
    wait_for(lambda: saved_updates(run_dir) >= 1, process, "the first checkpoint")
    engines = engine_processes()
    assert engines, "no engine process while the run generates"
    return run_dir, process, engines


def test_sigterm_stops_at_an_update_boundary_with_no_engine_left(tmp_path):
    _, process, engines = generating_run(tmp_path)
    process.send_signal(signal.SIGTERM)
    code, output = finish(process)
    assert code == 128 + signal.SIGTERM, output[-4000:]
    assert "SIGTERM received: checkpointed after update" in output
    assert gone(engines), "the engine outlived its run"


def test_a_dead_engine_stops_the_run_naming_the_engine_and_where_to_resume(tmp_path):
    run_dir, process, engines = generating_run(tmp_path)
    for pid in engines:
        os.kill(pid, signal.SIGKILL)
    code, output = finish(process)
    assert code not in (0, 128 + signal.SIGTERM), output[-4000:]
    assert "vLLM engine process" in output  # EngineStopped: which process, and its log
    assert "the rollout engine (model.engine=vllm) stopped" in output
    assert f"resume={run_dir}" in output and "last.ckpt" in output, output[-4000:]
