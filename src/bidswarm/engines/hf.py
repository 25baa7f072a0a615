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
    PromptTokens,
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
    prompt_tokens: where the prompt tokens given and computed are counted (the engine's
    :class:`~bidswarm.engines.base.PromptTokens`; None: nowhere).
    """

    def __init__(
        self,
        policy: AgentPolicy,
        kv_cache: str,
        compile_decode: bool,
        rollout_dtype: torch.dtype | None,
        cast_copies: CastCopies | None = None,
        prompt_tokens: PromptTokens | None = None,
    ):
        self.policy = policy
        self.cast_copies = CastCopies() if cast_copies is None else cast_copies
        self.prompt_tokens = prompt_tokens
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
        groups: Sequence[tuple[HFDecoder, int]] | None = None,
    ) -> list[Generation]:
        """The decode loop of :meth:`generate` on ``model`` (:meth:`rollout_model`);
        ``adapter_names`` routes each row through its own LoRA adapter of the shared peft model
        (:meth:`HFEngine.generate` for LoRA agents of one base). ``groups``: consecutive rows
        of one agent each, as (its decoder, rows), whose prompt heads are its own (None: every
        row is this decoder's)."""
        device = self.device
        stop = torch.tensor(self.policy.stop_ids, device=device)
        pad_id = self.policy.pad_id
        routing = {} if adapter_names is None else {"adapter_names": adapter_names}
        was_training = model.training
        model.eval()
        heads = self._prompt_heads(model, prompt_ids, groups or [(self, len(prompt_ids))])
        # The prompts' columns: the longest head, then the suffixes after each row's head.
        head_width = max(len(head.ids) if head else 0 for head in heads)
        width = head_width + max(
            len(ids) - (len(head.ids) if head else 0)
            for ids, head in zip(prompt_ids, heads, strict=True)
        )
        static = self.uses_static_cache()
        slots = static_cache_slots(width + max_new_tokens) if static else width + max_new_tokens
        cache = StaticCache(config=model.config, max_cache_len=slots) if static else None
        # One mask for prompt and reply, preallocated: each decode step writes its column
        # instead of concatenating a new mask. A static cache attends over all its slots, so it
        # sees the whole mask (fixed shape); a dynamic one the columns it holds so far.
        attention_mask = torch.zeros((len(prompt_ids), slots), dtype=torch.long, device=device)
        out, next_positions = self._prefill(
            model, prompt_ids, heads, head_width, attention_mask, cache, routing
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
        generations, start = [], 0
        for decoder, count in groups or [(self, len(prompt_ids))]:
            part = slice(start, start + count)
            head = heads[start] if count else None
            generations += finished_generations(
                decoder.policy,
                prompt_ids[part],
                rows[part],
                row_logprobs[part],
                len(head.ids) if head else 0,
            )
            start += count
        return generations

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

    def _prompt_heads(
        self,
        model: PreTrainedModel,
        prompt_ids: list[list[int]],
        groups: Sequence[tuple[HFDecoder, int]],
    ) -> list[PromptHead | None]:
        """Each row's prompt head (None: none): the prefix shared by the rows of its group
        (consecutive rows of one agent), computed once for all of them under that agent's
        weights (its LoRA adapter) from and into its decoder's kept heads
        (:meth:`_prompt_head`), when the group has two rows or more and shares at least
        ``min_shared_prefix`` tokens. Counts the prompt tokens given and computed in the
        engine's :class:`~bidswarm.engines.base.PromptTokens`."""
        heads: list[PromptHead | None] = []
        computed, start = 0, 0
        for decoder, count in groups:
            rows = prompt_ids[start : start + count]
            start += count
            prefix = shared_prefix_length(rows) if count >= 2 else 0
            if prefix < decoder.min_shared_prefix:
                heads += [None] * count
                computed += sum(map(len, rows))
                continue
            decoder.policy.use_own_adapter(model)
            head, head_computed = decoder._prompt_head(model, rows[0][:prefix])
            heads += [head] * count
            computed += head_computed + sum(len(ids) - prefix for ids in rows)
        if self.prompt_tokens is not None:
            self.prompt_tokens.add(sum(map(len, prompt_ids)), computed)
        return heads

    def _prefill(
        self,
        model: PreTrainedModel,
        prompt_ids: list[list[int]],
        heads: list[PromptHead | None],
        head_width: int,
        attention_mask: Tensor,
        cache: StaticCache | None,
        routing: dict[str, list[str]],
    ):
        """Forward the prompts into a KV cache (``cache``, or a new dynamic one). Writes the
        prompts' columns of ``attention_mask`` [B, slots] and returns the model output and the
        position ids [B, 1] of the first reply token.

        Prompts of one agent share the task and role text (chat templates put it first), so
        that prefix (the row's prompt head, :meth:`_prompt_heads`) is computed once and its
        keys and values are written into its rows of the cache, right-aligned in the first
        ``head_width`` columns (shorter heads, and rows without one, masked before it); only
        the rows' suffixes after their heads run here, left-padded after those columns. Rows
        of several LoRA agents (``routing``) each have their own adapter's head.
        """
        pad_id, device = self.policy.pad_id, self.device
        lengths = [len(head.ids) if head else 0 for head in heads]
        if head_width:
            cache = DynamicCache(config=model.config) if cache is None else cache
            for index, (keys, values) in enumerate(head_columns(heads, head_width)):
                # The cache's own update writes them (a static cache allocates itself at the
                # batch size here).
                cache.update(keys, values, index)
            for row, length in enumerate(lengths):
                attention_mask[row, head_width - length : head_width] = 1
        suffixes = [ids[length:] for ids, length in zip(prompt_ids, lengths, strict=True)]
        input_ids, prompt_mask = left_pad(suffixes, pad_id, device)
        width = head_width + input_ids.shape[1]
        attention_mask[:, head_width:width] = prompt_mask
        static = isinstance(cache, StaticCache)
        position_ids = positions_from_mask(prompt_mask)
        position_ids = position_ids + torch.tensor(lengths, device=device)[:, None]
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask if static else attention_mask[:, :width],
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=self._logits_to_keep(model, input_ids.shape[1], 1),
            **routing,
        )
        return out, position_ids[:, -1:] + 1

    def _logits_to_keep(self, model: PreTrainedModel, width: int, keep: int) -> int | Tensor:
        """The ``logits_to_keep`` of a forward of ``width`` positions whose last ``keep`` logits
        are read: on a rollout copy, the positions' indices (:meth:`AgentPolicy.logits_to_keep`
        says why); on the weights themselves the plain count."""
        return self.policy.logits_to_keep(model, width, keep)

    def score_branches(
        self,
        prompt_ids: list[list[int]],
        replies: list[list[int]],
        temperature: float,
        token_budget: int | None,
    ) -> Tensor:
        """:func:`~bidswarm.agents.branching.branch_logprobs` on :meth:`rollout_model`, the
        prompts' shared head from and into the kept heads (:meth:`_prompt_head`: computed once
        per weights, not once per call), counted in ``prompt_tokens``."""
        model = self.rollout_model()
        computed: list[tuple[int, int]] = []  # (head length, its tokens computed)

        def kept_head(model: PreTrainedModel, ids: list[int]) -> DynamicCache:
            head, rest = self._prompt_head(model, ids)
            computed.append((len(ids), rest))
            cache = DynamicCache(config=model.config)
            for index, (keys, values) in enumerate(zip(head.keys, head.values, strict=True)):
                cache.update(keys, values, index)
            return cache

        scores = branch_logprobs(
            self.policy, prompt_ids, replies, temperature, token_budget, model, kept_head
        )
        if self.prompt_tokens is not None:
            length, rest = computed[0] if computed else (0, 0)
            given = sum(map(len, prompt_ids))
            self.prompt_tokens.add(given, rest + given - length * len(prompt_ids))
        return scores

    def _prompt_head(self, model: PreTrainedModel, ids: list[int]) -> tuple[PromptHead, int]:
        """The keys and values of the prompt head ``ids`` under ``model``, from and into this
        decoder's kept heads, and the tokens computed for it
        (:func:`~bidswarm.engines.prompt_heads.prompt_head`)."""
        return prompt_head(model, ids, self._rollout.heads, self.kept_prompt_heads)


def head_columns(heads: Sequence[PromptHead | None], width: int) -> list[tuple[Tensor, Tensor]]:
    """Per layer, the keys and values [rows, kv heads, ``width``, head dim] of each row's
    prompt head right-aligned in ``width`` columns (rows of one head: one expanded view; one
    head for every row is not copied). The columns before a shorter head (all of them for a
    row without one) are masked; they hold ones, not zeros: some transformers releases count
    a static cache's filled slots as the non-zero keys of its first row."""
    runs: list[tuple[PromptHead | None, int]] = []
    for head in heads:
        if runs and runs[-1][0] is head:
            runs[-1] = (head, runs[-1][1] + 1)
        else:
            runs.append((head, 1))
    first = next(head for head in heads if head is not None)
    layers = []
    for index in range(len(first.keys)):
        pair = []
        for like, kind in ((first.keys[index], "keys"), (first.values[index], "values")):
            pieces = []
            for head, count in runs:
                tensor = None if head is None else getattr(head, kind)[index]
                length = 0 if tensor is None else tensor.shape[2]
                if length < width:
                    filler = like.new_ones((1, like.shape[1], width - length, like.shape[3]))
                    tensor = filler if tensor is None else torch.cat([filler, tensor], dim=2)
                pieces.append(tensor.expand(count, -1, -1, -1))
            pair.append(pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0))
        layers.append((pair[0], pair[1]))
    return layers


