"""Streaming reader for Kineto (Chrome trace JSON) files of any size.

A trace is one JSON object whose ``traceEvents`` array holds millions of small objects.  Instead of
``json.loads`` on the whole file, :class:`TraceStream` reads the (decompressed) bytes in large
chunks, cuts the array at event boundaries with a byte search, and hands out each batch as the
text of a complete JSON array, which callers decode with ``msgspec`` into compact structs.  A cut
is only accepted when the batch decodes as a valid array, so a wrong guess (a ``},`` inside a
nested ``args`` object) is detected and the previous candidate is tried; files whose layout the
fast path cannot cut are decoded whole as a fallback, which is slower but still correct.

The top-level keys around ``traceEvents`` (``distributedInfo``, ``deviceProperties``,
``baseTimeNanoseconds`` ...) are available as :attr:`TraceStream.metadata` once the events have
been consumed (some writers put them after the array).
"""

from __future__ import annotations

import gzip
import io
import re
import types
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, NoReturn, Protocol, cast

import msgspec

from torchprof_args.errors import TraceError

__all__ = ["GZIP_ERRORS", "EventText", "ProgressBar", "TraceStream", "is_gzip", "not_utf8", "open_gzip"]

#: the text of a batch of events as :meth:`TraceStream.batches` hands it to its ``decode``.
EventText = bytes | bytearray | memoryview
#: what reading a corrupt or truncated gzip stream raises (isal's own error included).
GZIP_ERRORS: tuple[type[BaseException], ...] = (EOFError, OSError, zlib.error, gzip.BadGzipFile)
_gzip_impl: types.ModuleType
try:  # isal is several times faster than zlib and reads the same format.
    from isal import igzip as _gzip_impl
    from isal.igzip_lib import IsalError

    # isal's stub declares IsalError an instance of Exception; it is the exception class.
    GZIP_ERRORS += (cast("type[BaseException]", IsalError),)
except ImportError:  # pragma: no cover - isal is an optional extra
    _gzip_impl = gzip


class ProgressBar(Protocol):
    """A progress bar (tqdm's): what reading, decoding and collecting traces report to."""

    def update(self, n: int = 1) -> object:
        """Add ``n`` done."""
        ...

    def close(self) -> None:
        """Take it off the terminal."""
        ...


def open_gzip(file: str | Path | IO[bytes], mode: str = "rb", compresslevel: int = 3) -> IO[bytes]:
    """A gzip stream over a path or an open binary file, through isal when it is installed.

    Args:
        file: a path, or an open binary file (left open when the stream is closed).
        mode: ``"rb"`` or ``"wb"``.
        compresslevel: when writing (3: isal's highest, still fast with zlib).

    Returns:
        The binary stream; reading a corrupt or truncated one raises one of :data:`GZIP_ERRORS`.
    """
    if "w" in mode:
        return cast(IO[bytes], _gzip_impl.open(file, mode, compresslevel=compresslevel))
    return cast(IO[bytes], _gzip_impl.open(file, mode))


CHUNK_BYTES = 4 << 20
#: files at least this large get a progress bar when the caller asks for one.
PROGRESS_MIN_BYTES = 64 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_KEY = b'"traceEvents"'
_WS = b" \t\r\n"
# The end of the events array: the last event's "}" then "]" then either more keys or the end.
_ARRAY_END_RE = re.compile(rb"\}\s*\](\s*,\s*\"|\s*\}\s*$)")
_EMPTY_ARRAY_RE = re.compile(rb"\s*\]")  # matched from after the "["
#: where the end of the events array is looked for first (the keys after it are small).
_TAIL_WINDOW = 1 << 20
_json_any = msgspec.json.Decoder()


def not_utf8(exc: UnicodeDecodeError) -> str:
    """The one-line reason for a trace whose text is not UTF-8 (a corrupt or truncated write)."""
    return f"not valid UTF-8 text ({exc.reason}); the file is corrupt, re-export or re-record it"


def raise_if_not_utf8(exc: msgspec.DecodeError) -> None:
    """Raise ``exc`` as the :class:`UnicodeDecodeError` it stands for where the text was not UTF-8:
    msgspec 0.23 and later say so with a ``DecodeError`` (earlier ones raised UnicodeDecodeError),
    which the reader would otherwise take for a wrong cut (a cut is at ``},``, ASCII: it never
    splits a character), then for a truncated file."""
    if "utf-8" in str(exc).lower():
        raise UnicodeDecodeError("utf-8", b"", 0, 1, str(exc).rstrip(".")) from None


