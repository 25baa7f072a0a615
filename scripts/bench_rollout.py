"""Decisions per second of batched rollouts versus a naive loop, the rollout engines side by
side (``hf`` variants and ``vllm``), and SmolLM2 prefill FLOP/s.

One decision: every agent bids for every live environment, the highest bid acts (argmax, ties
to the first agent), its action is generated, the environment steps. The batched path asks
each agent once per decision step for all environments (one batch, left padding, KV cache,
shared prompt prefix computed once), with a dynamic KV cache and, side by side, with a static
one (``model.kv_cache``; on CUDA also with the compiled decode step, ``model.compile_decode``);
the naive path asks one prompt at a time. LoRA agents' bids (the tiny model with
``model.adapter=lora``) are measured one generation batch per agent against one batch across
all adapters (the ``hf`` engine's batches across adapters).

The rollout engines are measured side by side on the same decisions (:func:`compare_engines`):
each round snapshots the envs, and every engine plays the same decision step from the same
states with the same random stream, each keeping its own state across rounds. A decision step
asks the engine as a rollout does: every agent's bids in one call, then every winner's action
in one call (LoRA agents of one base: one batch across their adapters). ``hf`` variants
(``--hf-engines``, the first the reference): ``plain`` (computes its prompts' shared prefix
anew at every call), ``kept_heads`` (the shared prefix's keys and values kept across calls: the
``hf`` default), ``bf16`` (kept heads and ``model.rollout_dtype=bfloat16``: generation on a
bfloat16 copy of the float32 weights, which also samples by inverse CDF, another random
stream), ``bf16_per_agent`` (one call per agent: no batch across LoRA adapters) and
``bf16_rows<N>`` (batches of at most N rows); vLLM engines (``--vllm``: the schema's settings;
``--vllm-variants``: one per block size and mode, e.g. ``32-eager 128-compiled``, each its own
process, ``make vllm``; ``--vllm-dtype``). Each reports decisions/s, its ratio to the
reference, the share of replies identical to the reference's, the reply tokens it generated
per decision (the work it did), the share of prompt tokens it did not compute
(``engine/prefix_cached_frac``), its warm-up step (a vLLM process's start included) and the gap
of its log-probs of its own sampled tokens to the learner's; for SmolLM2 (``--engine-lora``:
also LoRA agents on one base) and the tiny model (2 heads: head size 32, what vLLM's CPU
attention computes), at each of ``--compare-envs``; with ``--new-tokens N`` also with every
action running to N tokens (no stop token: decode-bound). Then the peak resident memory of
the bench's process (every ``hf`` variant's agents and copies) and of each vLLM process.

    .venv/bin/python scripts/bench_rollout.py                       # default, ~5 min on 2 cores
    .venv/bin/python scripts/bench_rollout.py --tiny-envs 64 --smollm-envs 32 --smollm-rounds 3
    .venv/bin/python scripts/bench_rollout.py --engines-only --threads 1    # SmolLM2 engines
    .venv/bin/python scripts/bench_rollout.py --engines-only --vllm --compare-envs 16 64
    .venv/bin/python scripts/bench_rollout.py --engines-only --skip-tiny-engines --hf-engines \
        bf16 --vllm-variants 32-eager 128-eager --compare-envs 16 64 --new-tokens 20
    .venv/bin/python scripts/bench_rollout.py --device cuda --skip-smollm   # + the engine figures

On an accelerator (``--device cuda``) it also measures the rollout engine on a real-shaped model
(``--shape-model``, default ``llama_1b``, random init): decode tokens/s and their fraction of the
memory-bandwidth roofline (weights + KV cache bytes per step / ``--memory-bandwidth``), and the
MFU of a prefill and of a training step (forward + backward) against the measured bf16 matmul
peak (FLOPs: 2 or 6 x non-embedding parameters x tokens; attention and the head are left out).
The decode figures are taken for each KV cache path (dynamic, static, static + compiled step).

Progress goes to stderr. Each finished section (engine figures first) prints one JSON line
with every figure so far: the last line of stdout is the result, whole or as far as it got.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bidswarm.agents.policy import AgentPolicy, left_pad, positions_from_mask
from bidswarm.agents.population import Population
from bidswarm.agents.prompts import PromptTemplate, parse_bid
from bidswarm.config import Adapter, ModelConfig
from bidswarm.config.machine import vllm_python
from bidswarm.engines import PromptBatch, RolloutEngine
from bidswarm.engines.hf import HFEngine
from bidswarm.engines.vllm_engine import VLLMEngine
from bidswarm.envs.crafting import CraftingEnv
from bidswarm.envs.crafting.config import CraftingConfig
from bidswarm.envs.experts import play_expert_episode
from bidswarm.run.demonstrations import (
    action_limit_worlds,
    action_token_limit,
    expert_demonstrations,
)

CONF = Path(__file__).resolve().parents[1] / "conf"
LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8]
DECODE_PATHS = {  # name: (model.kv_cache, model.compile_decode)
    "dynamic": ("dynamic", False),
    "static": ("static", False),
    "static_compiled": ("static", True),
}
"""The decode paths measured side by side; the compiled one on CUDA only (CUDA graphs)."""


HF_ENGINES = {  # name: (model.rollout_dtype, a decoder's kept_prompt_heads)
    "plain": (None, 0),
    "kept_heads": (None, 4),
    "bf16": (torch.bfloat16, 4),
}
"""The ``hf`` engine's variants measured side by side (:func:`compare_engines`); with
``--hf-engines`` also ``bf16_per_agent`` (one call per agent: no batch across LoRA adapters)
and ``bf16_rows<N>`` (each agent's prompts in batches of at most N rows)."""


class PerCall(RolloutEngine):
    """An engine asked one agent at a time, each agent's prompts in batches of at most
    ``rows`` rows (None: all): what the ``hf`` engine does without one batch across LoRA
    adapters, or with smaller batches."""

    def __init__(self, engine: RolloutEngine, rows: int | None = None):
        self.engine, self.rows, self.name = engine, rows, engine.name

    def generate(self, batches, max_new_tokens, temperature, generator):
        replies = []
        for batch in batches:
            rows = self.rows or max(len(batch.prompt_ids), 1)
            chunks = [
                PromptBatch(batch.policy, batch.prompt_ids[start : start + rows])
                for start in range(0, len(batch.prompt_ids), rows)
            ]
            replies.append(
                [
                    reply
                    for chunk in chunks
                    for reply in self.engine.generate(
                        [chunk], max_new_tokens, temperature, generator
                    )[0]
                ]
            )
        return replies

    def metrics(self):
        return self.engine.metrics()


def hf_variant(name: str) -> RolloutEngine:
    """The ``hf`` engine variant ``name`` (:data:`HF_ENGINES`, ``bf16_per_agent``,
    ``bf16_rows<N>``)."""
    if name in HF_ENGINES:
        return hf_engine(*HF_ENGINES[name])
    if name == "bf16_per_agent":
        return PerCall(hf_engine(torch.bfloat16, 4))
    if name.startswith("bf16_rows"):
        return PerCall(hf_engine(torch.bfloat16, 4), int(name.removeprefix("bf16_rows")))
    raise SystemExit(f"--hf-engines: no variant {name!r}")


def hf_engine(rollout_dtype=None, kept_prompt_heads: int = 4, kv_cache="auto", compiled=False):
    """An ``hf`` engine whose decoders keep ``kept_prompt_heads`` prompt heads."""
    engine = HFEngine(kv_cache, compiled, rollout_dtype)
    make = engine.decoder

    def decoder(policy):
        made = make(policy)
        made.kept_prompt_heads = kept_prompt_heads
        return made

    engine.decoder = decoder
    return engine


def vllm_engine(
    population: Population, dtype: torch.dtype, max_model_len: int, variant: str = "default"
) -> VLLMEngine:
    """The ``vllm`` engine with the schema's settings (``model.vllm``), on this process's
    threads; ``variant``: ``<block size or default>[-eager|-compiled]`` (e.g. ``32-eager``:
    ``model.vllm.block_size=32``, ``model.vllm.enforce_eager=true``; without a mode, the
    schema's)."""
    settings = ModelConfig().vllm
    python = vllm_python(settings)
    if python is None:
        raise SystemExit("the vllm engine needs vLLM's environment: run `make vllm`")
    block, _, mode = variant.partition("-")
    eager = {"eager": True, "compiled": False, "": settings.enforce_eager}[mode]
    block_size = settings.block_size if block == "default" else int(block)
    served = 1 if population.is_lora else len(population)
    return VLLMEngine(
        python, dtype, max_model_len, settings.kv_cache_gib, settings.gpu_memory_utilization,
        eager, torch.get_num_threads(), settings.start_timeout_s, served, 0, block_size,
    )  # fmt: skip


def peak_memory_gib(pid: int | str = "self") -> float:
    """A process's peak resident memory (``VmHWM``), GiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def decode_paths(device: str) -> list[str]:
    return [name for name in DECODE_PATHS if device == "cuda" or name != "static_compiled"]


def decode_path_engine(path: str) -> HFEngine:
    """The ``hf`` engine of a decode path (:data:`DECODE_PATHS`)."""
    kv_cache, compiled = DECODE_PATHS[path]
    return hf_engine(kv_cache=kv_cache, compiled=compiled)


def warmed_up(path: str, run) -> bool:
    """Whether the warm-up ``run()`` of ``path`` worked. A compiled path that fails (no Triton,
    a compiler error) is reported and left out: the check's other figures still come back."""
    try:
        run()
    except Exception as error:
        if not DECODE_PATHS[path][1]:
            raise
        progress(f"{path} left out: {type(error).__name__}: {str(error)[:500]}")
        return False
    return True


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def model_config(name: str) -> ModelConfig:
    raw = OmegaConf.load(CONF / "model" / f"{name}.yaml")
    raw.pop("defaults", None)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), raw))


