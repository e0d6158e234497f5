"""A real Prometheus server for the tests (Debian's ``prometheus`` package): started on loopback with a
temp config and storage and a 1 s scrape interval, queried through its HTTP API."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from helpers.processes import free_port


def prometheus_binary() -> str | None:
    """The ``prometheus`` server binary, or None (the tests that need it skip, saying why)."""
    return shutil.which("prometheus")


class PrometheusServer:
    """``prometheus`` scraping ``targets`` every second; a context manager."""

    def __init__(self, folder: Path, targets: list[str]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        config = folder / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: torchprof\n    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n"
        )
        binary = prometheus_binary()
        assert binary is not None
        self.log = open(folder / "prometheus.log", "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (
                f"prometheus exited: {Path(self.log.name).read_text()[-2000:]}"
            )
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready after {timeout} s")

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant query: each series' labels (without ``__name__``, ``job``, ``instance``) -> value."""
        data = self.api("query", query=expr)
        hidden = ("job", "instance", "__name__")
        result = {}
        for item in data["result"]:
            labels = tuple(sorted((k, v) for k, v in item["metric"].items() if k not in hidden))
            result[labels] = float(item["value"][1])
        return result

    def value(self, expr: str) -> float | None:
        """The value of a query with one series (None when it has none)."""
        result = self.query(expr)
        assert len(result) <= 1, (expr, result)
        return next(iter(result.values()), None)

    def names(self) -> list[str]:
        return list(self.api("label/__name__/values"))

    def wait_for(
        self, expr: str, check: Callable[[float | None], bool], timeout: float = 60.0
    ) -> float | None:
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            value = self.value(expr)
            if check(value):
                return value
            time.sleep(0.25)
        raise AssertionError(f"{expr} never passed the check (last value {value})")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
