"""``model.engine=hf``: bidswarm's own decode loop over the agents' transformers models.

Batched over many environments in one forward batch (left padding, KV cache). What makes it
fast on a CPU (docs/performance.md): the prompt head shared by a batch's rows is computed once
and kept across calls (``engines/prompt_heads.py``), ``model.rollout_dtype`` generates on a
cast copy of the weights (bfloat16 matmuls for float32 weights), a static KV cache and CUDA
graphs on an accelerator. Sampling, scoring and the learner's gradient forward agree on
padding (left), position ids (from the mask: ``agents/policy.py`` ``positions_from_mask``) and
temperature: the learner's side is :class:`~bidswarm.agents.policy.AgentPolicy`, this module is
the sampler's.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel, StaticCache

from bidswarm.agents.branching import branch_logprobs
from bidswarm.agents.policy import (
    AgentPolicy,
    left_pad,
    positions_from_mask,
    share_one_lora_model,
    shared_prefix_length,
)
from bidswarm.engines.base import (
    Generation,
    PromptBatch,
    RolloutEngine,
    finished_generations,
    rollout_dtype,
)
from bidswarm.engines.prompt_heads import (
    KEPT_PROMPT_HEADS,
    MIN_SHARED_PREFIX,
    PromptHead,
    prompt_head,
)
from bidswarm.engines.sampling import sample_tokens, token_logprobs

STATIC_CACHE_BLOCK = 64
"""A static KV cache holds a multiple of this many tokens per row (:func:`static_cache_slots`)."""


def static_cache_slots(tokens: int) -> int:
    """Slots per row of a static KV cache for ``tokens`` tokens: rounded up to a multiple of
    :data:`STATIC_CACHE_BLOCK`, so that calls with similar prompt widths share one shape (one
    compiled decode step, one CUDA graph, reused allocator blocks)."""
    return -(-tokens // STATIC_CACHE_BLOCK) * STATIC_CACHE_BLOCK


class CastCopies:
    """Copies of models with their parameters cast to a rollout dtype, one per source model,
    each refreshed in place when its source's weights changed (:func:`weights_version`). An
    engine's decoders share it, so LoRA agents of one shared peft model generate on one copy
    (base and every adapter), refreshed once per update whichever agent asks first."""

    def __init__(self) -> None:
        self._copies: weakref.WeakKeyDictionary[PreTrainedModel, tuple[tuple, PreTrainedModel]]
        self._copies = weakref.WeakKeyDictionary()

    def of(self, model: PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
        """``model``'s copy in ``dtype``, as its weights are now."""
        version = (weights_version(model), dtype)
        kept = self._copies.get(model)
        if kept is not None and kept[0] == version:
            return kept[1]
        copied = cast_copy(model, dtype, kept[1] if kept is not None else None)
        self._copies[model] = (version, copied)
        return copied


def weights_version(model: PreTrainedModel) -> tuple[tuple[int, int], ...]:
    """Changes whenever a parameter of ``model`` is written (an optimizer step) or replaced."""
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


def cast_copy(
    model: PreTrainedModel, dtype: torch.dtype, kept: PreTrainedModel | None
) -> PreTrainedModel:
    """A copy of ``model`` with its parameters in ``dtype`` (buffers, e.g. the rotary
    frequencies, kept): ``kept`` refreshed in place when it is one on the same device, else a
    new one."""
    with torch.inference_mode(False), torch.no_grad():  # plain tensors, writable later
        if kept is not None and kept.device == model.device:
            for target, source in zip(kept.parameters(), model.parameters(), strict=True):
                target.copy_(source)
            return kept
        copied = copy.deepcopy(model).eval().requires_grad_(False)
        for parameter in copied.parameters():
            parameter.data = parameter.data.to(dtype)
        return copied


@dataclass
class RolloutWeights:
    """What a decoder keeps between calls, valid for the weights it was made from:
    ``version`` (:func:`weights_version`) and ``dtype`` (the rollout dtype asked for).
    ``model``: the copy of the weights in the rollout dtype (None: generation runs on the
    weights themselves); ``heads``: the kept prompt heads, most recent first."""

    version: tuple[tuple[int, int], ...] = ()
    dtype: torch.dtype | None = None
    model: PreTrainedModel | None = None
    heads: list[PromptHead] = field(default_factory=list)


