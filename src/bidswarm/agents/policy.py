"""One agent: a causal LM with its own parameters, its tokenizer and its role.

The same model writes the agent's bid and, when it wins the auction, its action
(docs/method.md section 1). This module is the learner's side of an agent: its trainable
weights, prompts encoded to tokens, the teacher-forced log-probs of replies (with gradient for
training, without for scoring at rollout time), saving and loading, and the frozen reference of
the KL penalty. Generation is a rollout engine's (``bidswarm.engines``): whichever engine sampled
a reply, the log-probs computed here are the training signal.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel
from transformers import PreTrainedTokenizerBase as Tokenizer
from transformers.modeling_layers import GradientCheckpointingLayer

from bidswarm.agents.flops import ParameterCounts
from bidswarm.envs.base import role_name

AGENT_FILE = "agent.json"
ADAPTER_FILE = "adapter_model.safetensors"  # peft's name: the folder loads with PeftModel too


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


def rows_of(one_row: DynamicCache, config, rows: int) -> DynamicCache:
    """A new cache of ``rows`` rows, each with the keys and values of ``one_row``'s one row
    (a prompt head's); the forwards it is given extend it without changing ``one_row``."""
    cache = DynamicCache(config=config)
    for index, layer in enumerate(one_row.layers):
        cache.update(*(t.expand(rows, -1, -1, -1) for t in (layer.keys, layer.values)), index)
    return cache


MIN_TRAINED_PROMPT_HEAD = 32
"""A forward over rows whose prompts all start with at least this many equal tokens computes
that prompt head once (:meth:`AgentPolicy.prompt_head_length`)."""


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
    at the end of a prompt; ``model.max_prompt_tokens``).
    adapter: with LoRA agents (``model.adapter=lora``), ``model`` is a peft model shared by
    the whole population and ``adapter`` names this agent's LoRA adapter in it: the agent
    trains only that adapter (:meth:`trainable_parameters`) and saves only it.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: Tokenizer,
        role: str | None,
        max_prompt_tokens: int,
        adapter: str | None = None,
    ):
        super().__init__()
        self.model = model
        self.adapter = adapter
        self.tokenizer = tokenizer
        self.role = role
        self.max_prompt_tokens = max_prompt_tokens
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

    def use_own_adapter(self, model: PreTrainedModel | None = None) -> None:
        """Route the shared peft model's forwards through this agent's adapter; ``model``: a
        rollout engine's copy of that model (its cast copy), else the weights themselves.
        peft's ``set_adapter`` also freezes every other adapter; on the weights they stay
        trainable (each is another agent's parameter group; an inactive adapter simply gets no
        gradient); a copy trains nothing."""
        if self.adapter is None:
            return
        if model is not None and model is not self.model:
            model.set_adapter(self.adapter)
            return
        self.model.set_adapter(self.adapter)
        for name, parameter in self.model.named_parameters():
            if "lora_" in name:
                parameter.requires_grad_(True)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

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

    def prompt_head_length(self, prompt_ids: list[list[int]], with_gradient: bool = True) -> int:
        """Tokens at the start of every prompt of ``prompt_ids`` that one forward over them
        computes once, for one row, and the rows' remaining tokens attend to (0: none): their
        shared prefix (a chat template's system turn, the task and role text), leaving at least
        one prompt token per row, when it is at least :data:`MIN_TRAINED_PROMPT_HEAD` long. The
        same log-probs and gradients as a forward of every row in full, up to float rounding;
        for a forward ``with_gradient``, never under activation checkpointing, which then drops
        the keys and values a layer is given (a forward without gradients in evaluation mode
        keeps them)."""
        if len(prompt_ids) < 2 or (
            with_gradient
            and any(
                layer.gradient_checkpointing
                for layer in self.model.modules()
                if isinstance(layer, GradientCheckpointingLayer)
            )
        ):
            return 0
        length = shared_prefix_length(prompt_ids)
        return length if length >= MIN_TRAINED_PROMPT_HEAD else 0

    def forward_row_tokens(
        self, prompt_ids: list[list[int]], reply_ids: list[list[int]]
    ) -> list[int]:
        """What a forward over these rows computes per row, in tokens: prompt and reply, less
        the prompt head computed once (:meth:`prompt_head_length`): the unit in which the
        learners' micro-batches (:func:`micro_batches`) bound a forward's memory."""
        head = self.prompt_head_length(prompt_ids)
        return [len(p) + len(r) - head for p, r in zip(prompt_ids, reply_ids, strict=True)]

    def forward_tokens(self, prompt_ids: list[list[int]], reply_ids: list[list[int]]) -> int:
        """Tokens one forward over these rows computes: its prompt head once and each row's
        remaining tokens (what the FLOP ledger counts, as it counts a generation batch's
        shared prompt prefix once)."""
        return self.prompt_head_length(prompt_ids) + sum(
            self.forward_row_tokens(prompt_ids, reply_ids)
        )

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
        self.use_own_adapter()
        return self._reply_scores(self.model, prompt_ids, reply_ids, temperature, entropy)

    def _reply_scores(
        self,
        model: PreTrainedModel,
        prompt_ids: list[list[int]],
        reply_ids: list[list[int]],
        temperature: float,
        entropy: bool = False,
    ) -> ReplyScores:
        """:meth:`reply_token_scores` under ``model`` (the weights, or a rollout engine's copy
        of them)."""
        lengths = torch.tensor([len(reply) for reply in reply_ids], device=self.device)
        width = int(lengths.max()) if len(reply_ids) else 0
        if width == 0:
            empty = torch.zeros((len(reply_ids), 0), device=self.device)
            return ReplyScores(empty, empty, empty if entropy else None)
        sequences = [p + r for p, r in zip(prompt_ids, reply_ids, strict=True)]
        head = self.prompt_head_length(prompt_ids)
        input_ids, row_mask = left_pad([s[head:] for s in sequences], self.pad_id, self.device)
        cache = self.prompt_head_cache(model, prompt_ids[0][:head], len(sequences))
        out = model(
            input_ids=input_ids,
            attention_mask=torch.cat([row_mask.new_ones(len(sequences), head), row_mask], 1),
            position_ids=head + positions_from_mask(row_mask),
            past_key_values=cache,
            use_cache=cache is not None,
            logits_to_keep=self.logits_to_keep(model, input_ids.shape[1], width + 1),
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

    def prompt_head_cache(
        self, model: PreTrainedModel, head: list[int], rows: int
    ) -> DynamicCache | None:
        """The keys and values of the prompt head ``head`` under ``model`` (one forward of one
        row, with gradient where grad is on, :meth:`prompt_head_keys`), the same for each of
        ``rows`` rows; None for an empty head."""
        one_row = self.prompt_head_keys(model, head)
        return None if one_row is None else rows_of(one_row, model.config, rows)

    def prompt_head_keys(self, model: PreTrainedModel, head: list[int]) -> DynamicCache | None:
        """The keys and values of the prompt head ``head`` under ``model``, for one row (one
        forward); None for an empty head."""
        if not head:
            return None
        one_row = DynamicCache(config=model.config)
        model(
            input_ids=torch.tensor([head], device=self.device),
            position_ids=torch.arange(len(head), device=self.device)[None],
            past_key_values=one_row,
            use_cache=True,
            # Nothing reads these logits: the last position's, gathered (a sliced view would
            # make the CPU matmul of the output head copy its whole weight).
            logits_to_keep=torch.tensor([len(head) - 1], device=self.device),
        )
        return one_row

    def logits_to_keep(self, model: PreTrainedModel, width: int, keep: int) -> int | Tensor:
        """The ``logits_to_keep`` of a forward of ``width`` positions whose last ``keep`` logits
        are read. On a copy of the weights (a rollout engine's, e.g. in bfloat16): the
        positions' indices, which gather those hidden states into a contiguous tensor before
        the output head. The plain count slices them, and torch's CPU matmul of a
        non-contiguous [B, keep, hidden] slice with the head copies the head's weight for every
        row: 5 s instead of 20 ms for SmolLM2's bfloat16 head at 16 rows, 270 instead of 75 ms
        in float32. On the weights themselves it stays the count: the two matmuls round
        differently, and the weights' own generation and training keep their floats."""
        if model is self.model:
            return keep
        return torch.arange(width - keep, width, device=self.device)

    @torch.no_grad()
    def sequence_logprobs(
        self,
        prompt_ids: list[list[int]],
        reply_ids: list[list[int]],
        temperature: float = 1.0,
        token_budget: int | None = None,
        model: PreTrainedModel | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Summed log-prob of each reply given its prompt, and its length, both [B], without
        gradient (scoring at rollout time) under ``model`` (None: the weights themselves; a
        rollout engine passes the copy it samples from); forwards of at most ``token_budget``
        tokens (:func:`micro_batches`).
        """
        sums, lengths = [], []
        rows = [len(p) + len(r) for p, r in zip(prompt_ids, reply_ids, strict=True)]
        model = self.model if model is None else model
        self.use_own_adapter(model)
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
            self.save_adapter(directory)
        self.tokenizer.save_pretrained(directory)
        meta = {"role": self.role, "max_prompt_tokens": self.max_prompt_tokens}
        if self.adapter is not None:
            meta["adapter"] = self.adapter
        (directory / AGENT_FILE).write_text(json.dumps(meta, indent=2) + "\n")

    def save_adapter(self, directory: Path) -> None:
        """A LoRA agent's adapter as a peft adapter folder (its weights and config) in
        ``directory``, which exists."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        state = get_peft_model_state_dict(self.model, adapter_name=self.adapter)
        save_file({k: v.contiguous() for k, v in state.items()}, directory / ADAPTER_FILE)
        self.model.peft_config[self.adapter].save_pretrained(directory)

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

    def parameter_counts(self) -> ParameterCounts:
        """The weights a reference forward runs through (its FLOPs per token): a full agent's
        copy, all of them; a LoRA agent's reference, the base with the adapters off."""
        counts = self.policy.parameter_counts()
        if self.copy is None:
            return ParameterCounts(frozen=counts.frozen, trained=0)
        return counts

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
