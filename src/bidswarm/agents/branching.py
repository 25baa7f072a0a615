"""Scoring several short replies to each prompt with one forward of the prompt: what a level
reader of bids needs (every level's canonical reply to every bid prompt, ``bids.reader``).

Teacher-forcing every (prompt, reply) row recomputes each prompt once per reply; here each
prompt is computed once and its replies' few tokens follow it side by side in one more forward,
each reply seeing the prompt and its own earlier tokens: the same log-probs up to float
rounding, at about 1 / (number of replies) of the prompt compute, with no copy of the prompt's
keys and values per reply. Replies that start alike feed their common start once
(:class:`ReplyTree`: the bid levels ``0.0`` .. ``0.8`` are ``0``, ``.``, a digit, the end, so 7
positions, not 15). The prompts' shared head (a chat template's system turn, the task and role
text: :meth:`AgentPolicy.prompt_head_length`) is computed once, for one row, for all of them;
the micro-batches bound the tokens of each prompt after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from bidswarm.agents.policy import (
    AgentPolicy,
    left_pad,
    micro_batches,
    positions_from_mask,
    rows_of,
)

HeadKeys = Callable[[PreTrainedModel, list[int]], DynamicCache]
"""The keys and values of a prompt head (its token ids) under a model, for one row."""


@dataclass(frozen=True)
class ReplyTree:
    """The replies' tokens after their first, fed once per distinct start: each position is a
    distinct prefix ``reply[:k + 1]`` (``k >= 0``) of a reply longer than one token, and its
    logits score the token after it for every reply that starts so."""

    tokens: list[int]
    """Each position's last token."""
    depth: list[int]
    """Each position's offset after the prompt (its prefix's length - 1)."""
    sees: list[list[bool]]
    """``sees[a][b]``: position ``b``'s prefix starts position ``a``'s (itself included)."""
    scored: list[tuple[int, int, int]]
    """(reply, position, target token) for every token of every reply after its first."""

    @classmethod
    def of(cls, replies: list[list[int]]) -> ReplyTree:
        prefixes: dict[tuple[int, ...], int] = {}
        scored = []
        for j, reply in enumerate(replies):
            for k in range(len(reply) - 1):
                prefix = tuple(reply[: k + 1])
                position = prefixes.setdefault(prefix, len(prefixes))
                scored.append((j, position, reply[k + 1]))
        order = list(prefixes)
        sees = [[a[: len(b)] == b for b in order] for a in order]
        return cls([p[-1] for p in order], [len(p) - 1 for p in order], sees, scored)

    def __len__(self) -> int:
        return len(self.tokens)


@torch.no_grad()
def branch_logprobs(
    policy: AgentPolicy,
    prompt_ids: list[list[int]],
    replies: list[list[int]],
    temperature: float = 1.0,
    token_budget: int | None = None,
    model: PreTrainedModel | None = None,
    head_keys_of: HeadKeys | None = None,
) -> Tensor:
    """``[prompts, replies]``: the summed log-prob of each of ``replies`` (the same for every
    prompt, each non-empty) after each prompt, under ``model`` (None: the policy's weights; a
    rollout engine passes the copy it samples from); forwards of at most ``token_budget``
    prompt tokens after the prompts' shared head (:func:`micro_batches`), whose keys and values
    for one row ``head_keys_of(model, head)`` gives (None: one forward of the head,
    :meth:`AgentPolicy.prompt_head_keys`; a rollout engine passes the heads it keeps)."""
    model = policy.model if model is None else model
    policy.use_own_adapter(model)
    if not prompt_ids:
        return torch.zeros((0, len(replies)), device=policy.device)
    # In evaluation mode: a layer under activation checkpointing in training mode drops the
    # keys and values it is given (some transformers releases even without gradients).
    was_training = model.training
    model.eval()
    head = policy.prompt_head_length(prompt_ids, with_gradient=False)
    head_keys = None
    if head:
        head_keys = (head_keys_of or policy.prompt_head_keys)(model, prompt_ids[0][:head])
    tree = ReplyTree.of(replies)
    parts = [
        _branch_part(
            policy,
            model,
            [prompt_ids[i] for i in part],
            head,
            head_keys,
            replies,
            tree,
            temperature,
        )
        for part in micro_batches([len(p) - head for p in prompt_ids], token_budget)
    ]
    model.train(was_training)
    return torch.cat(parts)


def branch_tokens(
    policy: AgentPolicy,
    prompt_ids: list[list[int]],
    replies: list[list[int]],
) -> int:
    """Tokens :func:`branch_logprobs` computes for these prompts and replies (what the FLOP
    ledger counts): the prompts' shared head once, each prompt's rest, then the replies' tree
    of later tokens (:class:`ReplyTree`) after every prompt (padding not counted)."""
    if not prompt_ids:
        return 0
    head = policy.prompt_head_length(prompt_ids, with_gradient=False)
    rests = sum(len(ids) - head for ids in prompt_ids)
    return head + rests + len(prompt_ids) * len(ReplyTree.of(replies))


def _branch_part(
    policy: AgentPolicy,
    model: PreTrainedModel,
    prompt_ids: list[list[int]],
    head: int,
    head_keys: DynamicCache | None,
    replies: list[list[int]],
    tree: ReplyTree,
    temperature: float,
) -> Tensor:
    """:func:`branch_logprobs` of prompts that start with the same ``head`` tokens, whose keys
    and values (one row) ``head_keys`` holds (None: no head); ``tree``: the replies'."""
    device = policy.device
    n = len(prompt_ids)
    ids, rest_mask = left_pad([prompt[head:] for prompt in prompt_ids], policy.pad_id, device)
    mask = torch.cat([rest_mask.new_ones(n, head), rest_mask], 1)
    positions = head + positions_from_mask(rest_mask)
    config = model.config
    cache = DynamicCache(config=config) if head_keys is None else rows_of(head_keys, config, n)
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=policy.logits_to_keep(model, ids.shape[1], 1),
    )
    first = torch.log_softmax(out.logits[:, -1, :].float() / temperature, dim=-1)  # [n, V]
    scores = torch.stack([first[:, reply[0]] for reply in replies], dim=1)  # [n, k]
    # Every reply's later tokens in one forward over the prompts' keys and values: the replies'
    # tree side by side in one row, each position attending to the prompt and to the positions
    # of its own prefix only, at the position it would have after the prompt alone.
    if not len(tree):
        return scores
    tokens = torch.tensor(tree.tokens, device=device)
    depth = torch.tensor(tree.depth, device=device)
    width = len(tree)
    own = torch.tensor(tree.sees, device=device)  # [Q, Q]
    visible = torch.cat(
        [
            mask.bool()[:, None, None, :].expand(n, 1, width, mask.shape[1]),
            own.expand(n, 1, -1, -1),
        ],
        dim=-1,
    )
    # Additive (0 or the dtype's lowest), as every attention implementation reads a 4D mask.
    blocked = torch.zeros(visible.shape, dtype=model.dtype, device=device)
    blocked.masked_fill_(~visible, torch.finfo(model.dtype).min)
    later = model(
        input_ids=tokens[None, :].expand(n, -1),
        attention_mask=blocked,
        position_ids=positions[:, -1:] + 1 + depth[None, :],
        past_key_values=cache,
        use_cache=True,
    )
    log_probs = torch.log_softmax(later.logits.float() / temperature, dim=-1)  # [n, Q, V]
    reply, position, target = (
        torch.tensor([entry[i] for entry in tree.scored], device=device) for i in range(3)
    )
    token_scores = log_probs[:, position, target]  # [n, scored tokens]
    return scores.index_add(1, reply, token_scores)
