"""The folders ``torchprof mcp`` may read: every path a tool is given is confined to them.

A path is resolved with :func:`os.path.realpath` (relative paths against the first root) and must
lie under one of the roots; a folder is then walked (links not followed) and refused whole when
anything in it would lead elsewhere or cost too much: a symbolic link resolving outside the roots,
a file over the size limit, something that is neither a file nor a folder (a FIFO would block the
read), more entries than :data:`MAX_ENTRIES`.  Each refusal is one sentence, raised before a byte
of the input is read.  What is checked may change between the check and the read (a race with
someone who can write under the roots): the roots are meant to hold the jobs' output, written by
the jobs, not by an adversary.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from torchprof_args.errors import CommandError

__all__ = ["MAX_ENTRIES", "RootError", "Roots"]

#: The most files and folders one path argument may hold (a whole file system given by mistake).
MAX_ENTRIES = 200_000


class RootError(CommandError):
    """A path the server refuses to read: outside the roots, a link out of them, a file too large."""


@dataclass(frozen=True)
class Roots:
    """The server's roots (real paths) and the largest file it reads.

    Attributes:
        dirs: the roots, resolved (:func:`os.path.realpath`), in the order given.
        max_file_bytes: a file larger than this is refused (``--max-file-mb``).
    """

    dirs: tuple[str, ...]
    max_file_bytes: int

    @classmethod
    def of(cls, dirs: Sequence[str], max_file_bytes: int) -> Roots:
        """The roots ``dirs`` resolved; :class:`RootError` when one is not a folder."""
        resolved = []
        for d in dirs:
            real = os.path.realpath(os.path.expanduser(d))
            if not os.path.isdir(real):
                raise RootError(f"--root {d}: not a folder; give the folders the server may read")
            resolved.append(real)
        return cls(tuple(resolved), max_file_bytes)

    def holds(self, real: str) -> bool:
        """Whether the resolved path ``real`` is a root or lies under one."""
        return any(real == d or real.startswith(d.rstrip(os.sep) + os.sep) for d in self.dirs)

    def resolve(self, path: str) -> str:
        """``path`` resolved and checked, with everything under it when it is a folder.

        Args:
            path: absolute, or relative to the first root.

        Returns:
            The real path, to hand to the command (what it reads is what was checked).

        Raises:
            RootError: the path does not exist, lies outside the roots (links resolved), or holds a
                link out of them, a file over the limit or a special file.
        """
        given = os.path.join(self.dirs[0], os.path.expanduser(path))
        real = os.path.realpath(given)
        if not self.holds(real):
            via = "" if real == os.path.normpath(given) else f" (it resolves to {real})"
            raise RootError(f"{path} is outside the folders this server reads{via}; give a path under "
                            f"{self._named()}")
        try:
            info = os.stat(real)
        except OSError as err:
            raise RootError(f"{path}: {err.strerror or err}") from None
        if stat.S_ISDIR(info.st_mode):
            self._check_tree(path, real, set())
        else:
            self._check_file(path, real, info)
        return real

    def _named(self) -> str:
        return " or ".join(self.dirs[:3]) + (f" (or {len(self.dirs) - 3} more)" if len(self.dirs) > 3 else "")

    def _check_file(self, shown: str, real: str, info: os.stat_result) -> None:
        if not stat.S_ISREG(info.st_mode):
            raise RootError(f"{shown} is neither a file nor a folder; the server reads only files")
        if info.st_size > self.max_file_bytes:
            raise RootError(f"{shown} is {info.st_size / 2**20:,.1f} MiB, over the server's limit of "
                            f"{self.max_file_bytes / 2**20:,.0f} MiB (--max-file-mb); nothing was read")

    def _check_tree(self, shown: str, top: str, seen: set[str]) -> None:
        """Every entry under the folder ``top``: links inside the roots (a linked folder checked too,
        once), files within the limit."""
        seen.add(top)
        count = 0
        for folder, subdirs, files in os.walk(top, followlinks=False):
            count += len(subdirs) + len(files)
            if count > MAX_ENTRIES:
                raise RootError(f"{shown} holds more than {MAX_ENTRIES:,} files and folders; give a run or "
                                "cycle folder")
            for name in (*subdirs, *files):
                full = os.path.join(folder, name)
                here = os.path.join(shown, os.path.relpath(full, top))
                try:
                    link = os.lstat(full)
                    if stat.S_ISLNK(link.st_mode):
                        target = os.path.realpath(full)
                        if not self.holds(target):
                            raise RootError(f"{here} is a link to {target}, outside the folders this server "
                                            f"reads ({self._named()}); nothing was read")
                        info = os.stat(full)
                        if stat.S_ISDIR(info.st_mode) and target not in seen:
                            self._check_tree(here, target, seen)
                    else:
                        info = link
                except FileNotFoundError:  # a link to nothing, or a file removed meanwhile: never read
                    continue
                if not stat.S_ISDIR(info.st_mode):
                    self._check_file(here, full, info)
