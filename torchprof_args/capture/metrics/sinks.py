"""The metrics writer's sinks: metrics.jsonl, TensorBoard event files, wandb (Prometheus:
:mod:`~torchprof_args.capture.metrics.prometheus`).

Each sink has ``name``, ``write(iteration, metrics, per_rank)`` and ``close()``; the writer
drops a sink that fails, with one warning, and keeps the others.  TensorBoard and wandb are
imported only when their sink starts.
"""

from __future__ import annotations

import atexit
import json
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from torchprof_args.atomic import write_json_atomically
from torchprof_args.capture.metrics.config import WandbMode
from torchprof_args.shared.metrics_log import (
    ALIVE_KEY,
    ALIVE_SECONDS,
    END_KEY,
    MetricsRecord,
    RunMarker,
    marker_line,
)

__all__ = ["DictLogger", "JsonlSink", "ScalarWriter", "Sink", "TensorBoardSink", "WandbSink"]


class ScalarWriter(Protocol):
    """TensorBoard's style, one scalar at a time: a ``SummaryWriter``, Megatron-LM's writer,
    :class:`~torchprof_args.capture.metrics.writer.MetricsWriter`."""

    def add_scalar(self, tag: str, value: float, step: int, /) -> object: ...


class DictLogger(Protocol):
    """wandb's style, a dict per step: the ``wandb`` module or a run."""

    def log(self, data: dict[str, float], step: int | None = None) -> object: ...


class Sink(Protocol):
    """Where the metrics rank writes each logged iteration."""

    @property
    def name(self) -> str: ...

    def write(self, iteration: int, metrics: Mapping[str, float], per_rank: Mapping[str, list]) -> None:
        """``metrics``: the iteration's figures; ``per_rank``: per-rank series by key (None: no value)."""

    def close(self) -> None: ...


class JsonlSink:
    """One JSON object per logged iteration, appended; each line goes out in one write and is flushed.

    With ``run`` (:mod:`~torchprof_args.shared.metrics_log`) the run's lines are marked: a ``"run"``
    line first, ``"alive"`` lines from a daemon thread after ``alive_seconds`` of silence, a
    ``"run_end"`` line at :meth:`close` (or at interpreter exit, if the writer was never closed).
    """

    name = "metrics.jsonl"

    def __init__(self, path: Path, run: RunMarker | None = None,
                 alive_seconds: float = ALIVE_SECONDS) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.run = run
        self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115  (closed in close())
        self._lock = threading.Lock()
        self._last_write = time.time()
        self._iteration = run.start_iteration if run is not None else 0
        self._closed = threading.Event()
        self._alive_seconds = alive_seconds
        if run is not None:
            self._line(run.record())
            thread = threading.Thread(target=_say_alive, name="torchprof-metrics-alive", daemon=True,
                                      args=(weakref.ref(self), alive_seconds, self._closed))
            thread.start()
            atexit.register(self.close)

    def _line(self, record: Mapping[str, Any]) -> None:
        with self._lock:
            if self._handle.closed:
                return
            self._handle.write(json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n")
            self._handle.flush()
            self._last_write = time.time()

    def write(self, iteration: int, metrics: Mapping[str, float], per_rank: Mapping[str, list]) -> None:
        self._iteration = iteration
        self._line(MetricsRecord(iteration, time.time(), dict(metrics), dict(per_rank)).to_line())

    def alive(self) -> None:
        """Say the process is alive when nothing was written for a while (the daemon thread)."""
        if self.run is not None and time.time() - self._last_write >= 0.9 * self._alive_seconds:
            self._line(marker_line(ALIVE_KEY, self.run.id, self._iteration))

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if self.run is not None:
            self._line(marker_line(END_KEY, self.run.id, self._iteration))
            atexit.unregister(self.close)
        with self._lock:
            self._handle.close()


def _say_alive(sink_ref: weakref.ref[JsonlSink], period: float, closed: threading.Event) -> None:
    """The alive thread: wakes every ``period`` seconds until the sink closes (or is collected)."""
    while not closed.wait(period):
        sink = sink_ref()
        if sink is None:
            return
        sink.alive()
        del sink


class TensorBoardSink:
    name = "TensorBoard"

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir=str(log_dir), flush_secs=30)

    def write(self, iteration: int, metrics: Mapping[str, float], per_rank: Mapping[str, list]) -> None:
        for tag, value in metrics.items():
            self._writer.add_scalar(tag, value, iteration)

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    name = "wandb"

    def __init__(
        self,
        *,
        project: str,
        name: str | None,
        entity: str | None,
        save_dir: Path,
        mode: WandbMode,
        config: Mapping[str, Any] | None,
        run_file: Path,
    ) -> None:
        import wandb

        run = wandb.run
        self._owns_run = run is None
        if run is None:
            save_dir.mkdir(parents=True, exist_ok=True)
            run = wandb.init(
                project=project,
                name=name,
                entity=entity,
                dir=str(save_dir),
                mode=mode,
                config=dict(config or {}),
                settings=wandb.Settings(init_timeout=120, silent=True),
            )
        # else the host (Megatron-LM with --wandb-project) already started a run: share it.
        self._run = run
        self._run.define_metric("iteration")
        self._run.define_metric("*", step_metric="iteration")
        info = {
            "project": self._run.project,
            "entity": getattr(self._run, "entity", None) or entity,
            "id": self._run.id,
            "name": self._run.name,
            "mode": mode,
            "dir": str(getattr(self._run, "dir", "") or ""),
        }
        write_json_atomically(run_file, info, indent=2)

    def write(self, iteration: int, metrics: Mapping[str, float], per_rank: Mapping[str, list]) -> None:
        self._run.log({"iteration": iteration, **metrics})

    def close(self) -> None:
        if self._owns_run:
            self._run.finish()
