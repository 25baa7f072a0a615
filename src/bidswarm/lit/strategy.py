"""The Lightning strategy object for ``trainer.strategy`` (a name in the trainer config).

Two names need arguments Lightning's defaults get wrong for bidswarm's learners:

- ``ddp``: agents that did not act in an update have no gradient, so DDP must allow unused
  parameters.
- ``deepspeed_stage_2`` / ``deepspeed_stage_3``: Lightning asks DeepSpeed for a micro-batch size
  and, unless given one, reads it from the train dataloader's ``batch_sampler``. The learners'
  dataloaders yield one update (or SFT step) at a time with ``batch_size=None``, so there is no
  batch sampler and the strategy dies at start. DeepSpeed uses the number only for throughput
  logging; an update is one "batch", so it is 1. Its gradient clip is its own config's
  ``gradient_clipping`` (one norm over every agent: ``trainer.gradient_clipping``): ZeRO keeps the
  gradients in its own buffers, so the learners' per-agent clip (``rl.grad_clip``, which reads
  ``p.grad``) cannot run there, and the config check refuses it.

Both take ``trainer.collective_timeout_s``, the process group's ``timeout``: how long a process
waits in a collective (a gradient all-reduce, or any other) for the others before it fails. A
process that waits for a slower one (longer episodes, a bigger share of an evaluation) must not
fail; one whose partner hangs should not wait for long.

When one process of a multi-process run dies, the others stop too and say so: a process whose
collective fails names itself (``train.py``); and where Lightning started the processes itself,
its watcher thread SIGKILLs the first process a few seconds after another one died, often before
any collective fails, so the watcher here says why first (``ExplainingProcessObserver``).
"""

from __future__ import annotations

import os
import sys
import threading
from datetime import timedelta
from pathlib import Path

from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver
from lightning.fabric.utilities.distributed import _set_num_threads_if_needed
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, Strategy
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from torch.distributed.constants import default_pg_timeout

DEEPSPEED_STAGES = {
    "deepspeed_stage_2": {"stage": 2},
    "deepspeed_stage_2_offload": {"stage": 2, "offload_optimizer": True},
    "deepspeed_stage_3": {"stage": 3},
    "deepspeed_stage_3_offload": {
        "stage": 3,
        "offload_optimizer": True,
        "offload_parameters": True,
    },
}
"""Lightning's registered DeepSpeed strategies (the same arguments), built here to set two
things its defaults get wrong or leave out: the micro-batch size and ``gradient_clipping``."""

_explained = threading.Event()  # one message per process, whichever part of it stops first


def explain_stop(rank: int, world: int, reason: str, run_dir: str | Path) -> None:
    """Say on stderr (once per process) that process ``rank`` of ``world`` stops and why, and
    how the run continues."""
    if _explained.is_set():
        return
    _explained.set()
    print(
        f"[bidswarm] process {rank} of {world} stops: {reason}\n"
        f"[bidswarm] when another process died first, its log says why; the run continues "
        f"from its last checkpoint with resume={run_dir}",
        file=sys.stderr,
        flush=True,
    )


class ExplainingProcessObserver(_ChildProcessObserver):
    """Lightning's watcher of the processes it started on this node (global ranks ``rank``,
    the watching one, then its children ``rank + 1, ...`` of ``world``), which first says which
    one died."""

    def __init__(self, run_dir: str | Path, rank: int, world: int, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.run_dir, self.rank, self.world = run_dir, rank, world

    def _terminate_all(self) -> None:
        dead = [
            f"process {rank} ended with exit code {child.returncode}"
            for rank, child in enumerate(self._child_processes, start=self.rank + 1)
            if child.returncode
        ]
        explain_stop(self.rank, self.world, "; ".join(dead), self.run_dir)
        super()._terminate_all()


class ExplainingLauncher(_SubprocessScriptLauncher):
    """Lightning's launcher of ``ddp`` processes, watched by ``ExplainingProcessObserver``."""

    def __init__(self, run_dir: str | Path, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.run_dir = run_dir

    def launch(self, function, *args, trainer=None, **kwargs):
        self.cluster_environment.validate_settings(
            num_devices=self.num_processes, num_nodes=self.num_nodes
        )
        if not self.cluster_environment.creates_processes_externally:
            self._call_children_scripts()
            observer = ExplainingProcessObserver(
                self.run_dir,
                self.cluster_environment.node_rank() * self.num_processes,
                self.num_nodes * self.num_processes,
                child_processes=self.procs,
                main_pid=os.getpid(),
            )
            observer.start()
        _set_num_threads_if_needed(num_processes=self.num_processes)
        return function(*args, **kwargs)


class ExplainingDDPStrategy(DDPStrategy):
    """DDP whose launcher says which process died when one does."""

    def __init__(self, run_dir: str | Path, **kwargs) -> None:
        super().__init__(**kwargs)
        self.run_dir = run_dir

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if isinstance(self._launcher, _SubprocessScriptLauncher):
            self._launcher = ExplainingLauncher(
                self.run_dir, self.cluster_environment, self.num_processes, self.num_nodes
            )


def build_strategy(
    name: str,
    run_dir: str | Path,
    gradient_clipping: float = 0.0,
    collective_timeout_s: float | None = None,
) -> str | Strategy:
    """The strategy for ``trainer.strategy=name`` of the run in ``run_dir``; other names go to
    Lightning unchanged. ``gradient_clipping``: DeepSpeed's global gradient-norm clip
    (``trainer.gradient_clipping``, 0: none; DeepSpeed strategies only).
    ``collective_timeout_s``: the process group's timeout (``trainer.collective_timeout_s``;
    None: torch's default, 30 minutes)."""
    timeout = (
        default_pg_timeout
        if collective_timeout_s is None
        else timedelta(seconds=collective_timeout_s)
    )
    if name == "ddp":
        return ExplainingDDPStrategy(run_dir, find_unused_parameters=True, timeout=timeout)
    if name in DEEPSPEED_STAGES:
        strategy = DeepSpeedStrategy(
            **DEEPSPEED_STAGES[name], logging_batch_size_per_gpu=1, timeout=timeout
        )
        # Lightning fills it from Trainer(gradient_clip_val), which manual optimization refuses.
        strategy.config["gradient_clipping"] = gradient_clipping
        return strategy
    return name
