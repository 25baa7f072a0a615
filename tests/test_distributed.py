"""Two CPU processes (gloo) share one run: the logged tokens and FLOPs are the sum of what each
process spent, both stop at the same global ``rl.flop_budget``, and an evaluation spread over
them gives exactly the numbers of one process playing it all.

One pair of processes (``torch.multiprocessing``, each with the environment ``torchrun``
gives) does everything; the tests read what each wrote."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger

from conftest import tiny_crafting_swarm

pytestmark = pytest.mark.slow  # ~40 s on 2 busy cores, most of it starting the processes

PROCESSES = 2
HELDOUT_WORLDS, RUNS_PER_WORLD, EVAL_BATCH = 3, 2, 2  # 3 batches: 2 on process 0, 1 on 1
USAGE_METRICS = ("tokens/rollout", "tokens/train", "flops/rollout", "flops/train", "flops/total")


class RecordingLogger(Logger):
    """What the learner logs, on every process (Lightning's loggers log on process 0 only)."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[dict[str, float]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logged.append(dict(metrics))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


def build_run(folder: Path):
    """The same tiny population (seeded), loop and collector in every process."""
    from bidswarm.algorithms.credit import CreditConfig, make_credit
    from bidswarm.config import RLConfig
    from bidswarm.rollout.collector import Collector

    env, population, loop = tiny_crafting_swarm(max_decisions=8)
    rl = RLConfig(
        cycles=1, action_updates=2, bid_updates=1, envs_per_update=2, bid_envs_per_update=2,
        fork_budget=1, checkpoint_every=1,
    )  # fmt: skip
    credit = make_credit(CreditConfig("bucket_brigade"))
    return env, population, loop, Collector(loop, rl, credit, env.train_seeds(), seed=0)


def process_main(rank: int, folder: Path, port: int) -> None:
    """One process of the pair: evaluate spread and alone, then RL under a global budget."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(PROCESSES),
        RANK=str(rank), LOCAL_RANK=str(rank), NODE_RANK="0",
    )  # fmt: skip
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo", rank=rank, world_size=PROCESSES, timeout=timedelta(seconds=120)
    )
    from bidswarm.lit.strategy import build_strategy
    from bidswarm.lit.swarm_module import SwarmModule
    from bidswarm.rollout.evaluation import evaluate
    from bidswarm.run.phases import evaluate_over_processes

    env, population, loop, collector = build_run(folder)
    written: dict = {}
    # -- evaluation: spread over both processes, then the same in process 0 alone
    seeds = env.heldout_seeds()[:HELDOUT_WORLDS]
    spread = evaluate_over_processes(loop, seeds, RUNS_PER_WORLD, 0, EVAL_BATCH)
    written["spread_is_none"] = spread is None
    if rank == 0:
        alone = evaluate(loop, seeds, RUNS_PER_WORLD, 0, EVAL_BATCH)
        for name, evaluation in (("spread", spread), ("alone", alone)):
            written[name] = {
                "metrics": evaluation.metrics,
                "world_rewards": evaluation.world_rewards,
                "world_pass_at_k": evaluation.world_pass_at_k,
                "usage": evaluation.usage.as_dict(),
                "episodes": [
                    [
                        e.seed,
                        e.total_reward,
                        [(s.actor, s.action and s.action.text) for s in e.steps],
                    ]
                    for e in evaluation.episodes
                ],
            }
    torch.distributed.barrier()
    # -- RL: what this process spends in update 0 (its randomness is (seed, rank, update))
    first = collector.collect(0, rank).usage
    flops = torch.tensor([first.rollout_flops + first.train_flops], dtype=torch.float64)
    torch.distributed.all_reduce(flops)
    # Reached by both processes together after update 0; by neither alone before update 1.
    budget = 0.9 * float(flops)
    module = SwarmModule(population, collector, replace(collector.rl, flop_budget=budget), 1.0)
    logger = RecordingLogger()
    trainer = L.Trainer(
        accelerator="cpu", devices=PROCESSES, strategy=build_strategy("ddp", folder, 0.0, 120),
        max_epochs=collector.total_updates, logger=logger, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0, use_distributed_sampler=False, default_root_dir=str(folder),
    )  # fmt: skip
    trainer.fit(module)
    written |= {
        "update0": first.as_dict(),
        "budget": budget,
        "scheduled": collector.total_updates,
        "history": module.history,
        "logged": logger.logged,
        "usage": module.usage.as_dict(),
    }
    (folder / f"process{rank}.json").write_text(json.dumps(written))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def processes(tmp_path_factory) -> list[dict]:
    folder = tmp_path_factory.mktemp("ddp")
    torch.multiprocessing.start_processes(
        process_main, args=(folder, free_port()), nprocs=PROCESSES, start_method="spawn"
    )
    return [json.loads((folder / f"process{r}.json").read_text()) for r in range(PROCESSES)]


def test_the_logged_tokens_and_flops_are_the_sum_over_the_processes(processes):
    for process in processes:  # every process logs (and checks the budget on) the same totals
        logged = process["logged"][0]
        for name in USAGE_METRICS:
            assert logged[name] == process["history"][0][name]
        spent = [p["update0"] for p in processes]
        assert logged["tokens/rollout"] == sum(u["rollout_tokens"] for u in spent)
        assert logged["tokens/train"] == sum(u["train_tokens"] for u in spent)
        assert logged["flops/train"] == sum(u["train_flops"] for u in spent)
        assert logged["flops/total"] == sum(u["rollout_flops"] + u["train_flops"] for u in spent)
        assert logged["parse_failures/bid"] == sum(u["bid_parse_failures"] for u in spent)
        assert process["usage"] == processes[0]["usage"]
    assert spent[0] != spent[1], "the processes played the same worlds"


def test_every_process_stops_when_the_runs_flops_reach_the_budget(processes):
    """The budget is 0.9 x both processes' FLOPs of update 0, more than either's: counted per
    process it would be reached an update later, perhaps on one process only."""
    for process in processes:
        assert process["scheduled"] == 3
        assert len(process["history"]) == 1
        assert process["history"][0]["flops/total"] >= process["budget"]
        alone = [u["rollout_flops"] + u["train_flops"] for u in (p["update0"] for p in processes)]
        assert max(alone) < process["budget"]


def test_an_evaluation_spread_over_processes_equals_it_in_one(processes):
    zero, one = processes
    assert not zero["spread_is_none"] and one["spread_is_none"]
    spread, alone = zero["spread"], zero["alone"]
    assert spread["metrics"] == alone["metrics"]
    assert spread["metrics"]["episodes"] == HELDOUT_WORLDS * RUNS_PER_WORLD
    for name in ("world_rewards", "world_pass_at_k", "usage", "episodes"):
        assert spread[name] == alone[name], name
