"""Hang forensics: PyTorch's flight recorder, on, and dumped on every way a hang ends.

``--torch-profile-flight-recorder N`` keeps the last N collectives of every process group in
PyTorch's own ring buffer.  PyTorch reads the buffer size when the first process group is
created, so the flag's argparse action sets the environment at parse time
(:func:`.flight_recorder_env.configure_environment`); :meth:`FlightRecorder.from_config` warns when
the process group existed before that.

PyTorch dumps the buffer by itself only on an NCCL watchdog timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT``,
into ``<profile dir>/flight_recorder/nccl_trace_rank_<R>``), and its analyzer needs a dump from
every rank.  :class:`FlightRecorder` therefore also dumps, through PyTorch's own dump call, when
the fence barrier fails (a rank is missing), when an exception leaves the profiler's context (a
collective timed out), and on SIGTERM (the launcher stopping the other ranks): a watcher thread
woken by the signal (``signal.set_wakeup_fd``) dumps even while the main thread is blocked in a
collective.  The first dump of a process wins (it is the state closest to the hang); later
triggers are logged.  Beside each dump, ``dump_info_rank<R>.json`` says why and when, with the
rank's process-group table (gloo dumps lack it; ``torchprof hang`` needs it).

Before each dump, every rank writes its threads' stacks (:mod:`torchprof_args.capture.stacks.dumper`,
``stacks_rank<R>.json``).  ``--torch-profile-stacks`` without the recorder: a recorder with no
entries, the same triggers, stacks and ``dump_info`` only.  Wherever the profiler runs, every rank
also serves its stacks on request (:mod:`~torchprof_args.capture.stacks.server`, ``torchprof trigger
--stacks``; ``--no-torch-profile-stacks-server`` turns it off), whose tick also notices PyTorch's
own NCCL-timeout dump; a job with neither the recorder nor the stacks gets a recorder that only
serves: it dumps nothing and watches no signal of its own.

Import-light: torch is imported only when a dump is taken.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from torchprof_args import _dist
from torchprof_args.atomic import write_bytes_atomically, write_json_atomically
from torchprof_args.capture.runtime import flight_recorder_env
from torchprof_args.capture.runtime.config import FlightRecorderConfig
from torchprof_args.capture.runtime.signals import SigtermGuard, SigtermWatcher, terminate
from torchprof_args.capture.stacks.dumper import StackDumper, mark_signal_handler
from torchprof_args.capture.stacks.server import StacksServer
from torchprof_args.log import get_logger
from torchprof_args.naming import FLIGHT_RECORDER_PREFIXES, flight_recorder_info_name, short_hostname
from torchprof_args.torch_support import needs

GLOO_FEATURE = "--torch-profile-flight-recorder (gloo dumps)"

__all__ = ["FlightRecorder"]

logger = get_logger(__name__)

SIGTERM_REASON = "SIGTERM received (the launcher is stopping this rank)"

def _process_groups() -> dict[str, dict[str, Any]]:
    """This rank's process groups: name -> description and global ranks (what gloo dumps lack)."""
    try:
        from torch.distributed import distributed_c10d as c10d

        world = c10d._world  # noqa: SLF001 - the only place PyTorch keeps this table
        return {str(world.pg_names[pg]): {"desc": getattr(pg, "group_desc", "undefined"),
                                          "ranks": sorted(int(r) for r in world.pg_group_ranks[pg])}
                for pg in list(world.pg_map)}
    except Exception:  # noqa: BLE001 - a table is a nicety; the dump is what matters
        return {}


def _dump_calls() -> dict[str, Any]:
    """PyTorch's own dump call of each recorder this build has (NCCL's only with CUDA and NCCL)."""
    import torch
    import torch.distributed as dist
    from torch._C import _distributed_c10d as c10d

    calls: dict[str, Any] = {}
    nccl = getattr(c10d, "_dump_nccl_trace", None)
    if nccl is not None and torch.cuda.is_available() and dist.is_nccl_available():
        calls["nccl"] = nccl
    cpu = getattr(c10d, "_dump_fr_trace", None)
    if cpu is not None:
        calls["gloo"] = cpu
    return calls


