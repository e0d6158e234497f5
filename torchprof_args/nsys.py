"""Nsight Systems: capture exactly the scheduled steps, with NVTX ranges for steps and timers.

Two halves that fit together:

* In the training process, ``--torch-profile-nsys`` makes :class:`NsysController` call
  ``cudaProfilerStart()`` when the schedule's recorded (active) steps begin and
  ``cudaProfilerStop()`` when they end, and wrap each step (and each step timer) in an NVTX range.
* Around the launcher, ``torchprof nsys -- CMD...`` prints (or ``--run``\\ s) the matching
  ``nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop ...`` command, so the
  report holds those steps only instead of hours of start-up and training.

Import-light: torch is imported only when a controller is created.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any, Protocol

from torchprof_args.log import current_rank, get_logger

__all__ = ["NsysController", "CudaNsysBackend", "nsys_command", "register"]

logger = get_logger("torchprof_args.nsys")


class NsysBackend(Protocol):
    """What the controller needs from CUDA; :class:`CudaNsysBackend` is the real one."""

    def synchronize(self) -> None: ...
    def profiler_start(self) -> None: ...
    def profiler_stop(self) -> None: ...
    def range_push(self, name: str) -> None: ...
    def range_pop(self) -> None: ...


class CudaNsysBackend:
    """``torch.cuda``'s profiler API and NVTX."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._cudart = torch.cuda.cudart()

    def synchronize(self) -> None:
        self._torch.cuda.synchronize()

    def profiler_start(self) -> None:
        self._cudart.cudaProfilerStart()

    def profiler_stop(self) -> None:
        self._cudart.cudaProfilerStop()

    def range_push(self, name: str) -> None:
        self._torch.cuda.nvtx.range_push(name)

    def range_pop(self) -> None:
        self._torch.cuda.nvtx.range_pop()


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001  (a broken CUDA install is "no CUDA" here)
        return False


class NsysController:
    """Starts/stops Nsight Systems capture around the recorded steps; NVTX ranges for steps.

    Hooks, called by the profiler on every rank:

    * ``on_step(iteration, recording)`` at the *start* of each iteration; ``recording`` is
      whether this iteration is one of the schedule's recorded (active) steps.  Capture starts
      (``cudaProfilerStart``) on the first recorded iteration and stops on the first one that is
      not, after a ``cuda.synchronize()`` so the captured kernels are exactly those steps'.  Each
      iteration runs inside an NVTX range ``step <iteration>``.
    * ``range(name)``: an NVTX range context manager (timers, phases).
    * ``close()``: ends the open step range and stops a running capture.

    Without CUDA every hook is a no-op, after one warning.  With ``enabled=False`` (flag not
    given) every hook is a silent no-op.
    """

    def __init__(self, enabled: bool = True, backend: NsysBackend | None = None,
                 cuda_available: bool | None = None) -> None:
        self.enabled = enabled
        self.capturing = False
        self._step_range_open = False
        self._backend: NsysBackend | None = None
        if not enabled:
            return
        available = _cuda_available() if cuda_available is None else cuda_available
        if not available:
            logger.warning(
                "--torch-profile-nsys needs CUDA, which is not available on rank %d: no Nsight "
                "Systems capture range or NVTX ranges will be emitted.", current_rank())
            self.enabled = False
            return
        self._backend = backend if backend is not None else CudaNsysBackend()

    @classmethod
    def from_args(cls, args: argparse.Namespace, **kwargs: Any) -> NsysController:
        """A controller for ``--torch-profile-nsys`` (a silent no-op when it is not given)."""
        return cls(enabled=bool(getattr(args, "torch_profile_nsys", False)), **kwargs)

    def on_step(self, iteration: int, recording: bool) -> None:
        """Call at the start of ``iteration``; see the class docstring."""
        if not self.enabled:
            return
        backend = self._backend
        assert backend is not None
        self._end_step_range()
        if recording and not self.capturing:
            backend.synchronize()
            backend.profiler_start()
            self.capturing = True
            logger.info("nsys capture started at iteration %d", iteration)
        elif not recording and self._stop_capture():
            logger.info("nsys capture stopped before iteration %d", iteration)
        backend.range_push(f"step {iteration}")
        self._step_range_open = True

    @contextlib.contextmanager
    def range(self, name: str) -> Iterator[None]:
        """An NVTX range around the block (no-op when disabled)."""
        if not self.enabled:
            yield
            return
        assert self._backend is not None
        self._backend.range_push(name)
        try:
            yield
        finally:
            self._backend.range_pop()

    def close(self) -> None:
        """End the open step range and a running capture; safe to call twice."""
        if not self.enabled:
            return
        self._end_step_range()
        if self._stop_capture():
            logger.info("nsys capture stopped at the end of the run")

    def _end_step_range(self) -> None:
        if self._step_range_open:
            self._backend.range_pop()
            self._step_range_open = False

    def _stop_capture(self) -> bool:
        """Stop a running capture after the device finished its work; True if one was running."""
        if not self.capturing:
            return False
        self._backend.synchronize()
        self._backend.profiler_stop()
        self.capturing = False
        return True


