"""The Prometheus sink: the endpoint serves what metrics.jsonl holds, faults never reach training,
and a real Prometheus server scrapes a real 2-rank gloo job (plus the Grafana dashboard's queries)."""

from __future__ import annotations

import json
import logging
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers.examples import run_doc_example
from helpers.paths import REPO
from helpers.processes import free_port, rank_results, run_torchrun, start_torchrun
from helpers.prometheus import PrometheusServer, prometheus_binary
from prometheus_client.parser import text_string_to_metric_families

from torchprof_args import MetricsWriter
from torchprof_args.analysis.dashboard.grafana import grafana_dashboard
from torchprof_args.analysis.dashboard.spec import DEFAULT_SPEC
from torchprof_args.capture.metrics.config import MetricsConfig, PrometheusConfig
from torchprof_args.capture.metrics.prometheus import PrometheusSink
from torchprof_args.shared.metrics_log import RunMarker, read_records
from torchprof_args.shared.prometheus_names import metric_name

JOB = REPO / "tests" / "jobs" / "operations_job.py"


def _writer(tmp_path: Path, port: int = 0, **kwargs) -> MetricsWriter:
    config = MetricsConfig(
        str(tmp_path / "run"), sinks=("jsonl", "prometheus"), prometheus=PrometheusConfig(port=port)
    )
    return MetricsWriter(config, rank=0, world_size=1, console=False, **kwargs)


def _sink(writer: MetricsWriter) -> PrometheusSink:
    return next(s for s in writer._sinks if isinstance(s, PrometheusSink))  # noqa: SLF001


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metric_names_follow_the_keys() -> None:
    assert metric_name("iteration-time") == "torchprof_iteration_time"
    assert metric_name("timers/forward-backward-time") == "torchprof_timers_forward_backward_time"
    assert metric_name("throughput/tokens-per-sec") == "torchprof_throughput_tokens_per_sec"
    assert metric_name("profiler/flush_seconds-min") == "torchprof_profiler_flush_seconds_min"
    assert metric_name("gpu/sm-clock-mhz") == "torchprof_gpu_sm_clock_mhz"


def test_endpoint_serves_every_scalar_and_per_rank_series_of_the_last_record(tmp_path: Path) -> None:
    writer = _writer(tmp_path)
    try:
        for iteration in (1, 2, 3):
            time.sleep(0.05)  # each interval longer than the profiling cost it holds
            writer.log_step(iteration, extra={"flush_seconds": 0.25, "cost_seconds_total": 0.02 * iteration})
        scraped = _scrape(_sink(writer).port)
    finally:
        writer.close()
    record = read_records(tmp_path / "run" / "metrics.jsonl")[-1]
    assert record.iteration == 3 and scraped[("torchprof_iteration", ())] == 3
    for key, value in record.metrics.items():
        assert scraped[(metric_name(key), ())] == value, key
    for key, values in record.per_rank.items():
        assert scraped[(metric_name(key) + "_by_rank", (("rank", "0"),))] == values[0], key
    lost = {
        labels[0][1]: v for (name, labels), v in scraped.items() if name == "torchprof_goodput_lost_seconds"
    }
    assert set(lost) == {
        "startup",
        "checkpoint",
        "data",
        "evaluation",
        "profiling",
        "hang",
        "restart",
        "other",
    }
    assert lost["profiling"] == pytest.approx(0.06)
    assert 0 < scraped[("torchprof_goodput", ())] < 1


def test_port_in_use_one_warning_and_the_other_sinks_go_on(tmp_path: Path, logs) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        writer = _writer(tmp_path, port)
        for iteration in (1, 2):
            writer.log_step(iteration)
        writer.close()
    assert writer.sink_names == [] and len(read_records(tmp_path / "run" / "metrics.jsonl")) == 2
    warnings = logs.at(logging.WARNING)
    assert len(warnings) == 1
    assert f"cannot listen on 127.0.0.1:{port}" in warnings[0] and "--metrics-prometheus-port" in warnings[0]
    assert "the other sinks keep working" in warnings[0]


def test_a_restart_binds_the_port_its_previous_run_served_on(tmp_path: Path, logs) -> None:
    first = _writer(tmp_path)
    port = _sink(first).port
    first.log_step(1)
    _scrape(port)  # the server closes the connection: its side of the port is left in TIME_WAIT
    first.close()
    second = _writer(tmp_path, port, start_iteration=1)
    try:
        second.log_step(2)
        assert _scrape(port)[("torchprof_iteration", ())] == 2
    finally:
        second.close()
    assert not logs.at(logging.WARNING)


