"""Hugging Face Trainer and TRL, with the real libraries: ``TorchProfileArguments`` parsed by the real
``HfArgumentParser`` (both spellings, one-line errors naming the flag), then real 2-rank gloo runs of
the docs' examples (a tiny GPT-2 from a config, gradient accumulation 2, a resume, wandb offline,
``torchprof diagnose``; TRL's SFTTrainer), and a slow trace flush on rank 0 under the Trainer."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.examples import run_doc_example
from helpers.paths import JOBS
from helpers.processes import run_torchrun
from helpers.trace_events import count_per_step, load_trace, profiler_steps

pytest.importorskip("transformers", reason="transformers (the huggingface extra) is not installed")

from transformers import HfArgumentParser  # noqa: E402

from torchprof_args import TorchProfileArgsError  # noqa: E402
from torchprof_args.capture.frameworks.flag_fields import host_flags  # noqa: E402
from torchprof_args.capture.frameworks.huggingface_args import TorchProfileArguments  # noqa: E402
from torchprof_args.capture.runtime import flags as runtime_flags  # noqa: E402
from torchprof_args.naming import STACKS_CONTROL_SUBDIR  # noqa: E402


def test_the_fields_are_the_registry_flags_the_trainer_does_not_own():
    names = [field.name for field in dataclasses.fields(TorchProfileArguments)]
    assert names == [flag.dest for flag in host_flags()]
    assert {"torch_profile", "torch_profile_step_start", "metrics_peak_tflops", "straggler_threshold",
            "torch_profile_flight_recorder", "torch_profile_on_demand"} <= set(names)
    # the Trainer's --logging_steps / --report_to own these
    owned = {"log_interval", "wandb_project", "metrics_sinks", "metrics_dir", "tensorboard_dir"}
    assert not owned & set(names)


def test_both_spellings_parse_to_the_same_configs(tmp_path):
    parser = HfArgumentParser(TorchProfileArguments)
    common = ["--torch-profile-dir", str(tmp_path / "prof")]
    (dashes,) = parser.parse_args_into_dataclasses(
        ["--torch-profile", "--torch-profile-step-start", "4", "--torch-profile-ranks", "0", "1",
         "--no-torch-profile-gzip", *common])
    (underscores,) = parser.parse_args_into_dataclasses(
        ["--torch_profile", "--torch_profile_step_start", "4", "--torch_profile_ranks", "0", "1",
         "--no_torch_profile_gzip", *common])
    assert dashes == underscores
    run = dashes.run_config(world_size=2)
    assert run.profiler.enabled and run.profiler.trace.ranks == (0, 1)
    assert run.profiler.trace.schedule.step_start == 4 and run.profiler.export.gzip_level is None


@pytest.mark.parametrize(("argv", "message"), [
    (["--torch-profile-step-start", "5", "--torch-profile-step-end", "3"],
     "--torch-profile-step-end (3) must be greater than --torch-profile-step-start (5)."),
    (["--torch_profile_step_start", "4", "--torch_profile_skip_first", "3"],
     "--torch-profile-step-start/-end cannot be combined with --torch-profile-skip-first"),
    (["--torch-profile-ranks", "0", "all"], "--torch-profile-ranks: give either 'all' or rank numbers"),
    (["--torch-profile-wait", "-1"], "--torch-profile-wait: must be >= 0, got -1"),
    (["--torch-profile-exit-timeout", "60", "--torch-profile-flush-timeout", "30"],
     "--torch-profile-exit-timeout (60 s) must be shorter than --torch-profile-flush-timeout (30 s)"),
])
def test_bad_values_end_the_parse_with_one_line_naming_the_flag(argv, message, capsys, tmp_path):
    parser = HfArgumentParser(TorchProfileArguments, prog="train.py")
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args_into_dataclasses([*argv, "--torch-profile-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train.py: error: ") and message in err, err


def test_a_wrong_kind_of_value_is_argparse_s_own_error(capsys):
    with pytest.raises(SystemExit):
        HfArgumentParser(TorchProfileArguments).parse_args_into_dataclasses(["--torch-profile-export", "x"])
    err = capsys.readouterr().err
    assert "argument --torch_profile_export/--torch-profile-export: invalid choice: 'x'" in err


def test_built_in_python_it_raises_the_package_error(tmp_path):
    with pytest.raises(TorchProfileArgsError, match="--torch-profile-active cannot be combined"):
        TorchProfileArguments(torch_profile_step_start=2, torch_profile_step_end=4, torch_profile_active=3,
                              torch_profile_dir=str(tmp_path))


def test_a_new_registry_flag_becomes_a_field():
    """Generated, not copied: the fields follow the declarations (here: one the runtime registers)."""
    fields = {field.name: field for field in dataclasses.fields(TorchProfileArguments)}
    flag = runtime_flags.GZIP_LEVEL
    assert fields[flag.dest].default == flag.default and flag.help in fields[flag.dest].metadata["help"]


# -- real runs ---------------------------------------------------------------------------------


def _wandb_history(root: Path, expect: int) -> list[dict]:
    """The offline run's history rows, once ``expect`` of them are there: wandb's service process
    may still be writing the run file when the training processes have exited (seen under load)."""
    (run_file,) = sorted(root.glob("wandb/offline-run-*/run-*.wandb"))
    deadline = time.monotonic() + 60
    while True:
        proc = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_file)],
                              capture_output=True, text=True, timeout=120, check=True, cwd=root)
        records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
        rows = [r["history"]["item"] for r in records if r.get("type") == "history"]
        if len(rows) >= expect or time.monotonic() > deadline:
            return rows
        time.sleep(1)


@pytest.mark.slow
def test_readme_example_trainer_steps_figures_wandb_resume_and_diagnose(tmp_path, offline_wandb):
    proc = run_doc_example("huggingface", tmp_path)  # wandb offline, its files in tmp_path
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    traces = sorted((tmp_path / "prof").glob("iter*/*.pt.trace.json.gz"))
    assert [f"{p.parent.name}/{p.name[:9]}" for p in traces] == [
        "iter000003-000004/rank00000", "iter000003-000004/rank00001", "iter000008-000008/rank00000"]
    for trace in traces:
        expected = [8] if "000008" in trace.parent.name else [3, 4]
        assert profiler_steps(trace) == expected  # optimizer steps, not micro-steps
        data = load_trace(trace)
        per_step = count_per_step(data["traceEvents"], lambda name: name == "aten::embedding")
        assert per_step == {step: 4 for step in expected}  # 2 micro-batches x (token + position)
        meta = data["torchprof_args"]
        assert meta["parallel"] == {"dp": int(trace.name[4:9])}
        assert meta["trainer"]["strategy"] == "DDP" and meta["trainer"]["gradient_accumulation_steps"] == 2
        assert meta["trainer"]["distributed_type"] == "MULTI_CPU" and meta["trainer"]["world_size"] == 2
    # the figures in trainer.state.log_history: the resumed run's (step 8) after the checkpoint's (2-6)
    history = json.loads((tmp_path / "history.json").read_text())
    logged = [entry for entry in history if "loss" in entry]
    assert [entry["step"] for entry in logged] == [2, 4, 6, 8]
    for entry in logged:
        for key in ("iteration-time", "throughput", "mfu", "timers/forward-backward-time",
                    "timers/optimizer-time", "timers/torch-profile-flush-time", "profiler/flush_seconds",
                    "profiler/fence_waits"):
            assert key in entry, (entry["step"], key)
        assert entry["mfu"] == pytest.approx(100 * entry["throughput"] / 1.0)
    # the first run's figures reached wandb (offline), with the Trainer's own
    rows = [row for row in _wandb_history(tmp_path, expect=3) if "train/loss" in row]
    assert [row["train/global_step"] for row in rows] == [2, 4, 6]
    for row in rows:
        assert row["train/throughput"] > 0 and row["train/mfu"] > 0 and row["train/iteration-time"] > 0
        assert row["train/timers/forward-backward-time"] > 0
    assert rows[1]["train/profiler/fence_waits"] == 1  # the flush at step 4
    assert "torchprof diagnose: 2 ranks" in proc.stdout and "iterations 3-4" in proc.stdout
    assert "done at global step 9" in proc.stdout


@pytest.mark.slow
def test_trl_sft_trainer_takes_the_same_callback(tmp_path):
    proc = run_doc_example("huggingface-trl", tmp_path, WANDB_MODE="disabled")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    traces = sorted((tmp_path / "prof-sft").glob("iter000002-000002/*.pt.trace.json.gz"))
    assert [p.name[:9] for p in traces] == ["rank00000", "rank00001"]
    assert all(profiler_steps(trace) == [2] for trace in traces)
    assert "done at global step 4" in proc.stdout and "MFU n/a" in proc.stdout


@pytest.mark.slow
def test_slow_flush_on_one_rank_the_other_waits_at_the_fence_and_both_finish(tmp_path):
    """Rank 0's flush takes 6 s on the training thread (inline export delayed), the Trainer's
    collective timeout is 3 s: rank 1 spends the 6 s at the fence (its own flush step lasts that
    long: profiler/flush_seconds-min), not in DDP's next all-reduce, and both ranks finish."""
    proc = run_torchrun(
        JOBS / "hf_fault_job.py", "--output_dir", "out", "--use_cpu", "--disable_tqdm", "true",
        "--max_steps", "6", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
        "--logging_steps", "2", "--save_strategy", "no", "--report_to", "none", "--ddp_timeout", "3",
        "--result_file", "history.json", "--torch-profile", "--torch-profile-step-start", "3",
        "--torch-profile-step-end", "5", "--torch-profile-export", "inline", "--torch-profile-dir", "prof",
        cwd=tmp_path, HF_EXPORT_DELAY="6", WANDB_MODE="disabled")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "done at global step 6" in proc.stdout
    (trace,) = sorted((tmp_path / "prof").glob("iter000003-000004/rank00000_*.pt.trace.json.gz"))
    assert profiler_steps(trace) == [3, 4]
    logged = {entry["step"]: entry for entry in json.loads((tmp_path / "history.json").read_text())
              if "loss" in entry}
    assert logged[4]["profiler/flush_seconds-min"] >= 5.5  # rank 1, which traces nothing, at the fence
    assert logged[4]["profiler/fence_waits-min"] == 1
    assert "Timed out" not in proc.stderr and "timed out" not in proc.stderr.lower()


