"""Gzip compression of a published file: isal's ``igzip`` where it is installed and as good, else zlib.

Both write the same format (RFC 1952, one member, ``mtime`` 0): gzip, zlib, isal, HTA and Perfetto
decompress either to the same bytes.  ``--torch-profile-gzip-level`` keeps zlib's 1..9 meaning (higher:
smaller files, slower).  isal (the ``analysis`` extra) has four levels: its level 1 compresses about
as well as zlib's level 1, four times faster; its best (3) is not much better than that and no
faster than zlib's 1.  So isal takes level 1, zlib every other (CPU time and compressed size of real
torch.profiler traces: 6.5 MB from benchmarks/bench_window_cost.py, 2.9 MB from a 2-rank gloo job):

=====================  ====================  ====================
compressor             6.5 MB trace          2.9 MB trace
=====================  ====================  ====================
zlib level 1           13 ms, 521 kB         6.5 ms, 251 kB
isal level 1 (for 1)   3 ms, 523 kB          1.5 ms, 260 kB
zlib level 2           14 ms, 495 kB         6.3 ms, 235 kB
isal level 3           11 ms, 497 kB         5.2 ms, 253 kB
zlib level 6 (default) 29 ms, 386 kB         13.6 ms, 181 kB
zlib level 9           132 ms, 340 kB        65 ms, 160 kB
=====================  ====================  ====================

Without isal every level is zlib's.  Import-light (the publisher imports it): no torch, no analysis.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path
from typing import IO, NamedTuple

from torchprof_args.atomic import atomic_output

__all__ = ["ISAL_LEVELS", "Compressor", "compressor_for", "copy_compressed"]

#: ``--torch-profile-gzip-level`` -> the isal level that matches its ratio; absent: zlib's.
ISAL_LEVELS = {1: 1}
#: Bytes per read: a buffer that stays in a core's cache beside the training processes' data.
COPY_CHUNK = 1 << 20


class Compressor(NamedTuple):
    """What compresses at a level: ``library`` ("isal", "zlib" or "copy" for none) and its own level."""

    library: str
    level: int


def _isal_available() -> bool:
    try:
        from isal import igzip  # noqa: F401
    except ImportError:
        return False
    return True


def compressor_for(level: int | None, *, isal: bool | None = None) -> Compressor:
    """The compressor for ``--torch-profile-gzip-level`` ``level`` (None: not compressed).

    ``isal``: whether isal may be used (default: where it is importable).
    """
    if level is None:
        return Compressor("copy", 0)
    allowed = _isal_available() if isal is None else isal
    if allowed and level in ISAL_LEVELS:
        return Compressor("isal", ISAL_LEVELS[level])
    return Compressor("zlib", level)


def copy_compressed(source: str | Path, target: str | Path, level: int | None, *,
                    isal: bool | None = None) -> Compressor:
    """Publish ``source`` as ``target`` (atomically, fsynced), gzip-compressed at ``level`` unless None;
    returns the compressor used."""
    compressor = compressor_for(level, isal=isal)
    with atomic_output(target, "wb", fsync=True) as handle, open(source, "rb") as src:
        if compressor.library == "copy":
            shutil.copyfileobj(src, handle, COPY_CHUNK)
        else:
            # both release the GIL while deflating each chunk; this process has no other work
            with _gzip_writer(compressor, handle) as gz:
                shutil.copyfileobj(src, gz, COPY_CHUNK)
    return compressor


def _gzip_writer(compressor: Compressor, handle: IO[bytes]) -> gzip.GzipFile:
    if compressor.library == "isal":
        from isal import igzip

        return igzip.IGzipFile(filename="", mode="wb", fileobj=handle, compresslevel=compressor.level,
                               mtime=0)
    return gzip.GzipFile(filename="", mode="wb", fileobj=handle, compresslevel=compressor.level, mtime=0)