def tokenizer_corpus(env: CraftingEnv, template: PromptTemplate, episodes: int) -> list[str]:
    texts = [env.task_description] + [env.role_description(role) for role in env.roles]
    for seed in range(episodes):
        demos = play_expert_episode(env, seed, LEVELS).demonstrations
        texts += template.demonstration_texts(demos)
    return texts


class Bench:
    """A population, its prompts and ``n_envs`` crafting worlds, played in lock-step."""

    def __init__(
        self,
        population: Population,
        template: PromptTemplate,
        cfg: ModelConfig,
        max_action_tokens: int,
        engine: RolloutEngine | None = None,
    ):
        self.population = population
        self.template = template
        self.cfg = cfg
        self.max_action_tokens = max_action_tokens
        self.engine = engine or hf_engine()
        self.generations: list | None = None
        """When a list: every generation of the next steps (the engine's log-probs)."""
        self.generator = torch.Generator(population[0].device).manual_seed(0)
        self.next_seed = 0
        self.replies: dict[tuple[str, int, int], list[int]] | None = None
        """When a dict: every reply of the next steps by (kind, agent, env position)."""

    def fresh_envs(self, n_envs: int) -> list[CraftingEnv]:
        envs = []
        for _ in range(n_envs):
            env = CraftingEnv(CraftingConfig())
            env.reset(self.next_seed)
            self.next_seed += 1
            envs.append(env)
        return envs

    def _renew(self, env: CraftingEnv) -> None:
        if env.done:
            env.reset(self.next_seed)
            self.next_seed += 1

    def _record(self, kind: str, agent: int, positions: list[int], replies: list) -> None:
        if self.replies is not None:
            for position, reply in zip(positions, replies, strict=True):
                self.replies[kind, agent, position] = reply.reply_ids

    def generate(self, agent: AgentPolicy, prompts: list[str], max_new_tokens: int) -> list:
        """``agent``'s replies to the prompt texts from the bench's engine."""
        return self.generate_many([agent], [prompts], max_new_tokens)[0]

    def generate_many(
        self, agents: list[AgentPolicy], prompts: list[list[str]], max_new_tokens: int
    ) -> list[list]:
        """Each of ``agents``' replies to its prompt texts, in one call of the bench's engine
        (as a rollout's decision step asks: ``Swarm.bid_many``, ``Swarm.act_many``)."""
        batches = [
            PromptBatch(agent, agent.encode_prompts(texts))
            for agent, texts in zip(agents, prompts, strict=True)
        ]
        replies = self.engine.generate(
            batches, max_new_tokens, self.cfg.temperature, self.generator
        )
        if self.generations is not None:
            self.generations += list(zip(agents, replies, strict=True))
        return replies

    def _bids(self, agent: AgentPolicy, envs: list[CraftingEnv], index: int = 0) -> list[float]:
        prompts = [self.template.bid(agent.role, env.observation(agent.role)) for env in envs]
        replies = self.generate(agent, prompts, self.cfg.max_bid_tokens)
        self._record("bid", index, list(range(len(envs))), replies)
        return [parse_bid(reply.text, LEVELS)[0] for reply in replies]

    def _act(
        self, agent: AgentPolicy, envs: list[CraftingEnv], index: int = 0, positions=None
    ) -> None:
        prompts = [self.template.action(agent.role, env.observation(agent.role)) for env in envs]
        replies = self.generate(agent, prompts, self.max_action_tokens)
        self._record("act", index, positions or list(range(len(envs))), replies)
        for env, reply in zip(envs, replies, strict=True):
            env.step(agent.role, reply.text)
            self._renew(env)

    def batched_step(self, envs: list[CraftingEnv]) -> int:
        """One decision in every env, as a rollout's decision step: every agent's bids for all
        envs in one call of the engine, then every winner's actions in one call."""
        agents = list(self.population)
        bid_prompts = [
            [self.template.bid(agent.role, env.observation(agent.role)) for env in envs]
            for agent in agents
        ]
        bid_replies = self.generate_many(agents, bid_prompts, self.cfg.max_bid_tokens)
        bids = []
        for index, replies in enumerate(bid_replies):
            self._record("bid", index, list(range(len(envs))), replies)
            bids.append([parse_bid(reply.text, LEVELS)[0] for reply in replies])
        winners = [max(range(len(bids)), key=lambda a: (bids[a][e], -a)) for e in range(len(envs))]
        actors = [
            (index, [e for e, winner in enumerate(winners) if winner == index])
            for index in range(len(agents))
        ]
        actors = [(index, mine) for index, mine in actors if mine]
        action_replies = self.generate_many(
            [agents[index] for index, _ in actors],
            [
                [self.template.action(agents[index].role, envs[e].observation(agents[index].role))
                 for e in mine]
                for index, mine in actors
            ],
            self.max_action_tokens,
        )  # fmt: skip
        for (index, mine), replies in zip(actors, action_replies, strict=True):
            self._record("act", index, mine, replies)
            for e, reply in zip(mine, replies, strict=True):
                envs[e].step(agents[index].role, reply.text)
                self._renew(envs[e])
        return len(envs)

    def naive_step(self, envs: list[CraftingEnv]) -> int:
        """One decision in every env, one prompt at a time."""
        for env in envs:
            bids = [self._bids(agent, [env])[0] for agent in self.population]
            winner = max(range(len(bids)), key=lambda a: (bids[a], -a))
            self._act(self.population[winner], [env])
        return len(envs)