# ---------------------------------------------------------------------------------------------
# ``torchprof nsys``


def _node_token(env: dict[str, str], placeholders: bool) -> str | None:
    """Which node launcher this is: SLURM's node id, else ``NODE_RANK``/``GROUP_RANK``."""
    for name in ("SLURM_NODEID", "NODE_RANK", "GROUP_RANK"):
        if name in env:
            return f"%q{{{name}}}" if placeholders else env[name]
    return None


def nsys_command(command: list[str], output_dir: str = "prof/nsys", trace: str = "cuda,nvtx,osrt",
                 mpi: bool = False, capture_range_end: str = "stop", extra: list[str] | None = None,
                 placeholders: bool = True, env: dict[str, str] | None = None,
                 host: str | None = None, nsys: str = "nsys") -> list[str]:
    """The ``nsys profile`` command line that captures the ``--torch-profile-nsys`` steps.

    Output names are per node: ``<dir>/nsys_<host>_node<id>_<pid>``.  With ``placeholders``
    (for a printed command that will run on other nodes) host and node id are nsys's own
    ``%h`` and ``%q{SLURM_NODEID}``; otherwise this machine's values.  ``%p`` (the launcher's
    pid) keeps reruns and several launchers per node apart.
    """
    env = dict(os.environ) if env is None else env
    traces = trace.split(",")
    if mpi and "mpi" not in traces:
        traces.append("mpi")
    host_part = "%h" if placeholders else (host or socket.gethostname()).split(".")[0]
    parts = ["nsys", host_part]
    node = _node_token(env, placeholders)
    if node is not None:
        parts.append(f"node{node}")
    parts.append("%p")
    output = os.path.join(output_dir, "_".join(parts))
    argv = [
        nsys, "profile",
        "-t", ",".join(traces),
        "--capture-range=cudaProfilerApi",
        f"--capture-range-end={capture_range_end}",
        "--cuda-memory-usage=true",
        "-o", output,
    ]
    for item in extra or []:
        argv += shlex.split(item)
    return [*argv, *command]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "nsys",
        help="print (or run) the nsys command that captures the --torch-profile-nsys steps",
        description=(
            "Print the `nsys profile` command that captures exactly the steps recorded with "
            "--torch-profile-nsys (cudaProfilerApi capture range), or run it with --run."
        ),
    )
    parser.add_argument("--output-dir", default=os.path.join("prof", "nsys"), metavar="DIR",
                        help="where nsys writes its .nsys-rep files (default prof/nsys)")
    parser.add_argument("--trace", default="cuda,nvtx,osrt", metavar="APIS",
                        help="nsys -t value (default cuda,nvtx,osrt)")
    parser.add_argument("--mpi", action="store_true", help="also trace MPI (adds mpi to -t)")
    parser.add_argument("--capture-range-end", default="stop", metavar="MODE",
                        help="nsys --capture-range-end: stop (default: the first recorded cycle "
                             "only), repeat[:N] (one report per cycle), repeat-shutdown:N")
    parser.add_argument("--extra", action="append", default=[], metavar="ARG",
                        help="more nsys arguments, shell-quoted; repeatable; write "
                             "--extra=--gpu-metrics-devices=all (with '=') for values starting with -")
    parser.add_argument("--run", action="store_true", help="run the command instead of printing it")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD",
                        help="the launch command (e.g. torchrun ... train.py --torch-profile-nsys)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("torchprof nsys: give the launch command after `--`, e.g. `torchprof nsys -- torchrun "
              "--nproc-per-node 8 train.py --torch-profile --torch-profile-nsys`.", file=sys.stderr)
        return 2
    if not args.run:
        print(shlex.join(nsys_command(command, args.output_dir, args.trace, args.mpi,
                                      args.capture_range_end, args.extra, placeholders=True)))
        return 0
    nsys = shutil.which("nsys")
    if nsys is None:
        print("torchprof nsys: --run needs Nsight Systems' `nsys` on PATH (e.g. module load nsight-systems, "
              "or /usr/local/cuda/bin); without --run the command is only printed.", file=sys.stderr)
        return 127
    try:
        os.makedirs(args.output_dir, exist_ok=True)
    except OSError as err:
        print(f"torchprof nsys: --output-dir {args.output_dir!r} cannot be created "
              f"({err.strerror or err}).", file=sys.stderr)
        return 2
    argv = nsys_command(command, args.output_dir, args.trace, args.mpi, args.capture_range_end,
                        args.extra, placeholders=False, nsys=nsys)
    print(f"torchprof nsys: {shlex.join(argv)}", file=sys.stderr)
    return subprocess.call(argv)
