"""Callbacks of the trainers: progress, crash-safe checkpoints, stopping on a signal."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import zipfile
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Checkpoint
from tqdm.auto import tqdm

LAST = "last.ckpt"
PREVIOUS = "previous.ckpt"
PARTIAL_SUFFIX = ".partial"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
"""SIGTERM: a kill, a pre-emption or a time limit (SLURM sends it before SIGKILL). SIGUSR1: the
signal a SLURM job asks for ahead of its time limit (``sbatch --signal=USR1@120``)."""


class _ProgressBar(L.Callback):
    """A tqdm bar that the rank-0 process opens when training starts and closes when it ends."""

    def __init__(self) -> None:
        self.bar: tqdm | None = None

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if self.bar is not None:
            self.bar.close()


class UpdateProgress(_ProgressBar):
    """One progress bar over all updates (each Lightning epoch is one update)."""

    def __init__(self, total_updates: int):
        super().__init__()
        self.total_updates = total_updates

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self.bar = tqdm(
                total=self.total_updates, initial=trainer.current_epoch, desc="MPT", unit="update"
            )

    def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if self.bar is None:
            return
        last = module.history[-1] if module.history else {}  # a SwarmModule's
        kind = "bid" if last.get("update_is_bid") else "action"
        self.bar.set_postfix(kind=kind, reward=f"{last.get('reward/mean', float('nan')):.1f}")
        self.bar.update(1)


class StepProgress(_ProgressBar):
    """One progress bar over a one-epoch fit's steps (SFT), with the ``prog_bar`` metrics.

    Our bars (this and :class:`UpdateProgress`) write to stderr through tqdm, which a log file
    shows as they move; Lightning's own bars write to stdout, which a log file (``nohup``, a
    SLURM job) buffers, so a long SFT (SmolLM2 on a CPU) showed nothing until it ended."""

    def __init__(self, description: str):
        super().__init__()
        self.description = description

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self.bar = tqdm(total=trainer.num_training_batches, desc=self.description, unit="step")

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: Any, index: int
    ) -> None:
        if self.bar is None:
            return
        shown = trainer.progress_bar_metrics
        self.bar.set_postfix({key: f"{float(value):.3f}" for key, value in shown.items()})
        self.bar.update(1)


# -- stopping on a signal ----------------------------------------------------------------------
class RunInterrupted(BaseException):
    """The process received a stop signal. A BaseException, like KeyboardInterrupt: no
    ``except Exception`` on the way up may swallow it."""

    def __init__(self, signum: int, checkpoint: Path | None = None, updates: int | None = None):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.checkpoint = checkpoint
        """The checkpoint written at the update boundary (None: stopped outside RL)."""
        self.updates = updates

    @property
    def exit_code(self) -> int:
        """The shell's code of a process ended by this signal (143 for SIGTERM)."""
        return 128 + self.signum


