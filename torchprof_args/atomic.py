"""Publishing files atomically: write under a hidden temporary name beside the target, then rename.

Readers (people, TensorBoard, ``torchprof trigger --wait``) never see a half-written file under
the final name, and a failed or interrupted write leaves nothing behind under it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

#: Temporary files are hidden, so directory listings and globs skip them.
PARTIAL_PREFIX = ".partial-"


def partial_path(final_path: str | os.PathLike[str]) -> Path:
    """The hidden temporary name a file is written under before it is renamed into place."""
    final_path = Path(final_path)
    return final_path.with_name(PARTIAL_PREFIX + final_path.name)


@contextlib.contextmanager
def atomic_output(final_path: str | os.PathLike[str], mode: str = "wb", *, fsync: bool = False,
                  private: bool = False) -> Iterator[IO[Any]]:
    """``with atomic_output(path, "w") as handle:`` writes ``path`` all at once or not at all.

    The parent directory is created if needed.  ``fsync`` forces the data to disk before the
    rename (traces on a shared filesystem).  ``private`` creates the temporary file with mode
    0600 under an unguessable name, refusing to follow a planted symlink (control files that
    other users must not read or pre-create).
    """
    final_path = Path(final_path)
    final_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_path(final_path)
    encoding = None if "b" in mode else "utf-8"
    try:
        if private:
            tmp = tmp.with_name(f"{tmp.name}.{os.getpid()}-{secrets.token_hex(4)}")
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
            handle_cm = os.fdopen(os.open(tmp, flags, 0o600), mode, encoding=encoding)
        else:
            handle_cm = open(tmp, mode, encoding=encoding)  # noqa: SIM115 - closed by the with below
        with handle_cm as handle:
            yield handle
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, final_path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_text_atomically(path: str | os.PathLike[str], text: str, *, private: bool = False) -> None:
    """Publish ``text`` (UTF-8) at ``path`` all at once or not at all."""
    with atomic_output(path, "w", private=private) as handle:
        handle.write(text)


def write_bytes_atomically(path: str | os.PathLike[str], data: bytes, *, private: bool = False) -> None:
    """Publish ``data`` at ``path`` all at once or not at all."""
    with atomic_output(path, "wb", private=private) as handle:
        handle.write(data)


def write_json_atomically(path: str | os.PathLike[str], payload: Any, *, private: bool = False,
                          **dumps_kwargs: Any) -> None:
    """Publish ``payload`` as one JSON document (plus a newline) at ``path``.

    ``private`` as for :func:`atomic_output` (control files of on-demand tracing);
    ``dumps_kwargs`` go to :func:`json.dumps` (``indent``, ``sort_keys``...).
    """
    write_text_atomically(path, json.dumps(payload, **dumps_kwargs) + "\n", private=private)
