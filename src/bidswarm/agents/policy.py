"""One agent: a causal LM with its own parameters, its tokenizer and its role.

The same model writes the agent's bid and, when it wins the auction, its action (PAPER.md
section 1). Generation is batched over many environments in one forward batch (left padding,
KV cache); log-probs of sampled replies are recomputed with gradient by a separate forward pass.
One module over 400 lines on purpose: sampling, scoring and the gradient forward must agree on
padding, position ids and temperature (DESIGN.md, transformers 5), so they are written side by
side.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    PreTrainedModel,
    StaticCache,
)
from transformers import PreTrainedTokenizerBase as Tokenizer

from bidswarm.agents.flops import ParameterCounts
from bidswarm.envs.base import role_name

AGENT_FILE = "agent.json"
ADAPTER_FILE = "adapter_model.safetensors"  # peft's name: the folder loads with PeftModel too
STATIC_CACHE_BLOCK = 64
"""A static KV cache holds a multiple of this many tokens per row (:func:`static_cache_slots`)."""


@dataclass(frozen=True)
class Generation:
    """One sampled reply: its text, the (truncated) prompt tokens and the reply tokens.

    ``reply_ids`` end with the end-of-sequence token when the model produced one.
    ``shared_prefix``: the first tokens of the prompt, shared by every row of the generation
    batch, that the batch computed once for all its rows (0: none). It says how the reply was
    computed, not what it is: two generations with the same tokens are equal.
    """

    text: str
    prompt_ids: list[int]
    reply_ids: list[int]
    shared_prefix: int = field(default=0, compare=False)


def left_pad(
    sequences: list[list[int]], pad_id: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """Token ids and attention mask, both [B, T], with every row padded on the left."""
    width = max(len(sequence) for sequence in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        if sequence:
            ids[row, width - len(sequence) :] = torch.tensor(sequence, dtype=torch.long)
            mask[row, width - len(sequence) :] = 1
    return ids.to(device), mask.to(device)


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """Position ids of left-padded rows: 0 at each row's first real token (pads clamp to 0)."""
    return (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens ``a`` and ``b`` start with in common."""
    length = 0
    for x, y in zip(a, b, strict=False):  # up to the shorter one
        if x != y:
            break
        length += 1
    return length


def shared_prefix_length(sequences: list[list[int]]) -> int:
    """Tokens every sequence starts with, leaving at least one token in the shortest."""
    shortest = min(len(sequence) for sequence in sequences)
    length = 0
    while length < shortest - 1 and all(s[length] == sequences[0][length] for s in sequences):
        length += 1
    return length


def micro_batches(lengths: Sequence[int], token_budget: int | None) -> list[range]:
    """Consecutive ranges of rows whose padded forward (rows x longest row, in tokens) stays
    within ``token_budget`` (None: one range of every row). A row longer than the budget cannot
    be split and forms a range alone; so the peak memory of a forward is set by the budget, not
    by how many rows a batch has."""
    if not lengths:
        return []
    if token_budget is None:
        return [range(len(lengths))]
    ranges, start, longest = [], 0, 0
    for row, length in enumerate(lengths):
        widest = max(longest, length)
        if row > start and (row - start + 1) * widest > token_budget:
            ranges.append(range(start, row))
            start, widest = row, length
        longest = widest
    ranges.append(range(start, len(lengths)))
    return ranges


def static_cache_slots(tokens: int) -> int:
    """Slots per row of a static KV cache for ``tokens`` tokens: rounded up to a multiple of
    :data:`STATIC_CACHE_BLOCK`, so that calls with similar prompt widths share one shape (one
    compiled decode step, one CUDA graph, reused allocator blocks)."""
    return -(-tokens // STATIC_CACHE_BLOCK) * STATIC_CACHE_BLOCK


def sample_tokens(
    logits: Tensor,
    temperature: float,
    generator: torch.Generator | None,
    inverse_cdf: bool = False,
) -> Tensor:
    """One token per row from [B, V] logits; ``temperature`` 0 is greedy.

    ``inverse_cdf``: the first token whose cumulative probability exceeds one uniform draw per
    row, instead of ``torch.multinomial`` (which draws an exponential per vocabulary entry:
    38 ms against 4 ms for 16 rows of SmolLM2's 49152 tokens on one CPU core). The same
    distribution, another random stream: other tokens for the same ``generator``.
    """
    if temperature <= 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if not inverse_cdf:
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    cumulative = probs.cumsum(dim=-1)
    draw = torch.rand(
        (probs.shape[0], 1), generator=generator, device=probs.device, dtype=probs.dtype
    )
    # right=True: a token of probability 0 (cumulative equal to its predecessor's) is never hit
    tokens = torch.searchsorted(cumulative, draw * cumulative[:, -1:], right=True)
    return tokens.squeeze(-1).clamp(max=probs.shape[-1] - 1)


@dataclass(frozen=True)
class PromptHead:
    """The keys and values of a prompt head (the first tokens of a batch's prompts, one row),
    kept across generation calls: ``keys[layer]`` and ``values[layer]`` are
    [1, kv heads, len(ids), head dim]."""

    ids: tuple[int, ...]
    keys: list[Tensor]
    values: list[Tensor]

    def cut(self, length: int) -> PromptHead:
        """The head of the first ``length`` tokens: a causal model's keys and values of a token
        depend on the tokens before it only, so a longer head holds every shorter one."""
        return PromptHead(
            self.ids[:length],
            [k[:, :, :length] for k in self.keys],
            [v[:, :, :length] for v in self.values],
        )


@dataclass
class RolloutState:
    """What an agent's generation keeps between calls, valid for the weights it was made from:
    ``weights`` (each weight tensor's address and in-place version) and ``dtype`` (the rollout
    dtype asked for). ``model``: the copy of the weights in the rollout dtype (None: generation
    runs on the weights themselves); ``heads``: the kept prompt heads, most recent first."""

    weights: tuple[tuple[int, int], ...] = ()
    dtype: torch.dtype | None = None
    model: PreTrainedModel | None = None
    heads: list[PromptHead] = field(default_factory=list)


@dataclass(frozen=True)
class ReplyScores:
    """Per reply token (column j: token j of the row's reply), every tensor [B, L].

    logprobs: log pi(token | prompt, earlier reply tokens), 0 on padding.
    mask:     1 on the reply's tokens, 0 on padding.
    entropy:  the entropy of the full next-token distribution at the token's position, 0 on
              padding (None: not asked for).
    """

    logprobs: Tensor
    mask: Tensor
    entropy: Tensor | None = None


class AgentPolicy(torch.nn.Module):
    """An agent of the swarm: ``model`` + ``tokenizer`` + ``role`` (None: monolithic agent).

    max_prompt_tokens: prompts longer than this are cut from the left (the newest context is
    at the end of a prompt).
    min_shared_prefix: a batch whose prompts all start with at least this many equal tokens
    computes that prefix once (see :meth:`generate`).
    adapter: with LoRA agents (``model.adapter=lora``), ``model`` is a peft model shared by
    the whole population and ``adapter`` names this agent's LoRA adapter in it: the agent
    trains only that adapter (:meth:`trainable_parameters`) and saves only it.

    Generation and rollout scoring run on :meth:`rollout_model`: the weights themselves, or
    their copy in ``rollout_dtype``. Training (:meth:`reply_token_scores`) always runs on the
    weights themselves.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: Tokenizer,
        role: str | None,
        max_prompt_tokens: int = 768,
        min_shared_prefix: int = 32,
        adapter: str | None = None,
    ):
        super().__init__()
        self.model = model
        self.adapter = adapter
        self.stop_check_every: int | None = None
        """Decode steps between checks that every row stopped (None: 1 on CPU, 8 elsewhere)."""
        self.kv_cache = "auto"
        """``dynamic``: the KV cache grows by a token per decode step; ``static``: it is
        preallocated for the prompt and the longest reply, so every decode step has the same
        shapes; ``auto``: static on CUDA, dynamic elsewhere (``model.kv_cache``)."""
        self.compile_decode = False
        """Compile the one-token decode forward with CUDA graphs (``torch.compile`` mode
        ``reduce-overhead``); applies to a static cache on CUDA only (``model.compile_decode``).
        """
        self._compiled_decode = None
        self.rollout_dtype: torch.dtype | None = None
        """The dtype generation and rollout scoring (:meth:`sequence_logprobs`) run in
        (``model.rollout_dtype``); None: the weights' own. Another dtype than the weights'
        runs on a copy of the weights cast to it (:meth:`rollout_model`), e.g. bfloat16
        matmuls for float32 weights; the learner still trains the float32 weights. On the
        copy, generation also reads its logits from a contiguous gather
        (:meth:`_logits_to_keep`) and samples by inverse CDF (:func:`sample_tokens`): faster,
        other floats and another random stream than the weights' own generation, which keeps
        both."""
        self.kept_prompt_heads = 4
        """Prompt heads (the prefix shared by every prompt of a generation batch, computed once
        for one row) whose keys and values the agent keeps across calls (0: none). A later
        batch whose shared prefix starts like a kept head computes only the tokens after their
        common start: the system turn of a chat template, shared by an agent's bid and action
        prompts, and the task text before each decision's observation run once per agent,
        not once per call. Dropped when the weights change."""
        self._rollout = RolloutState()
        self.tokenizer = tokenizer
        self.role = role
        self.max_prompt_tokens = max_prompt_tokens
        self.min_shared_prefix = min_shared_prefix
        if tokenizer.pad_token_id is None:
            raise ValueError("the agent's tokenizer needs a pad token")
        self.pad_id: int = tokenizer.pad_token_id
        self.stop_ids: list[int] = sorted(self._stop_ids(model, tokenizer))

    @staticmethod
    def _stop_ids(model: PreTrainedModel, tokenizer: Tokenizer) -> set[int]:
        stop = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        configured = model.generation_config.eos_token_id if model.generation_config else None
        if isinstance(configured, int):
            stop.add(configured)
        elif configured:
            stop.update(configured)
        if not stop:
            raise ValueError("the agent's tokenizer has no end-of-sequence token")
        return stop

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """What this agent's optimizer group trains: every weight, or its own LoRA adapter."""
        if self.adapter is None:
            return list(self.model.parameters())
        marker = f".{self.adapter}."
        return [p for name, p in self.model.named_parameters() if marker in name]

    def parameter_counts(self) -> ParameterCounts:
        """The weights this agent's tokens run through, frozen and trained (its FLOPs per token,
        :mod:`bidswarm.agents.flops`): a LoRA agent's shared base without any adapter, and its
        own adapter; else every weight, trained."""
        trained = sum(p.numel() for p in self.trainable_parameters())
        if self.adapter is None:
            return ParameterCounts(frozen=0, trained=trained)
        base = sum(p.numel() for name, p in self.model.named_parameters() if "lora_" not in name)
        return ParameterCounts(frozen=base, trained=trained)

    def _use_own_adapter(self) -> None:
        """Route the shared peft model's forwards through this agent's adapter. peft's
        ``set_adapter`` also freezes every other adapter; they stay trainable here (each is
        another agent's parameter group; an inactive adapter simply gets no gradient)."""
        if self.adapter is None:
            return
        self.model.set_adapter(self.adapter)
        for name, parameter in self.model.named_parameters():
            if "lora_" in name:
                parameter.requires_grad_(True)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def rollout_model(self) -> PreTrainedModel:
        """The model that generates and scores at rollout time: ``model``, or its copy in
        ``rollout_dtype`` (parameters cast; buffers, e.g. the rotary frequencies, kept as they
        are), made the first time and refreshed after the weights changed.

        A change is seen through each weight tensor's address and version counter: an
        optimizer step, ``load_state_dict``, a move to another device or dtype; a write
        through ``.data`` is not seen (nothing here writes that way). A change also drops the
        kept prompt heads. LoRA agents share one model: they generate on it.
        """
        state = self._rollout
        weights = tuple((p.data_ptr(), p._version) for p in self.model.parameters())
        if weights == state.weights and self.rollout_dtype == state.dtype:
            return state.model or self.model
        state.heads.clear()
        state.weights, state.dtype = weights, self.rollout_dtype
        if self.rollout_dtype in (None, self.model.dtype):
            state.model = None
            return self.model
        if self.adapter is not None:
            raise ValueError("a rollout dtype needs fully fine-tuned agents (not model.adapter)")
        state.model = self._weights_in(self.rollout_dtype, state.model)
        return state.model

    def _weights_in(self, dtype: torch.dtype, kept: PreTrainedModel | None) -> PreTrainedModel:
        """A copy of ``model`` with its parameters in ``dtype``: ``kept`` refreshed in place
        when it is one on the same device, else a new one."""
        with torch.inference_mode(False), torch.no_grad():  # plain tensors, writable later
            if kept is not None and kept.device == self.model.device:
                for target, source in zip(kept.parameters(), self.model.parameters(), strict=True):
                    target.copy_(source)
                return kept
            copied = copy.deepcopy(self.model).eval().requires_grad_(False)
            for parameter in copied.parameters():
                parameter.data = parameter.data.to(dtype)
            return copied

    @property
    def eos_id(self) -> int:
        """The token appended to supervised replies (the tokenizer's end of sequence)."""
        return self.tokenizer.eos_token_id

    @property
    def name(self) -> str:
        return role_name(self.role)

    def encode_prompts(self, prompts: list[str]) -> list[list[int]]:
        """Token ids of each prompt, cut from the left to ``max_prompt_tokens``.

        Templates write their own special tokens, so the tokenizer adds none.
        """
        encoded = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        return [ids[-self.max_prompt_tokens :] for ids in encoded]

    def encode_reply(self, reply_text: str) -> list[int]:
        """Token ids of a supervised reply, ending with end-of-sequence."""
        return [*self.tokenizer(reply_text, add_special_tokens=False)["input_ids"], self.eos_id]

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[str],
        max_new_tokens: int,
        temperature: float,
        generator: torch.Generator | None = None,
    ) -> list[Generation]:
        """Sample one reply per prompt, all prompts in one batch (left padding, KV cache).

        Each row stops at its first end-of-sequence token (kept in ``reply_ids``) or after
        ``max_new_tokens``. ``generator`` (on the model's device) makes sampling reproducible.
        """
        if not prompts:
            return []
        prompt_ids = self.encode_prompts(prompts)
        self._use_own_adapter()
        model = self.rollout_model()
        return self._decode(model, prompt_ids, None, max_new_tokens, temperature, generator)

    def uses_static_cache(self) -> bool:
        """Whether :meth:`generate` decodes into a preallocated :class:`StaticCache`."""
        if self.kv_cache == "auto":
            return self.device.type == "cuda"
        return self.kv_cache == "static"

    def _decode(
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
        (:func:`generate_across_adapters`)."""
        device = self.device
        stop = torch.tensor(self.stop_ids, device=device)
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
        # tokens only (rows that stopped decode padding, cut off by _collect), so the device
        # runs ahead of the host.
        check_every = self.stop_check_every or (1 if device.type == "cpu" else 8)
        sampled: list[Tensor] = []
        fast_sampling = model is not self.model  # the rollout copy's engine (rollout_model)
        for step in range(max_new_tokens):
            tokens = sample_tokens(out.logits[:, -1, :], temperature, generator, fast_sampling)
            tokens = torch.where(finished, self.pad_id, tokens)
            sampled.append(tokens)
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
        return self._collect(prompt_ids, sampled, shared_prefix)

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
        width = max(len(ids) for ids in prompt_ids)
        prefix = shared_prefix_length(prompt_ids)
        if len(prompt_ids) < 2 or prefix < self.min_shared_prefix or routing:
            input_ids, prompt_mask = left_pad(prompt_ids, self.pad_id, self.device)
            head_length = 0
        else:
            head = self._prompt_head(model, prompt_ids[0][:prefix])
            cache = DynamicCache(config=model.config) if cache is None else cache
            rows = (len(prompt_ids), -1, -1, -1)
            for index, (keys, values) in enumerate(zip(head.keys, head.values, strict=True)):
                # The cache's own update copies the row into every row (a static cache
                # allocates itself at the batch size here).
                cache.update(keys.expand(rows), values.expand(rows), index)
            input_ids, prompt_mask = left_pad(
                [ids[prefix:] for ids in prompt_ids], self.pad_id, self.device
            )
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
        are read. On a rollout copy (:meth:`rollout_model`): the positions' indices, which
        gather those hidden states into a contiguous tensor before the output head. The plain
        count slices them, and torch's CPU matmul of a non-contiguous [B, keep, hidden] slice
        with the head copies the head's weight for every row: 5 s instead of 20 ms for
        SmolLM2's bfloat16 head at 16 rows, 270 instead of 75 ms in float32. On the weights
        themselves it stays the count: the two matmuls round differently, and the weights'
        own generation and training keep their floats."""
        if model is self.model:
            return keep
        return torch.arange(width - keep, width, device=self.device)

    def _prompt_head(self, model: PreTrainedModel, ids: list[int]) -> PromptHead:
        """The keys and values of the prompt head ``ids`` under ``model``: cut from a kept head
        that starts with all of ``ids``; else the kept head with the longest common start,
        extended by a forward of the rest of ``ids`` over its keys and values; else one
        forward of ``ids``. Equal, up to float rounding, to one forward of ``ids``: a token's
        keys and values depend on the tokens before it only. The head is kept as the most
        recent one (``kept_prompt_heads``); a kept head it extends is dropped."""
        heads = self._rollout.heads
        best, common = None, 0
        for kept in heads:
            length = common_prefix_length(kept.ids, ids)
            if length > common:
                best, common = kept, length
        if best is not None and common == len(ids):
            head = best
            result = best.cut(common)
        else:
            cache = DynamicCache(config=model.config)
            if best is not None:  # the kept head's common start (common > 0)
                for index, (keys, values) in enumerate(zip(best.keys, best.values, strict=True)):
                    cache.update(keys[:, :, :common], values[:, :, :common], index)
            rest = len(ids) - common
            model(
                input_ids=torch.tensor([ids[common:]], device=self.device),
                position_ids=torch.arange(common, len(ids), device=self.device)[None],
                past_key_values=cache,
                use_cache=True,
                # Nothing reads these logits: the last position's, gathered (an int slices
                # [1, rest, hidden] into a view the output head's CPU matmul handles by copying
                # its whole weight: 250 ms per head for SmolLM2 in bfloat16).
                logits_to_keep=torch.tensor([rest - 1], device=self.device),
            )
            layers = cache.layers
            head = result = PromptHead(
                tuple(ids), [layer.keys for layer in layers], [layer.values for layer in layers]
            )
        if self.kept_prompt_heads > 0:
            heads[:] = [head] + [
                kept for kept in heads if kept is not head and kept.ids != head.ids[: len(kept.ids)]
            ]
            del heads[self.kept_prompt_heads :]
        return result

    def _collect(
        self, prompt_ids: list[list[int]], sampled: list[Tensor], shared_prefix: int
    ) -> list[Generation]:
        rows = torch.stack(sampled, dim=1).tolist() if sampled else [[] for _ in prompt_ids]
        stop = set(self.stop_ids)
        generations = []
        for prompt, row in zip(prompt_ids, rows, strict=True):
            end = next((i + 1 for i, token in enumerate(row) if token in stop), len(row))
            reply = row[:end]
            text = self.tokenizer.decode(reply, skip_special_tokens=True).strip()
            generations.append(Generation(text, prompt, reply, shared_prefix))
        return generations

    def reply_token_logprobs(
        self,
        prompt_ids: list[list[int]],
        reply_ids: list[list[int]],
        temperature: float = 1.0,
    ) -> tuple[Tensor, Tensor]:
        """Log-probs of each reply token given its prompt, with gradient.

        Returns ``logprobs`` [B, L] and ``mask`` [B, L] (float 0/1), L the longest reply; reply
        token j of row b is at column j. Rows are left-padded into one forward pass, with
        position ids counted from each row's first real token, so the values equal those of
        one-at-a-time passes. ``temperature`` divides the logits (match the sampling one).
        """
        scores = self.reply_token_scores(prompt_ids, reply_ids, temperature)
        return scores.logprobs, scores.mask

    def reply_token_scores(
        self,
        prompt_ids: list[list[int]],
        reply_ids: list[list[int]],
        temperature: float = 1.0,
        entropy: bool = False,
    ) -> ReplyScores:
        """:meth:`reply_token_logprobs` and, with ``entropy``, the entropy of the whole
        next-token distribution (at ``temperature``) at each reply position, with gradient
        (:class:`ReplyScores`, every tensor [B, L])."""
        self._use_own_adapter()
        return self._reply_scores(self.model, prompt_ids, reply_ids, temperature, entropy)

    def _reply_scores(
        self,
        model: PreTrainedModel,
        prompt_ids: list[list[int]],
        reply_ids: list[list[int]],
        temperature: float,
        entropy: bool = False,
    ) -> ReplyScores:
        """:meth:`reply_token_scores` under ``model`` (the weights, or :meth:`rollout_model`)."""
        lengths = torch.tensor([len(reply) for reply in reply_ids], device=self.device)
        width = int(lengths.max()) if len(reply_ids) else 0
        if width == 0:
            empty = torch.zeros((len(reply_ids), 0), device=self.device)
            return ReplyScores(empty, empty, empty if entropy else None)
        sequences = [p + r for p, r in zip(prompt_ids, reply_ids, strict=True)]
        input_ids, attention_mask = left_pad(sequences, self.pad_id, self.device)
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions_from_mask(attention_mask),
            use_cache=False,
            logits_to_keep=self._logits_to_keep(model, input_ids.shape[1], width + 1),
        )
        # Logits at the last width+1 positions; the first width of them predict the last width
        # tokens, where each row's reply sits right-aligned.
        logits = out.logits[:, :-1, :].float() / temperature
        targets = input_ids[:, -width:]
        log_probs = torch.log_softmax(logits, dim=-1)
        right_aligned = log_probs.gather(-1, targets[..., None])[..., 0]
        columns = torch.arange(width, device=self.device)
        mask = (columns[None, :] < lengths[:, None]).float()
        index = (columns[None, :] + (width - lengths)[:, None]).clamp(max=width - 1)
        token_entropy = None
        if entropy:
            right_aligned_entropy = -(log_probs.exp() * log_probs).sum(dim=-1)
            token_entropy = right_aligned_entropy.gather(1, index) * mask
        return ReplyScores(right_aligned.gather(1, index) * mask, mask, token_entropy)

    @torch.no_grad()
    def sequence_logprobs(
        self,
        prompt_ids: list[list[int]],
        reply_ids: list[list[int]],
        temperature: float = 1.0,
        token_budget: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Summed log-prob of each reply given its prompt, and its length, both [B], without
        gradient (scoring at rollout time, on :meth:`rollout_model`, the model that samples);
        forwards of at most ``token_budget`` tokens (:func:`micro_batches`).
        """
        sums, lengths = [], []
        rows = [len(p) + len(r) for p, r in zip(prompt_ids, reply_ids, strict=True)]
        self._use_own_adapter()
        model = self.rollout_model()
        for part in micro_batches(rows, token_budget):
            scores = self._reply_scores(
                model, [prompt_ids[i] for i in part], [reply_ids[i] for i in part], temperature
            )
            sums.append((scores.logprobs * scores.mask).sum(dim=1))
            lengths.append(scores.mask.sum(dim=1))
        if not sums:
            empty = torch.zeros(0, device=self.device)
            return empty, empty
        return torch.cat(sums), torch.cat(lengths)

    def forward(self, prompt_ids: list[list[int]], reply_ids: list[list[int]]) -> Tensor:
        """Per-token reply log-probs [B, L] (see :meth:`reply_token_logprobs`)."""
        return self.reply_token_logprobs(prompt_ids, reply_ids)[0]

    def save_pretrained(self, directory: str | Path) -> None:
        """A standard HF folder (model + tokenizer) plus ``agent.json`` holding the role; a
        LoRA agent writes its adapter only (a peft adapter folder; the base model is the
        population's, :meth:`Population.save_pretrained`)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self.adapter is None:
            self.model.save_pretrained(directory)
        else:
            from peft import get_peft_model_state_dict
            from safetensors.torch import save_file

            state = get_peft_model_state_dict(self.model, adapter_name=self.adapter)
            save_file({k: v.contiguous() for k, v in state.items()}, directory / ADAPTER_FILE)
            self.model.peft_config[self.adapter].save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        meta = {"role": self.role, "max_prompt_tokens": self.max_prompt_tokens}
        if self.adapter is not None:
            meta["adapter"] = self.adapter
        (directory / AGENT_FILE).write_text(json.dumps(meta, indent=2) + "\n")

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        dtype: torch.dtype = torch.float32,
        lora_base: torch.nn.Module | None = None,
    ) -> AgentPolicy:
        """The agent saved in ``directory`` by :meth:`save_pretrained`. A LoRA agent's adapter
        is loaded into ``lora_base``: the population's base model, or the peft model that
        holds the adapters loaded before (:meth:`Population.from_pretrained`)."""
        directory = Path(directory)
        meta_path = directory / AGENT_FILE
        if not meta_path.is_file():
            raise FileNotFoundError(f"{directory} is not a saved agent (no {AGENT_FILE})")
        meta = json.loads(meta_path.read_text())
        adapter = meta.get("adapter")
        if adapter is None:
            model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
        elif lora_base is None:
            raise ValueError(f"{directory} holds a LoRA adapter: load its population instead")
        else:
            from peft import PeftModel

            if isinstance(lora_base, PeftModel):
                lora_base.load_adapter(directory, adapter_name=adapter, is_trainable=True)
                model = lora_base
            else:
                model = PeftModel.from_pretrained(
                    lora_base, directory, adapter_name=adapter, is_trainable=True
                )
        tokenizer = AutoTokenizer.from_pretrained(directory)
        tokenizer.padding_side = "left"
        return cls(model, tokenizer, meta["role"], meta["max_prompt_tokens"], adapter=adapter)


class FrozenReference:
    """An agent's policy as it is when this is made (at the start of RL), frozen: the reference
    of the KL penalty (``rl.kl_coef``). It is kept outside the learner's modules, so it is in no
    checkpoint and no optimizer.

    A fully fine-tuned agent's reference is a copy of its weights (a model's memory again, on
    the agent's device; under DeepSpeed ZeRO-3 the copy is not sharded). A LoRA agent's is
    the shared base model with every adapter disabled: no copy, but it is the base before SFT's
    adapter, not the SFT policy.
    """

    def __init__(self, policy: AgentPolicy):
        self.policy = policy
        self.copy: AgentPolicy | None = None
        if policy.adapter is None:
            model = copy.deepcopy(policy.model).eval().requires_grad_(False)
            self.copy = AgentPolicy(model, policy.tokenizer, policy.role, policy.max_prompt_tokens)

    @torch.no_grad()
    def reply_token_logprobs(
        self, prompt_ids: list[list[int]], reply_ids: list[list[int]], temperature: float = 1.0
    ) -> Tensor:
        """log pi_ref of each reply token, [B, L], as :meth:`AgentPolicy.reply_token_logprobs`
        lays them out; no gradient."""
        if self.copy is None:
            with self.policy.model.disable_adapter():
                return self.policy.reply_token_logprobs(prompt_ids, reply_ids, temperature)[0]
        if self.copy.device != self.policy.device:  # the learner moved the agents
            self.copy.model.to(self.policy.device)
        return self.copy.reply_token_logprobs(prompt_ids, reply_ids, temperature)[0]


def share_one_lora_model(policies: Sequence[AgentPolicy]) -> bool:
    """Whether ``policies`` are LoRA agents of one shared peft model (``model.adapter=lora``)."""
    return all(p.adapter is not None and p.model is policies[0].model for p in policies)


@torch.inference_mode()
def generate_across_adapters(
    policies: Sequence[AgentPolicy],
    prompts: Sequence[list[str]],
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator | None = None,
) -> list[list[Generation]]:
    """``policies[i]``'s reply to each of ``prompts[i]``, all agents in one generation batch.

    The agents share one peft model (:func:`share_one_lora_model`); each row runs through its
    own agent's adapter (peft's mixed-adapter batches: ``adapter_names`` per row), so one
    decode loop serves the whole population instead of one loop per agent. Greedy replies are
    those of each agent's own :meth:`AgentPolicy.generate`. Sampled ones are drawn in another
    order (one draw for all agents' rows per token): for the same ``generator`` they differ
    from the per-agent calls' replies, and are as reproducible.
    """
    if not share_one_lora_model(policies):
        raise ValueError("generation across adapters needs LoRA agents of one shared model")
    encoded = [
        policy.encode_prompts(list(texts)) for policy, texts in zip(policies, prompts, strict=True)
    ]
    rows = [ids for part in encoded for ids in part]
    if not rows:
        return [[] for _ in policies]
    names = [policy.adapter for policy, part in zip(policies, encoded, strict=True) for _ in part]
    first = policies[0]
    generations = first._decode(first.model, rows, names, max_new_tokens, temperature, generator)
    replies, start = [], 0
    for part in encoded:
        replies.append(generations[start : start + len(part)])
        start += len(part)
    return replies
