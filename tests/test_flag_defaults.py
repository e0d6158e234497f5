"""One declaration per option: a flag's default is written once, in its ``Flag``, and the configs that
mirror the flags take theirs from it; a flag's ``type`` checks a value a host already typed as it
checks the command line's text."""

from __future__ import annotations

import argparse
import ast
import inspect

import pytest

from torchprof_args.capture.config import configs_from_args
from torchprof_args.capture.flags.types import non_negative_int, positive_float, rank_token
from torchprof_args.capture.metrics import config as metrics_config
from torchprof_args.capture.metrics.config import MetricsConfig, TimersConfig, straggler_threshold
from torchprof_args.capture.ondemand import config as ondemand_config
from torchprof_args.capture.runtime import config as runtime_config
from torchprof_args.capture.runtime import schedule
from torchprof_args.capture.runtime.config import ProfilerConfig

#: The modules whose dataclasses mirror flags.
CONFIG_MODULES = (runtime_config, schedule, metrics_config, ondemand_config)
#: The fields with a literal default of their own, and why none restates a flag's default.
OWN_LITERALS = {
    ("TraceConfig", "modules_via_stack"): "derived: --torch-profile-with-modules on a torch >= 2.14",
    ("FlightRecorderConfig", "entries"): "0: --torch-profile-flight-recorder unset (None)",
    ("OnDemandConfig", "warmup"): "the trace flag's: ondemand/ sits below runtime/ (equal: next test)",
    ("OnDemandConfig", "gzip"): "the trace flag's: ondemand/ sits below runtime/ (equal: next test)",
    ("TimersConfig", "nvtx"): "derived: --torch-profile-nsys",
    ("MetricsConfig", "gpu_hardware"): "derived: --metrics-gpu-hardware auto or off",
}


def _literals(node: ast.expr) -> list[object]:
    """The numbers, booleans and words written in a default (not None, a path's "/", nor a keyword
    argument such as ``field(compare=False)``)."""
    keywords = {id(kw.value) for call in ast.walk(node) if isinstance(call, ast.Call) for kw in call.keywords}
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and id(n) not in keywords
            and n.value is not None and n.value != "/"]


def test_no_config_field_restates_a_flags_default() -> None:
    literal = {}
    for module in CONFIG_MODULES:
        for cls in ast.parse(inspect.getsource(module)).body:
            if not isinstance(cls, ast.ClassDef):
                continue
            for field in cls.body:
                if isinstance(field, ast.AnnAssign) and field.value is not None and _literals(field.value):
                    literal[cls.name, ast.unparse(field.target)] = ast.unparse(field.value)
    assert literal.keys() == OWN_LITERALS.keys(), "take the default from the flag: flags.X.default"


def test_the_configs_defaults_are_the_flags_defaults() -> None:
    run = configs_from_args(argparse.Namespace(), world_size=1)  # every flag at its declared default
    assert run.profiler == ProfilerConfig()
    assert run.timers == TimersConfig()
    assert run.metrics == MetricsConfig()


def test_a_flags_type_checks_a_typed_value_as_it_checks_text() -> None:
    assert positive_float(2) == 2.0 and isinstance(positive_float(2), float)
    assert non_negative_int(3) == non_negative_int("3") == 3
    assert rank_token(5) == 5 and rank_token("ALL") == "all"
    assert straggler_threshold(0) == 0.0
    for kind, value, message in [(non_negative_int, -2, "must be >= 0, got -2"),
                                 (non_negative_int, "-2", "must be >= 0, got -2"),
                                 (non_negative_int, 2.0, "expected a whole number >= 0, got 2.0"),
                                 (non_negative_int, True, "expected a whole number >= 0, got True"),
                                 (positive_float, "x", "expected a number > 0, got 'x'"),
                                 (rank_token, -1, "must be >= 0 or 'all', got -1"),
                                 (straggler_threshold, 0.5, "must be above 1")]:
        with pytest.raises(argparse.ArgumentTypeError, match=message.replace("(", r"\(")):
            kind(value)