def compare_paths(
    bench: Bench, n_envs: int, naive_envs: int, rounds: int, device: str
) -> dict[str, float]:
    """Decisions per second of the batched path with each KV cache (:data:`DECODE_PATHS`) and of
    the naive path (dynamic cache), measured in alternating rounds so that all see the same
    load on a shared machine."""
    batched = []
    engines = {path: decode_path_engine(path) for path in decode_paths(device)}
    for path, engine in engines.items():  # warm-up (allocator, kernels, compilation)
        bench.engine = engine
        if warmed_up(path, lambda: bench.batched_step(bench.fresh_envs(2))):
            batched.append(path)
    envs = {path: bench.fresh_envs(n_envs) for path in batched}
    envs["naive"] = bench.fresh_envs(naive_envs)
    engines["naive"] = decode_path_engine("dynamic")
    seconds = dict.fromkeys(envs, 0.0)
    decisions = dict.fromkeys(envs, 0)
    for _ in range(rounds):
        for path in envs:
            bench.engine = engines[path]
            step = bench.naive_step if path == "naive" else bench.batched_step
            synchronize(torch.device(device))
            start = time.perf_counter()
            decisions[path] += step(envs[path])
            synchronize(torch.device(device))
            seconds[path] += time.perf_counter() - start
    return {path: decisions[path] / seconds[path] for path in envs}


