"""On-demand tracing's config and the flags that fill it (import-light: no torch)."""

from __future__ import annotations

import argparse
import dataclasses
import os

from torchprof_args.capture.flags import (
    Flag,
    FlagGroup,
    config_field,
    config_values,
    flag_value,
    register_group,
)
from torchprof_args.capture.flags.types import positive_float, positive_int
from torchprof_args.errors import TorchProfileArgsError
from torchprof_args.naming import DEFAULT_PROFILE_DIR

__all__ = ["CONTROL_SUBDIR", "OnDemandConfig", "default_control_dir"]

#: The control directory's name inside the profile directory, unless a flag says otherwise.
CONTROL_SUBDIR = "ondemand"

ON_DEMAND = Flag("--torch-profile-on-demand",
                 "Accept trace requests from `torchprof trigger --job-dir DIR` (or `--pid PID` on the node) "
                 "while the job runs. Works with or without --torch-profile.",
                 default=False, action="store_true")
CONTROL_DIR = Flag("--torch-profile-on-demand-dir",
                   "Control directory for requests and answers: private to your user, on a filesystem that "
                   "rank 0 and the trigger both reach.", metavar="DIR",
                   default_doc="`<profile dir>/ondemand`")
CHECK_SECONDS = Flag("--torch-profile-on-demand-check-seconds",
                     "Check for requests about every S seconds of training (rank 0 turns this into "
                     "iterations from the measured step time; one small asynchronous broadcast per check).",
                     default=10.0, type=positive_float, metavar="S")
INTERVAL = Flag("--torch-profile-on-demand-interval",
                "Fewest iterations between two request checks (also the spacing of the first checks).",
                default=10, type=positive_int, metavar="N")
MAX_ITERATIONS = Flag("--torch-profile-on-demand-max-iterations",
                      "Most iterations one request may trace (larger requests are rejected).", default=20,
                      type=positive_int, metavar="N")

ON_DEMAND_FLAGS = register_group(FlagGroup(
    title="torch profiler: on-demand",
    description="Trace chosen ranks for a few iterations while the job runs, when `torchprof trigger` "
                "asks; no relaunch, no daemon (torchprof-args).",
    flags=(ON_DEMAND, CONTROL_DIR, CHECK_SECONDS, INTERVAL, MAX_ITERATIONS),
    order=50,
))


def default_control_dir(profile_dir: str) -> str:
    """Where the control directory goes unless ``--torch-profile-on-demand-dir`` says otherwise."""
    return os.path.join(profile_dir, CONTROL_SUBDIR)


@dataclasses.dataclass(frozen=True)
class OnDemandConfig:
    """Where requests arrive, how often ranks look, and what a request may ask for.

    ``warmup`` and ``gzip`` come from the trace flags: an on-demand window warms up and
    publishes like a scheduled one.
    """

    enabled: bool = config_field(ON_DEMAND)
    control_dir: str = default_control_dir(DEFAULT_PROFILE_DIR)
    trace_dir: str = DEFAULT_PROFILE_DIR
    check_seconds: float = config_field(CHECK_SECONDS)
    interval: int = config_field(INTERVAL)
    max_iterations: int = config_field(MAX_ITERATIONS)
    #: The trace flags' (``--torch-profile-warmup``, ``--torch-profile-gzip``), which this layer,
    #: below ``runtime/``, cannot import: tests/test_flag_defaults.py keeps them equal.
    warmup: int = 1
    gzip: bool = True

    @classmethod
    def from_namespace(
        cls, args: argparse.Namespace, *, profile_dir: str, warmup: int, gzip: bool
    ) -> OnDemandConfig:
        values = config_values(cls, args)
        control_dir = flag_value(args, CONTROL_DIR)
        if control_dir and not values["enabled"]:
            raise TorchProfileArgsError("--torch-profile-on-demand-dir needs --torch-profile-on-demand.")
        return cls(**values, control_dir=control_dir or default_control_dir(profile_dir),
                   trace_dir=profile_dir, warmup=warmup, gzip=gzip)
