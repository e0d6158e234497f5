"""CUDA memory snapshots built in ``torch.cuda.memory._snapshot()``'s format, where no GPU can make one.

:func:`training_snapshot` replays a small training job's allocator actions (parameters allocated
before the history began, Adam's state, activations of a forward pass, gradients, a failed request)
into ``segments`` and ``device_traces`` exactly as the caching allocator reports them: every block
of a segment with its state and stack, every history entry with its action, address, size, stream,
time and stack (stacks shared between entries, as PyTorch's symbolisation shares them).  The sizes
are chosen by the caller, so a test knows the truth.  :func:`long_history` makes a history of N
entries for the streaming reader's benchmark.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

MIB = 1 << 20


def frames(*entries: tuple[str, int, str]) -> list[dict[str, Any]]:
    """A stack, innermost frame first (as snapshots list them)."""
    return [{"filename": f, "line": line, "name": name} for f, line, name in entries]


INIT = frames(("torch/nn/modules/module.py", 1340, "_apply"), ("torch/nn/modules/module.py", 1355, "cuda"),
              ("train.py", 12, "main"))
OPTIM = frames(("torch/optim/adam.py", 160, "_init_group"), ("torch/optim/adam.py", 220, "step"),
               ("train.py", 31, "main"))
FORWARD = frames(("torch/nn/modules/linear.py", 125, "forward"),
                 ("torch/nn/modules/module.py", 1750, "_call_impl"), ("train.py", 27, "main"))
BACKWARD = frames(("torch/autograd/graph.py", 825, "_engine_run_backward"),
                  ("torch/_tensor.py", 626, "backward"), ("train.py", 29, "main"))


class Builder:
    """Allocates and frees blocks in segments of a fixed size, recording the history."""

    def __init__(self, segment_bytes: int, base: int = 0x7F0000000000) -> None:
        self.segment_bytes = segment_bytes
        self.base = base
        self.segments: list[dict[str, Any]] = []
        self.history: list[dict[str, Any]] = []
        self.blocks: dict[int, dict[str, Any]] = {}  # address -> live block
        self.time = 0
        self.next_address = base

    def _entry(self, action: str, addr: int, size: int, stack: list[dict[str, Any]], **extra: Any) -> None:
        self.time += 10
        self.history.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": self.time,
                             "frames": stack, **extra})

    def alloc(self, size: int, stack: list[dict[str, Any]], record: bool = True) -> int:
        """A block of ``size`` in the first segment with room (a new segment when none has)."""
        for seg in self.segments:
            if seg["total_size"] - seg["used"] >= size:
                break
        else:
            seg = {"device": 0, "address": self.next_address, "total_size": max(self.segment_bytes, size),
                   "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0), "used": 0,
                   "is_expandable": False}
            self.next_address += 2 * seg["total_size"]  # a gap: segments are not contiguous
            self.segments.append(seg)
            if record:
                self._entry("segment_alloc", seg["address"], seg["total_size"], stack)
        addr = seg["address"] + seg["used"]
        seg["used"] += size
        self.blocks[addr] = {"address": addr, "size": size, "requested_size": size,
                             "state": "active_allocated", "frames": stack}
        if record:
            self._entry("alloc", addr, size, stack)
        return addr

    def free(self, addr: int) -> None:
        block = self.blocks.pop(addr)
        self._entry("free_requested", addr, block["size"], block["frames"])
        self._entry("free_completed", addr, block["size"], block["frames"])
        block["state"] = "inactive"
        self.blocks[-addr] = block  # keep the hole (its address, negated key)

    def oom(self, size: int, device_free: int, stack: list[dict[str, Any]]) -> None:
        self._entry("oom", 0, size, stack, device_free=device_free)

    def snapshot(self, expandable: bool = False) -> dict[str, Any]:
        segments = []
        for seg in self.segments:
            lo, hi = seg["address"], seg["address"] + seg["total_size"]
            blocks = sorted((b for b in self.blocks.values() if lo <= b["address"] < hi),
                            key=lambda b: b["address"])
            end = max((b["address"] + b["size"] for b in blocks), default=lo)
            if end < hi:
                blocks.append({"address": end, "size": hi - end, "requested_size": 0, "state": "inactive",
                               "frames": []})
            allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
            segments.append({k: v for k, v in seg.items() if k != "used"} | {
                "allocated_size": allocated, "active_size": allocated, "requested_size": allocated,
                "blocks": blocks})
        conf = "expandable_segments:True" if expandable else ""
        return {"segments": segments, "device_traces": [self.history],
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": conf}}


def training_snapshot(*, params: int, state: int, activations: int, holes: int, request: int,
                      device_free: int) -> dict[str, Any]:
    """A snapshot dumped at a failed ``request`` after: ``params`` bytes of parameters (allocated
    before the history, in 8 blocks), Adam's ``state`` (2 tensors per parameter block), a forward
    pass keeping ``activations`` bytes (in 8 blocks) and freeing as much again in between (leaving
    ``holes``-byte free blocks, one per activation), then the OOM with ``device_free`` bytes free
    for CUDA."""
    build = Builder(segment_bytes=64 * MIB)
    for _ in range(8):
        build.alloc(params // 8, INIT, record=False)
    for _ in range(16):
        build.alloc(state // 16, OPTIM)
    for _ in range(8):
        build.alloc(activations // 8, FORWARD)
        scratch = build.alloc(holes, FORWARD)
        build.free(scratch)
    build.oom(request, device_free, BACKWARD)
    return build.snapshot()


def long_history(n: int, *, seed: int = 0, stacks: int = 3000) -> dict[str, Any]:
    """A snapshot whose history holds ``n`` entries (allocations and frees of random sizes, stacks
    drawn from ``stacks`` distinct ones, shared as PyTorch shares them)."""
    rng = random.Random(seed)
    files = [f"/work/model/layer{i}.py" for i in range(40)] + ["torch/nn/modules/linear.py"]
    pool = [[{"filename": rng.choice(files), "line": rng.randint(1, 500), "name": f"fn{rng.randint(0, 200)}"}
             for _ in range(rng.randint(5, 30))] for _ in range(stacks)]
    history: list[dict[str, Any]] = []
    live: list[tuple[int, int, list[dict[str, Any]]]] = []
    for i in range(n):
        if live and rng.random() < 0.5:
            addr, size, stack = live.pop(rng.randrange(len(live)))
            action = "free_completed"
        else:
            size = rng.choice([512, 4096, MIB, 8 * MIB])
            addr, stack = 0x7F0000000000 + i * 4096, rng.choice(pool)
            live.append((addr, size, stack))
            action = "alloc"
        history.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": i,
                        "frames": stack})
    blocks = [{"address": a, "size": s, "requested_size": s, "state": "active_allocated", "frames": f}
              for a, s, f in live[:10000]]
    segment = {"device": 0, "address": 0x7F0000000000, "total_size": sum(b["size"] for b in blocks) + MIB,
               "stream": 0, "segment_type": "large", "allocated_size": sum(b["size"] for b in blocks),
               "blocks": blocks}
    return {"segments": [segment], "device_traces": [history], "allocator_settings": {}}


def write(snapshot: dict[str, Any], path: Path) -> Path:
    """Pickle ``snapshot`` as ``torch.cuda.memory._dump_snapshot`` does (protocol 4)."""
    with open(path, "wb") as handle:
        pickle.dump(snapshot, handle, protocol=4)
    return path
