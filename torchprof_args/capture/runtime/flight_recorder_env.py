"""PyTorch's flight recorder, turned on at parse time: the environment it reads when the first process
group is created.

``--torch-profile-flight-recorder N``'s argparse action (``runtime/flags.py``) calls
:func:`configure_environment` while the flags are parsed, before ``init_process_group``: the ring
buffer's size and where PyTorch's own NCCL-timeout dumps go.  Apart from
:mod:`.flight_recorder` (the recorder at run time, which reads the typed config) so that the flags
import only this.  Import-light: no torch.
"""

from __future__ import annotations

import os

from torchprof_args import _dist
from torchprof_args.naming import FLIGHT_RECORDER_PREFIXES, FLIGHT_RECORDER_SUBDIR

__all__ = [
    "BUFFER_VARS", "DUMP_FILE_VARS", "DUMP_ON_TIMEOUT_VAR", "STATE", "configure_environment",
    "flight_recorder_dir", "launcher_set_buffer", "point_dumps_at",
]

#: PyTorch's variables: current names, then the NCCL-era ones (still read, with a deprecation
#: warning, by recent versions; the only ones older versions read).
BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DUMP_FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
DUMP_ON_TIMEOUT_VAR = "TORCH_NCCL_DUMP_ON_TIMEOUT"

#: Set by :func:`configure_environment`: whether a process group already existed then.
STATE: dict[str, bool] = {"configured": False, "pg_existed": False}


def flight_recorder_dir(profile_dir: str) -> str:
    """``<profile dir>/flight_recorder``, absolute."""
    return os.path.join(os.path.abspath(profile_dir), FLIGHT_RECORDER_SUBDIR)


def configure_environment(entries: int, profile_dir: str) -> None:
    """Turn PyTorch's flight recorder on for this process (``entries`` per process group) and
    point its NCCL-timeout dumps at ``<profile_dir>/flight_recorder/``.  Must run before the
    first process group is created; whether one existed is remembered in :data:`STATE` (the
    recorder warns then: :meth:`.flight_recorder.FlightRecorder.from_config`)."""
    STATE["inherited_buffer"] = any(os.environ.get(name, "0") not in ("", "0") for name in BUFFER_VARS)
    for name in _names(BUFFER_VARS):
        os.environ[name] = str(entries)
    os.environ.setdefault(DUMP_ON_TIMEOUT_VAR, "1")
    point_dumps_at(profile_dir)
    STATE.update(configured=True, pg_existed=_dist.dist_if_initialized() is not None)


def launcher_set_buffer() -> bool:
    """Whether the buffer size came from the environment the process started with."""
    return bool(STATE.get("inherited_buffer"))


def point_dumps_at(profile_dir: str) -> None:
    """PyTorch's dump file prefix -> ``<profile_dir>/flight_recorder/nccl_trace_rank_`` (read when it
    dumps)."""
    prefix = os.path.join(flight_recorder_dir(profile_dir), FLIGHT_RECORDER_PREFIXES["nccl"])
    for name in _names(DUMP_FILE_VARS):
        os.environ[name] = prefix


def _names(variables: tuple[str, str]) -> tuple[str, ...]:
    """The current name, plus the NCCL-era one for PyTorch before 2.9 (read without importing torch)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(part) for part in version("torch").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return variables
    return variables if (major, minor) < (2, 9) else variables[:1]
