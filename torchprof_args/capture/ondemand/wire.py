"""The decision of one on-demand check, as a fixed-size byte string.

Fixed size, so that it travels in one asynchronous ``broadcast`` of a uint8 tensor on the
fence's gloo group (no pickling, no size exchange, nothing a rank must wait for).
"""

from __future__ import annotations

import struct

from torchprof_args.capture.ondemand.window import OnDemandWindow

__all__ = ["decision_size", "decode_decision", "encode_decision"]

#: has window, check after next, the window's check iteration, warmup start, start, end, all ranks
_DECISION_HEADER = struct.Struct("<7q")
_ID_BYTES = 100  # request ids are at most 100 characters (protocol.ID_PATTERN)


def decision_size(world_size: int) -> int:
    return _DECISION_HEADER.size + _ID_BYTES + world_size


def encode_decision(window: OnDemandWindow | None, check_after: int, world_size: int) -> bytes:
    """A fixed-size encoding of a check's decision, so it travels in one asynchronous broadcast."""
    payload = bytearray(decision_size(world_size))
    if window is None:
        _DECISION_HEADER.pack_into(payload, 0, 0, check_after, 0, 0, 0, 0, 0)
        return bytes(payload)
    _DECISION_HEADER.pack_into(payload, 0, 1, check_after, window.check_iteration, window.warmup_start,
                               window.start, window.end, int(window.ranks is None))
    request_id = window.request_id.encode()[:_ID_BYTES]
    payload[_DECISION_HEADER.size:_DECISION_HEADER.size + len(request_id)] = request_id
    for rank in window.ranks or ():
        payload[_DECISION_HEADER.size + _ID_BYTES + rank] = 1
    return bytes(payload)


def decode_decision(payload: bytes, world_size: int) -> tuple[OnDemandWindow | None, int]:
    has_window, check_after, check, warmup_start, start, end, all_ranks = (
        _DECISION_HEADER.unpack_from(payload, 0)
    )
    if not has_window:
        return None, check_after
    request_id = payload[_DECISION_HEADER.size:_DECISION_HEADER.size + _ID_BYTES].rstrip(b"\0").decode()
    mask = payload[_DECISION_HEADER.size + _ID_BYTES:]
    ranks = None if all_ranks else tuple(rank for rank in range(world_size) if mask[rank])
    return OnDemandWindow(request_id, check, warmup_start, start, end, ranks), check_after

