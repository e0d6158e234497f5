"""This package's pages on PyTorch's debug server, registered beside PyTorch's own
(:mod:`torchprof_args.capture.runtime.debug_server.server` starts it).

They run in the frontend's process, forked from rank 0 (never in a training process):

* ``/torchprof_trace?iterations=N&ranks=all`` traces the next N iterations through the on-demand
  channel ``torchprof trigger`` uses (:mod:`torchprof_args.capture.ondemand.client`: a request in the
  job's control directory, rank 0's answer); answers that answer as JSON.  Without a query: a form.
* ``/torchprof_brief?max_tokens=N``: the last cycle's brief, ``torchprof brief <profile dir>`` run
  in a child process at the lowest priority, one at a time, at most :data:`BRIEF_TIMEOUT` s; it
  reads the published sidecars.
* ``/torchprof_fr_trace``: every rank's flight recorder as each rank's worker serves it, one JSON
  document; its periodic dump (``torchprof_fr_trace_<time>.txt``) is what ``torchprof hang``
  reads beside PyTorch's ``stacks_<time>.txt``; it also keeps only the newest :data:`KEEP_DUMPS`
  of both in the dump folder.

Every rank's Python stacks are PyTorch's own page (``/stacks``) and dump: not repeated here.
Importing this module imports PyTorch's frontend (jinja2): only after the checks of
:func:`torchprof_args.capture.runtime.debug_server.server.unavailable`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.distributed.debug._frontend import DebugHandler, NavLink, Route, fetch_all

from torchprof_args.capture.flags.types import rank_token
from torchprof_args.capture.ondemand.client import RequestFailed, submit, wait_for_answer
from torchprof_args.naming import DEBUG_SERVER_DUMPS
from torchprof_args.shared import formats

if TYPE_CHECKING:
    from torch.distributed.debug._frontend import HTTPRequestHandler

__all__ = ["BRIEF_TIMEOUT", "KEEP_DUMPS", "RECORDERS", "BriefPage", "FlightRecorderPage", "TracePage",
           "pages"]

#: Dumps of each kind kept in the dump folder (PyTorch's dumper never removes any).
KEEP_DUMPS = 5
#: Seconds one brief may take; the most a trace page waits for rank 0's answer (default, at most).
BRIEF_TIMEOUT = 120.0
TRACE_WAIT, TRACE_WAIT_MAX = 60.0, 600.0
#: Each flight recorder in the dump, by the name ``torchprof hang`` gives it -> its workers' handler.
RECORDERS = {"gloo": "fr_trace_json", "nccl": "dump_nccl_trace_json"}

_TEXT_TEMPLATE = """
{% extends "base.html" %}
{% block header %}<h1>{% block title %}{{ title }}{% endblock %}</h1>{% endblock %}
{% block content %}{{ form | safe }}<pre>{{ text | e }}</pre>{% endblock %}
"""
_TRACE_FORM = """
<form action="" method="get">
  <label>Iterations <input type="number" name="iterations" value="3" min="1"></label>
  <label>Ranks <input type="text" name="ranks" value="0"></label>
  <input type="submit" value="Trace">
</form>"""


def _text_page(req: HTTPRequestHandler, title: str, text: str, form: str = "") -> bytes:
    return req.frontend.render_template("torchprof_text.html", title=title, text=text, form=form)


class TracePage(DebugHandler):
    """An on-demand trace of the next N iterations (see the module docstring)."""

    def __init__(self, control_dir: str | None) -> None:
        self.control_dir = control_dir

    def routes(self) -> list[Route]:
        return [Route("/torchprof_trace", self._handle)]

    def nav_links(self) -> list[NavLink]:
        return [NavLink("/torchprof_trace", "torchprof: trace N iterations")]

    def templates(self) -> dict[str, str]:
        return {"torchprof_text.html": _TEXT_TEMPLATE}

    def _handle(self, req: HTTPRequestHandler) -> bytes:
        query = req.get_query()
        if "iterations" not in query:
            how = ("Traces the next N iterations of the ranks given ('all', or numbers separated by commas) "
                   "through the job's on-demand channel; answers rank 0's answer as JSON.")
            if self.control_dir is None:
                how = "This job runs without --torch-profile-on-demand: no trace on request."
            return _text_page(req, "torchprof: trace N iterations", how, _TRACE_FORM)
        return json.dumps(self.request(query), indent=1, sort_keys=True).encode()

    def request(self, query: dict[str, list[str]]) -> dict[str, Any]:
        """Rank 0's answer to a trace request made of the query's ``iterations``, ``ranks`` and
        ``timeout``; ``{"status": "failed", "reason": ...}`` when it could not be asked or answered."""
        if self.control_dir is None:
            return {"status": "failed", "reason": "the job runs without --torch-profile-on-demand; "
                                                  "restart it with that flag to trace on request"}
        try:
            iterations = int(query["iterations"][0])
            ranks = _ranks(query.get("ranks", ["0"])[0])
            wait = min(float(query.get("timeout", [TRACE_WAIT])[0]), TRACE_WAIT_MAX)
        except ValueError as err:
            return {"status": "failed", "reason": f"iterations must be a whole number, ranks 'all' or rank "
                                                  f"numbers separated by commas, timeout seconds ({err})"}
        control = Path(self.control_dir)
        try:
            request_id, path = submit(control, iterations, ranks)
            return wait_for_answer(control, request_id, path, time.monotonic() + wait,
                                   timeout_hint=f"the page's timeout ({wait:g} s)")
        except RequestFailed as err:
            return {"status": "failed", "reason": str(err)}


def _ranks(text: str) -> list[int] | str:
    """The query's ranks: ``all``, or rank numbers separated by commas (each as ``--ranks`` reads it)."""
    try:
        tokens = [rank_token(token) for token in text.replace(" ", ",").split(",") if token]
    except argparse.ArgumentTypeError as err:
        raise ValueError(f"ranks {text!r}: {err}") from None
    if tokens == ["all"]:
        return "all"
    if not tokens or "all" in tokens:
        raise ValueError(f"ranks {text!r}")
    return sorted({int(token) for token in tokens})


