"""``torchprof flags``: print the flag reference (the README table is generated from it)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "flags", help="print the --torch-profile-* flag reference", description=__doc__
    )
    parser.add_argument("--markdown", action="store_true", help="print the README's markdown table")
    parser.add_argument(
        "--update-readme", metavar="README", help="rewrite the table between the README's FLAG TABLE markers"
    )
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from torchprof_args.atomic import write_text_atomically
    from torchprof_args.config import add_torch_profile_args, flag_reference_markdown
    from torchprof_args.flags.table import replace_flag_table

    if args.update_readme:
        with open(args.update_readme, encoding="utf-8") as handle:
            text = handle.read()
        write_text_atomically(args.update_readme, replace_flag_table(text, flag_reference_markdown()))
        return 0
    if args.markdown:
        print(flag_reference_markdown(), end="")
    else:
        add_torch_profile_args(argparse.ArgumentParser(prog="your_training_script.py")).print_help()
    return 0
