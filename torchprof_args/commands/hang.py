"""``torchprof hang DIR``: where each rank is and which ranks did not join which collective.

    torchprof hang prof/        # the --torch-profile-dir of a run with --torch-profile-flight-recorder
    torchprof hang prof/flight_recorder --json

Where each rank is comes first, from the ranks' stacks files (``--torch-profile-stacks``, on with
the flight recorder): ranks whose main threads stand at the same frames form one group, the odd
group first, with each rank's collective situation.  Then the flight recorder's answer (per
process group: the collective some ranks never joined, who issued it, each missing rank's last
collective in that group (and the last its recorder saw complete) and its last one anywhere,
with the Python stacks the recorder kept), then each group's last enqueued/completed collective
per rank, why each rank dumped, and PyTorch's own analyzer output
(``torch.distributed.flight_recorder``), which did the matching (:mod:`torchprof_args.analysis.tools.hang`).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from torchprof_args.commands.common import Subparsers

__all__ = ["register"]


def _document(args: argparse.Namespace) -> tuple[Any, int]:
    """``--json``'s document (plain JSON values: what is not JSON as its text) and the exit status:
    what ``torchprof mcp`` returns."""
    from torchprof_args.analysis.tools.hang import analyse_dumps

    return json.loads(json.dumps(analyse_dumps(args.directory), default=str)), 0


def _run(args: argparse.Namespace) -> int:
    from torchprof_args.analysis.render.hang import format_hang
    from torchprof_args.analysis.tools.hang import analyse_dumps

    if args.json:
        print(json.dumps(_document(args)[0]))
    else:
        print(format_hang(analyse_dumps(args.directory), not args.brief), end="")
    return 0


def register(subparsers: Subparsers) -> None:
    """Add ``torchprof hang``."""
    p = subparsers.add_parser(
        "hang",
        help="where each rank is (stacks) and which ranks did not join which collective (flight recorder)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directory", metavar="DIR", help="the run's --torch-profile-dir, or its flight_recorder/")
    p.add_argument("--json", action="store_true", help="the whole result as one JSON object")
    p.add_argument("--brief", action="store_true", help="leave out PyTorch's analyzer output")
    p.set_defaults(func=_run, document=_document)