class HFDecoder:
    """One agent's decode loop (:class:`HFEngine` keeps one per agent).

    kv_cache: ``dynamic`` (grows by a token per decode step), ``static`` (preallocated for the
    prompt and the longest reply: fixed shapes per step, what CUDA graphs need) or ``auto``
    (static on CUDA) (``model.kv_cache``). compile_decode: compile the one-token decode forward
    with CUDA graphs, for a static cache on CUDA only (``model.compile_decode``).
    rollout_dtype: the dtype generation and rollout scoring run in (``model.rollout_dtype``;
    None: the weights' own). Another one runs on a copy of the weights cast to it
    (:meth:`rollout_model`); on the copy, generation also reads its logits from a contiguous
    gather (:meth:`_logits_to_keep`) and samples by inverse CDF (:func:`sample_tokens`):
    faster, other floats and another random stream than the weights' own generation.
    kept_prompt_heads: prompt heads (the prefix shared by every prompt of a batch) whose keys
    and values are kept across calls: the system turn of a chat template and the task text run
    once per agent, not once per call; dropped when the weights change.
    stop_check_every: decode steps between checks that every row stopped (None: 1 on CPU, 8
    elsewhere). min_shared_prefix: the shortest prompt head a batch computes once.
    """

    def __init__(
        self,
        policy: AgentPolicy,
        kv_cache: str,
        compile_decode: bool,
        rollout_dtype: torch.dtype | None,
        cast_copies: CastCopies | None = None,
    ):
        self.policy = policy
        self.cast_copies = CastCopies() if cast_copies is None else cast_copies
        self.kv_cache = kv_cache
        self.compile_decode = compile_decode
        self.rollout_dtype = rollout_dtype
        self.kept_prompt_heads = KEPT_PROMPT_HEADS
        self.min_shared_prefix = MIN_SHARED_PREFIX
        self.stop_check_every: int | None = None
        self._rollout = RolloutWeights()
        self._compiled_decode = None

    @property
    def device(self) -> torch.device:
        return self.policy.device

    def rollout_model(self) -> PreTrainedModel:
        """The model that generates and scores at rollout time: the policy's model, or its copy
        in ``rollout_dtype`` (:class:`CastCopies`: made the first time, refreshed after the
        weights changed; LoRA agents share the copy of their shared peft model, each routed
        through its own adapter). A change also drops the kept prompt heads."""
        model = self.policy.model
        state = self._rollout
        version = weights_version(model)
        if version == state.version and self.rollout_dtype == state.dtype:
            return state.model or model
        state.heads.clear()
        state.version, state.dtype = version, self.rollout_dtype
        if self.rollout_dtype in (None, model.dtype):
            state.model = None
            return model
        state.model = self.cast_copies.of(model, self.rollout_dtype)
        return state.model

    def uses_static_cache(self) -> bool:
        """Whether :meth:`generate` decodes into a preallocated :class:`StaticCache`."""
        if self.kv_cache == "auto":
            return self.device.type == "cuda"
        return self.kv_cache == "static"

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: list[list[int]],
        max_new_tokens: int,
        temperature: float,
        generator: torch.Generator | None = None,
    ) -> list[Generation]:
        """Sample one reply per prompt, all prompts in one batch (left padding, KV cache).

        Each row stops at its first end-of-sequence token (kept in ``reply_ids``) or after
        ``max_new_tokens``. ``generator`` (on the model's device) makes sampling reproducible.
        """
        if not prompt_ids:
            return []
        model = self.rollout_model()
        self.policy.use_own_adapter(model)
        return self.decode(model, prompt_ids, None, max_new_tokens, temperature, generator)

    def decode(
        self,
        model: PreTrainedModel,
        prompt_ids: list[list[int]],
        adapter_names: list[str] | None,
        max_new_tokens: int,
        temperature: float,
        generator: torch.Generator | None,
    ) -> list[Generation]:
        """The decode loop of :meth:`generate` on ``model`` (:meth:`rollout_model`);
        ``adapter_names`` routes each row through its own LoRA adapter of the shared peft model
        (:meth:`HFEngine.generate` for LoRA agents of one base)."""
        device = self.device
        stop = torch.tensor(self.policy.stop_ids, device=device)
        pad_id = self.policy.pad_id
        routing = {} if adapter_names is None else {"adapter_names": adapter_names}
        was_training = model.training
        model.eval()
        width = max(len(ids) for ids in prompt_ids)
        static = self.uses_static_cache()
        slots = static_cache_slots(width + max_new_tokens) if static else width + max_new_tokens
        cache = StaticCache(config=model.config, max_cache_len=slots) if static else None
        # One mask for prompt and reply, preallocated: each decode step writes its column
        # instead of concatenating a new mask. A static cache attends over all its slots, so it
        # sees the whole mask (fixed shape); a dynamic one the columns it holds so far.
        attention_mask = torch.zeros((len(prompt_ids), slots), dtype=torch.long, device=device)
        out, next_positions, shared_prefix = self._prefill(
            model, prompt_ids, attention_mask, cache, routing
        )
        step_forward = self._decode_step_forward(model, static)
        finished = torch.zeros(len(prompt_ids), dtype=torch.bool, device=device)
        # Whether every row has stopped is a host sync; on an accelerator it is asked every few
        # tokens only (rows that stopped decode padding, cut off afterwards), so the device
        # runs ahead of the host.
        check_every = self.stop_check_every or (1 if device.type == "cpu" else 8)
        sampled: list[Tensor] = []
        logprobs: list[Tensor] = []
        fast_sampling = model is not self.policy.model  # the rollout copy (rollout_model)
        for step in range(max_new_tokens):
            logits = out.logits[:, -1, :]
            tokens = sample_tokens(logits, temperature, generator, fast_sampling)
            tokens = torch.where(finished, pad_id, tokens)
            sampled.append(tokens)
            logprobs.append(token_logprobs(logits, tokens, temperature))
            finished |= torch.isin(tokens, stop)
            if step == max_new_tokens - 1:
                break
            if (step + 1) % check_every == 0 and bool(finished.all()):
                break
            attention_mask[:, width + step] = 1
            visible = attention_mask if static else attention_mask[:, : width + step + 1]
            out = step_forward(
                input_ids=tokens[:, None],
                attention_mask=visible,
                position_ids=next_positions,
                past_key_values=out.past_key_values,
                use_cache=True,
                **routing,
            )
            next_positions = next_positions + 1
        model.train(was_training)
        if not sampled:
            rows, row_logprobs = [[] for _ in prompt_ids], [[] for _ in prompt_ids]
        else:
            rows = torch.stack(sampled, dim=1).tolist()
            row_logprobs = torch.stack(logprobs, dim=1).tolist()
        return finished_generations(self.policy, prompt_ids, rows, row_logprobs, shared_prefix)

    def _decode_step_forward(self, model: PreTrainedModel, static: bool):
        """``model``'s forward for one token per row: compiled with CUDA graphs
        (``compile_decode``) when the cache is static on a CUDA device, else the plain one.
        CUDA graphs replay fixed shapes only; a dynamic cache grows every step."""
        if not (self.compile_decode and static and self.device.type == "cuda"):
            return model
        if self._compiled_decode is None or self._compiled_decode[0] is not model:
            # The bound forward, not the module: a compiled module assigned here would be
            # registered as a second copy of the agent's parameters.
            compiled = torch.compile(model.forward, mode="reduce-overhead")

            def step_forward(**inputs):
                # Each step replays the graph anew: the previous step's outputs (read before
                # this call) may be overwritten.
                torch.compiler.cudagraph_mark_step_begin()
                return compiled(**inputs)

            self._compiled_decode = (model, step_forward)
        return self._compiled_decode[1]

    def _prefill(
        self,
        model: PreTrainedModel,
        prompt_ids: list[list[int]],
        attention_mask: Tensor,
        cache: StaticCache | None,
        routing: dict[str, list[str]],
    ):
        """Forward the prompts into a KV cache (``cache``, or a new dynamic one); a long
        prefix shared by all rows runs once. Writes the prompts' columns of ``attention_mask``
        [B, slots] (prompts left-padded to the longest) and returns the model output, the
        position ids [B, 1] of the first reply token and the length of the prefix run once.

        Prompts of one agent share the task and role text (chat templates put it first), so
        the prefix (the prompt head, :meth:`_prompt_head`) is computed for one row and written
        into every row of the cache, and only the differing suffixes (left-padded after the
        prefix) run for every row. Rows routed through different LoRA adapters (``routing``)
        never share a prefix: its keys and values depend on the adapter.
        """
        pad_id, device = self.policy.pad_id, self.device
        width = max(len(ids) for ids in prompt_ids)
        prefix = shared_prefix_length(prompt_ids)
        if len(prompt_ids) < 2 or prefix < self.min_shared_prefix or routing:
            input_ids, prompt_mask = left_pad(prompt_ids, pad_id, device)
            head_length = 0
        else:
            head = self._prompt_head(model, prompt_ids[0][:prefix])
            cache = DynamicCache(config=model.config) if cache is None else cache
            rows = (len(prompt_ids), -1, -1, -1)
            for index, (keys, values) in enumerate(zip(head.keys, head.values, strict=True)):
                # The cache's own update copies the row into every row (a static cache
                # allocates itself at the batch size here).
                cache.update(keys.expand(rows), values.expand(rows), index)
            input_ids, prompt_mask = left_pad([ids[prefix:] for ids in prompt_ids], pad_id, device)
            head_length = prefix
        attention_mask[:, :head_length] = 1
        attention_mask[:, head_length:width] = prompt_mask
        static = isinstance(cache, StaticCache)
        position_ids = head_length + positions_from_mask(prompt_mask)
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask if static else attention_mask[:, :width],
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=self._logits_to_keep(model, input_ids.shape[1], 1),
            **routing,
        )
        return out, position_ids[:, -1:] + 1, head_length

    def _logits_to_keep(self, model: PreTrainedModel, width: int, keep: int) -> int | Tensor:
        """The ``logits_to_keep`` of a forward of ``width`` positions whose last ``keep`` logits
        are read: on a rollout copy, the positions' indices (:meth:`AgentPolicy.logits_to_keep`
        says why); on the weights themselves the plain count."""
        return self.policy.logits_to_keep(model, width, keep)

    def _prompt_head(self, model: PreTrainedModel, ids: list[int]) -> PromptHead:
        """The keys and values of the prompt head ``ids`` under ``model``, from and into this
        decoder's kept heads (:func:`~bidswarm.engines.prompt_heads.prompt_head`)."""
        return prompt_head(model, ids, self._rollout.heads, self.kept_prompt_heads)


