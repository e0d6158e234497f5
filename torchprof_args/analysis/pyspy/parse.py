"""Reading py-spy's ``raw`` output (collapsed stacks) into a :class:`Profile`.

py-spy writes one line per distinct stack, ``frame;frame;...;frame COUNT``, root first.  The
frames it writes are:

* Python and native frames: ``function (path:line)``, or ``function (path)`` without a line
  (``--nolineno``, unresolved native code such as ``0x7f3a... (libc.so.6)``);
* with ``--subprocesses``: a chain of ``process PID:"command line"`` frames (parent first); the
  command line is the process's argv joined with spaces and may itself contain ``;``, quotes and
  newlines, so records are not always one physical line;
* with ``--threads``: ``thread (TID)`` or ``thread (TID): name``.

Anything else is kept as an ``unknown`` frame, counted and reported: a bad frame never aborts
the report.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Protocol

from torchprof_args.analysis.pyspy.launcher import LAUNCHER_MARKER

__all__ = [
    "Frame",
    "Stack",
    "Profile",
    "is_own_code",
    "parse_frame",
    "parse_raw_text",
    "read_profiles",
    "shorten_path",
]

#: The launcher's markers: its current path, and where it lived before (``pyspy/`` beside
#: ``analysis/``; ``_pyspy_child.py`` before the pyspy package existed), so raw files recorded by
#: earlier versions still lose the launcher's frames.
_LAUNCHER_MARKERS = (LAUNCHER_MARKER, os.path.join("torchprof_args", "pyspy", "launcher.py"),
                     "_pyspy_child.py")
#: their file names, as py-spy may name the launcher's own Python frames.
_LAUNCHER_FILES = frozenset(os.path.basename(marker) for marker in _LAUNCHER_MARKERS)

PYTHON, NATIVE, PROCESS, THREAD, UNKNOWN = "python", "native", "process", "thread", "unknown"


@dataclasses.dataclass(frozen=True)
class Frame:
    """One frame of a sampled stack."""

    name: str
    path: str | None = None
    line: int | None = None
    kind: str = PYTHON

    @property
    def is_context(self) -> bool:
        """Process and thread frames say where a stack ran, not what it ran."""
        return self.kind in (PROCESS, THREAD)

    def label(self, max_command: int = 120) -> str:
        """The text the speedscope file names this frame with."""
        if self.kind == PROCESS:
            command = " ".join((self.path or "").split())
            if len(command) > max_command:
                command = command[: max_command - 3] + "..."
            return f"process {self.name}: {command}"
        if self.kind in (THREAD, UNKNOWN) or self.path is None:
            return self.name
        path = shorten_path(self.path)
        return f"{self.name} ({path}:{self.line})" if self.line is not None else f"{self.name} ({path})"


@dataclasses.dataclass(frozen=True)
class Stack:
    """A distinct sampled stack (root first) and how many samples had it."""

    frames: tuple[Frame, ...]
    count: int


@dataclasses.dataclass
class Profile:
    """Stacks read from one or more py-spy raw files, with what could not be read."""

    stacks: list[Stack] = dataclasses.field(default_factory=list)
    files: list[str] = dataclasses.field(default_factory=list)
    #: Frames that matched none of py-spy's frame forms (each occurrence in a stack).
    unparsed_frames: int = 0
    #: Samples in stacks that contain at least one such frame (they still count in the report).
    unparsed_frame_samples: int = 0
    #: Text that was not a ``stack COUNT`` record at all (skipped).
    malformed_records: int = 0
    #: Samples of the ``torchprof pyspy record`` launcher itself (it only waits): dropped.
    launcher_samples: int = 0
    examples_unparsed: list[str] = dataclasses.field(default_factory=list)

    @property
    def total_samples(self) -> int:
        """Samples in all stacks (launcher samples and malformed records excluded)."""
        return sum(stack.count for stack in self.stacks)

    def merge(self, other: Profile) -> None:
        """Add ``other``'s stacks and counters to this profile (at most 5 unparsed examples)."""
        self.stacks += other.stacks
        self.files += other.files
        self.unparsed_frames += other.unparsed_frames
        self.unparsed_frame_samples += other.unparsed_frame_samples
        self.malformed_records += other.malformed_records
        self.launcher_samples += other.launcher_samples
        self.examples_unparsed += other.examples_unparsed[: max(0, 5 - len(self.examples_unparsed))]

    def problems(self) -> list[str]:
        """Sentences about what could not be read, for the report's footer."""
        notes = []
        if self.unparsed_frames:
            examples = ", ".join(repr(e[:80]) for e in self.examples_unparsed[:3])
            notes.append(
                f"{self.unparsed_frames} frame(s) in {self.unparsed_frame_samples} sample(s) were not in "
                f"a py-spy frame format and are shown verbatim (e.g. {examples})."
            )
        if self.malformed_records:
            notes.append(f"{self.malformed_records} line(s) were not 'stack COUNT' records and were skipped.")
        return notes


