"""The Prometheus sink: the metrics rank serves ``/metrics`` in Prometheus' text format.

``--metrics-sinks prometheus`` (``pip install 'torchprof-args[prometheus]'``: ``prometheus_client``,
imported only here) starts an HTTP server thread on ``--metrics-prometheus-addr`` (loopback by
default) and ``--metrics-prometheus-port``.  Every scrape reads what the last ``log_step`` wrote:

* every scalar the metrics writer logs, as a gauge named ``torchprof_`` + the key with each run
  of characters other than letters and digits replaced by ``_`` (``iteration-time`` ->
  ``torchprof_iteration_time``, ``timers/forward-backward-time`` ->
  ``torchprof_timers_forward_backward_time``), the same value as ``metrics.jsonl``;
* every per-rank series of that record (the timers, straggler scores, GPU clock / power /
  temperature, allocator figures the one all-gather brings) as ``<name>_by_rank{rank="R"}``;
* ``torchprof_iteration``, ``torchprof_last_write_timestamp_seconds``;
* the goodput ledger (:mod:`~torchprof_args.capture.metrics.goodput`) of this process over the last
  ``--metrics-goodput-window`` seconds, computed at scrape time (a hang shows as it grows):
  ``torchprof_goodput``, ``torchprof_goodput_wall_seconds``, ``torchprof_goodput_productive_seconds``
  and ``torchprof_goodput_lost_seconds{category="..."}``.

Faults never reach training: a port in use (another job, or a previous run still running) makes
the sink fail to start (one warning from the writer; the other sinks go on); a scraper that
disconnects mid-response or sends garbage costs that response only (one warning for the first).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from torchprof_args.capture.metrics.config import PrometheusConfig
from torchprof_args.capture.metrics.goodput import (
    CATEGORIES,
    COST_TOTAL,
    PROFILING_TOTALS,
    TIMER_CATEGORIES,
    build_ledger,
)
from torchprof_args.log import get_logger
from torchprof_args.shared.metrics_log import MetricsRecord, RunMarker, RunSegment
from torchprof_args.shared.prometheus_names import PER_RANK_SUFFIX, PREFIX, metric_name

__all__ = ["PrometheusSink"]

logger = get_logger(__name__)

#: Bytes per chunk of a response (a scraper gone mid-response is noticed at the next chunk).
CHUNK = 64 << 10
#: The keys the goodput window keeps of each record.
_LEDGER_KEYS = ("iteration-time", COST_TOTAL, *PROFILING_TOTALS.values())


def _ledger_key(key: str) -> bool:
    if key in _LEDGER_KEYS:
        return True
    return any(
        key in (f"timers/{n}-time", f"deepspeed/{n}-ms")
        for names in TIMER_CATEGORIES.values()
        for n in (*names, "load-checkpoint")
    )


class _Window:
    """This process's records for the rolling goodput gauges: only the keys the ledger reads, and
    only the window's (older ones fold into a floor: the first interval's start and the totals)."""

    def __init__(self, run: RunMarker, seconds: float) -> None:
        self.run, self.seconds = run, seconds
        self.records: list[MetricsRecord] = []
        self.floor: MetricsRecord | None = None

    def add(self, iteration: int, timestamp: float, metrics: Mapping[str, float]) -> None:
        kept = {key: value for key, value in metrics.items() if _ledger_key(key)}
        self.records.append(MetricsRecord(iteration, timestamp, kept))
        old = [r for r in self.records if r.timestamp < timestamp - self.seconds]
        if len(old) > max(16, len(self.records) // 2):  # fold in batches: O(1) amortised per record
            floor = old[-1]
            self.floor = MetricsRecord(floor.iteration, floor.timestamp, {})
            self.records = self.records[len(old) :]
            for record in self.records:  # the profiler's totals count from the floor
                for key in (COST_TOTAL, *PROFILING_TOTALS.values()):
                    if key in record.metrics and key in floor.metrics:
                        record.metrics[key] -= floor.metrics[key]

    def segment(self) -> RunSegment:
        run = self.run
        if self.floor is not None:
            run = RunMarker(run.id, self.floor.timestamp, self.floor.iteration, None, run.world_size)
        return RunSegment(run, list(self.records))


class PrometheusSink:
    """Serves the latest record on ``/metrics`` (see the module docstring); ``port`` is the bound port."""

    name = "Prometheus"

    def __init__(self, config: PrometheusConfig, run: RunMarker) -> None:
        try:
            from prometheus_client import CollectorRegistry, make_wsgi_app
        except ImportError:
            raise ImportError(
                "the Prometheus sink needs prometheus_client: pip install 'torchprof-args[prometheus]'"
            ) from None
        self.config = config
        self._lock = threading.Lock()
        self._latest: tuple[int, float, dict[str, float], dict[str, list[Any]]] | None = None
        self._window = _Window(run, config.goodput_window)
        self._warned: set[str] = set()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        app = _watched(
            make_wsgi_app(registry),
            lambda: self._warn_once(
                "disconnect",
                "a Prometheus scraper disconnected before the end of its response; serving goes on",
            ),
        )
        self._server = _serve(config.addr, config.port, app, self._warn_once)
        self.port = int(self._server.server_address[1])
        threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},  # close() waits for one poll at most
            name="torchprof-prometheus",
            daemon=True,
        ).start()
        logger.info("serving Prometheus metrics on http://%s:%d/metrics", config.addr, self.port)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)

    def write(self, iteration: int, metrics: Mapping[str, float], per_rank: Mapping[str, list]) -> None:
        now = time.time()
        with self._lock:
            self._latest = (iteration, now, dict(metrics), {k: list(v) for k, v in per_rank.items()})
            self._window.add(iteration, now, metrics)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- the collector (prometheus_client calls it at every scrape, on the server's thread) --------

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        with self._lock:
            latest = self._latest
            segment = self._window.segment()
        names: set[str] = set()

        def family(name: str, documentation: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily | None:
            if name in names:
                self._warn_once(
                    f"clash:{name}",
                    f"two metrics keys map to the Prometheus name {name}; only the first is served",
                )
                return None
            names.add(name)
            return GaugeMetricFamily(name, documentation, labels=labels)

        now = time.time()
        yield from self._goodput(segment, now, family)
        if latest is None:
            return
        iteration, written, metrics, per_rank = latest
        for name, doc, value in (
            (PREFIX + "iteration", "Iteration of the last metrics record.", iteration),
            (PREFIX + "last_write_timestamp_seconds", "When it was written.", written),
        ):
            gauge = family(name, doc)
            if gauge is not None:
                gauge.add_metric([], float(value))
                yield gauge
        for key, value in metrics.items():
            gauge = family(metric_name(key), f"torchprof metrics key {key!r} (metrics.jsonl).")
            if gauge is not None:
                gauge.add_metric([], float(value))
                yield gauge
        for key, values in per_rank.items():
            gauge = family(metric_name(key) + PER_RANK_SUFFIX, f"{key!r} of each rank.", ("rank",))
            if gauge is None:
                continue
            for rank, value in enumerate(values):
                if value is not None:
                    gauge.add_metric([str(rank)], float(value))
            yield gauge

    def _goodput(self, segment: RunSegment, now: float, family: Callable[..., Any]) -> Iterator[Any]:
        window = self.config.goodput_window
        ledger = build_ledger([segment], since=now - window, now=now)
        scalars = (
            (PREFIX + "goodput", "Productive share of the wall time in the window.", ledger.goodput),
            (
                PREFIX + "goodput_window_seconds",
                "The goodput gauges' window (--metrics-goodput-window).",
                window,
            ),
            (PREFIX + "goodput_wall_seconds", "Wall time of this process in the window.", ledger.wall_s),
            (
                PREFIX + "goodput_productive_seconds",
                "Productive training time in the window.",
                ledger.productive_s,
            ),
        )
        for name, doc, value in scalars:
            gauge = family(name, doc)
            if gauge is not None and value is not None:
                gauge.add_metric([], float(value))
                yield gauge
        lost = family(PREFIX + "goodput_lost_seconds", "Time lost in the window, by category.", ("category",))
        if lost is not None:
            for category in CATEGORIES:
                lost.add_metric([category], ledger.lost_s[category])
            yield lost


# ---------------------------------------------------------------------------------------------
# The HTTP server: wsgiref's, threaded, quiet, with a timeout per connection


class _Handler(WSGIRequestHandler):
    timeout = 30.0  # a scraper that connects and says nothing frees its thread

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """One line per request on stderr is not ours to print."""


def _serve(addr: str, port: int, app: Callable[..., Any], warn: Callable[[str, str], None]) -> WSGIServer:
    """Bind the server (raises ``OSError`` naming the flag when the port is taken)."""
    family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = family

        def handle_error(self, request: Any, client_address: Any) -> None:
            warn("request", f"a Prometheus request from {client_address[0]} failed; serving goes on")

    try:
        return make_server(addr, port, app, Server, handler_class=_Handler)
    except OSError as err:
        raise OSError(
            err.errno,
            f"cannot listen on {addr}:{port} ({err.strerror or err}): another job, or a "
            "previous run of this one, may still hold it; choose another "
            "--metrics-prometheus-port (0: any free port)",
        ) from None


def _watched(app: Callable[..., Any], on_cut: Callable[[], None]) -> Callable[..., Any]:
    """``app`` whose response goes out in chunks; ``on_cut()`` when the client left before the end."""

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> _Chunks:
        return _Chunks(b"".join(app(environ, start_response)), on_cut)

    return wrapped


class _Chunks:
    """A response body that knows whether the server got to write all of it."""

    def __init__(self, body: bytes, on_cut: Callable[[], None]) -> None:
        self.body, self.on_cut, self.done = body, on_cut, False

    def __iter__(self) -> Iterator[bytes]:
        for start in range(0, len(self.body), CHUNK):
            yield self.body[start : start + CHUNK]
        self.done = True

    def close(self) -> None:
        if not self.done:
            self.on_cut()
