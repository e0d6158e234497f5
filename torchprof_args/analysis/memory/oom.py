"""Why it ran out of memory: an ``oom`` entry of a snapshot's allocator history, explained.

At an OOM the caching allocator has already returned its wholly free segments to CUDA and retried;
what is left is the request that failed, the memory CUDA reported free (``device_free``) and the
free blocks the allocator still caches inside segments that also hold live tensors.  So:

* **fragmentation**: the free memory (CUDA's plus the cached blocks) would hold the request, but no
  single free block or free CUDA range is that large; expandable segments fix it;
* **demand**: even all the free memory together is short by ``missing`` bytes; the remedy is the
  least disruptive one that frees at least that much, from what held the memory then (by category,
  from the blocks' stacks: :mod:`.snapshot_history`).
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec
import numpy as np

from torchprof_args.analysis.memory.breakdown import TOP_SITES
from torchprof_args.analysis.memory.categories import MEMORY_CATEGORIES, ByCategory, Site, human_bytes
from torchprof_args.analysis.memory.findings import REMEDIES, category_remedies
from torchprof_args.analysis.memory.snapshot_history import History, history_allocations

__all__ = ["OomExplanation", "Remedy", "explain_oom"]


class Remedy(msgspec.Struct, frozen=True):
    """A change, what it frees, and whether that covers the missing bytes."""

    kind: str
    bytes_freed: int
    enough: bool
    remedy: str


class OomExplanation(msgspec.Struct, frozen=True):
    """One OOM: the failed request, the free memory then, what held the memory, the cause, the remedy.

    Attributes:
        device: ``cuda:N``.
        requested_bytes: the allocation that failed.
        device_free_bytes: what CUDA reported free at the OOM (None: not recorded).
        reserved_bytes / allocated_bytes: the allocator's, at the dump that followed.
        cached_free_bytes: free blocks the allocator caches inside segments still in use.
        largest_free_block_bytes: the largest of them.
        cause: ``fragmentation`` or ``demand``.
        missing_bytes: what no rearrangement could provide (0 for fragmentation).
        held: what held the memory at the OOM, by category.
        top_sites: the largest allocation sites live then.
        site: where the failed request came from.
        remedy: the first of ``remedies`` that frees enough (None: none alone does).
        remedies: every remedy considered, with what it frees.
        summary: one sentence.
    """

    device: str
    requested_bytes: int
    device_free_bytes: int | None
    reserved_bytes: int
    allocated_bytes: int
    cached_free_bytes: int
    largest_free_block_bytes: int
    cause: str
    missing_bytes: int
    held: ByCategory
    top_sites: list[Site]
    site: str
    remedy: Remedy | None
    remedies: list[Remedy]
    summary: str


class _State(Protocol):
    """The allocator's state at the dump (:class:`~.timer_snapshot.AllocatorState`)."""

    @property
    def reserved_bytes(self) -> int: ...

    @property
    def allocated_bytes(self) -> int: ...

    @property
    def cached_free_bytes(self) -> int: ...

    @property
    def largest_free_block_bytes(self) -> int: ...


def _mib(n: float) -> str:
    return human_bytes(n)


def explain_oom(history: History, state: _State, live_blocks: list[tuple[int, int, Any]], device: str,
                data_parallel: int = 2) -> OomExplanation:
    """The explanation of ``history``'s last ``oom`` entry, with the allocator ``state`` at the dump.

    Args:
        history: the device's allocator history (with an ``oom`` entry).
        state: the allocator's state at the dump that followed the OOM.
        live_blocks: the blocks allocated at the dump (those with no ``alloc`` in the history were
            allocated before it).
        device: ``cuda:N``.
        data_parallel: the data-parallel ranks the sharding remedies count on.

    Returns:
        The explanation.
    """
    oom = history.ooms[-1]
    allocs = history_allocations(history, device, live_blocks, until=oom.index)
    live = ~np.isfinite(allocs.end)
    totals = np.zeros(len(MEMORY_CATEGORIES), dtype=np.int64)
    np.add.at(totals, allocs.category[live].astype(np.intp), allocs.size[live])
    held = ByCategory.of(totals)
    sites = _sites(allocs.places, allocs.where[live], allocs.size[live], allocs.category[live])
    free = (oom.device_free_bytes or 0) + state.cached_free_bytes
    largest = max(state.largest_free_block_bytes, oom.device_free_bytes or 0)
    request = oom.requested_bytes
    fragmentation = request <= free
    missing = 0 if fragmentation else request - free
    remedies = [Remedy("fragmentation", state.cached_free_bytes, fragmentation, REMEDIES["fragmentation"])]
    for kind, freed, _ in category_remedies(held, data_parallel):
        remedies.append(Remedy(kind, freed, freed + free >= request, REMEDIES[kind]))
    chosen = remedies[0] if fragmentation else next((r for r in remedies[1:] if r.enough), None)
    if fragmentation:
        summary = (f"{device}: a request of {_mib(request)} failed with {_mib(free)} free in all "
                   f"({_mib(oom.device_free_bytes or 0)} by CUDA, {_mib(state.cached_free_bytes)} cached by "
                   f"the allocator) but no free block over {_mib(largest)}: fragmentation")
    else:
        summary = (f"{device}: a request of {_mib(request)} failed with {_mib(free)} free in all: "
                   f"{_mib(missing)} short; the memory was held by {_biggest(held)}")
    return OomExplanation(
        device=device, requested_bytes=request, device_free_bytes=oom.device_free_bytes,
        reserved_bytes=state.reserved_bytes, allocated_bytes=state.allocated_bytes,
        cached_free_bytes=state.cached_free_bytes, largest_free_block_bytes=state.largest_free_block_bytes,
        cause="fragmentation" if fragmentation else "demand", missing_bytes=missing, held=held,
        top_sites=sites, site=oom.site, remedy=chosen, remedies=remedies, summary=summary)


def _biggest(held: ByCategory) -> str:
    ranked = sorted(zip(MEMORY_CATEGORIES, held.values(), strict=True), key=lambda kv: -kv[1])
    return ", ".join(f"{name.replace('_', ' ')} {_mib(n)}" for name, n in ranked[:3] if n)


def _sites(places: list[Any], where: np.ndarray, size: np.ndarray, category: np.ndarray) -> list[Site]:
    totals: dict[str, list[int]] = {}
    for w, s, c in zip(where.tolist(), size.tolist(), category.tolist(), strict=True):
        entry = totals.setdefault(places[w].site or "<unknown>", [0, 0, 0 * c] + [0] * len(MEMORY_CATEGORIES))
        entry[0] += s
        entry[1] += 1
        entry[3 + c] += s
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:TOP_SITES]
    return [Site(site, v[0], v[1], MEMORY_CATEGORIES[int(np.argmax(v[3:]))]) for site, v in ranked]