def test_without_prometheus_client_one_warning_names_the_extra(tmp_path: Path, logs, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    writer = _writer(tmp_path)
    writer.log_step(1)
    writer.close()
    assert writer.sink_names == []
    warnings = logs.at(logging.WARNING)
    assert len(warnings) == 1 and "pip install 'torchprof-args[prometheus]'" in warnings[0]


_SCRAPER = """
import socket, sys
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
sock.connect(("127.0.0.1", int(sys.argv[1])))
sock.sendall(b"GET /metrics HTTP/1.0\\r\\n\\r\\n")
sock.recv(100)
print("reading", flush=True)
sys.stdin.read()  # killed here, its socket still holding unread data
"""


@pytest.mark.slow
def test_a_scraper_killed_mid_response_costs_one_warning(tmp_path: Path, logs) -> None:
    """A response of several MB (many series), a scraper SIGKILLed after its first bytes: the server's
    write fails, one warning (for two such scrapers), and serving and writing go on."""
    sink = PrometheusSink(PrometheusConfig(port=0), RunMarker.here(0, 1))
    try:
        per_rank = {f"timers/t{i}-time": [float(r) for r in range(64)] for i in range(2000)}
        sink.write(1, {"iteration-time": 1.0}, per_rank)
        for _ in range(2):
            scraper = subprocess.Popen(
                [sys.executable, "-c", _SCRAPER, str(sink.port)],
                stdout=subprocess.PIPE,
                stdin=subprocess.PIPE,
                text=True,
            )
            assert scraper.stdout.readline().strip() == "reading"
            scraper.send_signal(signal.SIGKILL)
            scraper.wait()
        deadline = time.monotonic() + 30
        while not logs.at(logging.WARNING) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        sink.write(2, {"iteration-time": 2.0}, {})
        assert _scrape(sink.port)[("torchprof_iteration", ())] == 2
    finally:
        sink.close()
    warnings = logs.at(logging.WARNING)
    assert len(warnings) == 1
    assert warnings[0].endswith(
        "a Prometheus scraper disconnected before the end of its response; serving goes on"
    )


# ---------------------------------------------------------------------------------------------
# A real Prometheus server and a real 2-rank job


def _job_args(tmp_path: Path, name: str, port: int, *extra: str) -> list[str]:
    folder = tmp_path / name
    return [
        "--result-dir",
        str(folder / "results"),
        "--metrics-dir",
        str(folder / "metrics"),
        "--metrics-sinks",
        "jsonl",
        "prometheus",
        "--metrics-prometheus-port",
        str(port),
        "--log-interval",
        "2",
        "--iters",
        "8",
        "--hold",
        str(folder / "hold"),
        *extra,
    ]


def _wait_for(path: Path, job: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert job.poll() is None, f"the job ended early (exit {job.returncode})"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def _finish(job: subprocess.Popen, hold: Path, folder: Path) -> str:
    hold.touch()
    assert job.wait(120) == 0, (folder / "torchrun.err").read_text()[-3000:]
    return (folder / "torchrun.err").read_text() + (folder / "torchrun.out").read_text()


def _grafana_queries(server: PrometheusServer) -> dict[str, list[str]]:
    """Each Grafana panel's queries with its variable expanded as Grafana would (``metrics()`` then
    the variable's regex, the capture group as the value): panel title -> queries."""
    dashboard = grafana_dashboard(DEFAULT_SPEC)
    names = server.names()
    values = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            regex = re.compile(variable["regex"].strip("/"))
            values[variable["name"]] = sorted({m.group(1) for n in names if (m := regex.match(n))})
    queries = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            repeat = panel.get("repeat")
            for value in values.get(repeat, [None]) if repeat else [None]:
                expr = target["expr"].replace(f"${{{repeat}}}", value) if value else target["expr"]
                queries.setdefault(panel["title"].replace(f"${repeat}", value or ""), []).append(expr)
    return queries


@pytest.mark.slow
def test_real_prometheus_scrapes_a_two_rank_job_through_restart_and_port_taken(tmp_path: Path) -> None:
    if prometheus_binary() is None:
        pytest.skip("the prometheus server binary is not installed (Debian: apt-get install prometheus)")
    port = free_port()
    with PrometheusServer(tmp_path / "prometheus", [f"127.0.0.1:{port}"]) as server:
        # 1. the job: its last record, scalars and per-rank series, as Prometheus scraped them
        (tmp_path / "first").mkdir()
        job = start_torchrun(JOB, *_job_args(tmp_path, "first", port), cwd=tmp_path / "first")
        _wait_for(tmp_path / "first" / "hold.waiting", job)
        server.wait_for("torchprof_iteration", lambda v: v == 8)
        record = read_records(tmp_path / "first" / "metrics" / "metrics.jsonl")[-1]
        server.wait_for("torchprof_iteration_time", lambda v: v == record.metrics["iteration-time"])
        for key, value in record.metrics.items():
            assert server.value(metric_name(key)) == pytest.approx(value, rel=1e-12), key
        for key, values in record.per_rank.items():
            scraped = server.query(metric_name(key) + "_by_rank")
            assert scraped == pytest.approx(
                {(("rank", str(r)),): v for r, v in enumerate(values) if v is not None}
            )
        by_rank = server.query("torchprof_timers_batch_generator_time_by_rank")
        assert by_rank[(("rank", "1"),)] > by_rank[(("rank", "0"),)] + 0.005  # rank 1 sleeps 10 ms longer
        assert 0 < server.value("torchprof_goodput") < 1
        assert len(server.query("torchprof_goodput_lost_seconds")) == 8
        # the Grafana dashboard's queries, variables expanded, find these series
        queries = _grafana_queries(server)
        for title in (
            "iteration time (s)",
            "forward_backward (s)",
            "batch_generator (s)",
            "forward_backward (x median)",
            "host peak RSS (GB)",
            "flush_seconds",
        ):
            assert all(server.query(expr) for expr in queries[title]), (title, queries[title])
        # a scraper killed mid-request: training and serving go on
        scraper = subprocess.Popen(
            [sys.executable, "-c", _SCRAPER, str(port)],
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE,
            text=True,
        )
        scraper.stdout.readline()
        scraper.kill()
        scraper.wait()
        output = _finish(job, tmp_path / "first" / "hold", tmp_path / "first")
        # the kill may land before or after the server wrote the whole response: at most the one
        # disconnect warning, nothing else about Prometheus
        other = [
            line
            for line in output.splitlines()
            if "Prometheus" in line
            and "serving Prometheus metrics" not in line
            and "scraper disconnected before the end of its response" not in line
        ]
        assert not other, other
        assert output.count("scraper disconnected before the end") <= 1
        # 2. the job restarted on the same port (its old connections in TIME_WAIT): served again
        (tmp_path / "second").mkdir()
        job = start_torchrun(
            JOB, *_job_args(tmp_path, "second", port, "--iters", "4"), cwd=tmp_path / "second"
        )
        _wait_for(tmp_path / "second" / "hold.waiting", job)
        server.wait_for("torchprof_iteration", lambda v: v == 4)
        output = _finish(job, tmp_path / "second" / "hold", tmp_path / "second")
        assert "WARNING" not in "".join(line for line in output.splitlines(True) if "Prometheus" in line)
    # 3. the port taken by another process: one warning, training and metrics.jsonl go on
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the server's side may be in TIME_WAIT
        taken.bind(("127.0.0.1", port))
        taken.listen()
        (tmp_path / "third" / "hold").parent.mkdir()
        (tmp_path / "third" / "hold").touch()
        result = run_torchrun(JOB, *_job_args(tmp_path, "third", port), cwd=tmp_path / "third")
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if "Prometheus metrics are off" in line]
    assert len(warnings) == 1 and f"cannot listen on 127.0.0.1:{port}" in warnings[0]
    records = read_records(tmp_path / "third" / "metrics" / "metrics.jsonl")
    assert [r.iteration for r in records] == [2, 4, 6, 8]
    assert set(rank_results(tmp_path / "third" / "results")) == {0, 1}


@pytest.mark.slow
def test_operations_guide_prometheus_example(tmp_path: Path) -> None:
    """The guide's example, verbatim: a 2-rank job scraped by curl after its last step, then the
    Grafana dashboard written."""
    port = free_port()
    proc = run_doc_example("operations-prometheus", tmp_path, PROMETHEUS_PORT=str(port))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    scraped = dict(line.rsplit(" ", 1) for line in proc.stdout.splitlines() if line.startswith("torchprof_"))
    assert float(scraped["torchprof_iteration"]) == 8.0
    record = read_records(tmp_path / "run" / "metrics.jsonl")[-1]
    assert float(scraped["torchprof_iteration_time"]) == record.metrics["iteration-time"]
    slow, fast = (
        float(scraped[f'torchprof_timers_batch_generator_time_by_rank{{rank="{r}"}}']) for r in (1, 0)
    )
    assert slow > fast + 0.005
    assert sum(1 for key in scraped if key.startswith("torchprof_goodput_lost_seconds{")) == 8
    assert "wrote grafana.json" in proc.stdout
    assert json.loads((tmp_path / "grafana.json").read_text())["uid"] == "torchprof-step-timings"