# ---------------------------------------------------------------------------------------------
# Frames.

_THREAD_RE = re.compile(r"thread \((0x[0-9A-Fa-f]+|\d+)\)(?:: (.*))?", re.S)
_FRAME_RE = re.compile(r"(?P<name>.+?) \((?P<loc>[^()]*)\)", re.S)
_LOC_LINE_RE = re.compile(r"(?P<path>.*):(?P<line>-?\d+)", re.S)
_NATIVE_SUFFIX_RE = re.compile(r"\.(so(\.\d+)*|dylib|dll|c|cc|cpp|cxx|h|hpp|cu|rs)$|^\[")


@lru_cache(maxsize=1 << 16)
def parse_frame(text: str) -> Frame:
    """One (non-process) frame token; never raises."""
    match = _THREAD_RE.fullmatch(text)
    if match:
        return Frame(name=text, path=None, line=None, kind=THREAD)
    match = _FRAME_RE.fullmatch(text)
    if match is None or not match.group("name").strip():
        return Frame(name=text, kind=UNKNOWN)
    name, loc = match.group("name"), match.group("loc")
    located = _LOC_LINE_RE.fullmatch(loc)
    path, line = (located.group("path"), int(located.group("line"))) if located else (loc, None)
    if path.endswith((".py", ".pyx", ".pyw")) or path.startswith("<"):
        kind = PYTHON
    elif _NATIVE_SUFFIX_RE.search(path) or name.startswith("0x"):
        kind = NATIVE
    else:
        kind = PYTHON
    return Frame(name=name, path=path, line=line, kind=kind)


_PROCESS_START_RE = re.compile(r'process (\d+):"')
# The end of a process frame's command line: a quote followed by ';' (more frames), or by the
# sample count at the end of the record.
_PROCESS_END_RE = re.compile(r'"(;|[ \t]+(\d+)[ \t]*\r?(?:\n|$))')
_COUNT_RE = re.compile(r"(.*)[ \t]+(\d+)[ \t]*\r?", re.S)



class Progress(Protocol):
    """A progress bar counting bytes (a ``tqdm`` bar)."""

    def update(self, n: int) -> object: ...


def _iter_records(text: str,
                  progress: Progress | None = None) -> Iterator[tuple[list[Frame] | None, int, list[str]]]:
    """Yields ``(frames, count, raw_tokens)`` per record; ``frames`` is None for a malformed one."""
    pos, size = 0, len(text)
    last_reported = 0
    while pos < size:
        if progress is not None and pos - last_reported > 1 << 20:
            progress.update(pos - last_reported)
            last_reported = pos
        frames: list[Frame] = []
        tokens: list[str] = []
        count: int | None = None
        # A chain of process frames (``--subprocesses``), whose command lines may span lines.
        while True:
            start = _PROCESS_START_RE.match(text, pos)
            if start is None:
                break
            end = _PROCESS_END_RE.search(text, start.end())
            if end is None:
                break
            frames.append(Frame(name=start.group(1), path=text[start.end() : end.start()], kind=PROCESS))
            pos = end.end()
            if end.group(1) != ";":
                count = int(end.group(2))
                break
        if count is None:
            newline = text.find("\n", pos)
            line_end = size if newline < 0 else newline
            line = text[pos:line_end]
            pos = line_end + 1
            if not line.strip() and not frames:
                continue
            match = _COUNT_RE.fullmatch(line)
            if match is None:
                yield None, 0, [line]
                continue
            body, count = match.group(1), int(match.group(2))
            tokens = body.split(";") if body else []
            frames += [parse_frame(token) for token in tokens]
        yield frames, count, tokens
    if progress is not None:
        progress.update(size - last_reported)


