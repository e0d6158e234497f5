"""The exporter's and the publisher's priority: the lowest CPU and I/O priority the platform allows.

A flush forks a child that serialises the trace, then becomes the publisher (gzip, summary
sidecar, diagnosis).  At the training process's own priority they take CPU and disk bandwidth
from the steps that follow the flush (measured on 2 gloo ranks on a 2-core machine: +585 ms over
the 22 steps after a flush that itself stalled 362 ms; ``benchmarks/bench_window_cost.py``).
:func:`lower_to_background` is applied first thing in the forked child and in the publisher:
``nice`` 19, the ``SCHED_IDLE`` policy (the CPU only when nothing else wants it) and the ``idle``
I/O class (honoured by the BFQ and CFQ I/O schedulers).  Each is inherited across ``exec`` and by
the publisher's own decoding processes.

While training runs this is what we want; at exit nothing competes with training any more, so
:func:`leave_idle_policy` moves the publishers still running back to ``SCHED_OTHER`` and the
best-effort I/O class (nice 19 stays: an unprivileged process may not lower it again) so that a
host busy with other tenants cannot starve them until ``--torch-profile-exit-timeout``.  Linux
allows leaving ``SCHED_IDLE`` only to root, ``CAP_SYS_NICE`` or an ``RLIMIT_NICE`` (``ulimit -e``)
of at least 1; under the usual limit of 0 the call is refused and the publishers stay idle.

``--torch-profile-publisher-priority normal`` keeps the training process's priority (the
behaviour before).  Where a call is not available (not Linux, an unknown architecture for the
``ioprio_set`` syscall, a seccomp filter) it is skipped; the publisher says so in a debug line.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform

__all__ = ["IDLE", "NORMAL", "PRIORITIES", "io_priority", "leave_idle_policy", "lower_to_background"]

#: ``--torch-profile-publisher-priority`` values.
IDLE = "idle"
NORMAL = "normal"
PRIORITIES = (IDLE, NORMAL)

#: The lowest nice value's number (the highest nice).
LOWEST_NICE = 19
#: linux/ioprio.h
IOPRIO_CLASS_BE = 2
IOPRIO_CLASS_IDLE = 3
IOPRIO_CLASS_SHIFT = 13
IOPRIO_WHO_PROCESS = 1
#: ``(ioprio_set, ioprio_get)`` syscall numbers by machine (arch/*/syscall tables).
_IOPRIO_SYSCALLS = {
    "x86_64": (251, 252),
    "amd64": (251, 252),
    "i386": (289, 290),
    "i686": (289, 290),
    "aarch64": (30, 31),
    "arm64": (30, 31),
    "riscv64": (30, 31),
    "armv7l": (314, 315),
    "ppc64le": (273, 274),
    "ppc64": (273, 274),
    "s390x": (282, 283),
}


def _syscall(number: int, *args: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    result = int(libc.syscall(number, *(ctypes.c_long(a) for a in args)))
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


def _ioprio_numbers() -> tuple[int, int] | None:
    if os.uname().sysname != "Linux":
        return None
    return _IOPRIO_SYSCALLS.get(platform.machine().lower())


def set_io_priority(pid: int, io_class: int, level: int = 0) -> None:
    """``ioprio_set`` for process ``pid`` (0: this one); raises ``OSError`` where it is unavailable."""
    numbers = _ioprio_numbers()
    if numbers is None:
        raise OSError(f"no ioprio_set syscall known for {os.uname().sysname} {platform.machine()}")
    _syscall(numbers[0], IOPRIO_WHO_PROCESS, pid, (io_class << IOPRIO_CLASS_SHIFT) | level)


def io_priority(pid: int = 0) -> tuple[int, int] | None:
    """``(class, level)`` of process ``pid``'s I/O priority, or None where it cannot be read."""
    numbers = _ioprio_numbers()
    if numbers is None:
        return None
    try:
        value = _syscall(numbers[1], IOPRIO_WHO_PROCESS, pid)
    except OSError:
        return None
    return value >> IOPRIO_CLASS_SHIFT, value & ((1 << IOPRIO_CLASS_SHIFT) - 1)


def lower_to_background() -> list[str]:
    """Lower this process (its calling thread, and what it starts from now on) to nice 19,
    ``SCHED_IDLE`` and the idle I/O class.  Never raises and never logs (a forked child must not
    touch the parent's logging): returns what could not be applied, one ``"what: why"`` each, for
    the publisher's debug line."""
    skipped: list[str] = []
    steps = (
        ("nice 19", lambda: os.setpriority(os.PRIO_PROCESS, 0, LOWEST_NICE)),
        ("SCHED_IDLE", lambda: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))),
        ("I/O idle", lambda: set_io_priority(0, IOPRIO_CLASS_IDLE)),
    )
    for name, step in steps:
        try:
            step()
        except (AttributeError, OSError) as err:  # not this platform, or refused: go on as is
            skipped.append(f"{name}: {err}")
    return skipped


def leave_idle_policy(pid: int) -> None:
    """Move a still-running publisher ``pid`` from ``SCHED_IDLE`` to ``SCHED_OTHER`` (at its nice 19)
    and from the idle to the lowest best-effort I/O class: at exit it competes only with other
    tenants.  Best effort: a process already gone, or a refusal, is ignored."""
    with contextlib.suppress(AttributeError, OSError):
        if os.sched_getscheduler(pid) == os.SCHED_IDLE:
            os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
    with contextlib.suppress(OSError):
        current = io_priority(pid)
        if current is not None and current[0] == IOPRIO_CLASS_IDLE:
            set_io_priority(pid, IOPRIO_CLASS_BE, 7)
