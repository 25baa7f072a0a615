"""Faults a long run meets: kills (SIGKILL, SIGTERM, SLURM's signals), damaged checkpoints,
mistyped or mismatched resume folders, a dead DDP process, an LLM judge's key, a tracking server.

Each CLI test runs the real ``python -m bidswarm.train`` at ``debug=smoke`` size. The table of
faults and the test that shows each is ``docs/reliability.md``.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.types import RunMode
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

import bidswarm.lit.strategy
from bidswarm import metric_names as names
from bidswarm import tracking
from bidswarm.config import register_configs
from bidswarm.lit.callbacks import (
    LAST,
    PREVIOUS,
    CheckpointError,
    CrashSafeCheckpoint,
    RunInterrupted,
    StopSignals,
    StreamedCheckpointIO,
    checkpoint_problem,
    resume_checkpoint,
)
from bidswarm.lit.memory import release_cached_blocks
from bidswarm.lit.strategy import ExplainingProcessObserver
from bidswarm.run.preflight import checked_at_hydra_start, preflight
from bidswarm.run.resume import ResumeError, check_resume, load_state, method_changes
from conftest import CONF, ROOT

register_configs()

# Four RL updates (action, bid, action, bid), no evaluation before RL: the runs that kill stop
# during RL, and the comparison is on the updates' metrics and the held-out result after RL.
COMMON = ("debug=smoke", "rl.cycles=2", "eval.before_rl=false")
WAIT_S = 600


# -- helpers -----------------------------------------------------------------------------------
def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "OMP_NUM_THREADS": "1",
        **extra,
    }


def start_cli(run_dir: Path, *overrides: str, env: dict[str, str], driver: tuple[str, ...] = ()):
    """Start the real CLI (or ``driver``: a script and its arguments, which patches the CLI
    and then runs it with the overrides)."""
    command = (
        [sys.executable, "-c", *driver] if driver else [sys.executable, "-m", "bidswarm.train"]
    )
    command += [f"hydra.run.dir={run_dir}", *overrides]
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish(process: subprocess.Popen) -> tuple[int, str]:
    output, _ = process.communicate(timeout=WAIT_S)
    return process.returncode, output


def run_cli(run_dir: Path, *overrides: str, env: dict[str, str]) -> str:
    code, output = finish(start_cli(run_dir, *overrides, env=env))
    assert code == 0, output[-6000:]
    return output


def wait_for(condition, process: subprocess.Popen, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"ended before {what}: {process.communicate()[0][-4000:]}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def saved_updates(run_dir: Path) -> int:
    """Updates in the run's ``last.ckpt`` (0 when there is none or it is being replaced)."""
    path = run_dir / "checkpoints" / LAST
    try:
        return torch.load(path, weights_only=False)["bidswarm_run"]["updates"]
    except Exception:
        return 0


def decided(key: str) -> bool:
    """Whether the metric ``key`` is decided by the run's randomness and arithmetic: not a
    timing, nor the share of prompt tokens the engine found cached (a resumed run's engine
    starts with an empty cache)."""
    return not key.startswith("time/") and key != names.ENGINE_PREFIX_CACHED_FRAC