class HFEngine(RolloutEngine):
    """``model.engine=hf``: one :class:`HFDecoder` per agent, made at its first call; the
    settings are :class:`HFDecoder`'s. LoRA agents of one shared peft model asked together
    generate in one batch across their adapters (:meth:`generate`)."""

    name = "hf"

    def __init__(self, kv_cache: str, compile_decode: bool, rollout_dtype: torch.dtype | None):
        self.kv_cache = str(kv_cache)
        self.compile_decode = compile_decode
        self.rollout_dtype = rollout_dtype
        self._decoders: weakref.WeakKeyDictionary[AgentPolicy, HFDecoder] = (
            weakref.WeakKeyDictionary()
        )
        self._cast_copies = CastCopies()

    @classmethod
    def from_config(cls, model_cfg) -> HFEngine:
        """The engine ``model.kv_cache``, ``model.compile_decode`` and ``model.rollout_dtype``
        configure."""
        return cls(model_cfg.kv_cache, model_cfg.compile_decode, rollout_dtype(model_cfg))

    def decoder(self, policy: AgentPolicy) -> HFDecoder:
        """``policy``'s decoder (made at its first call, kept while the policy lives)."""
        found = self._decoders.get(policy)
        if found is None:
            found = HFDecoder(
                policy, self.kv_cache, self.compile_decode, self.rollout_dtype, self._cast_copies
            )
            self._decoders[policy] = found
        return found

    def generate(
        self,
        batches: Sequence[PromptBatch],
        max_new_tokens: int,
        temperature: float,
        generator: torch.Generator | None,
    ) -> list[list[Generation]]:
        """Each batch in its agent's decode loop, in order; LoRA agents of one shared model
        (two or more batches) in one batch across their adapters (peft's mixed-adapter batches:
        ``adapter_names`` per row), one decode loop for the whole population. Greedy replies are
        those of each agent's own loop; sampled ones are drawn in another order (one draw for
        all agents' rows per token): for the same ``generator`` they differ from the per-agent
        calls' replies, and are as reproducible."""
        policies = [batch.policy for batch in batches]
        if len(batches) < 2 or not share_one_lora_model(policies):
            return [
                self.decoder(batch.policy).generate(
                    batch.prompt_ids, max_new_tokens, temperature, generator
                )
                for batch in batches
            ]
        return self._generate_across_adapters(batches, max_new_tokens, temperature, generator)

    @torch.inference_mode()
    def _generate_across_adapters(
        self,
        batches: Sequence[PromptBatch],
        max_new_tokens: int,
        temperature: float,
        generator: torch.Generator | None,
    ) -> list[list[Generation]]:
        rows = [ids for batch in batches for ids in batch.prompt_ids]
        if not rows:
            return [[] for _ in batches]
        names = [batch.policy.adapter for batch in batches for _ in batch.prompt_ids]
        first = self.decoder(batches[0].policy)
        generations = first.decode(
            first.rollout_model(), rows, names, max_new_tokens, temperature, generator
        )
        replies, start = [], 0
        for batch in batches:
            replies.append(generations[start : start + len(batch.prompt_ids)])
            start += len(batch.prompt_ids)
        return replies

    def score(
        self,
        policy: AgentPolicy,
        prompt_ids: list[list[int]],
        reply_ids: list[list[int]],
        temperature: float,
        token_budget: int | None,
    ) -> tuple[Tensor, Tensor]:
        """On the model that samples (:meth:`HFDecoder.rollout_model`: the weights, or their
        copy in ``model.rollout_dtype``)."""
        model = self.decoder(policy).rollout_model()
        return policy.sequence_logprobs(prompt_ids, reply_ids, temperature, token_budget, model)

    def score_branches(
        self,
        policy: AgentPolicy,
        prompt_ids: list[list[int]],
        replies: list[list[int]],
        temperature: float,
        token_budget: int | None,
    ) -> Tensor:
        """On the model that samples, as :meth:`score`."""
        model = self.decoder(policy).rollout_model()
        return branch_logprobs(policy, prompt_ids, replies, temperature, token_budget, model)