@pytest.mark.slow
def test_an_exception_leaving_train_stops_the_profiler_and_cleans_staging(tmp_path):
    """Every rank raises after step 3, inside the window 3-4: the Trainer calls no on_train_end; the
    profiler stops at interpreter exit, without the fence: no trace of the half window, nothing
    half-written in the output, nothing left in the staging directory, the job's own error shown."""
    stage = tmp_path / "stage"
    stage.mkdir()
    proc = run_torchrun(
        JOBS / "hf_fault_job.py", "--output_dir", "out", "--use_cpu", "--disable_tqdm", "true",
        "--max_steps", "6", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
        "--logging_steps", "2", "--save_strategy", "no", "--report_to", "none", "--torch-profile",
        "--torch-profile-ranks", "all", "--torch-profile-step-start", "3", "--torch-profile-step-end", "5",
        "--torch-profile-dir", "prof", "--torch-profile-staging-dir", str(stage),
        cwd=tmp_path, HF_RAISE_AT_STEP="3", WANDB_MODE="disabled")
    assert proc.returncode != 0
    failures = proc.stderr.count("RuntimeError: injected failure after optimizer step 3")
    assert failures >= 2, proc.stderr[-4000:]
    prof = tmp_path / "prof"
    # nothing but the stacks server's control directory (its job.json says the job stopped: state)
    assert not (prof.exists() and [p for p in prof.rglob("*") if p.is_file()
                                   and p.relative_to(prof).parts[0] != STACKS_CONTROL_SUBDIR])
    assert not [p for p in stage.rglob("*") if p.is_file()], sorted(stage.rglob("*"))