def trace(run_dir: Path) -> dict:
    """What a run's randomness and arithmetic decide: every update's metrics (not its timings
    or its engine's cache hits, :func:`decided`) and the held-out result after RL."""
    history = torch.load(run_dir / "checkpoints" / LAST, weights_only=False)["bidswarm"]["history"]
    return {
        "updates": [{k: v for k, v in h.items() if decided(k)} for h in history],
        "eval_after": load_state(run_dir)["eval_after"],
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """The trace of the run the interrupted ones must end up equal to."""
    root = tmp_path_factory.mktemp("uninterrupted")
    run_cli(root / "run", *COMMON, "logger=csv", env=cli_env(root))
    return trace(root / "run")


# -- kills and signals (real CLI) --------------------------------------------------------------
def test_sigterm_then_sigkill_then_resume_ends_as_if_never_interrupted(tmp_path, uninterrupted):
    """SIGTERM: the update in progress finishes, is checkpointed, exit 143 with a message, the
    MLflow run is KILLED. SIGKILL of the resumed run: its last complete checkpoint survives.
    The second resume ends with the same metrics as the uninterrupted run, in the same MLflow
    run."""
    from mlflow.tracking import MlflowClient

    run_dir, env = tmp_path / "run", cli_env(tmp_path)
    first = start_cli(run_dir, *COMMON, env=env)
    wait_for(lambda: saved_updates(run_dir) >= 1, first, "the first checkpoint")
    first.send_signal(signal.SIGTERM)
    code, output = finish(first)
    assert code == 128 + signal.SIGTERM, output[-4000:]
    stopped_at = saved_updates(run_dir)
    assert f"SIGTERM received: checkpointed after update {stopped_at}" in output
    assert f"continue with resume={run_dir}" in output
    state = load_state(run_dir)
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    assert client.get_run(state["mlflow_run_id"]).info.status == "KILLED"

    second = start_cli(tmp_path / "second", *COMMON, f"resume={run_dir}", env=env)
    wait_for(lambda: saved_updates(run_dir) > stopped_at, second, "a checkpoint after resume")
    second.kill()
    finish(second)
    assert checkpoint_problem(run_dir / "checkpoints" / LAST) is None
    assert load_state(run_dir)["mlflow_run_id"] == state["mlflow_run_id"]

    run_cli(tmp_path / "third", *COMMON, f"resume={run_dir}", env=env)
    assert trace(run_dir) == uninterrupted
    run = client.get_run(state["mlflow_run_id"])
    assert run.info.status == "FINISHED" and "eval_after/reward/mean" in run.data.metrics
    assert load_state(run_dir)["mlflow_run_id"] == state["mlflow_run_id"]


def test_sigusr1_under_slurm_checkpoints_and_requeues(tmp_path):
    """SLURM's warning signal (``sbatch --signal=USR1@120``): checkpoint at the update
    boundary, ``scontrol requeue <job>``, exit 138. A fake ``scontrol`` records the call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol_calls"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    env = cli_env(tmp_path, SLURM_JOB_ID="4242", PATH=f"{bin_dir}:{os.environ['PATH']}")
    run_dir = tmp_path / "run"
    fast = ("sft.enabled=false", "eval.enabled=false", "logger=csv", "rl.cycles=20")
    process = start_cli(run_dir, "debug=smoke", *fast, env=env)
    wait_for(lambda: saved_updates(run_dir) >= 1, process, "the first checkpoint")
    process.send_signal(signal.SIGUSR1)
    code, output = finish(process)
    assert code == 128 + signal.SIGUSR1, output[-4000:]
    assert "SIGUSR1 received: checkpointed after update" in output
    assert calls.read_text().split() == ["requeue", "4242"]
    assert "SLURM job 4242: requeued" in output
    assert checkpoint_problem(run_dir / "checkpoints" / LAST) is None


def test_resume_of_a_missing_folder_fails_naming_it_and_creates_nothing(tmp_path):
    missing = tmp_path / "no" / "such" / "run"
    result = subprocess.run(
        [sys.executable, "-m", "bidswarm.train", "debug=smoke", "logger=csv",
         f"hydra.run.dir={tmp_path / 'out'}", f"resume={missing}"],
        cwd=ROOT, env=cli_env(tmp_path), capture_output=True, text=True, timeout=WAIT_S,
    )  # fmt: skip
    assert result.returncode == 1
    assert f"resume={missing}: no such folder" in result.stderr
    assert not (tmp_path / "no").exists() and not (tmp_path / "out").exists()


# -- resume checks (no process) ----------------------------------------------------------------
def compose_train(overrides: list[str]):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("train", overrides=overrides)


def fake_run(folder: Path, overrides: list[str]) -> Path:
    """A run folder as training leaves it before RL: its state and resolved config."""
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps({"sft_done": True}))
    cfg = compose_train(overrides)
    (folder / "resolved_config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=False))
    return folder


def test_resume_of_a_folder_without_a_run_fails_naming_it(tmp_path):
    (tmp_path / "empty").mkdir()
    cfg = compose_train([f"resume={tmp_path / 'empty'}"])
    with pytest.raises(ResumeError, match="holds no run"):
        check_resume(cfg)


@pytest.mark.parametrize(
    "change, keys",
    [
        (["task=crafting_torch"], ["task.target"]),
        (["model.tiny.hidden_size=32"], ["model.tiny.hidden_size"]),
        (["coordination=round_robin"], ["coordination.name"]),
        (["credit=random"], ["credit.name"]),
        (["seed=7"], ["seed"]),
        (["seed=7", "rl.lr=0.5"], ["rl.lr", "seed"]),
    ],
)
def test_resume_with_another_method_fails_naming_the_keys(tmp_path, change, keys):
    run = fake_run(tmp_path / "run", ["debug=smoke"])
    cfg = compose_train(["debug=smoke", *change, f"resume={run}"])
    with pytest.raises(ResumeError) as error:
        check_resume(cfg)
    for key in keys:
        assert f"\n  {key}: " in str(error.value)


def test_resume_into_a_deleted_or_missing_mlflow_run_fails_before_anything_loads(tmp_path):
    """The run's MLflow run was deleted (say, by tidying up killed runs) or lives in another
    store: preflight names the run and the fix, instead of the first update failing to log."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    run = fake_run(tmp_path / "run", ["debug=smoke"])
    (run / "state.json").write_text(json.dumps({"sft_done": True, "mlflow_run_id": run_id}))
    cfg = compose_train(["debug=smoke", f"logger.tracking_uri={uri}", f"resume={run}"])
    preflight(cfg)  # an active run resumes
    client.delete_run(run_id)
    with pytest.raises(ResumeError, match=f"MLflow run {run_id} was deleted; restore it"):
        preflight(cfg)
    other = f"sqlite:///{tmp_path / 'other.db'}"
    cfg = compose_train(["debug=smoke", f"logger.tracking_uri={other}", f"resume={run}"])
    with pytest.raises(ResumeError, match=f"MLflow run {run_id} is not in the tracking store"):
        preflight(cfg)


def test_resume_may_lengthen_the_schedule(tmp_path):
    run = fake_run(tmp_path / "run", ["debug=smoke"])
    check_resume(compose_train(["debug=smoke", "rl.cycles=9", "rl.stop_after=2", f"resume={run}"]))
    saved = OmegaConf.load(run / "resolved_config.yaml")
    assert method_changes(saved, compose_train(["debug=smoke", "eval.runs_per_seed=5"])) == []


def test_preflight_runs_once_per_job():
    """A single run is checked by Hydra's callback (before Hydra makes its folder), so main
    does not check it again; a sweep's job, or Hydra without the callback, is checked by main."""
    with initialize_config_dir(str(CONF), version_base="1.3"):
        hydra_cfg = compose("train", return_hydra_config=True).hydra
    hydra_cfg.mode = RunMode.RUN
    assert checked_at_hydra_start(hydra_cfg)
    hydra_cfg.mode = RunMode.MULTIRUN
    assert not checked_at_hydra_start(hydra_cfg)
    hydra_cfg.mode = RunMode.RUN
    hydra_cfg.callbacks = {}
    assert not checked_at_hydra_start(hydra_cfg)


def test_a_damaged_state_file_is_named(tmp_path):
    (tmp_path / "state.json").write_text('{"sft_done": tr')
    with pytest.raises(ResumeError, match=r"state\.json is damaged"):
        load_state(tmp_path)


# -- the checkpoint callback in process (a trivial module) -------------------------------------
class Counter(L.LightningModule):
    """One parameter, one manual update per epoch; sends itself ``signal_at`` = (epoch, signal)."""

    def __init__(self, signal_at: tuple[int, int] | None = None):
        super().__init__()
        self.automatic_optimization = False
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.signal_at = signal_at

    def train_dataloader(self):
        return DataLoader([0], batch_size=None)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1.0)

    def training_step(self, batch, batch_idx):
        if self.signal_at and self.current_epoch == self.signal_at[0]:
            os.kill(os.getpid(), self.signal_at[1])
        optimizer = self.optimizers()
        self.manual_backward(-self.weight.sum())
        optimizer.step()
        optimizer.zero_grad()


