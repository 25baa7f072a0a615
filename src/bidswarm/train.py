"""Train a swarm with MPT (or a baseline): SFT cold start, RL, held-out evaluation.

python -m bidswarm.train                       # the default: tiny model, wooden pickaxe
python -m bidswarm.train debug=smoke           # the whole pipeline in under a minute
python -m bidswarm.train -m ablation=random_credit,round_robin seed=0,1,2
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig

from bidswarm import console
from bidswarm.config import refuse_misspelled_keys, refuse_unknown_choices, register_configs
from bidswarm.engines.vllm_engine import EngineStopped
from bidswarm.lit.callbacks import STOP_SIGNALS_OF_THIS_PROCESS, RunInterrupted, resume_checkpoint
from bidswarm.lit.strategy import explain_stop
from bidswarm.run.phases import Run
from bidswarm.run.preflight import checked_at_hydra_start, preflight, say_debug_changes
from bidswarm.run.threads import threads_per_job

CONF = Path(__file__).resolve().parents[2] / "conf"

register_configs()


def train(cfg: DictConfig) -> dict[str, float]:
    """The whole job; returns the held-out metrics after RL (or before, if RL is off).

    A stop signal (SIGTERM, SIGUSR1) ends it with exit code 128 + the signal, after the RL
    update in progress is checkpointed; under SLURM, SIGUSR1 also requeues the job.
    """
    STOP_SIGNALS_OF_THIS_PROCESS.install()
    try:
        run = Run.start(cfg)
    except RunInterrupted as stop:
        stop_with_signal(stop, cfg.resume or cfg.output_dir)
    try:
        if not run.state.get("sft_done"):
            run.cold_start()
        if cfg.eval.enabled and cfg.eval.before_rl and "eval_before" not in run.state:
            run.evaluate_and_record("eval_before")
        if not run.fit():
            console.say(f"[bidswarm] stopped early; continue with resume={run.run_dir}")
            run.close(status="FINISHED")
            return {}
        result = run.evaluate_and_record("eval_after") if cfg.eval.enabled else {}
        run.finish()
    except RunInterrupted as stop:
        run.close(status="KILLED")
        stop_with_signal(stop, run.run_dir)
    except BaseException as error:
        run.close(status="FAILED")
        explain_distributed_failure(error, run.run_dir)
        if isinstance(error, EngineStopped):
            explain_engine_stop(run.run_dir)
        raise
    run.close(status="FINISHED")
    return result


def stop_with_signal(stop: RunInterrupted, run_dir: str | Path) -> NoReturn:
    """Say what a stop signal left behind, requeue under SLURM (SIGUSR1), exit 128 + signal."""
    name = signal.Signals(stop.signum).name
    if stop.checkpoint is not None:
        what = f"checkpointed after update {stop.updates} in {stop.checkpoint}"
    else:
        what = "stopped before RL checkpointed anything new (SFT and evaluation are redone)"
    print(f"[bidswarm] {name} received: {what}; continue with resume={run_dir}", flush=True)
    job = slurm_job_id()
    if stop.signum == signal.SIGUSR1 and job and rank_zero_only.rank == 0:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
        outcome = "requeued" if done.returncode == 0 else f"could not requeue ({done.stderr})"
        print(f"[bidswarm] SLURM job {job}: {outcome}", flush=True)
    raise SystemExit(stop.exit_code)


def slurm_job_id() -> str | None:
    """This SLURM job's id (``<array job>_<task>`` in an array), or None outside SLURM."""
    if "SLURM_ARRAY_JOB_ID" in os.environ and "SLURM_ARRAY_TASK_ID" in os.environ:
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def explain_engine_stop(run_dir: Path) -> None:
    """After the rollout engine's process died: where the run can continue from."""
    checkpoint = resume_checkpoint(run_dir / "checkpoints", full=False)
    where = f"from {checkpoint}" if checkpoint else "from its last saved phase (no RL checkpoint)"
    console.say(
        f"[bidswarm] the rollout engine (model.engine=vllm) stopped, so the run stopped; "
        f"continue {where} with resume={run_dir}"
    )


def explain_distributed_failure(error: BaseException, run_dir: Path) -> None:
    """In a multi-process run, say which process stopped and why, and how to continue: a
    collective that fails because another process died is otherwise a bare gloo/NCCL trace."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    reason = (str(error).splitlines() or [""])[0][:300]
    explain_stop(
        torch.distributed.get_rank(),
        torch.distributed.get_world_size(),
        f"{type(error).__name__}: {reason}",
        run_dir,
    )


@hydra.main(version_base="1.3", config_path="../../conf", config_name="train")
def main(cfg: DictConfig) -> float:
    console.configure(cfg.verbose)
    if not checked_at_hydra_start(HydraConfig.get()):
        preflight(cfg)  # a sweep's job (its values are not the sweep's), or no Preflight
        say_debug_changes(HydraConfig.get(), cfg)
    # Decoding grows KV caches a token at a time and training asks for activations of other
    # sizes: with fixed-size segments the allocator's cache fragments (an OOM with 140 GiB in
    # use, 33 GiB of it in tensors). Growable segments are read at the first CUDA allocation.
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    threads = cfg.model.torch_threads or threads_per_job(HydraConfig.get())
    if threads:
        torch.set_num_threads(threads)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    result = train(cfg)
    return result.get("reward/mean", float("nan"))


if __name__ == "__main__":
    try:
        refuse_unknown_choices(sys.argv[1:], CONF)
        refuse_misspelled_keys(sys.argv[1:])
    except ValueError as error:
        sys.exit(f"Error: {error}")
    sys.exit(main())