def is_gzip(path: str | Path) -> bool:
    """Whether the file starts with the gzip magic bytes (whatever its name says)."""
    with open(path, "rb") as fh:
        return fh.read(2) == _GZIP_MAGIC


class _CountingFile(io.RawIOBase):
    """Wraps a raw file to count bytes read, for progress bars over compressed input."""

    def __init__(self, fh: io.BufferedIOBase, callback: Callable[[int], object] | None) -> None:
        self._fh = fh
        self._callback = callback

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._fh.seekable()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._fh.seek(offset, whence)

    def tell(self) -> int:
        return self._fh.tell()

    def readinto(self, buffer: Any) -> int:  # Any: typeshed's WriteableBuffer is private
        n = self._fh.readinto(buffer)
        if n and self._callback is not None:
            self._callback(n)
        return n

    def close(self) -> None:
        self._fh.close()
        super().close()


class TraceStream:
    """Iterate over a trace's ``traceEvents`` as batches of JSON array text.

    ``for batch in stream.batches(): events = decoder.decode(batch)``; after the loop,
    :attr:`metadata` holds every other top-level key.  Errors are :class:`TraceError` naming the
    file.
    """

    def __init__(
        self, path: str | Path, *, progress: bool = False, chunk_bytes: int = CHUNK_BYTES,
        validate: bool = True,
    ) -> None:
        self.path = Path(path)
        #: with ``validate=False`` cuts are not checked by decoding here; the consumer must then
        #: treat a batch that fails to decode as a wrong cut (see ``loader.load_trace``).
        self.validate = validate
        self.chunk_bytes = chunk_bytes
        self.progress = progress
        self.metadata: dict[str, Any] = {}
        self.compressed = False
        self.file_bytes = 0
        self.uncompressed_bytes = 0
        self._bar: ProgressBar | None = None
        self._decode: Callable[[EventText], Any] = msgspec.json.Decoder(list[msgspec.Raw]).decode

    # -- opening -----------------------------------------------------------------------------
    def _open(self) -> IO[bytes]:
        if not self.path.exists():
            raise TraceError(f"{self.path}: no such file")
        if self.path.is_dir():
            raise TraceError(f"{self.path}: is a directory, expected a .json or .json.gz trace file")
        self.file_bytes = self.path.stat().st_size
        self.compressed = is_gzip(self.path)
        raw = open(self.path, "rb")  # noqa: SIM115 - closed by the caller
        callback = None
        if self.progress and self.file_bytes >= PROGRESS_MIN_BYTES:
            from tqdm import tqdm

            self._bar = tqdm(  # disable=None: no bar when stderr is not a terminal (batch job logs)
                total=self.file_bytes, unit="B", unit_scale=True, desc=f"reading {self.path.name}",
                leave=False, disable=None,
            )
            callback = self._bar.update
        counted = io.BufferedReader(_CountingFile(raw, callback), buffer_size=1 << 20)
        if self.compressed:
            return open_gzip(counted)
        return counted

    def _read(self, fh: IO[bytes], n: int) -> bytes:
        try:
            data = fh.read(n)
        except GZIP_ERRORS as exc:
            raise TraceError(f"{self.path}: the gzip stream is truncated or corrupt ({exc})") from None
        self.uncompressed_bytes += len(data)
        return data

    # -- iteration ---------------------------------------------------------------------------
    def batches(self, decode: Callable[[EventText], Any] | None = None,
                start: int | None = None) -> Iterator[Any]:
        """Yield ``decode(text)`` for successive ``[...]`` JSON texts of events.

        ``decode`` must raise ``msgspec.DecodeError`` only for malformed JSON (that is how a wrong
        cut is detected); the default yields lists of ``msgspec.Raw``.  Fills :attr:`metadata`.
        ``start`` resumes an uncompressed file at that byte offset, which must be where an event
        of the array begins (or whitespace before it), e.g. just after a validated cut.
        """
        if decode is not None:
            self._decode = decode
        fh = self._open()
        try:
            yield from self._batches(fh, start)
        except UnicodeDecodeError as exc:
            raise TraceError(f"{self.path}: {not_utf8(exc)}") from None
        finally:
            fh.close()
            if self._bar is not None:
                self._bar.close()

    def _head(self, fh: IO[bytes]) -> tuple[bytes, int] | bytes:
        """Parse the keys before ``traceEvents``; return (bytes after its ``[``, their file offset).

        When the layout is not the usual one (the key far from the start, or not followed by an
        array), the whole document is returned instead, for :meth:`_whole_file`.
        """
        head = b""
        while True:
            data = self._read(fh, 1 << 20)
            head += data
            key = head.find(_KEY)
            if key >= 0 and head.find(b"[", key) >= 0:
                break
            if not data:
                self._no_events(head)
            if len(head) > (64 << 20):  # the key is not near the start: decode the whole file.
                return head + self._read(fh, -1)
        key = head.find(_KEY)
        after = head[key + len(_KEY) :].lstrip(_WS)
        if not after.startswith(b":") or not after[1:].lstrip(_WS).startswith(b"["):
            return head + self._read(fh, -1)
        try:
            meta = _json_any.decode(head[:key] + b'"traceEvents": null}')
        except msgspec.DecodeError:
            return head + self._read(fh, -1)
        if not isinstance(meta, dict):
            self._no_events(head)
        meta.pop("traceEvents", None)
        self.metadata.update(meta)
        rest = after[1:].lstrip(_WS)[1:]
        return rest, len(head) - len(rest)

    def events_offset(self) -> int | None:
        """Byte offset of the first event of an uncompressed trace (reading only its head).

        Fills :attr:`metadata` with the keys before the array.  ``None`` for gzip input and for
        layouts that need the whole-document fallback; then use :meth:`batches`.
        """
        fh = self._open()
        try:
            if self.compressed:
                return None
            found = self._head(fh)
            return None if isinstance(found, bytes) else found[1]
        finally:
            fh.close()

    def _read_into(self, fh: IO[bytes], buf: bytearray, at: int) -> int:
        """Fill ``buf`` from offset ``at`` (fewer bytes only at the end of the file); bytes read."""
        view = memoryview(buf)[at:]
        done = 0
        try:
            while done < len(view):
                n = fh.readinto(view[done:])  # type: ignore[attr-defined]  # IO lacks readinto
                if not n:
                    break
                done += n
        except GZIP_ERRORS as exc:
            raise TraceError(f"{self.path}: the gzip stream is truncated or corrupt ({exc})") from None
        finally:
            view.release()
        self.uncompressed_bytes += done
        return done

    def _batches(self, fh: IO[bytes], start: int | None = None) -> Iterator[Any]:
        """Batches as :meth:`batches` yields them: decoded (``validate``) or their text.

        Each batch's text is one buffer, ``[`` then the events then ``]``, that the file is read
        straight into (only the part of an event after the cut is copied into the next one): no
        copy of the text is made to cut it or to wrap it, which for a ``.json.gz`` trace cost
        several times the decompression.  A text handed out is never written to again.
        """
        if start is None:
            head = self._head(fh)
            if isinstance(head, bytes):
                yield from self._whole_file(head)
                return
            pending = head[0]
        else:
            fh.seek(start)
            pending = b""
            self.uncompressed_bytes = start
        eof = False
        while True:
            # "[" + the text left from the last batch + at least chunk_bytes more of the file.
            buf = bytearray(1 + len(pending) + self.chunk_bytes)
            buf[0] = 0x5B
            buf[1 : 1 + len(pending)] = pending
            fill = 1 + len(pending)
            if not eof:
                got = self._read_into(fh, buf, fill)
                eof = fill + got < len(buf)
                fill += got
            del buf[fill:]
            while True:
                if _EMPTY_ARRAY_RE.match(buf, 1):
                    tail = bytes(buf[1:]).lstrip(_WS)[1:]
                    if not eof:
                        tail += self._read(fh, -1)
                    self._parse_tail(tail)
                    return
                found = None if eof else self._find_cut(buf)
                if found is not None:
                    cut, decoded = found
                    pending = bytes(buf[cut + 2 :]).lstrip(_WS)  # past the "}," closing the batch
                    if not self.validate:  # the text itself, "]" over the ","
                        buf[cut + 1] = 0x5D
                        del buf[cut + 2 :]
                        decoded = buf
                    del buf
                    yield decoded
                    break
                # No event boundary found: the array may end in this buffer.
                end = self._find_array_end(buf)
                if end is not None:
                    events, tail = end
                    if not eof:
                        tail += self._read(fh, -1)
                    self._parse_tail(tail)
                    yield events
                    return
                if eof:
                    raise TraceError(
                        f"{self.path}: the trace ends before its traceEvents array is closed "
                        "(the file is truncated or not valid JSON)"
                    )
                # One event (or a nested structure) larger than the chunk: read more and retry.
                data = self._read(fh, max(self.chunk_bytes, len(buf)))
                eof = not data
                buf += data

    def _find_cut(self, buf: bytearray) -> tuple[int, Any] | None:
        """The ``}`` closing the last complete event in ``buf`` (``[`` then events) and, when
        validating, the decoded batch before it (else None: the caller ends the text there).

        A candidate is accepted only if the batch decodes: a prefix of the array that parses as
        an array necessarily ends at an event boundary.  Without ``validate`` it is accepted when
        an object follows it, and the consumer checks that the batch decodes.
        """
        pos = len(buf)
        for _ in range(4):
            pos = buf.rfind(b"},", 1, pos)
            if pos < 0:
                return None
            if not self.validate:
                if buf[pos + 2 : pos + 64].lstrip(_WS).startswith(b"{"):
                    return pos, None
                continue
            buf[pos + 1] = 0x5D  # decode "[" ... "}]" in place, then put the "," back
            try:
                with memoryview(buf) as view:
                    return pos, self._decode(view[: pos + 2])
            except msgspec.DecodeError as exc:
                raise_if_not_utf8(exc)
                continue
            finally:
                buf[pos + 1] = 0x2C
        return None

    def _find_array_end(self, buf: bytearray) -> tuple[Any, bytes] | None:
        # The array ends near the end of the file: look in its last 64 KiB, then MiB first
        # (scanning a whole small trace with the regex cost more than decoding it), then everywhere.
        for window in (_TAIL_WINDOW >> 4, _TAIL_WINDOW):
            start = max(len(buf) - window, 1)
            if start > 1:
                found = self._array_end_from(buf, start)
                if found is not None:
                    return found
        return self._array_end_from(buf, 1)

    def _array_end_from(self, buf: bytearray, start: int) -> tuple[Any, bytes] | None:
        for match in _ARRAY_END_RE.finditer(buf, start):
            tail = bytes(buf[match.start() + 1 :]).lstrip(_WS)[1:]
            try:
                _json_any.decode(b'{"traceEvents": null' + tail)
                events: Any = bytes(buf[: match.start() + 1]) + b"]"
                if self.validate:
                    events = self._decode(events)
            except msgspec.DecodeError as exc:
                raise_if_not_utf8(exc)
                continue
            return events, tail
        return None

    def _parse_tail(self, tail: bytes) -> None:
        try:
            rest = _json_any.decode(b'{"traceEvents": null' + tail)
        except msgspec.DecodeError as exc:
            raise TraceError(f"{self.path}: invalid JSON after the traceEvents array ({exc})") from None
        rest.pop("traceEvents", None)
        self.metadata.update(rest)

    def _whole_file(self, data: bytes) -> Iterator[Any]:
        """Fallback for layouts the chunked path cannot cut: decode the document at once."""
        try:
            doc = _json_any.decode(data)
        except msgspec.DecodeError as exc:
            raise_if_not_utf8(exc)
            raise TraceError(f"{self.path}: not valid JSON ({exc})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
            self._no_events(data[:200])
        events = doc.pop("traceEvents")
        self.metadata.update(doc)
        del data
        step = 200_000
        for i in range(0, len(events), step):
            text = msgspec.json.encode(events[i : i + step])
            yield self._decode(text) if self.validate else text

    def _no_events(self, head: bytes) -> NoReturn:
        text = head.lstrip()
        if not text:
            raise TraceError(f"{self.path}: the file is empty")
        if not text.startswith((b"{", b"[")):
            raise TraceError(f"{self.path}: not a JSON trace (it does not start with '{{')")
        if text.startswith(b"["):
            raise TraceError(
                f"{self.path}: a bare JSON array is not a Kineto trace; expected an object with 'traceEvents'"
            )
        try:
            _json_any.decode(head)
        except msgspec.DecodeError as exc:
            raise TraceError(f"{self.path}: not valid JSON ({exc})") from None
        raise TraceError(
            f"{self.path}: not a Kineto trace: it has no 'traceEvents' array (is it a torch.profiler export?)"
        )

