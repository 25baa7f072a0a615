"""One agent: a causal LM with its own parameters, its tokenizer and its role.

The same model writes the agent's bid and, when it wins the auction, its action (PAPER.md
section 1). Generation is batched over many environments in one forward batch (left padding,
KV cache); log-probs of sampled replies are recomputed with gradient by a separate forward pass.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers import PreTrainedTokenizerBase as Tokenizer

from bidswarm.envs.base import role_name

AGENT_FILE = "agent.json"
ADAPTER_FILE = "adapter_model.safetensors"  # peft's name: the folder loads with PeftModel too


@dataclass(frozen=True)
class Generation:
    """One sampled reply: its text, the (truncated) prompt tokens and the reply tokens.

    ``reply_ids`` end with the end-of-sequence token when the model produced one.
    """

    text: str
    prompt_ids: list[int]
    reply_ids: list[int]


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


def sample_tokens(logits: Tensor, temperature: float, generator: torch.Generator | None) -> Tensor:
    """One token per row from [B, V] logits; ``temperature`` 0 is greedy."""
    if temperature <= 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class AgentPolicy(torch.nn.Module):
    """An agent of the swarm: ``model`` + ``tokenizer`` + ``role`` (None: monolithic agent).

    max_prompt_tokens: prompts longer than this are cut from the left (the newest context is
    at the end of a prompt).
    min_shared_prefix: a batch whose prompts all start with at least this many equal tokens
    computes that prefix once (see :meth:`generate`).
    adapter: with LoRA agents (``model.adapter=lora``), ``model`` is a peft model shared by
    the whole population and ``adapter`` names this agent's LoRA adapter in it: the agent
    trains only that adapter (:meth:`trainable_parameters`) and saves only it.
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
        device = self.device
        stop = torch.tensor(self.stop_ids, device=device)
        was_training = self.model.training
        self.model.eval()
        out, attention_mask, position_ids = self._prefill(prompt_ids)
        next_positions = position_ids[:, -1:] + 1
        finished = torch.zeros(len(prompts), dtype=torch.bool, device=device)
        # Whether every row has stopped is a host sync; on an accelerator it is asked every few
        # tokens only (rows that stopped decode padding, cut off by _collect), so the device
        # runs ahead of the host.
        check_every = self.stop_check_every or (1 if device.type == "cpu" else 8)
        sampled: list[Tensor] = []
        for step in range(max_new_tokens):
            tokens = sample_tokens(out.logits[:, -1, :], temperature, generator)
            tokens = torch.where(finished, self.pad_id, tokens)
            sampled.append(tokens)
            finished |= torch.isin(tokens, stop)
            if step == max_new_tokens - 1:
                break
            if (step + 1) % check_every == 0 and bool(finished.all()):
                break
            attention_mask = torch.cat(
                [attention_mask, attention_mask.new_ones(len(prompts), 1)], 1
            )
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=attention_mask,
                position_ids=next_positions,
                past_key_values=out.past_key_values,
                use_cache=True,
            )
            next_positions = next_positions + 1
        self.model.train(was_training)
        return self._collect(prompt_ids, sampled)

    def _prefill(self, prompt_ids: list[list[int]]):
        """Forward the prompts into a KV cache; a long prefix shared by all rows runs once.

        Prompts of one agent share the task and role text (chat templates put it first), so
        the prefix is computed for one row and its cache repeated, and only the differing
        suffixes (left-padded after the prefix) run for every row.
        """
        prefix = shared_prefix_length(prompt_ids)
        if len(prompt_ids) < 2 or prefix < self.min_shared_prefix:
            input_ids, attention_mask = left_pad(prompt_ids, self.pad_id, self.device)
            position_ids = positions_from_mask(attention_mask)
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                logits_to_keep=1,
            )
            return out, attention_mask, position_ids
        head = torch.tensor([prompt_ids[0][:prefix]], device=self.device)
        cache = self.model(input_ids=head, use_cache=True, logits_to_keep=1).past_key_values
        cache.batch_repeat_interleave(len(prompt_ids))
        suffixes = [ids[prefix:] for ids in prompt_ids]
        suffix_ids, suffix_mask = left_pad(suffixes, self.pad_id, self.device)
        attention_mask = torch.cat([suffix_mask.new_ones(len(suffixes), prefix), suffix_mask], 1)
        position_ids = prefix + positions_from_mask(suffix_mask)
        out = self.model(
            input_ids=suffix_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out, attention_mask, position_ids

    def _collect(self, prompt_ids: list[list[int]], sampled: list[Tensor]) -> list[Generation]:
        rows = torch.stack(sampled, dim=1).tolist() if sampled else [[] for _ in prompt_ids]
        stop = set(self.stop_ids)
        generations = []
        for prompt, row in zip(prompt_ids, rows, strict=True):
            end = next((i + 1 for i, token in enumerate(row) if token in stop), len(row))
            reply = row[:end]
            text = self.tokenizer.decode(reply, skip_special_tokens=True).strip()
            generations.append(Generation(text=text, prompt_ids=prompt, reply_ids=reply))
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
        lengths = torch.tensor([len(reply) for reply in reply_ids], device=self.device)
        width = int(lengths.max()) if len(reply_ids) else 0
        if width == 0:
            empty = torch.zeros((len(reply_ids), 0), device=self.device)
            return empty, empty
        sequences = [p + r for p, r in zip(prompt_ids, reply_ids, strict=True)]
        input_ids, attention_mask = left_pad(sequences, self.pad_id, self.device)
        self._use_own_adapter()
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions_from_mask(attention_mask),
            use_cache=False,
            logits_to_keep=width + 1,
        )
        # Logits at the last width+1 positions; the first width of them predict the last width
        # tokens, where each row's reply sits right-aligned.
        logits = out.logits[:, :-1, :].float() / temperature
        targets = input_ids[:, -width:]
        right_aligned = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0]
        columns = torch.arange(width, device=self.device)
        mask = (columns[None, :] < lengths[:, None]).float()
        index = (columns[None, :] + (width - lengths)[:, None]).clamp(max=width - 1)
        return right_aligned.gather(1, index) * mask, mask

    @torch.no_grad()
    def sequence_logprobs(
        self,
        prompt_ids: list[list[int]],
        reply_ids: list[list[int]],
        temperature: float = 1.0,
        token_budget: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Summed log-prob of each reply given its prompt, and its length, both [B], without
        gradient (scoring); forwards of at most ``token_budget`` tokens (:func:`micro_batches`).
        """
        sums, lengths = [], []
        rows = [len(p) + len(r) for p, r in zip(prompt_ids, reply_ids, strict=True)]
        for part in micro_batches(rows, token_budget):
            logprobs, mask = self.reply_token_logprobs(
                [prompt_ids[i] for i in part], [reply_ids[i] for i in part], temperature
            )
            sums.append((logprobs * mask).sum(dim=1))
            lengths.append(mask.sum(dim=1))
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
