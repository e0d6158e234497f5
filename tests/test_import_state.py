"""The process's state at the package's first import, and the dynolog check's fallback to it."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch.profiler
from helpers.processes import subprocess_env

from torchprof_args.capture.ondemand import dynolog
from torchprof_args.import_state import ImportState

SHOW = "import torchprof_args.import_state as s; print(s.AT_FIRST_IMPORT)"


@pytest.mark.parametrize(("before", "expected"), [
    ("", ImportState(torch_imported=False, kineto_use_daemon=None)),
    # a stand-in for torch in sys.modules (importing the real one takes seconds)
    ("import sys, types; sys.modules['torch'] = types.ModuleType('torch'); ",
     ImportState(torch_imported=True, kineto_use_daemon=None)),
    ("import os; os.environ['KINETO_USE_DAEMON'] = '1'; ",
     ImportState(torch_imported=False, kineto_use_daemon="1")),
])
def test_the_state_is_taken_at_the_first_import(before, expected):
    env = subprocess_env()
    env.pop("KINETO_USE_DAEMON", None)
    # set after the first import: the state keeps what it saw then
    late = ("; import os; os.environ['KINETO_USE_DAEMON'] = '2'; "
            "import torchprof_args.capture.ondemand.dynolog; "
            + SHOW)
    out = subprocess.run([sys.executable, "-c", before + SHOW + late], capture_output=True, text=True,
                         env=env, timeout=60, check=True).stdout.splitlines()
    assert out == [repr(expected)] * 2


@pytest.mark.parametrize(("state", "too_late"), [
    (ImportState(torch_imported=True, kineto_use_daemon=None), True),
    (ImportState(torch_imported=True, kineto_use_daemon="1"), False),
    (ImportState(torch_imported=False, kineto_use_daemon=None), False),
])
def test_dynolog_falls_back_to_the_state_when_torch_cannot_say(monkeypatch, state, too_late):
    monkeypatch.setenv("KINETO_USE_DAEMON", "1")
    monkeypatch.delattr(torch.profiler, "_optimizer_post_hook", raising=False)  # torch cannot say
    monkeypatch.setattr(dynolog, "AT_FIRST_IMPORT", state)
    assert dynolog.kineto_daemon_env_too_late() is too_late

