"""PyTorch's distributed debug server (``--torch-profile-debug-server``), started and stopped with
the profiler, with this package's pages (:mod:`.pages`) beside PyTorch's.

``torch.distributed.debug.start_debug_server`` starts a worker server on every rank (an HTTP
server in C++, on an ephemeral port of every interface, advertised in the launcher's TCPStore) and,
on rank 0, forks the web frontend (``--torch-profile-debug-server-port``) that asks every worker
and, every ``--torch-profile-debug-server-dump-interval`` seconds, dumps every rank's stacks and
flight recorder into ``<profile dir>/debug_server/`` for ``torchprof hang``.

What cannot work here is one warning on rank 0 before training, and training goes on without the
server (as the Prometheus sink does): a torch without the server, a missing package, no
torchrun-style environment, the port taken.  The forked frontend gets the default SIGTERM action
and no signal wakeup descriptor of the training process (a stop must not wake the rank's own
SIGTERM handling), and dies with rank 0 (``PR_SET_PDEATHSIG``): a rank killed at a hang leaves no
frontend behind.

Import-light: torch's module is imported in :meth:`DebugServer.start`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import importlib.util
import inspect
import os
import signal
import socket
import threading
from collections.abc import Sequence
from types import ModuleType

from torchprof_args.capture.runtime.config import DebugServerConfig
from torchprof_args.log import get_logger
from torchprof_args.naming import DEBUG_SERVER_DUMPS
from torchprof_args.torch_support import needs

__all__ = ["DebugServer", "unavailable"]

logger = get_logger(__name__)

FEATURE = "--torch-profile-debug-server"
#: What PyTorch's frontend and handlers import (the ``debugserver`` extra).
PACKAGES = ("aiohttp", "jinja2", "tabulate")
#: What PyTorch's ``_store`` reads to reach the launcher's TCPStore.
ENVIRONMENT = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
_PR_SET_PDEATHSIG = 1

#: Set only while :meth:`DebugServer.start` forks the frontend (read by the at-fork hook).
_FORKING_FRONTEND = threading.Event()
_HOOKED = False


def unavailable(packages: Sequence[str] = PACKAGES, module: ModuleType | None = None) -> str | None:
    """Why PyTorch's debug server cannot start in this process (one sentence), None when it can.

    Args:
        packages: what it imports; ``module``: ``torch.distributed.debug`` (default: the installed
            torch's; another: what an older torch has).
    """
    if module is None:
        try:
            import torch.distributed.debug as module
        except ImportError:
            return needs(FEATURE)
    start = getattr(module, "start_debug_server", None)
    if start is None or not {"handlers", "dump_dir"} <= set(inspect.signature(start).parameters):
        return needs(FEATURE)
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    if missing:
        return (f"{FEATURE}: PyTorch's debug server needs {', '.join(missing)}, not installed: pip install "
                "'torchprof-args[debugserver]'")
    unset = [name for name in ENVIRONMENT if name not in os.environ]
    if unset:
        return (f"{FEATURE}: PyTorch's debug server finds the ranks through {', '.join(ENVIRONMENT)}, and "
                f"{', '.join(unset)} not set: launch with torchrun (or set them as it does)")
    return None


def _port_taken(port: int) -> str | None:
    """Why the frontend could not listen on ``port`` (as it binds: every interface, IPv6 with
    IPv4 mapped, address reuse), None when it can."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("", port))
    except OSError as err:
        what = "is in use on this node" if err.errno == errno.EADDRINUSE else f"cannot be bound ({err})"
        return f"--torch-profile-debug-server-port {port} {what}; choose another port"
    return None


def _in_forked_frontend() -> None:
    """At fork, in the child: only for the frontend's fork (see the module docstring)."""
    if not _FORKING_FRONTEND.is_set():
        return
    with contextlib.suppress(ValueError, OSError):  # ValueError: not forked from the main thread
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


class DebugServer:
    """PyTorch's debug server on this rank (see the module docstring).

    Args:
        config: the flags' settings; ``rank``: this rank (0 hosts the frontend).
    """

    def __init__(self, config: DebugServerConfig, rank: int) -> None:
        self.config = config
        self.rank = rank
        self.running = False

    @classmethod
    def from_config(cls, config: DebugServerConfig, rank: int) -> DebugServer | None:
        """The server the config asks for; None without ``--torch-profile-debug-server``."""
        return cls(config, rank) if config.enabled else None

    def start(self) -> bool:
        """Start this rank's part (after ``init_process_group``); True when it runs.  What cannot
        work is one warning on rank 0, and training goes on."""
        if self.running:
            return True
        problem = unavailable() or (_port_taken(self.config.port) if self.rank == 0 else None)
        if problem:
            if self.rank == 0:
                logger.warning("rank %d: %s; training goes on without the debug server", self.rank, problem)
            return False
        import torch.distributed.debug as debug

        config = self.config
        dump_dir = config.dump_dir if config.dump_interval > 0 else None
        kwargs = {}
        if self.rank == 0:
            from torchprof_args.capture.runtime.debug_server.pages import pages

            kwargs = {"handlers": pages(control_dir=config.control_dir, profile_dir=config.profile_dir,
                                        dump_dir=dump_dir),
                      "dump_dir": dump_dir,
                      "dump_interval": self.config.dump_interval or 60.0,
                      "enabled_dumps": set(DEBUG_SERVER_DUMPS.values())}
        global _HOOKED
        if not _HOOKED:
            os.register_at_fork(after_in_child=_in_forked_frontend)
            _HOOKED = True
        _FORKING_FRONTEND.set()
        try:
            debug.start_debug_server(port=self.config.port, **kwargs)  # type: ignore[arg-type]
        except Exception as err:  # noqa: BLE001 - a debugging aid never stops training
            logger.warning("rank %d: %s: PyTorch's debug server did not start (%s: %s); training goes on "
                           "without it", self.rank, FEATURE, type(err).__name__, err)
            return False
        finally:
            _FORKING_FRONTEND.clear()
        self.running = True
        if self.rank == 0:
            logger.info("rank %d: PyTorch's debug server on http://%s:%d/ (trusted networks only)%s",
                        self.rank, socket.gethostname(), self.config.port,
                        f"; dumps every {self.config.dump_interval:g} s into {dump_dir}" if dump_dir else "")
        return True

    def stop(self) -> None:
        """Stop the frontend (rank 0) and this rank's worker server; never raises."""
        if not self.running:
            return
        self.running = False
        import torch.distributed.debug as debug

        try:
            if self.rank == 0:
                debug.stop_debug_server()
            else:  # PyTorch's stop_debug_server() expects the frontend: a worker alone is shut here
                worker, debug._WORKER_SERVER = debug._WORKER_SERVER, None  # noqa: SLF001
                if worker is not None:
                    worker.shutdown()
        except Exception as err:  # noqa: BLE001 - the job is ending; say it and go on
            logger.warning("rank %d: PyTorch's debug server did not stop cleanly (%s: %s)", self.rank,
                           type(err).__name__, err)