class BriefPage(DebugHandler):
    """The last cycle's brief (see the module docstring)."""

    def __init__(self, profile_dir: str) -> None:
        self.profile_dir = profile_dir
        self._one_at_a_time = threading.Lock()

    def routes(self) -> list[Route]:
        return [Route("/torchprof_brief", self._handle)]

    def nav_links(self) -> list[NavLink]:
        return [NavLink("/torchprof_brief", "torchprof: brief")]

    def templates(self) -> dict[str, str]:
        return {"torchprof_text.html": _TEXT_TEMPLATE}

    def _handle(self, req: HTTPRequestHandler) -> bytes:
        max_tokens = req.get_query_arg("max_tokens", default=600, type=int)
        return _text_page(req, "torchprof: the last cycle's brief", self.brief(int(str(max_tokens))))

    def brief(self, max_tokens: int) -> str:
        """``torchprof brief``'s text for the profile directory, or one sentence why there is none."""
        command = Path(sys.executable).parent / "torchprof"
        if not command.is_file():
            return f"no torchprof command beside {sys.executable}: install torchprof-args in this environment"
        if not self._one_at_a_time.acquire(blocking=False):
            return "a brief is being computed for another request; ask again in a moment"
        try:
            proc = subprocess.Popen([str(command), "brief", self.profile_dir, "--max-tokens", str(max_tokens),
                                     "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True)
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, proc.pid, 19)
            try:
                out, err = proc.communicate(timeout=BRIEF_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                return (f"the brief took more than {BRIEF_TIMEOUT:g} s; run `torchprof brief "
                        f"{self.profile_dir}`")
        finally:
            self._one_at_a_time.release()
        if proc.returncode not in (0, 1):  # 1: some traces unreadable, the brief says the rest
            lines = err.strip().splitlines()
            return f"no brief yet: {lines[-1] if lines else f'torchprof brief exited {proc.returncode}'}"
        return out


class FlightRecorderPage(DebugHandler):
    """Every rank's flight recorder as one JSON document, dumped for ``torchprof hang`` (see the
    module docstring)."""

    def __init__(self, dump_dir: str | None) -> None:
        self.dump_dir = dump_dir

    def routes(self) -> list[Route]:
        return [Route("/torchprof_fr_trace", self._handle)]

    def nav_links(self) -> list[NavLink]:
        return [NavLink("/torchprof_fr_trace", "torchprof: flight recorder (hang)")]

    def _handle(self, req: HTTPRequestHandler) -> bytes:
        return self.document().encode()

    def document(self) -> str:
        """Every rank's flight recorders (or why not) at this moment, as the dump's JSON text: per
        rank its worker's address, ``recorders`` (``gloo``: the CPU backends' recorder, ``nccl``:
        NCCL's, where the build serves it) and ``errors`` (recorder -> why it is missing)."""
        ranks: dict[str, dict[str, Any]] = {}
        for recorder, handler in RECORDERS.items():
            addrs, resps = fetch_all(handler, timeout=self.fetch_timeout)
            for rank, (addr, resp) in enumerate(zip(addrs, resps, strict=True)):
                entry = ranks.setdefault(str(rank), {"address": addr.split("/handler/")[0], "recorders": {},
                                                     "errors": {}})
                if resp.status_code != 200:
                    entry["errors"][recorder] = f"HTTP {resp.status_code}: {resp.text[:300]}"
                    continue
                try:
                    entry["recorders"][recorder] = json.loads(resp.text)
                except ValueError as err:
                    entry["errors"][recorder] = f"not JSON ({err})"
        format_name, version = formats.DEBUG_SERVER_FR.name, formats.DEBUG_SERVER_FR.version
        return json.dumps({"format": format_name, "version": version, "time": time.time(),
                           "world_size": len(ranks), "ranks": ranks})

    def dump(self) -> str | None:
        if self.dump_dir is not None:
            prune_dumps(Path(self.dump_dir), KEEP_DUMPS - 1)  # this one is written next
        return self.document()

    def dump_filename(self) -> str:
        return DEBUG_SERVER_DUMPS["flight_recorder"]


def prune_dumps(directory: Path, keep: int) -> None:
    """Leave the newest ``keep`` dumps of each kind ``torchprof hang`` reads in ``directory``."""
    for name in DEBUG_SERVER_DUMPS.values():
        for old in sorted(directory.glob(f"{name}_*.txt"))[:-keep or None]:
            with contextlib.suppress(OSError):
                old.unlink()


def pages(*, control_dir: str | None, profile_dir: str, dump_dir: str | None) -> list[DebugHandler]:
    """PyTorch's default handlers, then this package's pages."""
    from torch.distributed.debug._debug_handlers import default_handlers

    return [*default_handlers(), TracePage(control_dir), BriefPage(profile_dir), FlightRecorderPage(dump_dir)]