class HFEngine(RolloutEngine):
    """``model.engine=hf``: one :class:`HFDecoder` per agent, made at its first call; the
    settings are :class:`HFDecoder`'s. LoRA agents of one shared peft model asked together
    generate in one batch across their adapters (:meth:`generate`), each agent's rows after
    its own prompt head. :meth:`metrics`: ``engine/prefix_cached_frac``."""

    name = "hf"

    def __init__(self, kv_cache: str, compile_decode: bool, rollout_dtype: torch.dtype | None):
        self.kv_cache = str(kv_cache)
        self.compile_decode = compile_decode
        self.rollout_dtype = rollout_dtype
        self._decoders: weakref.WeakKeyDictionary[AgentPolicy, HFDecoder] = (
            weakref.WeakKeyDictionary()
        )
        self._cast_copies = CastCopies()
        self._prompt_tokens = PromptTokens()

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
                policy,
                self.kv_cache,
                self.compile_decode,
                self.rollout_dtype,
                self._cast_copies,
                self._prompt_tokens,
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
        ``adapter_names`` per row), one decode loop for the whole population; each agent's rows
        share its own prompt head, as in its own loop. Greedy replies are those of each agent's
        own loop (up to float rounding); sampled ones are drawn in another order (one draw for
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
        groups = [(self.decoder(batch.policy), len(batch.prompt_ids)) for batch in batches]
        first = groups[0][0]
        model = first.rollout_model()
        for decoder, _ in groups[1:]:  # one copy for all; each decoder drops its stale heads
            decoder.rollout_model()
        generations = first.decode(
            model, rows, names, max_new_tokens, temperature, generator, groups
        )
        replies, start = [], 0
        for batch in batches:
            replies.append(generations[start : start + len(batch.prompt_ids)])
            start += len(batch.prompt_ids)
        return replies

    def metrics(self) -> dict[str, float]:
        """``engine/prefix_cached_frac`` since the last call: the share of the prompt tokens
        its decoders were given that a kept prompt head held or a batch's shared prompt head
        computed once for all its rows."""
        return self._prompt_tokens.read()

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
        """On the model that samples, as :meth:`score`, after its decoder's kept prompt heads
        (:meth:`HFDecoder.score_branches`)."""
        return self.decoder(policy).score_branches(prompt_ids, replies, temperature, token_budget)
