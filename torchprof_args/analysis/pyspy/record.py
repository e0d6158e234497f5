"""``torchprof pyspy record``: run a command under ``py-spy record`` and publish its raw profile.

``py-spy record -s -f raw`` samples the command and every process it starts (all torchrun
workers, say).  py-spy always exits 0, so the command runs under :mod:`.launcher`, which writes
its exit code to a hidden status file; the profile is written under a hidden partial name and
renamed into place when py-spy is done, so nobody reads half a file.
"""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from torchprof_args.atomic import partial_path
from torchprof_args.naming import safe_token, short_hostname

__all__ = [
    "PYSPY_INSTALL_HINT", "Recording", "find_py_spy", "finish", "output_name", "record_command", "start",
]

PYSPY_INSTALL_HINT = "install it with `pip install py-spy` (torchprof-args[pyspy])"
#: The script py-spy runs; see :mod:`torchprof_args.analysis.pyspy.launcher`.
LAUNCHER = Path(__file__).with_name("launcher.py")


def find_py_spy() -> str | None:
    """The py-spy executable: on PATH, else next to this interpreter (an unactivated venv)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None


def output_name(now: datetime.datetime | None = None, pid: int | None = None,
                env: Mapping[str, str] | None = None, host: str | None = None) -> str:
    """``pyspy_<host>[_node<N>][_task<P>]_<YYYYmmdd-HHMMSS>_<pid>.txt``.

    ``SLURM_NODEID`` (else ``NODE_RANK``/``GROUP_RANK``) tells nodes apart, ``SLURM_PROCID``
    launchers on one node, the time and pid reruns.
    """
    env = os.environ if env is None else env
    host = (host.split(".")[0] if host else short_hostname()) or "host"
    parts = ["pyspy", safe_token(host)]
    node = env.get("SLURM_NODEID") or env.get("NODE_RANK") or env.get("GROUP_RANK")
    if node:
        parts.append(f"node{safe_token(node)}")
    task = env.get("SLURM_PROCID")
    if task:
        parts.append(f"task{safe_token(task)}")
    parts.append((now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S"))
    parts.append(str(os.getpid() if pid is None else pid))
    return "_".join(parts) + ".txt"


def record_command(py_spy: str, output: str, status_file: str, command: list[str], rate: int = 100,
                   native: bool = False, idle: bool = False, full_filenames: bool = True) -> list[str]:
    """The py-spy command line: CMD runs under the exit-code launcher, sampled with ``-s``."""
    argv = [py_spy, "record", "-s", "-f", "raw", "-r", str(rate), "-o", output]
    if full_filenames:
        argv.append("--full-filenames")
    if native:
        argv.append("--native")
    if idle:
        argv.append("--idle")
    return [*argv, "--", sys.executable, str(LAUNCHER), status_file, "--", *command]


@dataclass
class Recording:
    """A running ``py-spy record``: its process and the files it will leave."""

    spy: subprocess.Popen
    final: str  # the published profile
    partial: str  # where py-spy writes it
    status_file: str  # where the launcher writes the command's exit code


def start(py_spy: str, output_dir: str, command: list[str], *, rate: int = 100, native: bool = False,
          idle: bool = False, full_filenames: bool = True) -> Recording:
    """Start py-spy on ``command``, its profile due in ``output_dir`` (which must exist).

    Raises OSError when py-spy cannot be started.
    """
    final = os.path.join(output_dir, output_name())
    partial = str(partial_path(final))
    status_file = os.path.join(output_dir, f".{os.path.basename(final)}.status")
    argv = record_command(py_spy, partial, status_file, command, rate=rate, native=native, idle=idle,
                          full_filenames=full_filenames)
    return Recording(subprocess.Popen(argv), final, partial, status_file)


def finish(recording: Recording) -> int:
    """Wait for py-spy, publish its profile (or say it wrote none); returns the exit code to use.

    That is the command's exit code; when the launcher did not finish (py-spy was interrupted,
    could not start the command, or died): 128 + the signal that interrupted us, else py-spy's
    own non-zero code, else 1.
    """
    spy_code, interrupted = _wait(recording.spy)
    child_code = _read_status(recording.status_file)
    _publish(recording, spy_code)
    if child_code is None:
        if interrupted:
            return 128 + interrupted[0]
        return spy_code if spy_code != 0 else 1
    return child_code


def _wait(spy: subprocess.Popen) -> tuple[int, list[int]]:
    """py-spy's exit code and the signals we received meanwhile.

    Ctrl-C reaches py-spy (which then writes its file) and the command by themselves; we wait.
    A SIGTERM sent to us alone (a job script's ``kill``) asks py-spy to stop and write.
    """
    interrupted: list[int] = []

    def on_term(signum: int, _frame: object) -> None:
        interrupted.append(signum)
        spy.send_signal(signal.SIGINT)

    previous_int = signal.signal(signal.SIGINT, lambda signum, _frame: interrupted.append(signum))
    previous_term = signal.signal(signal.SIGTERM, on_term)
    try:
        return spy.wait(), interrupted
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)


def _publish(recording: Recording, spy_code: int) -> None:
    """Rename a non-empty profile into place and say how to read it; remove an empty one."""
    final, partial = recording.final, recording.partial
    if os.path.exists(partial) and os.path.getsize(partial) > 0:
        os.replace(partial, final)
        print(f"torchprof pyspy: wrote {final}\n  report:     torchprof pyspy report {final}\n"
              f"  speedscope: torchprof pyspy speedscope {final} -o {final[:-4]}.speedscope.json",
              file=sys.stderr)
    else:
        if os.path.exists(partial):
            os.remove(partial)
        print(f"torchprof pyspy: py-spy wrote no samples (py-spy exit code {spy_code}).", file=sys.stderr)


def _read_status(path: str) -> int | None:
    """The exit code the launcher wrote (None if it wrote none); the file is removed."""
    try:
        with open(path) as handle:
            code = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    finally:
        for leftover in (path, str(partial_path(path))):
            if os.path.exists(leftover):
                os.remove(leftover)
    return code
