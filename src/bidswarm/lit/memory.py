"""Peak GPU memory of a named phase of an update (collect, update_action, update_bid).

Three figures per phase, in GiB, because an out-of-memory error has three possible owners:

- ``memory/peak_gpu_gib/<phase>``: the most PyTorch's tensors held at once;
- ``memory/peak_reserved_gpu_gib/<phase>``: the most the caching allocator held; above the
  first by blocks it keeps cached for reuse (fragmentation: decoding allocates KV caches of a
  new size every token, training activations of other sizes);
- ``memory/gpu_used_gib/<phase>``: what the device has in use at the phase's end, for every
  process; above the reserved figure by memory outside PyTorch's allocator (CUDA context,
  cuBLAS / NCCL workspaces, DeepSpeed buffers, other processes).

Nothing is measured on CPU. Between phases the memory freed is handed back: the CUDA caching
allocator's blocks, on a CPU the C library's heap (:func:`release_cached_blocks`).
"""

from __future__ import annotations

import ctypes
import gc
import sys
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
    """Free what only reference cycles still hold, then hand the allocator's cached, unused
    blocks back to the device between phases: the rollout's blocks (KV caches of every length)
    otherwise stay reserved while training asks for blocks of other sizes. On a CPU, the C
    library's free memory back to the system (:func:`release_free_host_memory`).

    The collection comes first because Python frees a cycle's tensors only when its garbage
    collector next runs, which may be much later: SmolLM2's SFT left 3 GiB in unreachable cycles
    (AdamW's states of three float32 agents, the size of it) until a collection, through the
    first RL update, whose optimizer step then made RL's own states beside them
    (docs/performance.md)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    else:
        release_free_host_memory()


def release_free_host_memory() -> bool:
    """Return the C library's freed but kept heap memory to the system (glibc's
    ``malloc_trim(0)``; elsewhere nothing): whether it ran.

    glibc keeps freed memory of its heap for later allocations, and after a phase of other
    shapes much of it stays resident: after SmolLM2's SFT 7.3 GiB resident held 1.5 GiB of
    live tensors (the weights), and a trim brought it to 2.2 GiB (docs/performance.md)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