def compare_engines(
    bench: Bench, engines: dict[str, RolloutEngine], n_envs: int, rounds: int, label: str
) -> dict[str, float]:
    """Decisions per second of each rollout engine on the same decisions.

    Each engine keeps its own state across rounds (prompt heads, bfloat16 copy, a vLLM
    process), as in a rollout. Each round snapshots the envs; every engine restores them,
    reseeds the generator with the round's seed and plays one decision step in all of them
    (the first engine last: its step is the one the envs keep). ``same_replies``: the share of
    replies, keyed by kind, agent and env, equal to the first engine's (equal logits and
    sampler give equal replies). ``logprob_gap_*``: |engine - learner| log-prob per sampled
    token of the engine's own replies. ``start_s``: the engine's warm-up step (a vLLM
    process's start and its first weights included). ``prefix_cached_frac``: the share of the
    prompt tokens the engine did not compute (``engine/prefix_cached_frac`` over the rounds).
    ``new_tokens``: every reply runs to that many tokens (bids to their own budget), no stop
    token (None: as a rollout)."""
    first = next(iter(engines))
    order = [name for name in engines if name != first] + [first]
    started: dict[str, float] = {}
    for name in order:
        bench.engine = engines[name]
        start = time.perf_counter()
        bench.batched_step(bench.fresh_envs(2))  # warm-up: allocator, copies, processes
        started[name] = time.perf_counter() - start
        engines[name].metrics()  # counts from here on
    envs = bench.fresh_envs(n_envs)
    seconds = dict.fromkeys(order, 0.0)
    same = dict.fromkeys(order, 0.0)
    generated = dict.fromkeys(order, 0)
    gaps: dict[str, list[torch.Tensor]] = {name: [] for name in order}
    for round_index in range(rounds):
        states, next_seed = [env.snapshot() for env in envs], bench.next_seed
        replies = {}
        for name in order:
            for env, state in zip(envs, states, strict=True):
                env.restore(state)
            bench.next_seed = next_seed
            bench.engine = engines[name]
            bench.generator.manual_seed(1000 + round_index)
            bench.replies = replies[name] = {}
            bench.generations = []
            start = time.perf_counter()
            bench.batched_step(envs)
            seconds[name] += time.perf_counter() - start
            gaps[name].append(learner_gap(bench.generations))
        bench.replies = bench.generations = None
        for name in order:
            reference = replies[first]
            equal = sum(replies[name].get(key) == reply for key, reply in reference.items())
            same[name] += equal / len(reference) / rounds
            generated[name] += sum(len(reply) for reply in replies[name].values())
    result = {f"{label}/envs": float(n_envs), f"{label}/rounds": float(rounds)}
    for name in order:
        gap = torch.cat(gaps[name])
        cached = engines[name].metrics().get("engine/prefix_cached_frac", float("nan"))
        result[f"{label}/{name}_prefix_cached_frac"] = cached
        result |= {
            f"{label}/{name}_decisions_per_s": n_envs * rounds / seconds[name],
            f"{label}/{name}_over_{first}": seconds[first] / seconds[name],
            f"{label}/{name}_same_replies": same[name],
            f"{label}/{name}_reply_tokens_per_decision": generated[name] / (n_envs * rounds),
            f"{label}/{name}_start_s": started[name],
            f"{label}/{name}_logprob_gap_mean": float(gap.mean()),
            f"{label}/{name}_logprob_gap_max": float(gap.max()),
        }
    for key, value in result.items():
        progress(f"{key}: {value:.4g}")
    return result


def learner_gap(generations: list) -> torch.Tensor:
    """|engine - learner| log-prob of each sampled token of ``generations`` ((agent, replies)
    per generation call), the learner's at the bench's temperature (1)."""
    gaps = []
    for agent, replies in generations:
        prompt_ids = [g.prompt_ids for g in replies]
        reply_ids = [g.reply_ids for g in replies]
        with torch.no_grad():
            logprobs, _ = agent.reply_token_logprobs(prompt_ids, reply_ids)
        for row, generation in enumerate(replies):
            n = len(generation.reply_ids)
            if n:
                engine = torch.tensor(generation.logprobs, device=logprobs.device)
                gaps.append((logprobs[row, :n] - engine).abs().cpu())
    return torch.cat(gaps) if gaps else torch.zeros(1)


