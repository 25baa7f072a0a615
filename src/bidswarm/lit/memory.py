"""Peak GPU memory of a named phase of an update (collect, update_action, update_bid).

Three figures per phase, in GiB, because an out-of-memory error has three possible owners:

- ``memory/peak_gpu_gib/<phase>``: the most PyTorch's tensors held at once;
- ``memory/peak_reserved_gpu_gib/<phase>``: the most the caching allocator held; above the
  first by blocks it keeps cached for reuse (fragmentation: decoding allocates KV caches of a
  new size every token, training activations of other sizes);
- ``memory/gpu_used_gib/<phase>``: what the device has in use at the phase's end, for every
  process; above the reserved figure by memory outside PyTorch's allocator (CUDA context,
  cuBLAS / NCCL workspaces, DeepSpeed buffers, other processes).

Nothing is measured on CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

GIB = 2**30


@contextmanager
def gpu_memory(figures: dict[str, float], phase: str, device: torch.device) -> Iterator[None]:
    """Add the block's three memory figures for ``phase`` to ``figures`` (CUDA ``device`` only)."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.reset_peak_memory_stats(device)
    yield
    figures[f"memory/peak_gpu_gib/{phase}"] = torch.cuda.max_memory_allocated(device) / GIB
    figures[f"memory/peak_reserved_gpu_gib/{phase}"] = torch.cuda.max_memory_reserved(device) / GIB
    free, total = torch.cuda.mem_get_info(device)
    figures[f"memory/gpu_used_gib/{phase}"] = (total - free) / GIB


def release_cached_blocks(device: torch.device) -> None:
    """Hand the allocator's cached, unused blocks back to the device between phases: the
    rollout's blocks (KV caches of every length) otherwise stay reserved while training asks
    for blocks of other sizes."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
