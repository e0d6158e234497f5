"""The flag plugin: parsing, single-flag errors, cross-flag validation, host parsers, docs."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from helpers.paths import REPO
from helpers.processes import subprocess_env

from torchprof_args import TorchProfileArgsError, add_torch_profile_args, configs_from_args, validate_args
from torchprof_args.capture.config import flag_reference_markdown
from torchprof_args.capture.flags import Flag, FlagGroup, register_group, was_given
from torchprof_args.capture.runtime import flags as runtime_flags
from torchprof_args.capture.runtime.config import profile_dir as resolve_profile_dir
from torchprof_args.capture.runtime.schedule import ProfileSchedule


def parse(*argv: str, parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    return add_torch_profile_args(parser or argparse.ArgumentParser()).parse_args(list(argv))


def test_defaults_and_seed_flag_block(tmp_path):
    args = parse(
        "--tensorboard-dir", str(tmp_path), "--torch-profile", "--torch-profile-wait", "0",
        "--torch-profile-ranks", "0", "1", "--torch-profile-warmup", "1", "--torch-profile-active", "1",
        "--torch-profile-repeat", "1", "--torch-profile-skip-first", "1", "--torch-profile-with-flops",
        "--torch-profile-profile-memory", "--torch-profile-with-stack", "--torch-profile-with-modules",
    )
    validate_args(args, world_size=2)
    assert args.torch_profile and args.torch_profile_ranks == [0, 1]
    assert (args.torch_profile_wait, args.torch_profile_warmup, args.torch_profile_active) == (0, 1, 1)
    assert args.torch_profile_with_flops and args.torch_profile_with_modules
    assert not args.torch_profile_record_shapes
    assert resolve_profile_dir(args) == str(tmp_path)  # --tensorboard-dir is the default output dir


def test_defaults_are_visible_right_after_parsing():
    args = parse()  # what a Megatron user sees when printing args: no None for schedule flags
    assert (args.torch_profile_wait, args.torch_profile_warmup, args.torch_profile_active,
            args.torch_profile_repeat, args.torch_profile_skip_first) == (0, 1, 1, 1, 1)
    assert (args.torch_profile_memory_snapshot_max_entries, args.torch_profile_memory_snapshot_stacks,
            args.torch_profile_memory_snapshot_interval) == (100_000, "python", 0)
    assert resolve_profile_dir(args) == "./prof"
    assert args.torch_profile_gzip and args.torch_profile_export == "fork"
    validate_args(args, world_size=1)
    assert vars(args) == vars(parse())  # validation changes nothing


def test_an_option_given_with_its_default_value_still_counts_as_given():
    with pytest.raises(TorchProfileArgsError, match="cannot be combined with --torch-profile-wait"):
        validate_args(parse("--torch-profile-step-start", "5", "--torch-profile-wait", "0"), world_size=1)
    with pytest.raises(TorchProfileArgsError,
                       match="--torch-profile-memory-snapshot-stacks only take effect"):
        validate_args(parse("--torch-profile-memory-snapshot-stacks", "python"), world_size=1)
    # a namespace built by hand (no record of given options): a value other than the default counts
    args = parse()
    args.torch_profile_step_start, args.torch_profile_repeat = 5, 3
    with pytest.raises(TorchProfileArgsError, match="--torch-profile-repeat"):
        validate_args(args, world_size=1)


def test_memory_categories_need_what_pytorchs_categorisation_reads():
    with pytest.raises(TorchProfileArgsError, match="--torch-profile-memory-categories every needs "
                       "--torch-profile-record-shapes, --torch-profile-with-stack"):
        validate_args(parse("--torch-profile-memory-categories", "every", "--torch-profile-profile-memory"),
                      world_size=1)
    validate_args(parse("--torch-profile-memory-categories", "off"), world_size=1)
    assert parse().torch_profile_memory_categories == "first"


def test_configs_from_args_builds_every_feature_config(tmp_path):
    args = parse("--torch-profile", "--torch-profile-dir", str(tmp_path),
                 "--torch-profile-ranks", "1", "0", "1",
                 "--torch-profile-step-start", "5", "--torch-profile-active", "2", "--no-torch-profile-gzip",
                 "--torch-profile-record-shapes", "--torch-profile-on-demand", "--torch-profile-warmup", "3",
                 "--timing-log-level", "2", "--metrics-sinks", "jsonl", "--torch-profile-nsys")
    run = configs_from_args(args, world_size=2)
    trace, export, on_demand = run.profiler.trace, run.profiler.export, run.profiler.on_demand
    assert trace.enabled and trace.ranks == (0, 1) and trace.output_dir == str(tmp_path)
    assert trace.schedule == ProfileSchedule(warmup=3, active=2, step_start=5, step_end=7)
    assert trace.profiler_options()["record_shapes"] and not trace.profiler_options()["with_stack"]
    assert export.gzip_level is None and export.mode == "fork" and export.operator_table_rows == 30
    assert on_demand.enabled and on_demand.warmup == 3 and not on_demand.gzip
    assert on_demand.control_dir == str(tmp_path / "ondemand")
    assert run.timers.log_level == 2 and run.timers.nvtx
    assert run.metrics.sinks == ("jsonl",) and run.metrics.metrics_dir == str(tmp_path)
    assert configs_from_args(args, world_size=2) == run  # idempotent, args untouched


def test_ranks_accept_all():
    assert parse("--torch-profile-ranks", "all").torch_profile_ranks == ["all"]


@pytest.mark.parametrize(
    ("argv", "flag", "words"),
    [
        (["--torch-profile-wait", "-1"], "--torch-profile-wait", "must be >= 0"),
        (["--torch-profile-active", "0"], "--torch-profile-active", "must be >= 1"),
        (["--torch-profile-warmup", "two"], "--torch-profile-warmup", "whole number"),
        (["--torch-profile-ranks", "0", "-3"], "--torch-profile-ranks", "must be >= 0 or 'all', got -3"),
        (["--torch-profile-ranks", "zero"], "--torch-profile-ranks", "'all'"),
        (["--torch-profile-flush-timeout", "0"], "--torch-profile-flush-timeout", "must be > 0"),
        (["--torch-profile-gzip-level", "11"], "--torch-profile-gzip-level", "between 1 and 9"),
        (["--torch-profile-activities", "tpu"], "--torch-profile-activities", "invalid choice"),
    ],
)
def test_single_flag_errors_fail_in_parse_args(argv, flag, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse(*argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage:")
    assert f"error: argument {flag}" in err and words in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--torch-profile-step-start", "10", "--torch-profile-step-end", "10"],
         "--torch-profile-step-end (10) must be greater than --torch-profile-step-start (10)"),
        (["--torch-profile-step-end", "10"], "--torch-profile-step-end needs --torch-profile-step-start"),
        (["--torch-profile-step-start", "5", "--torch-profile-wait", "2"],
         "cannot be combined with --torch-profile-wait"),
        (["--torch-profile-step-start", "5", "--torch-profile-step-end", "8", "--torch-profile-active", "2"],
         "--torch-profile-active cannot be combined with --torch-profile-step-end"),
        (["--torch-profile", "--torch-profile-ranks", "0", "5"],
         "--torch-profile-ranks 5 outside the world size 4"),
        (["--torch-profile", "--torch-profile-ranks", "all", "1"], "either 'all' or rank numbers"),
    ],
)
def test_cross_flag_errors_name_the_flags(argv, words):
    with pytest.raises(TorchProfileArgsError) as err:
        validate_args(parse(*argv), world_size=4)
    assert words in str(err.value)
    assert isinstance(err.value, ValueError)


TABLE, TABLE_ROWS = "--torch-profile-operator-table", "--torch-profile-operator-table-rows"


@pytest.mark.parametrize(("old", "new", "given"), [
    (["--torch-profile-summary-rows", "12"], [TABLE_ROWS, "12"], [TABLE_ROWS]),
    (["--no-torch-profile-summary"], ["--no-torch-profile-operator-table"], [TABLE]),
    (["--torch-profile-summary"], [TABLE], [TABLE]),
    (["--no-torch-profile-summary", "--torch-profile-summary-rows", "5"],
     ["--no-torch-profile-operator-table", TABLE_ROWS, "5"], [TABLE, TABLE_ROWS]),
])
def test_old_summary_flags_still_parse_as_the_operator_table_flags(tmp_path, old, new, given):
    base = ["--torch-profile", "--torch-profile-dir", str(tmp_path)]
    old_args, new_args = parse(*base, *old), parse(*base, *new)
    assert vars(old_args) == vars(new_args)  # the same values, and the same options recorded as given
    assert configs_from_args(old_args, world_size=1) == configs_from_args(new_args, world_size=1)
    flags = (runtime_flags.OPERATOR_TABLE, runtime_flags.OPERATOR_TABLE_ROWS)
    assert [flag.option for flag in flags if was_given(old_args, flag)] == given


def test_old_summary_flags_are_hidden(capsys):
    rows = configs_from_args(parse("--torch-profile-summary-rows", "7"), world_size=1).profiler.export
    assert rows.operator_table_rows == 7
    assert (configs_from_args(parse("--no-torch-profile-summary"), world_size=1)
            .profiler.export.operator_table_rows is None)
    help_text = add_torch_profile_args(argparse.ArgumentParser()).format_help()
    assert ("--torch-profile-operator-table-rows" in help_text
            and "--no-torch-profile-operator-table" in help_text)
    assert ("torch-profile-summary" not in help_text
            and "torch-profile-summary" not in flag_reference_markdown())


def test_aliases_clash_like_options_and_yield_to_the_host():
    clash = FlagGroup("test: alias clash", "",
                      (Flag("--my-flag", "x", aliases=("--torch-profile-summary",)),))
    with pytest.raises(ValueError, match="redefines --torch-profile-summary"):
        register_group(clash)
    host = argparse.ArgumentParser()
    host.add_argument("--torch-profile-summary", default="the host's")
    args = add_torch_profile_args(host).parse_args(
        ["--torch-profile-summary", "x", "--no-torch-profile-operator-table"])
    assert args.torch_profile_summary == "x" and args.torch_profile_operator_table is False


def test_unwritable_output_dir_is_reported(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(TorchProfileArgsError, match=r"--torch-profile-dir .*cannot be created"):
        validate_args(parse("--torch-profile", "--torch-profile-dir", str(blocker / "prof")), world_size=1)
    with pytest.raises(TorchProfileArgsError, match="--torch-profile-staging-dir"):
        validate_args(parse("--torch-profile", "--torch-profile-dir", str(tmp_path / "ok"),
                            "--torch-profile-staging-dir", str(blocker / "stage")), world_size=1)


def test_directory_checks_only_when_enabled(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    validate_args(parse("--torch-profile-dir", str(blocker / "prof")), world_size=1)


def megatron_like_parser() -> argparse.ArgumentParser:
    """The Megatron-LM options this plugin must not clash with (megatron/training/arguments.py)."""
    parser = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
    group = parser.add_argument_group(title="profiling")
    group.add_argument("--profile", action="store_true")
    group.add_argument("--use-pytorch-profiler", action="store_true")
    group.add_argument("--profile-ranks", nargs="+", type=int, default=[0])
    group.add_argument("--profile-step-start", type=int, default=10)
    group.add_argument("--profile-step-end", type=int, default=12)
    logging_group = parser.add_argument_group(title="logging")
    logging_group.add_argument("--tensorboard-dir", type=str, default=None)
    logging_group.add_argument("--log-interval", type=int, default=100)
    return parser


def test_megatron_extra_args_provider_reuses_host_options(tmp_path):
    parser = add_torch_profile_args(megatron_like_parser())  # what extra_args_provider does
    args = parser.parse_args([
        "--profile", "--profile-ranks", "3", "--profile-step-start", "4", "--tensorboard-dir", str(tmp_path),
        "--torch-profile", "--torch-profile-ranks", "0", "1", "--torch-profile-step-start", "7",
    ])
    assert args.profile and args.profile_ranks == [3] and args.profile_step_start == 4
    assert args.torch_profile_ranks == [0, 1] and args.torch_profile_step_start == 7
    validate_args(args, world_size=2)
    assert resolve_profile_dir(args) == str(tmp_path)
    # --tensorboard-dir is defined once, by the host; the plugin added no second definition.
    assert sum("--tensorboard-dir" in action.option_strings for action in parser._actions) == 1


def test_no_abbreviation_clash_with_allow_abbrev_false(capsys):
    parser = add_torch_profile_args(megatron_like_parser())
    with pytest.raises(SystemExit):
        parser.parse_args(["--torch-prof"])  # abbreviations are refused, not guessed
    assert "unrecognized arguments" in capsys.readouterr().err


def test_beside_deepspeed_config_arguments():
    deepspeed = pytest.importorskip("deepspeed")
    parser = add_torch_profile_args(deepspeed.add_config_arguments(argparse.ArgumentParser()))
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", "ds.json", "--torch-profile"])
    assert args.deepspeed and args.deepspeed_config == "ds.json" and args.torch_profile


def test_adding_twice_is_harmless():
    parser = add_torch_profile_args(add_torch_profile_args(argparse.ArgumentParser()))
    assert parser.parse_args(["--torch-profile"]).torch_profile


def test_docs_reference_pages_are_generated_from_the_code():
    """docs/reference/flags.md (the registry's table) and commands.md (every --help), regenerated."""
    from torchprof_args.commands.docs_reference import stale_pages
    from torchprof_args.console import build_parser

    assert not stale_pages(REPO / "docs", build_parser()), "run: torchprof flags --update-docs docs"
    page = (REPO / "docs" / "reference" / "flags.md").read_text()
    for row in flag_reference_markdown().splitlines():
        if row.startswith("| `"):
            assert row in page


def test_import_is_light():
    code = ("import sys, torchprof_args, torchprof_args.console; "
            "heavy = [m for m in sys.modules "
            "if m.split('.')[0] in ('torch', 'wandb', 'deepspeed', 'megatron', 'numpy') "
            "or m.startswith('torchprof_args.analysis')]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=subprocess_env())
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("module", ["torchprof_args.capture.flags", "torchprof_args.capture.runtime.flags",
                                    "torchprof_args.capture.runtime.config",
                                    "torchprof_args.capture.metrics.config",
                                    "torchprof_args.capture.ondemand.config", "torchprof_args.capture.config",
                                    "torchprof_args.cli"])
@pytest.mark.slow
def test_every_config_module_imports_first_without_a_circle(module):
    """Each module imported first, in a fresh interpreter: a circle would fail on a partial module."""
    code = f"import {module}, torchprof_args.capture.flags.registry as r; print(len(r.registered_groups()))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=subprocess_env())
    assert result.returncode == 0, result.stderr


def test_the_registry_knows_no_feature():
    """flags/ imports nothing of the package but itself (``flags command`` imports lazily, inside)."""
    import ast

    for path in (REPO / "torchprof_args" / "capture" / "flags").glob("*.py"):
        tree = ast.parse(path.read_text())
        top_level = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        modules = [node.module or "" for node in top_level if isinstance(node, ast.ImportFrom)]
        modules += [alias.name for node in top_level if isinstance(node, ast.Import) for alias in node.names]
        outside = [m for m in modules
                   if m.startswith("torchprof_args") and not m.startswith("torchprof_args.capture.flags")]
        assert not outside, f"{path.name} imports {outside}"


def test_console_flags_command():
    result = subprocess.run([sys.executable, "-m", "torchprof_args", "flags"], capture_output=True, text=True,
                            env=subprocess_env())
    assert result.returncode == 0
    assert "--torch-profile-step-start" in result.stdout and "torch profiler" in result.stdout


def test_validate_args_is_idempotent(tmp_path):
    args = parse("--torch-profile", "--torch-profile-dir", str(tmp_path), "--torch-profile-step-start", "5",
                 "--torch-profile-step-end", "7")
    validate_args(args, world_size=1)
    validate_args(args, world_size=1)  # e.g. the application validates, then TorchProfiler.from_args again
    assert (args.torch_profile_step_start, args.torch_profile_step_end) == (5, 7)
