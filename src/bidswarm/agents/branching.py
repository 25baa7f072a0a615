"""Scoring several short replies to each prompt with one forward of the prompt: what a level
reader of bids needs (every level's canonical reply to every bid prompt, ``bids.reader``).

Teacher-forcing every (prompt, reply) row recomputes each prompt once per reply; here each
prompt is computed once, its keys and values repeated for its replies, and only the replies'
few tokens are computed per row: the same log-probs up to float rounding, at about 1 / (number
of replies) of the prompt compute.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from bidswarm.agents.policy import AgentPolicy, left_pad, micro_batches, positions_from_mask


@torch.no_grad()
def branch_logprobs(
    policy: AgentPolicy,
    prompt_ids: list[list[int]],
    replies: list[list[int]],
    temperature: float = 1.0,
    token_budget: int | None = None,
    model: PreTrainedModel | None = None,
) -> Tensor:
    """``[prompts, replies]``: the summed log-prob of each of ``replies`` (the same for every
    prompt, each non-empty) after each prompt, under ``model`` (None: the policy's weights; a
    rollout engine passes the copy it samples from); forwards of at most ``token_budget``
    prompt tokens (:func:`micro_batches`)."""
    model = policy.model if model is None else model
    policy.use_own_adapter(model)
    parts = [
        _branch_part(policy, model, [prompt_ids[i] for i in part], replies, temperature)
        for part in micro_batches([len(p) for p in prompt_ids], token_budget)
    ]
    if not parts:
        return torch.zeros((0, len(replies)), device=policy.device)
    return torch.cat(parts)


def _branch_part(
    policy: AgentPolicy,
    model: PreTrainedModel,
    prompt_ids: list[list[int]],
    replies: list[list[int]],
    temperature: float,
) -> Tensor:
    device = policy.device
    n, k = len(prompt_ids), len(replies)
    ids, mask = left_pad(prompt_ids, policy.pad_id, device)
    positions = positions_from_mask(mask)
    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=policy.logits_to_keep(model, ids.shape[1], 1),
    )
    first = torch.log_softmax(out.logits[:, -1, :].float() / temperature, dim=-1)  # [n, V]
    cache.batch_repeat_interleave(k)
    width = max(len(reply) for reply in replies)
    reply = torch.full((k, width), policy.pad_id, dtype=torch.long, device=device)
    reply_mask = torch.zeros((k, width), dtype=torch.long, device=device)
    for row, tokens in enumerate(replies):
        reply[row, : len(tokens)] = torch.tensor(tokens, device=device)
        reply_mask[row, : len(tokens)] = 1
    rows_reply = reply.repeat(n, 1)  # row n_i * k + j: prompt i, reply j
    rows_mask = reply_mask.repeat(n, 1)
    scores = first.repeat_interleave(k, dim=0).gather(1, rows_reply[:, :1])[:, 0]
    if width > 1:
        start = positions[:, -1:].repeat_interleave(k, dim=0) + 1
        later = model(
            input_ids=rows_reply[:, :-1],
            attention_mask=torch.cat([mask.repeat_interleave(k, dim=0), rows_mask[:, :-1]], 1),
            position_ids=start + torch.arange(width - 1, device=device)[None, :],
            past_key_values=cache,
            use_cache=True,
        )
        log_probs = torch.log_softmax(later.logits.float() / temperature, dim=-1)
        tokens = log_probs.gather(-1, rows_reply[:, 1:, None])[..., 0]
        scores = scores + (tokens * rows_mask[:, 1:]).sum(dim=1)
    return scores.reshape(n, k)
