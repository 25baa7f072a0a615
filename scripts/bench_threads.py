"""Two jobs on one machine: each taking every core versus each taking its share.

A parallel local sweep (``hydra/launcher=local``) runs ``n_jobs`` training jobs at once. When
each job keeps torch's default (a thread per core), their threads spin-wait on each other;
``bidswarm.train`` therefore gives each job cores / n_jobs threads (``threads_per_job``). This
runs ``--jobs`` processes at once, each forwarding a batch through a small Llama in a loop,
first with every core per job, then with the share, and prints the combined forwards/s.

    nice -n 10 .venv/bin/python scripts/bench_threads.py            # ~1 min

The last line of stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def job(threads: int, seconds: float, start: mp.Event, results: mp.Queue) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    batch = torch.randint(0, 512, (16, 96))
    with torch.inference_mode():
        model(input_ids=batch)  # warm-up
        start.wait()
        began, forwards = time.perf_counter(), 0
        while time.perf_counter() - began < seconds:
            model(input_ids=batch)
            forwards += 1
    results.put(forwards / (time.perf_counter() - began))


def combined_rate(jobs: int, threads: int, seconds: float) -> float:
    context = mp.get_context("spawn")
    start, results = context.Event(), context.Queue()
    workers = [
        context.Process(target=job, args=(threads, seconds, start, results)) for _ in range(jobs)
    ]
    for worker in workers:
        worker.start()
    time.sleep(3.0)  # let every job build its model before the clock starts
    start.set()
    rates = [results.get() for _ in workers]
    for worker in workers:
        worker.join()
    return sum(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    share = max(1, cores // args.jobs)
    every_core = combined_rate(args.jobs, cores, args.seconds)
    shared = combined_rate(args.jobs, share, args.seconds)
    print(f"{args.jobs} jobs on {cores} cores: {every_core:.1f} forwards/s with {cores} threads "
          f"each, {shared:.1f} with {share} each ({shared / every_core:.2f}x)")  # fmt: skip
    summary = {
        "cores": cores,
        "jobs": args.jobs,
        "forwards_per_s_every_core": round(every_core, 2),
        "forwards_per_s_shared": round(shared, 2),
        "speedup": round(shared / every_core, 2),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
