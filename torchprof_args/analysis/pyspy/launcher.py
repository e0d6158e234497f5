"""Launcher that ``torchprof pyspy record`` runs under py-spy to learn the command's exit code.

``py-spy record -- CMD`` always exits 0, whatever CMD returned, so a job script could not tell a
crashed training run from a finished one.  py-spy therefore runs this small script, which starts
CMD as its child (sampled through ``py-spy -s``), forwards SIGTERM/SIGHUP to it, writes the exit
code to STATUS_FILE and exits with it.  Its own samples (it only waits) are dropped by the report.

Usage: ``python .../torchprof_args/analysis/pyspy/launcher.py STATUS_FILE -- CMD...``, run by file path
(:func:`torchprof_args.analysis.pyspy.record.record_command`) with the interpreter of ``torchprof``, so
``torchprof_args`` is importable; it is imported only once this file's own folder is off
``sys.path`` (see the end of the file).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

#: What :mod:`torchprof_args.analysis.pyspy.parse` looks for in py-spy's process frames (the command line
#: of this launcher's process): this file's path inside the package.
LAUNCHER_MARKER = os.path.join("torchprof_args", "analysis", "pyspy", "launcher.py")


def exit_code(returncode: int) -> int:
    """A shell-style exit code: 128 + signal number for a child killed by a signal."""
    return 128 - returncode if returncode < 0 else returncode


def _die_with_parent() -> None:
    """In the command's process: get SIGTERM if this launcher dies.  py-spy kills the process it
    started (this launcher) when it is stopped with Ctrl-C, as it would kill CMD itself without
    the launcher in between; the command must not outlive it unnoticed."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the command may outlive py-spy
        pass


def main(argv: list[str]) -> int:
    """Run CMD, write its exit code to STATUS_FILE, return it (2 for a usage error)."""
    from torchprof_args.atomic import write_text_atomically

    if len(argv) < 3 or argv[1] != "--":
        print("usage: launcher.py STATUS_FILE -- CMD...", file=sys.stderr)
        return 2
    status_file, command = argv[0], argv[2:]
    try:
        child = subprocess.Popen(command, preexec_fn=_die_with_parent)
    except OSError as err:
        print(f"torchprof pyspy: cannot start {command[0]!r}: {err.strerror or err}", file=sys.stderr)
        code = 127
    else:
        def forward(signum: int, _frame: object) -> None:
            child.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGHUP, forward)
        # Ctrl-C reaches the whole foreground process group, the command included: don't die
        # before the command does, so its exit code is still recorded.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        code = exit_code(child.wait())
    write_text_atomically(status_file, f"{code}\n")
    return code


if __name__ == "__main__":
    # Run by path, Python put this file's folder first on sys.path, where its sibling modules
    # (parse.py, record.py, report.py...) would shadow any top-level module of the same name.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    sys.exit(main(sys.argv[1:]))
