"""``torchprof flags``: print the flag reference (the docs' reference pages are generated from it)."""

from __future__ import annotations

import argparse

from torchprof_args.commands.common import Subparsers


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "flags", help="print the --torch-profile-* flag reference", description=__doc__
    )
    parser.add_argument("--markdown", action="store_true", help="print the flag table as markdown")
    parser.add_argument(
        "--update-docs",
        metavar="DOCS_DIR",
        help="rewrite the generated reference pages under DOCS_DIR: reference/flags.md, "
        "reference/commands.md",
    )
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from torchprof_args.capture.config import add_torch_profile_args, flag_reference_markdown

    if args.update_docs:
        from torchprof_args.commands.docs_reference import write_pages

        for path in write_pages(args.update_docs, args.command_line):
            print(f"wrote {path}")
        return 0
    if args.markdown:
        print(flag_reference_markdown(), end="")
    else:
        add_torch_profile_args(argparse.ArgumentParser(prog="your_training_script.py")).print_help()
    return 0
