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
    from torchprof_args.flags import add_torch_profile_args, flag_table_markdown

    if args.update_readme:
        with open(args.update_readme, encoding="utf-8") as handle:
            text = handle.read()
        with open(args.update_readme, "w", encoding="utf-8") as handle:
            handle.write(replace_flag_table(text, flag_table_markdown()))
        return 0
    if args.markdown:
        print(flag_table_markdown(), end="")
    else:
        add_torch_profile_args(argparse.ArgumentParser(prog="your_training_script.py")).print_help()
    return 0


BEGIN_MARKER = "<!-- BEGIN FLAG TABLE -->"
END_MARKER = "<!-- END FLAG TABLE -->"


def replace_flag_table(readme: str, table: str) -> str:
    """``readme`` with the text between the FLAG TABLE markers replaced by ``table``."""
    head, rest = readme.split(BEGIN_MARKER, 1)
    _, tail = rest.split(END_MARKER, 1)
    return f"{head}{BEGIN_MARKER}\n{table}{END_MARKER}{tail}"
