"""Where a writer's traces get their publisher: a worker of the fork server, a process each, or here.

:class:`Publishers` holds the rank's publisher fork server
(:mod:`~torchprof_args.runtime.export.forkserver`, ``--torch-profile-publisher-server``), started with
the writer.  While it serves, the forked exporter only exports and the reaper thread calls
:meth:`Publishers.hand_off` with the staged trace: the server's worker publishes it.  When the server
cannot start or is gone (killed, or it failed to answer), it says so once and each trace starts a
publisher process (``python -m torchprof_args.runtime.export.publisher``) as before; when not even a
process can start, the trace is published on the calling thread.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from torchprof_args.log import get_logger
from torchprof_args.runtime.config import ExportConfig
from torchprof_args.runtime.export.forkserver import ForkServer, ForkServerError
from torchprof_args.runtime.export.job import PublishJob
from torchprof_args.runtime.export.priority import leave_idle_policy
from torchprof_args.runtime.export.publisher import publish, publisher_argv, publisher_env
from torchprof_args.runtime.export.reaper import Pending
from torchprof_args.runtime.export.staging import StagingArea
from torchprof_args.runtime.export.status import PublishStatus

__all__ = ["Publishers"]

logger = get_logger(__name__)


class Publishers:
    """Starts the publishers of one rank's traces (see the module docstring)."""

    def __init__(self, output_dir: Path, staging: StagingArea, config: ExportConfig, rank: int) -> None:
        self.output_dir = output_dir
        self.staging = staging
        self.config = config
        self.rank = rank
        self._server = self._start_server() if config.publisher_server and hasattr(os, "fork") else None

    # -- the fork server -------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        """The fork server is there to publish the next trace; one found ended is said so, once."""
        server = self._server
        if server is None:
            return False
        if not server.alive:
            self._lose_server(ForkServerError(f"the publisher fork server has ended{server.ended_how()}",
                                              sent=False))
            return False
        return True

    @property
    def server_pid(self) -> int | None:
        """The fork server's pid; None when traces start a publisher process each."""
        server = self._server
        return server.process.pid if server is not None else None

    def server_ready(self) -> bool:
        """Whether the fork server has finished starting (its imports); False without one."""
        server = self._server
        return server is not None and server.alive and server.poll_ready()

    def _start_server(self) -> ForkServer | None:
        try:
            return ForkServer.start([str(d) for d in self.staging.dirs], str(self.output_dir),
                                    self.config.publisher_priority, publisher_env(), self.staging.lock_fds)
        except OSError as err:
            logger.warning("rank %d: cannot start the publisher fork server (%s); each trace starts a "
                           "publisher process", self.rank, err.strerror or err)
            return None

    def hand_off(self, pending: Pending) -> PublishStatus | None:
        """On the reaper thread: start the publisher of a staged trace: a worker of the fork server,
        else a publisher process, else publish it here; returns the outcome when there is one already."""
        job = pending.job
        server = self._server
        if server is not None:
            read_fd, write_fd = os.pipe()
            try:
                worker = server.start_worker(pending.job_path, write_fd,
                                             pending.started + self.config.flush_timeout)
                pending.serve(server, worker, read_fd)
                return None
            except ForkServerError as err:
                os.close(read_fd)
                self._lose_server(err)
                if err.sent:  # a worker may have it: no second publisher for this trace
                    return PublishStatus(trace_path=job.trace_path, rank=job.rank, error=str(err))
            finally:
                os.close(write_fd)
        started = self.start_process(job, pending.job_path, "on the reaper thread")
        if started is not None:
            pending.publish_in(*started)
            return None
        return publish(job)

    def _lose_server(self, err: ForkServerError) -> None:
        """The fork server cannot serve any more: say so once, stop it; a publisher per trace from now."""
        server, self._server = self._server, None
        if server is None:
            return
        logger.warning("rank %d: %s; from now on each trace starts a publisher process", self.rank, err)
        server.kill()

    def leave_idle_policy(self) -> None:
        """At exit: the workers the server starts from now on leave SCHED_IDLE (``leave_idle_policy``)."""
        server = self._server
        if server is not None:
            leave_idle_policy(server.process.pid)

    def close(self) -> None:
        """Close the fork server (its workers still running finish)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()

    def kill(self) -> None:
        """Stop the fork server now (from a watchdog thread)."""
        server, self._server = self._server, None
        if server is not None:
            server.kill()

    # -- a process per trace -------------------------------------------------------------------

    def argv(self, job_path: str, status_fd: int) -> list[str]:
        """The command line of a publisher process for ``job_path`` reporting on ``status_fd``."""
        return publisher_argv(job_path, [str(d) for d in self.staging.dirs], str(self.output_dir), status_fd,
                              self.config.publisher_priority)

    def start_process(self, job: PublishJob, job_path: str,
                      instead: str) -> tuple[subprocess.Popen[bytes], int] | None:
        """A publisher process for ``job`` and its status pipe; None when none can start (logged,
        naming where it is published ``instead``)."""
        read_fd, write_fd = os.pipe()
        try:
            popen = subprocess.Popen(self.argv(job_path, write_fd), env=publisher_env(),
                                     start_new_session=True, stdin=subprocess.DEVNULL,
                                     pass_fds=(write_fd, *self.staging.lock_fds))
        except OSError as err:
            os.close(read_fd)
            logger.warning("rank %d: cannot start a publisher process (%s); publishing %s %s", self.rank,
                           err.strerror or err, Path(job.trace_path).name, instead)
            return None
        finally:
            os.close(write_fd)
        return popen, read_fd