@pytest.mark.slow
def test_the_callback_goes_ahead_of_the_reporting_callbacks(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from transformers.integrations import TensorBoardCallback

    from torchprof_args.huggingface import TorchProfileCallback

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=8, n_embd=16, n_layer=1, n_head=2))
    callback = TorchProfileCallback(TorchProfileArguments(torch_profile_dir=str(tmp_path / "prof")))
    args = TrainingArguments(output_dir=str(tmp_path), report_to=["tensorboard"], use_cpu=True)
    trainer = Trainer(model=model, args=args, train_dataset=[], callbacks=[callback])
    names = [type(cb).__name__ for cb in trainer.callback_handler.callbacks]
    assert names.index("TorchProfileCallback") < names.index(TensorBoardCallback.__name__), names
    assert names[0] == "DefaultFlowCallback" and callback._ordered
    # added after the Trainer was built: ordered when training begins
    late = TorchProfileCallback(TorchProfileArguments(torch_profile_dir=str(tmp_path / "prof")))
    trainer.pop_callback(callback)
    trainer.add_callback(late)
    names = [type(cb).__name__ for cb in trainer.callback_handler.callbacks]
    assert names.index("TorchProfileCallback") > names.index(TensorBoardCallback.__name__), names
    trainer.callback_handler.on_train_begin(args, trainer.state, trainer.control)
    names = [type(cb).__name__ for cb in trainer.callback_handler.callbacks]
    assert names[1] == "TorchProfileCallback" and late._ordered, names
    trainer.callback_handler.on_train_end(args, trainer.state, trainer.control)