class _PlainData(pickle.Unpickler):
    """Builds only builtin containers and scalars (what a dump holds); refuses every global."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name}")


def _entries(data: bytes) -> int:
    try:
        dump = _PlainData(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError):
        return 0
    return len(dump.get("entries") or []) if isinstance(dump, dict) else 0


def _warm_up() -> None:
    """Import what PyTorch's dump call imports on its first call with entries to symbolise
    (``torch._inductor``, 1-3 s), in a background thread now, so that a dump at a hang, with the
    launcher's SIGKILL coming, does not wait for it."""

    def load() -> None:
        started = time.monotonic()
        try:
            import importlib

            importlib.import_module("torch._inductor")
        except Exception as err:  # noqa: BLE001 - only a speed-up
            logger.debug("flight recorder warm-up failed: %s", err)
            return
        logger.debug("flight recorder warm-up: torch._inductor imported in %.1f s",
                     time.monotonic() - started)

    if "torch._inductor" not in sys.modules:
        threading.Thread(target=load, name="torchprof-fr-warmup", daemon=True).start()


class FlightRecorder:
    """Dumps PyTorch's flight recorder of this rank into ``directory`` (see the module docstring)."""

    def __init__(self, directory: str, *, entries: int, rank: int | None = None, stacks: bool = False,
                 stacks_control_dir: str | None = None) -> None:
        self.directory = Path(directory)
        self.entries = entries
        self.rank = _dist.rank() if rank is None else rank
        #: Every thread's stack, written first at each dump (None: ``--torch-profile-stacks`` is off).
        self.stacks = StackDumper(self.directory, self.rank) if stacks else None
        #: Answers ``torchprof trigger --stacks`` (None: no ``stacks_control_dir``).
        self._server = None if stacks_control_dir is None else StacksServer(
            stacks_control_dir, self.stacks or StackDumper(self.directory, self.rank), rank=self.rank,
            world_size=_dist.world_size(), tick=self._check_pytorch_dump)
        self._pytorch_dump_seen: float | None = None
        self._armed = False
        self.dumped: str | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._writer_thread: int | None = None
        self._terminate_after = False
        self._guard: SigtermGuard | None = None
        self._sigterm = SigtermWatcher(lambda: self.dump(SIGTERM_REASON), self._on_sigterm_handler)

    @property
    def dumps(self) -> bool:
        """Whether this recorder dumps at a hang (the flight recorder or the stacks are on); when not,
        it only serves stacks on request."""
        return self.entries > 0 or self.stacks is not None

    @classmethod
    def from_config(cls, config: FlightRecorderConfig, rank: int, *, profiling: bool = False
                    ) -> FlightRecorder | None:
        """The recorder a config asks for.

        Args:
            config: the flight recorder's, stacks' and stacks server's settings.
            rank: this rank.
            profiling: the profiler runs (a trace, memory snapshot, nsys or on-demand feature is on),
                so the stacks server runs unless the config turns it off.

        Returns:
            The recorder; None when there is nothing to do (neither the recorder, the stacks nor the
            server).  Warns when the process group was created before the recorder could be turned on.
        """
        serve = config.stacks_server and (profiling or config.active)
        if not config.active and not serve:
            return None
        control_dir = config.stacks_control_dir if serve else None
        if not config.enabled:
            return cls(config.output_dir, entries=0, rank=rank, stacks=config.stacks,
                       stacks_control_dir=control_dir)
        if not flight_recorder_env.STATE["configured"]:  # configs built without the flag's parse-time action
            flight_recorder_env.configure_environment(config.entries, str(Path(config.output_dir).parent))
        if flight_recorder_env.STATE["pg_existed"] and not flight_recorder_env.launcher_set_buffer():
            logger.warning(
                "rank %d: --torch-profile-flight-recorder: the process group was created before the flag "
                "took effect, so PyTorch's flight recorder is off (it reads TORCH_FR_BUFFER_SIZE when the "
                "first process group is created). Parse the flags before init_process_group, or export "
                "TORCH_FR_BUFFER_SIZE=%d in the launcher.", rank, config.entries)
        return cls(config.output_dir, entries=config.entries, rank=rank, stacks=config.stacks,
                   stacks_control_dir=control_dir)

    def arm(self, guard: SigtermGuard | None = None) -> None:
        """Create the dump directory, point PyTorch's dumps at it, watch for SIGTERM (main thread).

        ``guard``: the profiler's installed :class:`~torchprof_args.capture.runtime.signals.SigtermGuard`,
        whose watchdog thread already owns the signal wakeup: the dump rides on it (as soon as the
        signal arrives, and again at the safe point in case no watchdog could start).  Without
        one (flight recorder only), this recorder watches by itself.
        """
        if self._armed:
            return
        self._armed = True
        if self.dumps:
            self.directory.mkdir(parents=True, exist_ok=True)
        if self.entries:
            flight_recorder_env.point_dumps_at(str(self.directory.parent))
            _warm_up()
            self._pytorch_dump_seen = self._pytorch_dump_mtime()
        if self._server is not None:
            self._server.start()
        if guard is not None and guard.installed:
            self._guard = guard
            guard.on_arrival.append(self._dump_on_sigterm)
            guard.hooks.append(self._dump_on_sigterm)
            watching = True
        else:  # a recorder that only serves leaves SIGTERM alone
            watching = self.dumps and self._sigterm.start()
        logger.debug("rank %d: hang forensics armed (%d flight-recorder entries, stacks %s, dumps to %s; "
                     "stacks server %s; SIGTERM watcher %s)", self.rank, self.entries,
                     "on" if self.stacks else "off", self.directory if self.dumps else "-",
                     "on" if self._server is not None else "off", "on" if watching else "off")

    def disarm(self) -> None:
        guard, self._guard = self._guard, None
        if guard is not None:
            for hooks in (guard.on_arrival, guard.hooks):
                with contextlib.suppress(ValueError):
                    hooks.remove(self._dump_on_sigterm)
        self._sigterm.stop()
        if self._server is not None:
            self._server.stop()
        self._armed = False

    def _pytorch_dump_mtime(self) -> float | None:
        try:
            return (self.directory / f"{FLIGHT_RECORDER_PREFIXES['nccl']}{self.rank}").stat().st_mtime
        except OSError:
            return None

    def _check_pytorch_dump(self) -> None:
        """The stacks server's tick: PyTorch's NCCL watchdog dumped by itself (a collective timed
        out): write the stacks (and dump_info) beside its dump."""
        if not self.entries or self.dumped is not None:
            return
        mtime = self._pytorch_dump_mtime()
        if mtime is not None and mtime != self._pytorch_dump_seen:
            self._pytorch_dump_seen = mtime
            self.dump("PyTorch's NCCL watchdog dumped the flight recorder (a collective timed out)",
                      pytorch_dumped=True)

    def wait_for_dump(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) for a dump in progress on another thread; True when none is
        in progress any more."""
        if self.dumped is None or self._writer_thread == threading.get_ident() or self._done.is_set():
            return True
        logger.warning("rank %d: waiting for the flight-recorder dump in progress (%s) before ending",
                       self.rank, self.dumped)
        return self._done.wait(timeout)

    def _dump_on_sigterm(self) -> None:
        self.dump(SIGTERM_REASON)

    def on_fence_failure(self, iteration: int, what: str, err: BaseException) -> None:
        """A :class:`~torchprof_args.capture.runtime.fence.Fence` failure hook: a rank did not arrive."""
        self.dump(f"the {what} barrier at iteration {iteration} failed: {str(err)[:200]}")

    def dump(self, reason: str, wait: float = 60.0, *, exc: BaseException | None = None,
             pytorch_dumped: bool = False) -> list[Path]:
        """Write this rank's stacks, then its dump(s) through PyTorch's own dump call (not when
        ``pytorch_dumped``: PyTorch did); never raises.  ``exc``: the exception that ended the
        training loop (its traceback says where the rank was).  The first dump of the process
        wins: a later call from another thread waits (at most ``wait`` s) for it to be written,
        so a process about to exit does not cut it short, and only logs."""
        reason = " ".join(reason.split())  # one line, in the log and in dump_info
        if reason == SIGTERM_REASON and self._server is not None:
            self._server.forget()  # the process ends: no stale `trigger --pid` entry
        if not self.dumps:
            return []
        with self._lock:
            first = self.dumped is None
            if first:
                self.dumped, self._writer_thread = reason, threading.get_ident()
        if not first:
            if self._writer_thread != threading.get_ident():  # a signal handler inside our own dump: no wait
                self._done.wait(wait)
            logger.info("rank %d: flight recorder already dumped (%s); not dumping again for: %s",
                        self.rank, self.dumped, reason)
            return []
        try:
            return self._write_once(reason, exc, pytorch_dumped)
        finally:
            self._done.set()
            if self._terminate_after:
                terminate(signal.SIGTERM)

    def _write_once(self, reason: str, exc: BaseException | None, pytorch_dumped: bool) -> list[Path]:
        if self.stacks is not None:  # first: the state closest to the hang, and quick
            self.stacks.dump(reason, exc)
        try:
            return self._write(reason, pytorch_dumped)
        except (SystemExit, KeyboardInterrupt):  # a signal handler raised in the middle: finish, then go on
            self._write(reason, pytorch_dumped)
            raise
        except Exception as err:  # noqa: BLE001 - forensics must never make things worse
            logger.error("rank %d: flight recorder dump failed (%s: %s)", self.rank, type(err).__name__, err)
            return []
        finally:
            if self.stacks is not None:  # py-spy pauses the process: after the collectives are saved
                self.stacks.add_native()

    def _on_sigterm_handler(self, signum: int, frame: FrameType | None) -> None:
        """The SIGTERM handler when nobody else has one: dump, then terminate (after our own dump
        if the signal interrupted it)."""
        if self._writer_thread == threading.get_ident() and not self._done.is_set():
            self._terminate_after = True
            return
        self.dump(SIGTERM_REASON)
        terminate(signum)

    def _write(self, reason: str, pytorch_dumped: bool = False) -> list[Path]:
        written: list[Path] = []
        calls = _dump_calls() if self.entries and not pytorch_dumped else {}
        for backend, call in calls.items():
            data = call()
            if not _entries(data):
                continue
            path = self.directory / f"{FLIGHT_RECORDER_PREFIXES[backend]}{self.rank}"
            write_bytes_atomically(path, data)
            written.append(path)
        write_json_atomically(self.directory / flight_recorder_info_name(self.rank), {
            "rank": self.rank, "host": short_hostname(), "pid": os.getpid(), "reason": reason,
            "time": time.time(), "files": [p.name for p in written], "process_groups": _process_groups(),
            "world_size": _dist.world_size(),
            "stacks": self.stacks.path.name if self.stacks is not None else None}, indent=1)
        if not self.entries or pytorch_dumped:
            return written
        if written:
            logger.warning("rank %d: flight recorder dumped to %s (%s); run `torchprof hang %s` once every "
                           "rank has dumped", self.rank, ", ".join(map(str, written)), reason, self.directory)
        elif "gloo" not in calls:
            logger.warning("rank %d: flight recorder not dumped (%s): %s", self.rank, reason,
                           needs(GLOO_FEATURE))
        else:
            logger.warning("rank %d: flight recorder had no collectives to dump (%s)", self.rank, reason)
        return written


for _handler in (FlightRecorder._on_sigterm_handler, SigtermGuard._handler):  # noqa: SLF001
    mark_signal_handler(_handler)  # a rank's stacks show where the signal found it, not the dump