def engines_for(
    bench: Bench,
    hf: list[str],
    vllm: list[str],
    vllm_dtype: torch.dtype,
    max_model_len: int,
) -> dict[str, RolloutEngine]:
    """The ``hf`` variants named in ``hf`` (:func:`hf_variant`; the first is the reference of
    the comparison) and a vLLM engine per variant in ``vllm`` (:func:`vllm_engine`), named
    ``vllm`` for ``default``, else ``vllm_<variant>``."""
    engines: dict[str, RolloutEngine] = {name: hf_variant(name) for name in hf}
    for variant in vllm:
        name = "vllm" if variant == "default" else f"vllm_{variant}".replace("-", "_")
        engines[name] = vllm_engine(bench.population, vllm_dtype, max_model_len, variant)
    return engines


def compare_lora_bids(name: str, n_envs: int, rounds: int, device: str) -> dict[str, float]:
    """Bids per second of LoRA agents (``name``, a model built from its shape, with
    ``model.adapter=lora``): one generation batch per agent against one batch across all
    adapters, in alternating rounds."""
    cfg = model_config(name)
    cfg.adapter = Adapter.lora
    env = CraftingEnv(CraftingConfig())
    torch.manual_seed(0)
    corpus = tokenizer_corpus(env, PromptTemplate.for_env(env, cfg.prompt_style, None, LEVELS), 8)
    with torch.device(device):
        population = Population.build(cfg, list(env.roles), 1, corpus)
    template = PromptTemplate.for_env(env, cfg.prompt_style, population[0].tokenizer, LEVELS)
    bench = Bench(population, template, cfg, cfg.max_bid_tokens)
    envs = bench.fresh_envs(n_envs)
    prompts = [
        [template.bid(agent.role, env.observation(agent.role)) for env in envs]
        for agent in population
    ]

    batches = [
        PromptBatch(agent, agent.encode_prompts(agent_prompts))
        for agent, agent_prompts in zip(population, prompts, strict=True)
    ]

    def per_agent():
        for batch in batches:
            bench.engine.generate([batch], cfg.max_bid_tokens, cfg.temperature, bench.generator)

    def across_adapters():
        bench.engine.generate(batches, cfg.max_bid_tokens, cfg.temperature, bench.generator)

    paths = {"per_agent": per_agent, "across_adapters": across_adapters}
    seconds = dict.fromkeys(paths, 0.0)
    for run in paths.values():
        run()  # warm-up
    for _ in range(rounds):
        for path, run in paths.items():
            synchronize(torch.device(device))
            start = time.perf_counter()
            run()
            synchronize(torch.device(device))
            seconds[path] += time.perf_counter() - start
    bids = rounds * n_envs * len(population)
    result = {f"{name}/lora_bids_per_s/{path}": bids / seconds[path] for path in paths}
    result[f"{name}/lora_bids/across_over_per_agent"] = (
        seconds["per_agent"] / seconds["across_adapters"]
    )
    for key, value in result.items():
        progress(f"{key}: {value:.4g}")
    return result


def build_bench(
    name: str, device: str = "cpu", heads: int | None = None, lora: bool = False
) -> Bench:
    """The agents of model config ``name`` (one per crafting role) and their prompts; a tiny
    model with ``heads`` attention heads when given (2: head size 32, what vLLM's CPU
    attention computes); with ``lora``, one base and an adapter per agent
    (``model.adapter=lora``)."""
    cfg = model_config(name)
    if heads is not None:
        cfg.tiny.num_heads = heads
    if lora:
        cfg.adapter = Adapter.lora
    env = CraftingEnv(CraftingConfig())
    torch.manual_seed(0)
    started = time.perf_counter()
    corpus = None
    if cfg.source == "tiny":
        corpus = tokenizer_corpus(
            env, PromptTemplate.for_env(env, cfg.prompt_style, None, LEVELS), 8
        )
    population = Population.build(cfg, list(env.roles), 1, corpus).to(device)
    population.eval()
    template = PromptTemplate.for_env(env, cfg.prompt_style, population[0].tokenizer, LEVELS)
    progress(f"{name}: built {len(population)} agents in {time.perf_counter() - started:.1f}s")
    demos = expert_demonstrations(env, action_limit_worlds(env), LEVELS)
    budget = action_token_limit(cfg.max_action_tokens, demos, template, population[0].tokenizer)
    return Bench(population, template, cfg, budget)