def parse_raw_text(text: str, source: str = "<text>", progress: Progress | None = None) -> Profile:
    """Parse the contents of one py-spy raw file (``progress``: a tqdm bar, updated in bytes)."""
    profile = Profile(files=[source])
    merged: Counter[tuple[Frame, ...]] = Counter()
    for frames, count, _tokens in _iter_records(text, progress):
        if frames is None:
            profile.malformed_records += 1
            continue
        frames = _strip_launcher(frames)
        if frames is None:
            profile.launcher_samples += count
            continue
        unknown = [f for f in frames if f.kind == UNKNOWN]
        if unknown:
            profile.unparsed_frames += len(unknown)
            profile.unparsed_frame_samples += count
            if len(profile.examples_unparsed) < 5:
                profile.examples_unparsed.append(unknown[0].name)
        merged[tuple(frames)] += count
    profile.stacks = [Stack(frames, count) for frames, count in merged.items()]
    return profile


def _strip_launcher(frames: list[Frame]) -> list[Frame] | None:
    """Remove the ``torchprof pyspy record`` launcher's process frames; None for its own samples.

    The launcher starts the program with ``Popen(preexec_fn=...)``: when py-spy first sees the
    child between fork and exec, it keeps the launcher's command line for that pid, so the
    program's own stacks may sit under a second, stale launcher frame, or (a busy host: the
    parent not read in time) under that stale frame alone.  Only stacks whose outermost Python
    frame is the launcher's (py-spy may read its command line as empty), or with no Python frame
    or only the launcher's file under the launcher as their innermost process, are the launcher's
    own."""
    first_python = next((f for f in frames if f.kind == PYTHON), None)
    if first_python is not None and (first_python.path or "").endswith(_LAUNCHER_MARKERS):
        return None
    process_indexes = [i for i, f in enumerate(frames) if f.kind == PROCESS]
    launcher = [i for i in process_indexes
                if any(m in (frames[i].path or "") for m in _LAUNCHER_MARKERS)]
    if not launcher:
        return frames
    if process_indexes[-1] == launcher[0] and (
            first_python is None or os.path.basename(first_python.path or "") in _LAUNCHER_FILES):
        return None  # the launcher's own (waiting) stack; py-spy may give its file's name alone
    return [f for i, f in enumerate(frames) if i not in launcher]


def read_profiles(paths: Sequence[str]) -> Profile:
    """Read and merge py-spy raw files, with a progress bar for large ones.

    Raises ``FileNotFoundError``/``OSError`` with the file name when one cannot be read.
    """
    from tqdm import tqdm

    total = Profile()
    for path in paths:
        size = os.path.getsize(path)
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        with tqdm(
            total=len(text), unit="B", unit_scale=True, desc=os.path.basename(path),
            disable=None if size > 32 << 20 else True, leave=False,
        ) as bar:
            total.merge(parse_raw_text(text, source=path, progress=bar))
    return total


# ---------------------------------------------------------------------------------------------
# Paths.

_SITE_RE = re.compile(r"^.*[/\\]((?:site|dist)-packages[/\\].*)$")
_STDLIB_RE = re.compile(r"^.*[/\\]lib[/\\]python\d+(?:\.\d+)?t?[/\\](.*)$")


def shorten_path(path: str) -> str:
    """``/venv/lib/python3.11/site-packages/torch/x.py`` -> ``site-packages/torch/x.py``.

    Standard-library files lose their prefix too (``multiprocessing/util.py``); other
    absolute paths under the working directory become relative to it.
    """
    match = _SITE_RE.match(path)
    if match:
        return match.group(1).replace("\\", "/")
    match = _STDLIB_RE.match(path)
    if match:
        return match.group(1)
    if os.path.isabs(path):
        cwd = os.getcwd()
        if path.startswith(cwd + os.sep):
            return path[len(cwd) + 1 :]
    return path


@lru_cache(maxsize=1)
def _installed_top_level_modules() -> frozenset[str]:
    try:
        from importlib.metadata import packages_distributions

        return frozenset(packages_distributions())
    except Exception:  # noqa: BLE001  (broken metadata must not break a report)
        return frozenset()


@lru_cache(maxsize=1 << 16)
def is_own_code(path: str | None) -> bool:
    """Whether a frame's file is the user's code: not site-packages, stdlib, frozen or native.

    Works best on full file names (``torchprof pyspy record`` passes ``--full-filenames``); for
    py-spy's short names (``torch/nn/modules/conv.py``) the first component is compared with the
    standard library and with the packages installed where the report runs.
    """
    if not path or path.startswith("<"):
        return False
    if not path.endswith((".py", ".pyx", ".pyw")):
        return False
    if _SITE_RE.match(path) or _STDLIB_RE.match(path):
        return False
    if os.path.isabs(path):
        return True
    first = re.split(r"[/\\]", path, maxsplit=1)[0]
    first = first[:-3] if first.endswith(".py") else first
    return first not in sys.stdlib_module_names and first not in _installed_top_level_modules()
