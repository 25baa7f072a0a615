"""Prompt heads: the keys and values of the prompt prefix a generation batch's rows share (the
chat template's system turn, the task and role text), kept across generation calls so that a
later batch computes only what no kept head holds (``engines/hf.py``, docs/performance.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from bidswarm.agents.policy import common_prefix_length

MIN_SHARED_PREFIX = 32
"""A batch whose prompts all start with at least this many equal tokens computes that prefix
once (:meth:`HFDecoder._prefill`; a decoder's ``min_shared_prefix``)."""
KEPT_PROMPT_HEADS = 4
"""Prompt heads per agent whose keys and values are kept across calls (a decoder's
``kept_prompt_heads``)."""


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


def prompt_head(
    model: PreTrainedModel, ids: list[int], heads: list[PromptHead], keep: int
) -> tuple[PromptHead, int]:
    """The keys and values of the prompt head ``ids`` under ``model``, and how many of its
    tokens were computed (the rest came from a kept head): cut from a kept head (``heads``,
    most recent first) that starts with all of ``ids``; else the kept head with the longest
    common start, extended by a forward of the rest of ``ids`` over its keys and values; else
    one forward of ``ids``. Equal, up to float rounding, to one forward of ``ids``: a token's
    keys and values depend on the tokens before it only. The head goes first into ``heads``,
    which keeps at most ``keep``; a kept head it extends is dropped."""
    device = next(model.parameters()).device
    best, common = None, 0
    for kept in heads:
        length = common_prefix_length(kept.ids, ids)
        if length > common:
            best, common = kept, length
    if best is not None and common == len(ids):
        head = best
        result = best.cut(common)
        rest = 0
    else:
        cache = DynamicCache(config=model.config)
        if best is not None:  # the kept head's common start (common > 0)
            for index, (keys, values) in enumerate(zip(best.keys, best.values, strict=True)):
                cache.update(keys[:, :, :common], values[:, :, :common], index)
        rest = len(ids) - common
        model(
            input_ids=torch.tensor([ids[common:]], device=device),
            position_ids=torch.arange(common, len(ids), device=device)[None],
            past_key_values=cache,
            use_cache=True,
            # Nothing reads these logits: the last position's, gathered (an int slices
            # [1, rest, hidden] into a view the output head's CPU matmul handles by copying
            # its whole weight: 250 ms per head for SmolLM2 in bfloat16).
            logits_to_keep=torch.tensor([rest - 1], device=device),
        )
        layers = cache.layers
        head = result = PromptHead(
            tuple(ids), [layer.keys for layer in layers], [layer.values for layer in layers]
        )
    if keep > 0:
        heads[:] = [head] + [
            kept for kept in heads if kept is not head and kept.ids != head.ids[: len(kept.ids)]
        ]
        del heads[keep:]
    return result, rest