class StopSignals:
    """SIGTERM / SIGUSR1 handling of a training process.

    Outside RL a signal ends the process at once (:class:`RunInterrupted`): SFT and evaluation
    are redone on resume, so nothing is lost. During RL (``defer``) it is only recorded; the
    :class:`CrashSafeCheckpoint` stops at the next update boundary, after a checkpoint.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self.defer = False
        self.launcher: Any = None
        """Lightning's launcher of this process's DDP children, which the signal is sent on to."""

    def install(self) -> None:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self.handle)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        first = self.received is None
        self.received = signum
        if first and self.launcher is not None:
            self.launcher.kill(signum)
        if not self.defer:
            raise RunInterrupted(signum)


STOP_SIGNALS_OF_THIS_PROCESS = StopSignals()


# -- crash-safe checkpoints --------------------------------------------------------------------
class CheckpointError(RuntimeError):
    """A checkpoint file is truncated or corrupt."""


class CrashSafeCheckpoint(Checkpoint):
    """``checkpoints/last.ckpt`` after every ``every`` updates, after the last one, at
    ``rl.stop_after`` and at the first update boundary after a stop signal.

    Written atomically: the new checkpoint goes to ``last.ckpt.partial`` and is flushed to disk;
    the complete ``last.ckpt`` it replaces becomes ``previous.ckpt`` (a hard link, no copy);
    then a rename puts the new one in place. A kill at any moment leaves a complete
    ``last.ckpt``. ``run_info`` (the MLflow run id) is stored in each checkpoint.
    """

    def __init__(
        self,
        folder: Path,
        every: int,
        total_updates: int,
        run_info: dict[str, Any],
        signals: StopSignals = STOP_SIGNALS_OF_THIS_PROCESS,
    ):
        self.folder = Path(folder)
        self.every = every
        self.total_updates = total_updates
        self.run_info = run_info
        self.signals = signals
        self.stop_signal: int | None = None
        """The signal (on any rank) that stopped training at an update boundary, or None."""
        self.updates_saved: int | None = None

    @property
    def last(self) -> Path:
        return self.folder / LAST

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = StreamedCheckpointIO()
        # Lightning's own SIGTERM handler (installed by the Trainer) would end training right
        # after the batch, before any checkpoint, with exit code 0: replace it while RL runs.
        self.signals.defer = True
        self.signals.launcher = trainer.strategy.launcher
        self.signals.install()

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.signals.defer = False

    def on_exception(self, trainer: L.Trainer, module: L.LightningModule, error: BaseException):
        self.signals.defer = False

    def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        updates = trainer.current_epoch + 1
        # Every rank must stop at the same update: the largest signal number of any rank.
        received = torch.tensor(float(self.signals.received or 0), device=module.device)
        signum = int(trainer.strategy.reduce(received, reduce_op="max"))
        if (
            signum
            or trainer.should_stop
            or updates % self.every == 0
            or updates >= self.total_updates
        ):
            self.save(trainer, updates)
        if signum:
            self.stop_signal = signum
            trainer.should_stop = True

    def on_save_checkpoint(
        self, trainer: L.Trainer, module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint["bidswarm_run"] = dict(self.run_info) | {
            "updates": trainer.current_epoch + 1,
            "total_updates": self.total_updates,
        }

    def save(self, trainer: L.Trainer, updates: int) -> None:
        """Write the checkpoint of ``updates`` updates as the new ``last.ckpt`` (see above)."""
        partial = self.folder / (LAST + PARTIAL_SUFFIX)
        if trainer.is_global_zero:
            self.folder.mkdir(parents=True, exist_ok=True)
            _remove(partial)
        trainer.strategy.barrier("bidswarm.checkpoint.start")
        try:
            trainer.save_checkpoint(partial)  # every rank: sharded strategies write their part
            if trainer.is_global_zero:
                _flush(partial)
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
            _remove(partial)  # gives back what the unfinished file took; last.ckpt is untouched
            raise OSError(
                errno.ENOSPC,
                f"no space left on the disk of {self.folder} for the checkpoint of update "
                f"{updates} ({shutil.disk_usage(self.folder).free / 2**30:.1f} GiB free); the "
                f"unfinished file is removed and {LAST} is kept: free space, then continue "
                "with resume=<this run's folder>",
            ) from error
        if trainer.is_global_zero:
            _keep_as_previous(self.last, self.folder / PREVIOUS)
            os.replace(partial, self.last)
            _flush_folder(self.folder)
        trainer.strategy.barrier("bidswarm.checkpoint.done")
        self.updates_saved = updates


class StreamedCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer without its in-memory copy: ``torch.save`` straight into
    the file. Lightning's own serializes the whole checkpoint into a buffer first (to write it
    in one go), which holds the checkpoint's size in memory on top of the weights and optimizer
    states it copies: 3.5 GiB more resident memory at every save of three float32 SmolLM2
    agents (docs/performance.md). Atomicity is :class:`CrashSafeCheckpoint`'s own (a partial
    file, flushed, then renamed)."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        torch.save(checkpoint, path)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _flush(path: Path) -> None:
    """Force ``path`` (a file, or a folder's files: DeepSpeed) to disk before it is renamed."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for file in files:
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())


def _flush_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _keep_as_previous(last: Path, previous: Path) -> None:
    """Make the complete ``last`` also ``previous`` without a moment with no ``last``."""
    if not last.exists():
        return
    staged = previous.with_name(previous.name + PARTIAL_SUFFIX)
    _remove(staged)
    if last.is_file():
        os.link(last, staged)
    else:  # a DeepSpeed checkpoint folder: copy (hard links would share the files it rewrites)
        shutil.copytree(last, staged)
    _remove(previous)
    os.replace(staged, previous)


def resume_checkpoint(folder: Path, full: bool = True) -> Path | None:
    """The checkpoint a resumed run continues from (``last.ckpt``), or None when RL has not
    checkpointed yet. A truncated or corrupt ``last.ckpt`` raises :class:`CheckpointError`
    naming it and the previous complete one, which is left in place. ``full=False`` only reads
    the archive's directory (catches a truncated file, not a damaged record)."""
    last, previous = folder / LAST, folder / PREVIOUS
    if not last.exists():
        return None
    problem = checkpoint_problem(last, full)
    if problem is None:
        return last
    if previous.exists() and checkpoint_problem(previous) is None:
        advice = (
            f"the previous complete checkpoint is {previous} (one checkpoint older): "
            f"`mv {previous} {last}` and resume again to continue from it"
        )
    else:
        advice = f"no complete earlier checkpoint; delete {last} to redo RL from its start"
    raise CheckpointError(f"checkpoint {last} is truncated or corrupt ({problem}); {advice}")


def checkpoint_problem(path: Path, full: bool = True) -> str | None:
    """Why ``path`` is not a complete checkpoint (a torch zip archive whose every record
    matches its CRC), or None. ``full`` reads the whole file once; otherwise only the
    archive's directory at its end."""
    if path.is_dir():  # a DeepSpeed checkpoint: written in full before it was renamed
        return None if any(path.iterdir()) else "an empty folder"
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip() if full else None
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        return f"{type(error).__name__}: {error}"
    return None if bad is None else f"record {bad} fails its CRC check"