def fit_counter(folder: Path, epochs: int, every: int = 1, signal_at=None, resume=None):
    signals = StopSignals()
    callback = CrashSafeCheckpoint(folder, every, epochs, {"mlflow_run_id": "abc"}, signals)
    trainer = L.Trainer(
        max_epochs=epochs,
        callbacks=[callback],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        default_root_dir=str(folder),
    )
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)
    try:
        trainer.fit(Counter(signal_at), ckpt_path=resume)
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGUSR1, previous[1])
    return callback, trainer


def test_checkpoints_are_replaced_atomically_keeping_the_previous_one(tmp_path):
    callback, _ = fit_counter(tmp_path, epochs=5, every=2)
    last = torch.load(tmp_path / LAST, weights_only=False)
    previous = torch.load(tmp_path / PREVIOUS, weights_only=False)
    # every 2 updates, and after the last: 2, 4, 5
    assert (last["bidswarm_run"]["updates"], previous["bidswarm_run"]["updates"]) == (5, 4)
    assert last["bidswarm_run"]["mlflow_run_id"] == "abc"
    assert sorted(p.name for p in tmp_path.iterdir()) == [LAST, PREVIOUS]  # no partial file
    assert callback.updates_saved == 5


def test_a_checkpoint_is_streamed_to_its_file_without_a_copy_in_memory(tmp_path, monkeypatch):
    """Lightning's writer serializes the whole checkpoint into memory before writing it (3.5
    GiB more resident memory for three float32 SmolLM2 agents); the crash-safe checkpoint
    streams it into its partial file instead."""
    import lightning.fabric.plugins.io.torch_io as torch_io

    def in_memory(checkpoint, path):
        raise AssertionError("the checkpoint went through an in-memory buffer")

    monkeypatch.setattr(torch_io, "_atomic_save", in_memory)
    _, trainer = fit_counter(tmp_path, epochs=2)
    assert isinstance(trainer.strategy.checkpoint_io, StreamedCheckpointIO)
    saved = torch.load(tmp_path / LAST, weights_only=False)
    assert saved["bidswarm_run"]["updates"] == 2 and saved["state_dict"]["weight"].item() == 2.0


def resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_heap_memory_goes_back_to_the_system_between_phases():
    """glibc keeps freed heap memory resident (it cannot shrink its heap below a chunk still in
    use); between phases :func:`release_cached_blocks` on a CPU hands it back."""
    chunks = [bytearray(64 * 1024) for _ in range(4800)]  # 300 MiB, each under mmap's threshold
    for chunk in chunks:
        chunk[::4096] = b"x" * len(chunk[::4096])  # touched: resident
    last = chunks.pop()  # the heap's top stays in use
    del chunks
    before = resident_bytes()
    release_cached_blocks(torch.device("cpu"))
    assert before - resident_bytes() > 200 * 2**20
    assert len(last) == 64 * 1024  # kept alive until here


def test_tensors_that_only_a_reference_cycle_holds_are_freed_between_phases():
    """What only an unreachable cycle still holds (an optimizer and the trainer that refers to
    it) is freed when Python's collector next runs, however much it is: between phases
    :func:`release_cached_blocks` runs it, on any device."""

    class Holder:
        pass

    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection in between: only the release may free it
    try:
        holder = Holder()
        holder.itself = holder
        holder.states = torch.zeros(1024, 1024)
        states = weakref.ref(holder.states)
        del holder
        assert states() is not None  # unreachable, not yet freed
        release_cached_blocks(torch.device("cpu"))
        assert states() is None
    finally:
        if was_enabled:
            gc.enable()


