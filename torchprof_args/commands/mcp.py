"""``torchprof mcp --root DIR``: the toolkit as an MCP server over stdio, for agents.

    torchprof mcp --root /shared/prof                       # the runs under /shared/prof
    torchprof mcp --root /shared/prof --root ~/runs --max-result-kb 32

Tools: diagnose, critical-path (with what-if questions), summary, mem, collectives, hang, trend,
diff, report; each returns the document its command's ``--json`` prints, with its JSON schema
declared.  Resources: the runs and profiled cycles under the roots.  Read-only: every path must lie
under a root (links resolved, a folder's links checked too) and no file may exceed --max-file-mb;
nothing is written under the roots.  A document over --max-result-kb is cut (its longest lists
first) and says what was cut, where the whole document was written (--cache-dir) and the command
line that prints it.  Needs the mcp extra: pip install 'torchprof-args[mcp]'.  docs/guides/mcp.md
shows an agent's configuration.
"""

from __future__ import annotations

import argparse
import os

from torchprof_args.capture.flags.types import positive_int
from torchprof_args.commands.common import Subparsers
from torchprof_args.errors import CommandError

__all__ = ["register"]

#: The largest file a tool reads, in MiB (a trace of a large job is a few hundred MB gzipped).
DEFAULT_MAX_FILE_MB = 2048
#: The largest document returned whole, in KiB of JSON (about 12k tokens).
DEFAULT_MAX_RESULT_KB = 48


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torchprof-mcp")


def _run(args: argparse.Namespace) -> int:
    from torchprof_args.mcp_server.roots import Roots
    from torchprof_args.private_dir import ensure_private_dir

    roots = Roots.of(args.root, args.max_file_mb * 2**20)
    cache = os.path.realpath(os.path.expanduser(args.cache_dir or _default_cache_dir()))
    if roots.holds(cache):
        raise CommandError(f"--cache-dir {cache} lies under a root; the server writes nothing under its "
                           "roots, give a folder outside them")
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise CommandError("the MCP server needs the mcp package: "
                           "pip install 'torchprof-args[mcp]'") from None
    from torchprof_args.mcp_server.server import Options, serve

    ensure_private_dir(cache, "--cache-dir", CommandError)
    return serve(args.command_line, Options(roots, args.max_result_kb * 1024, cache))


def register(subparsers: Subparsers) -> None:
    """Add ``torchprof mcp``."""
    p = subparsers.add_parser(
        "mcp", help="an MCP server over stdio for agents: the commands as tools, the runs as resources",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", action="append", required=True, metavar="DIR",
                   help="a folder the tools may read (repeatable); relative paths are taken from the first")
    p.add_argument("--max-file-mb", type=positive_int, default=DEFAULT_MAX_FILE_MB, metavar="MB",
                   help=f"refuse a path holding a file larger than this (default {DEFAULT_MAX_FILE_MB})")
    p.add_argument("--max-result-kb", type=positive_int, default=DEFAULT_MAX_RESULT_KB, metavar="KB",
                   help="cut a larger document, pointing at the whole one "
                        f"(default {DEFAULT_MAX_RESULT_KB})")
    p.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="a private folder outside the roots for cut documents and reports "
                        "(default $XDG_CACHE_HOME/torchprof-mcp, else ~/.cache/torchprof-mcp)")
    p.set_defaults(func=_run)