def bench_model(
    name: str, bench: Bench, n_envs: int, rounds: int, naive_envs: int, device: str = "cpu"
) -> dict[str, float]:
    cfg, population, template = bench.cfg, bench.population, bench.template
    rates = compare_paths(bench, n_envs, naive_envs, rounds, device)
    batched, naive = rates["dynamic"], rates["naive"]
    for path, rate in rates.items():
        envs = naive_envs if path == "naive" else n_envs
        progress(f"{name}: {path} {rate:.2f} decisions/s ({envs} envs x {rounds} rounds)")
    result = {
        f"{name}/envs": float(n_envs),
        f"{name}/batched_decisions": float(n_envs * rounds),
        f"{name}/naive_decisions": float(naive_envs * rounds),
        f"{name}/batched_decisions_per_s": batched,
        f"{name}/naive_decisions_per_s": naive,
        f"{name}/speedup": batched / naive,
    }
    for path in [path for path in rates if path not in ("dynamic", "naive")]:
        result[f"{name}/batched_{path}_decisions_per_s"] = rates[path]
        result[f"{name}/{path}_over_dynamic"] = rates[path] / batched
    if cfg.source != "tiny" and device == "cpu":
        result.update(prefill_efficiency(name, population[0], template, bench, n_envs))
    return result


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_best(run, device: torch.device, repeats: int = 3) -> float:
    """The fastest of ``repeats`` runs of ``run()``, in seconds, after one warm-up run."""
    run()
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        run()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def bf16_matmul_peak(device: torch.device, size: int = 8192) -> float:
    """Best bf16 FLOP/s of a square matmul on ``device`` (the MFU denominator)."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    return 2 * size**3 / timed_best(lambda: torch.mm(a, b), device, repeats=10)


def engine_figures(
    name: str, device: torch.device, n_envs: int, new_tokens: int, bandwidth: float, matmul: int
) -> dict[str, float]:
    """Decode roofline fraction, prefill and training-step MFU of one ``name`` agent."""
    cfg = model_config(name)
    env = CraftingEnv(CraftingConfig())
    corpus = tokenizer_corpus(env, PromptTemplate.for_env(env, cfg.prompt_style, None, LEVELS), 8)
    torch.manual_seed(0)
    with torch.device(device):
        agent = Population.build(cfg, [env.roles[0]], 1, corpus)[0]
    agent.model.eval()
    template = PromptTemplate.for_env(env, cfg.prompt_style, agent.tokenizer, LEVELS)
    bench = Bench(Population([agent]), template, cfg, new_tokens)
    envs = bench.fresh_envs(n_envs)
    prompts = [template.action(agent.role, e.observation(agent.role)) for e in envs]
    ids = agent.encode_prompts(prompts)
    model = agent.model.config
    params = sum(p.numel() for p in agent.model.parameters())
    embedding = agent.model.get_input_embeddings().weight.numel()
    dense = params - embedding
    weight_bytes = sum(p.numel() * p.element_size() for p in agent.model.parameters())
    peak = bf16_matmul_peak(device, matmul)
    progress(f"{name} on {device}: {params / 1e9:.2f}B parameters, bf16 peak {peak / 1e12:.0f} TF")

    input_ids, mask = left_pad(ids, agent.pad_id, device)
    tokens = int(mask.sum())

    def prefill():
        with torch.no_grad():
            agent.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions_from_mask(mask),
                use_cache=True,
                logits_to_keep=1,
            )

    prefill_s = timed_best(prefill, device)
    agent.stop_ids = [-1]  # no row stops: every row decodes new_tokens tokens

    def generate():
        bench.generate(agent, prompts, new_tokens)

    decode_s = {}
    for path in decode_paths(device.type):
        bench.engine = decode_path_engine(path)
        if warmed_up(path, generate):
            decode_s[path] = max(timed_best(generate, device) - prefill_s, 1e-9)
    head_dim = model.head_dim or model.hidden_size // model.num_attention_heads
    kv_per_token = 2 * model.num_hidden_layers * model.num_key_value_heads * head_dim
    kv_per_token *= agent.model.dtype.itemsize
    mean_context = mask.shape[1] + new_tokens / 2
    step_bytes = weight_bytes + kv_per_token * mean_context * n_envs
    roofline_s = (new_tokens - 1) * step_bytes / bandwidth

    replies = [[5] * 16 for _ in ids]
    agent.model.train()
    train_tokens = sum(len(p) + 16 for p in ids)

    def train_step():
        logp, lengths = agent.reply_token_logprobs(ids, replies)
        (logp * lengths).sum().backward()
        agent.model.zero_grad(set_to_none=True)

    train_s = timed_best(train_step, device)
    figures = {
        "parameters": float(params),
        "envs": float(n_envs),
        "bf16_matmul_peak_flops_per_s": peak,
        "prefill_tokens": float(tokens),
        "prefill_s": prefill_s,
        "prefill_mfu": 2 * dense * tokens / prefill_s / peak,
        "decode_tokens_per_s": n_envs * (new_tokens - 1) / decode_s["dynamic"],
        "decode_fraction_of_roofline": roofline_s / decode_s["dynamic"],
        "train_tokens": float(train_tokens),
        "train_step_s": train_s,
        "train_step_mfu": 6 * dense * train_tokens / train_s / peak,
    }
    for path in [path for path in decode_s if path != "dynamic"]:
        figures[f"decode_tokens_per_s_{path}"] = n_envs * (new_tokens - 1) / decode_s[path]
        figures[f"decode_fraction_of_roofline_{path}"] = roofline_s / decode_s[path]
        figures[f"decode_{path}_over_dynamic"] = decode_s["dynamic"] / decode_s[path]
    for key, value in figures.items():
        progress(f"{name}/engine/{key}: {value:.4g}")
    return {f"{name}/engine/{key}": value for key, value in figures.items()}


def matmul_peak_flops(sizes: tuple[int, ...] = (512, 1024, 2048, 3072), repeats: int = 8) -> float:
    """Best fp32 FLOP/s of square matmuls of several sizes on this machine, as torch runs now."""
    best = 0.0
    for size in sizes:
        a, b = torch.randn(size, size), torch.randn(size, size)
        torch.mm(a, b)
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2 * size**3 / (time.perf_counter() - start))
    return best


def prefill_efficiency(
    name: str, agent: AgentPolicy, template: PromptTemplate, bench: Bench, n_envs: int
) -> dict[str, float]:
    """Achieved FLOP/s of one batched prompt forward (2 * params * tokens) vs the matmul peak."""
    envs = bench.fresh_envs(n_envs)
    prompts = [template.bid(agent.role, env.observation(agent.role)) for env in envs]
    ids = agent.encode_prompts(prompts)
    input_ids, mask = left_pad(ids, agent.pad_id, agent.device)
    params = sum(p.numel() for p in agent.parameters())
    embedding = agent.model.get_input_embeddings().weight.numel()
    tokens = int(mask.sum())
    best = float("inf")
    with torch.no_grad():
        for _ in range(3):
            start = time.perf_counter()
            agent.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions_from_mask(mask),
                use_cache=False,
                logits_to_keep=1,
            )
            best = min(best, time.perf_counter() - start)
    achieved = 2 * params * tokens / best
    peak = matmul_peak_flops()
    progress(
        f"{name}: prefill {tokens} tokens in {best:.2f}s = {achieved / 1e9:.1f} GFLOP/s; "
        f"fp32 matmul peak {peak / 1e9:.1f} GFLOP/s ({achieved / peak:.0%})"
    )
    return {
        f"{name}/prefill_tokens": float(tokens),
        f"{name}/prefill_flops_per_s": achieved,
        f"{name}/matmul_peak_flops_per_s": peak,
        f"{name}/prefill_fraction_of_peak": achieved / peak,
        # Without the embedding table (a lookup, not a matmul; the head runs on one position).
        f"{name}/prefill_fraction_of_peak_non_embedding": 2
        * (params - embedding)
        * tokens
        / best
        / peak,
    }


def vllm_dtype_for(asked: str | None, device: str) -> torch.dtype:
    """``--vllm-dtype``, else bfloat16 on a GPU or a CPU with bfloat16 matmul units, float32
    elsewhere (emulated bfloat16 matmuls are slower than float32)."""
    if asked is not None:
        return getattr(torch, asked)
    native = device != "cpu" or torch.backends.cpu.get_cpu_capability() == "AVX512"
    native = native and (device != "cpu" or torch.cpu._is_avx512_bf16_supported())
    return torch.bfloat16 if native else torch.float32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny-envs", type=int, default=32)
    parser.add_argument("--tiny-rounds", type=int, default=3, help="decision steps per path")
    parser.add_argument("--tiny-naive-envs", type=int, default=8, help="envs of the naive loop")
    parser.add_argument("--smollm-envs", type=int, default=16)
    parser.add_argument("--smollm-rounds", type=int, default=1)
    parser.add_argument("--smollm-naive-envs", type=int, default=2)
    parser.add_argument("--skip-smollm", action="store_true")
    parser.add_argument(
        "--engine-rounds", type=int, default=3, help="decision steps of SmolLM2's engines"
    )
    parser.add_argument(
        "--engines-only", action="store_true", help="only the rollout engines side by side"
    )
    parser.add_argument(
        "--compare-envs", type=int, nargs="+", default=[16], help="envs of the engine comparison"
    )
    parser.add_argument("--vllm", action="store_true", help="also the vLLM engine (make vllm)")
    parser.add_argument(
        "--vllm-variants",
        nargs="*",
        default=[],
        help="vLLM engines side by side, each <block size|default>[-eager|-compiled], e.g. "
        "32-eager 128-eager (implies --vllm; each is a process of its own)",
    )
    parser.add_argument(
        "--hf-engines",
        nargs="+",
        default=list(HF_ENGINES),
        help="hf variants compared, the first the reference: plain kept_heads bf16 "
        "bf16_per_agent bf16_rows<N>",
    )
    parser.add_argument(
        "--new-tokens",
        type=int,
        default=0,
        help="also compare the engines with every action running to this many tokens, no stop "
        "token (decode-bound; 0: not)",
    )
    parser.add_argument(
        "--new-tokens-envs", type=int, nargs="+", default=[16], help="envs of --new-tokens"
    )
    parser.add_argument(
        "--engine-models",
        nargs="*",
        default=[],
        help="model configs whose engines are compared beside SmolLM2's (e.g. llama_1b)",
    )
    parser.add_argument(
        "--engine-lora",
        action="store_true",
        help="also compare the engines on LoRA agents (one base, an adapter per agent)",
    )
    parser.add_argument(
        "--vllm-dtype",
        default=None,
        help="vLLM's dtype (default: bfloat16 where the CPU has bfloat16 matmuls "
        "(AVX512-BF16/AMX) or on a GPU, else float32)",
    )
    parser.add_argument(
        "--tiny-threads",
        type=int,
        default=1,
        help="torch threads for the tiny model (its ops are too small to split; extra threads "
        "only spin-wait on a shared machine)",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads for SmolLM2 (0: all)")
    parser.add_argument(
        "--skip-tiny-engines", action="store_true", help="with --vllm: not the tiny model's engines"
    )
    parser.add_argument(
        "--skip-full",
        action="store_true",
        help="with --engine-lora: only the LoRA agents' engines, not the full models'",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--shape-model",
        default=None,
        help="model config of the engine figures (default on cuda: llama_1b; none on cpu)",
    )
    parser.add_argument("--engine-envs", type=int, default=64)
    parser.add_argument("--engine-new-tokens", type=int, default=32)
    parser.add_argument("--engine-matmul", type=int, default=8192, help="matmul size of the peak")
    parser.add_argument(
        "--memory-bandwidth", type=float, default=4.8e12, help="bytes/s (H200: 4.8e12)"
    )
    args = parser.parse_args()
    args.vllm = args.vllm or bool(args.vllm_variants)
    default_threads = torch.get_num_threads()
    figures: dict[str, float] = {}
    sections = []
    shape = args.shape_model or ("llama_1b" if args.device != "cpu" else None)
    if shape:  # the targets first: a check cut short by its time limit still has them
        sections.append(
            lambda: engine_figures(
                shape,
                torch.device(args.device),
                args.engine_envs,
                args.engine_new_tokens,
                args.memory_bandwidth,
                args.engine_matmul,
            )
        )

    def tiny() -> dict[str, float]:
        torch.set_num_threads(args.tiny_threads)
        bench = build_bench("tiny", args.device)
        return {"tiny/threads": float(args.tiny_threads)} | bench_model(
            "tiny", bench, args.tiny_envs, args.tiny_rounds, args.tiny_naive_envs, args.device
        )

    vllm_dtype = vllm_dtype_for(args.vllm_dtype, args.device)

    def engines_of(name: str, heads: int | None = None, lora: bool = False) -> dict[str, float]:
        bench = build_bench(name, args.device, heads, lora)
        cfg = bench.cfg
        longest = cfg.max_prompt_tokens + max(
            cfg.max_bid_tokens, bench.max_action_tokens, args.new_tokens or 0
        )
        vllm_variants = args.vllm_variants or (["default"] if args.vllm else [])
        # One call per agent is what the hf engine does for agents of their own weights.
        hf = [n for n in args.hf_engines if lora or n != "bf16_per_agent"]
        engines = engines_for(bench, hf, vllm_variants, vllm_dtype, longest)
        name = f"{name}_lora" if lora else name
        figures = {f"{name}/engines/threads": float(torch.get_num_threads())}
        try:
            for n_envs in args.compare_envs:
                label = f"{name}/engines/{n_envs}_envs"
                figures |= compare_engines(bench, engines, n_envs, args.engine_rounds, label)
            if args.new_tokens:  # decode-bound: every action runs to new_tokens tokens
                kept = bench.max_action_tokens, [agent.stop_ids for agent in bench.population]
                bench.max_action_tokens = args.new_tokens
                for agent in bench.population:
                    agent.stop_ids = []
                try:
                    for n_envs in args.new_tokens_envs:
                        label = f"{name}/engines/{n_envs}_envs_{args.new_tokens}_new_tokens"
                        figures |= compare_engines(
                            bench, engines, n_envs, args.engine_rounds, label
                        )
                finally:
                    bench.max_action_tokens = kept[0]
                    for agent, stop_ids in zip(bench.population, kept[1], strict=True):
                        agent.stop_ids = stop_ids
            figures[f"{name}/engines/peak_memory_gib/trainer"] = peak_memory_gib()
            for engine_name, engine in engines.items():
                if not isinstance(engine, VLLMEngine):
                    continue
                figures[f"{name}/engines/vllm_dtype"] = str(vllm_dtype).removeprefix("torch.")
                memory = peak_memory_gib(engine.pid)
                figures[f"{name}/engines/peak_memory_gib/{engine_name}_process"] = memory
                figures |= {
                    f"{name}/engines/{engine_name}/{key.removeprefix('time/engine_')}": value
                    for key, value in engine.metrics().items()
                    if key.startswith("time/")
                }
            for key, value in figures.items():
                if "peak_memory" in key or key.endswith("_s"):
                    progress(f"{key}: {value:.4g}")
        finally:
            for engine in engines.values():
                engine.close()
        return figures

    def tiny_engines() -> dict[str, float]:
        torch.set_num_threads(args.tiny_threads)
        return engines_of("tiny", heads=2)

    if not args.engines_only:
        sections += [
            tiny,
            lambda: compare_lora_bids("tiny", args.tiny_envs, args.tiny_rounds, args.device),
        ]
    if args.vllm and not args.skip_tiny_engines:
        sections.append(tiny_engines)
    if not args.skip_smollm:

        def smollm() -> dict[str, float]:
            torch.set_num_threads(args.threads or default_threads)
            figures = {"smollm2_135m/threads": float(torch.get_num_threads())}
            if not args.engines_only:
                bench = build_bench("smollm2_135m", args.device)
                figures |= bench_model(
                    "smollm2_135m",
                    bench,
                    args.smollm_envs,
                    args.smollm_rounds,
                    args.smollm_naive_envs,
                    args.device,
                )
            return figures if args.skip_full else figures | engines_of("smollm2_135m")

        sections.append(smollm)
    for model in args.engine_models:  # shapes beside SmolLM2, e.g. llama_1b on a GPU
        sections.append(lambda model=model: engines_of(model))
    if args.engine_lora:
        for model in ([] if args.skip_smollm else ["smollm2_135m"]) + args.engine_models:
            sections.append(lambda model=model: engines_of(model, lora=True))
    if shape:
        sections.append(lambda: compare_lora_bids(shape, args.engine_envs, 2, args.device))
    for section in sections:
        figures.update(section())
        # One JSON line per finished section, each holding every figure so far: the last line
        # is the whole result, or as much of it as a time limit let finish.
        print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