def test_a_full_disk_during_a_save_keeps_the_last_checkpoint_and_frees_the_partial_one(
    tmp_path, monkeypatch
):
    save = L.Trainer.save_checkpoint
    calls = []

    def fills_the_disk_on_the_third(trainer, path, *args, **kwargs):
        calls.append(path)
        if len(calls) < 3:
            return save(trainer, path, *args, **kwargs)
        Path(path).write_bytes(b"half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(L.Trainer, "save_checkpoint", fills_the_disk_on_the_third)
    with pytest.raises(OSError, match=r"no space left.*update 3.*resume=") as raised:
        fit_counter(tmp_path, epochs=5)
    assert raised.value.errno == errno.ENOSPC
    assert sorted(p.name for p in tmp_path.iterdir()) == [LAST, PREVIOUS]
    assert torch.load(tmp_path / LAST, weights_only=False)["bidswarm_run"]["updates"] == 2


def test_sigterm_stops_at_the_update_boundary_after_a_checkpoint(tmp_path):
    callback, trainer = fit_counter(tmp_path, epochs=10, every=5, signal_at=(2, signal.SIGTERM))
    assert callback.stop_signal == signal.SIGTERM
    assert trainer.current_epoch == 3  # the update in progress (index 2) was finished
    saved = torch.load(tmp_path / LAST, weights_only=False)
    assert saved["bidswarm_run"]["updates"] == 3
    assert saved["state_dict"]["weight"].item() == 3.0
    # and the run continues from there to the same end as an uninterrupted one
    fit_counter(tmp_path, epochs=10, every=5, resume=str(tmp_path / LAST))
    assert torch.load(tmp_path / LAST, weights_only=False)["state_dict"]["weight"].item() == 10.0


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_checkpoint_is_named_and_the_previous_one_kept(tmp_path, damage):
    fit_counter(tmp_path, epochs=3)
    last = tmp_path / LAST
    data = bytearray(last.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 3] ^= 0xFF
    last.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as error:
        resume_checkpoint(tmp_path)
    message = str(error.value)
    assert f"checkpoint {last} is truncated or corrupt" in message
    assert f"mv {tmp_path / PREVIOUS} {last}" in message
    assert checkpoint_problem(tmp_path / PREVIOUS) is None


def test_resume_of_a_run_with_a_truncated_checkpoint_fails_before_anything_loads(tmp_path):
    run = fake_run(tmp_path / "run", ["debug=smoke"])
    fit_counter(run / "checkpoints", epochs=2)
    last = run / "checkpoints" / LAST
    last.write_bytes(last.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match=f"checkpoint {last} is truncated"):
        check_resume(compose_train(["debug=smoke", f"resume={run}"]))


def test_a_signal_outside_rl_stops_at_once_with_its_exit_code(capsys, monkeypatch):
    """During SFT or an evaluation nothing is saved mid-phase (both are redone on resume):
    the signal ends the process at once, says so, exit 128 + signal."""
    from bidswarm.train import stop_with_signal

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(RunInterrupted) as stop:
        StopSignals().handle(signal.SIGTERM, None)
    with pytest.raises(SystemExit) as exit_:
        stop_with_signal(stop.value, "outputs/runs/x")
    assert exit_.value.code == 143
    assert (
        "SIGTERM received: stopped before RL checkpointed anything new" in capsys.readouterr().out
    )


def test_no_checkpoint_yet_means_rl_starts_at_update_zero(tmp_path):
    assert resume_checkpoint(tmp_path / "checkpoints") is None


# -- kills at chosen points (slow: a run and a resume each) ------------------------------------
DRIVER = textwrap.dedent(
    """
    import io, os, signal, sys, runpy
    import lightning.pytorch as pl
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    import torch
    from bidswarm.envs.crafting.env import CraftingEnv
    from bidswarm.lit.swarm_module import SwarmModule
    from bidswarm.run.phases import Run

    POINT, UPDATE = sys.argv.pop(1), int(sys.argv.pop(1))
    now = {"update": None, "steps": 0}

    def die():
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    training_step = SwarmModule.training_step
    def tracked_step(self, *args, **kwargs):
        now["update"], now["steps"] = self.current_epoch, 0
        return training_step(self, *args, **kwargs)
    SwarmModule.training_step = tracked_step

    evaluate_and_record = Run.evaluate_and_record
    def tracked_evaluation(self, key):
        now["update"], now["steps"] = key, 0
        return evaluate_and_record(self, key)
    Run.evaluate_and_record = tracked_evaluation

    step = CraftingEnv.step
    def env_step(self, *args, **kwargs):
        if (POINT, now["update"]) in (("rollout", UPDATE), ("evaluation", "eval_after")):
            now["steps"] += 1
            if now["steps"] == 10:
                die()
        return step(self, *args, **kwargs)
    CraftingEnv.step = env_step

    backward = pl.LightningModule.manual_backward
    def manual_backward(self, *args, **kwargs):
        backward(self, *args, **kwargs)
        if POINT == "update" and now["update"] == UPDATE:
            die()  # gradients computed, parameters not yet stepped
    pl.LightningModule.manual_backward = manual_backward

    save = TorchCheckpointIO.save_checkpoint
    def save_checkpoint(self, checkpoint, path, storage_options=None):
        if POINT == "checkpoint" and checkpoint.get("bidswarm_run", {}).get("updates") == UPDATE:
            buffer = io.BytesIO()
            torch.save(checkpoint, buffer)
            with open(path, "wb") as handle:
                handle.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
                handle.flush()
                os.fsync(handle.fileno())
            die()  # half of the new checkpoint is on disk
        return save(self, checkpoint, path, storage_options)
    TorchCheckpointIO.save_checkpoint = save_checkpoint

    sys.argv = ["bidswarm.train", *sys.argv[1:]]
    runpy.run_module("bidswarm.train", run_name="__main__")
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "point, update, complete",
    [
        ("rollout", 2, 2),  # 10 env steps into update 2's episodes
        ("update", 2, 2),  # after update 2's first backward, before its optimizer step
        ("checkpoint", 3, 2),  # half of the checkpoint after update 3 written
        ("evaluation", 0, 4),  # 10 env steps into the held-out evaluation after RL
    ],
)
def test_sigkill_at_any_point_resumes_from_the_last_complete_checkpoint(
    tmp_path, uninterrupted, point, update, complete
):
    run_dir, env = tmp_path / "run", cli_env(tmp_path)
    driver = start_cli(run_dir, *COMMON, "logger=csv", env=env, driver=(DRIVER, point, str(update)))
    code, output = finish(driver)
    assert code == -signal.SIGKILL, output[-4000:]
    assert saved_updates(run_dir) == complete
    assert checkpoint_problem(run_dir / "checkpoints" / LAST) is None
    load_state(run_dir)  # state.json is complete
    run_cli(tmp_path / "resumed", *COMMON, "logger=csv", f"resume={run_dir}", env=env)
    assert trace(run_dir) == uninterrupted


# -- a dead DDP process ------------------------------------------------------------------------
def test_the_watcher_of_ddp_processes_says_which_one_died_before_it_stops_the_first(
    tmp_path, capsys, monkeypatch
):
    """Lightning's watcher SIGKILLs the first process a few seconds after another died, often
    before any collective fails: ours first names the dead process and how to continue. Here
    the "first process" it stops is a stand-in that sleeps."""
    monkeypatch.setattr(bidswarm.lit.strategy, "_explained", threading.Event())
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead.wait()
    watcher = ExplainingProcessObserver(
        tmp_path, 3, 6, child_processes=[alive, dead], main_pid=first.pid
    )  # node 1 of 2
    assert watcher._run() is True
    assert first.wait(timeout=10) == -signal.SIGKILL
    assert alive.wait(timeout=10) == -signal.SIGKILL
    message = capsys.readouterr().err
    assert "[bidswarm] process 3 of 6 stops: process 5 ended with exit code 3" in message
    assert f"resume={tmp_path}" in message


def test_when_one_ddp_process_dies_the_other_stops_with_a_message(tmp_path):
    """Two CPU processes (gloo); SIGKILL of process 1 in the middle of RL: process 0 stops
    within a bounded time, says which process it is and how to continue, exits non-zero; the
    last checkpoint is complete."""
    run_dir = tmp_path / "run"
    overrides = (
        "debug=smoke", "trainer=ddp", "trainer.devices=2", "sft.enabled=false",
        "eval.enabled=false", "logger=csv", "rl.cycles=50",
    )  # fmt: skip
    parent = start_cli(run_dir, *overrides, env=cli_env(tmp_path))
    wait_for(lambda: saved_updates(run_dir) >= 1, parent, "the first checkpoint")
    children = subprocess.run(
        ["pgrep", "-P", str(parent.pid)], capture_output=True, text=True
    ).stdout.split()
    assert children, "no second process"
    os.kill(int(children[0]), signal.SIGKILL)
    killed_at = time.monotonic()
    code, output = finish(parent)
    assert time.monotonic() - killed_at < 120, "the surviving process hung"
    assert code != 0
    assert "[bidswarm] process 0 of 2 stops" in output, output[-4000:]
    assert f"resume={run_dir}" in output
    assert checkpoint_problem(run_dir / "checkpoints" / LAST) is None


@pytest.mark.slow
def test_sigterm_to_a_ddp_run_stops_every_process_at_the_same_update(tmp_path):
    """SIGTERM to the launching process is passed on to the other; both stop after the same
    update, once it is checkpointed, and exit 143."""
    run_dir = tmp_path / "run"
    overrides = (
        "debug=smoke", "trainer=ddp", "trainer.devices=2", "sft.enabled=false",
        "eval.enabled=false", "logger=csv", "rl.cycles=50",
    )  # fmt: skip
    parent = start_cli(run_dir, *overrides, env=cli_env(tmp_path))
    wait_for(lambda: saved_updates(run_dir) >= 1, parent, "the first checkpoint")
    child = int(subprocess.run(["pgrep", "-P", str(parent.pid)], capture_output=True, text=True)
                .stdout.split()[0])  # fmt: skip
    parent.send_signal(signal.SIGTERM)
    code, output = finish(parent)
    assert code == 128 + signal.SIGTERM, output[-4000:]
    deadline = time.monotonic() + 60
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{child}").exists(), "the other process did not stop"
    stopped = saved_updates(run_dir)
    said = f"SIGTERM received: checkpointed after update {stopped} in"
    assert output.count(said) == 2, output[-4000:]  # both processes, the same update


# -- the LLM judge's key never leaks -----------------------------------------------------------
CANARY = "sk-canary-4b1d5w4rm-do-not-log-7f3a9c"


class FakeJudge(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint that records the Authorization headers it receives."""

    authorizations: ClassVar[list[str]] = []

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        FakeJudge.authorizations.append(self.headers.get("Authorization", ""))
        body = json.dumps({"choices": [{"message": {"content": "CORRECT"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_the_judge_api_key_appears_nowhere(tmp_path):
    from mlflow.tracking import MlflowClient

    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeJudge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    run_dir = tmp_path / "run"
    env = cli_env(tmp_path, BIDSWARM_TEST_JUDGE_KEY=CANARY)
    try:
        output = run_cli(
            run_dir,
            "debug=smoke",
            "task=research",
            "task.judge=llm",
            f"task.judge_url=http://127.0.0.1:{server.server_port}/v1",
            "task.judge_model=fake",
            "task.judge_api_key_env=BIDSWARM_TEST_JUDGE_KEY",
            env=env,
        )
    finally:
        server.shutdown()
    assert f"Bearer {CANARY}" in FakeJudge.authorizations, "the judge was never asked"
    assert CANARY not in output
    key = CANARY.encode()
    for path in run_dir.rglob("*"):  # state, configs, logs, checkpoints, populations, plots
        if path.is_file():
            assert key not in path.read_bytes(), f"the key is in {path}"
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    run = client.get_run(load_state(run_dir)["mlflow_run_id"])
    texts = [
        *run.data.params,
        *run.data.params.values(),
        *run.data.metrics,
        *run.data.tags,
        *run.data.tags.values(),
    ]
    assert not [text for text in texts if CANARY in text]
    artifacts = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "artifacts")))
    for path in artifacts.rglob("*"):
        if path.is_file():
            assert key not in path.read_bytes(), f"the key is in the artifact {path}"
    assert key not in (tmp_path / "mlflow.db").read_bytes()


# -- tracking ----------------------------------------------------------------------------------
def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_tracking_server_fails_fast_before_training(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(tracking.TrackingUnavailable, match="is not reachable") as error:
        tracking.check_store(uri)
    assert time.monotonic() - start < tracking.HEALTH_TIMEOUT_S + 2
    assert uri in str(error.value) and "logger=csv" in str(error.value)
    with pytest.raises(tracking.TrackingUnavailable, match="schemes"):
        tracking.check_store("outputs/mlflow.db")
    result = subprocess.run(
        [sys.executable, "-m", "bidswarm.train", "debug=smoke", f"hydra.run.dir={tmp_path / 'r'}"],
        cwd=ROOT, env=cli_env(tmp_path, MLFLOW_TRACKING_URI=uri),
        capture_output=True, text=True, timeout=WAIT_S,
    )  # fmt: skip
    assert result.returncode == 1 and "is not reachable" in result.stderr
    assert not (tmp_path / "r").exists()


@pytest.fixture
def mlflow_server(tmp_path):
    """A real ``mlflow server`` on 127.0.0.1 with its own store and proxied artifacts."""
    port = free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    server = subprocess.Popen(
        [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "server_artifacts"), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            tracking.check_store(uri)
            break
        except tracking.TrackingUnavailable:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                pytest.fail("mlflow server did not start")
            time.sleep(1)
    yield uri, tmp_path / "server_artifacts"
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=60)


@pytest.mark.slow
def test_a_sweep_tracks_to_a_real_mlflow_server(tmp_path, mlflow_server):
    from mlflow.tracking import MlflowClient

    uri, server_artifacts = mlflow_server
    sweep_dir = tmp_path / "sweep"
    result = subprocess.run(
        [sys.executable, "-m", "bidswarm.train", "-m", "debug=smoke", "seed=0,1",
         "eval.before_rl=false", f"hydra.sweep.dir={sweep_dir}"],
        cwd=ROOT, env=cli_env(tmp_path, MLFLOW_TRACKING_URI=uri),
        capture_output=True, text=True, timeout=WAIT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("bidswarm")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get(tracking.SWEEP_TAG) == str(sweep_dir.resolve())]
    assert len(parents) == 1
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert sorted(r.info.run_name for r in children) == [
        f"debug=smoke,eval.before_rl=False,seed={seed}" for seed in (0, 1)
    ]
    for child in children:
        assert child.info.status == "FINISHED"
        assert "eval_after/reward/mean" in child.data.metrics
        names = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert {"resolved_config.yaml", "state.json", "reward_vs_flops.png"} <= names
    uploaded = {p.name for p in server_artifacts.rglob("*") if p.is_file()}
    assert {"resolved_config.yaml", "state.json"} <= uploaded


@pytest.mark.slow
def test_a_resumed_run_logs_each_step_of_each_metric_once(tmp_path, uninterrupted):
    """SIGKILL while the checkpoint of 3 updates is written: the third update (step 2) was
    logged to MLflow but the last complete checkpoint holds 2 updates, so the resumed run redoes
    it. The MLflow history of every metric then holds each step once, every update's included."""
    from mlflow.tracking import MlflowClient

    run_dir, env = tmp_path / "run", cli_env(tmp_path)
    driver = start_cli(run_dir, *COMMON, env=env, driver=(DRIVER, "checkpoint", "3"))
    code, output = finish(driver)
    assert code == -signal.SIGKILL, output[-4000:]
    assert saved_updates(run_dir) == 2
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    run_id = load_state(run_dir)["mlflow_run_id"]
    assert [m.step for m in client.get_metric_history(run_id, "flops/total")] == [0, 1, 2]
    run_cli(tmp_path / "resumed", *COMMON, f"resume={run_dir}", env=env)
    assert trace(run_dir) == uninterrupted
    metrics = client.get_run(run_id).data.metrics
    assert "eval_after/reward/mean" in metrics and "flops/total" in metrics
    for key in metrics:
        if key.startswith("system/"):  # sampled by MLflow's monitor on its own clock
            continue
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)), f"{key} logged twice at a step: {sorted(steps)}"
    history = sorted(client.get_metric_history(run_id, "flops/total"), key=lambda m: m.step)
    assert [m.step for m in history] == [0, 1, 2, 3]
    expected = [update["flops/total"] for update in uninterrupted["updates"]]
    assert [m.value for m in history] == expected
