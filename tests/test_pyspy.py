"""``torchprof pyspy``: the real py-spy on a small torch training script, then report + speedscope."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.paths import REPO

from torchprof_args import console
from torchprof_args.analysis.pyspy.parse import (
    NATIVE,
    PROCESS,
    PYTHON,
    THREAD,
    UNKNOWN,
    parse_frame,
    parse_raw_text,
    read_profiles,
    shorten_path,
)
from torchprof_args.analysis.pyspy.record import find_py_spy, output_name
from torchprof_args.analysis.pyspy.report import in_library, report_rows
from torchprof_args.analysis.pyspy.speedscope import SCHEMA, speedscope_document

TRAIN_SCRIPT = textwrap.dedent(
    """
    import time

    loaded = time.time()
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


    def train_step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss


    start = time.time()
    # Train at least as long as the start-up took (slow on a loaded machine), so the training
    # step holds a fair share of the samples whatever the load.
    while time.time() - start < max(2.5, start - loaded):
        train_step(torch.randn(64, 256), torch.randn(64, 1))
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    for name in ("SLURM_NODEID", "SLURM_PROCID", "NODE_RANK", "GROUP_RANK"):
        env.pop(name, None)
    return env


def _torchprof(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    return subprocess.run(
        [sys.executable, "-m", "torchprof_args", *args],
        env=env or _env(), cwd=cwd, capture_output=True, text=True, timeout=300,
    )


needs_py_spy = pytest.mark.skipif(find_py_spy() is None,
                                  reason="py-spy is not installed (pip install py-spy)")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """One real ``torchprof pyspy record`` run of the training script."""
    if find_py_spy() is None:
        pytest.skip("py-spy is not installed (pip install py-spy)")
    work = tmp_path_factory.mktemp("pyspy")
    script = work / "tiny_train.py"
    script.write_text(TRAIN_SCRIPT)
    out_dir = work / "out"  # does not exist yet: record must create it
    result = _torchprof("pyspy", "record", "-o", str(out_dir), "--rate", "200", "--",
                        sys.executable, str(script), cwd=work)
    assert result.returncode == 0, result.stderr
    files = sorted(out_dir.iterdir())
    assert len(files) == 1, files  # no .partial / .status left behind
    assert "wrote" in result.stderr
    return files[0]


@pytest.mark.slow
@needs_py_spy
def test_record_names_file_per_host_and_run(recorded: Path) -> None:
    import socket

    host = socket.gethostname().split(".")[0]
    assert re.fullmatch(rf"pyspy_{re.escape(host)}_\d{{8}}-\d{{6}}_\d+\.txt", recorded.name)
    text = recorded.read_text()
    assert "train_step (" in text and "tiny_train.py" in text
    # full file names, so the report can tell site-packages from the user's code
    assert "site-packages/torch/" in text


def test_output_name_includes_slurm_node_and_task() -> None:
    import datetime

    now = datetime.datetime(2025, 1, 2, 3, 4, 5)
    name = output_name(now=now, pid=42, env={"SLURM_NODEID": "3", "SLURM_PROCID": "17"},
                       host="gpu-a1.cluster")
    assert name == "pyspy_gpu-a1_node3_task17_20250102-030405_42.txt"
    assert output_name(now=now, pid=7, env={"NODE_RANK": "1"}, host="h") == (
        "pyspy_h_node1_20250102-030405_7.txt")
    assert output_name(now=now, pid=7, env={}, host="h") == "pyspy_h_20250102-030405_7.txt"


@pytest.mark.slow
@needs_py_spy
def test_record_exits_with_the_commands_exit_code(tmp_path: Path) -> None:
    code = "import sys, time\nt = time.time()\nwhile time.time() - t < 0.3: pass\nsys.exit(3)"
    result = _torchprof("pyspy", "record", "-o", str(tmp_path), "--", sys.executable, "-c", code)
    assert result.returncode == 3, result.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.slow
@needs_py_spy
def test_record_reports_a_missing_program(tmp_path: Path) -> None:
    result = _torchprof("pyspy", "record", "-o", str(tmp_path), "--", "/nonexistent/program")
    assert result.returncode == 127
    assert "cannot start '/nonexistent/program'" in result.stderr


def test_record_needs_a_command(capsys) -> None:
    assert console.main(["pyspy", "record", "-o", "unused"]) == 2
    assert "after `--`" in capsys.readouterr().err


def test_record_without_py_spy_says_how_to_install(monkeypatch, capsys) -> None:
    monkeypatch.setattr("torchprof_args.analysis.pyspy.record.find_py_spy", lambda: None)
    assert console.main(["pyspy", "record", "--", "python", "x.py"]) == 127
    err = capsys.readouterr().err
    assert "py-spy is not installed" in err and "torchprof-args[pyspy]" in err


@pytest.mark.slow
@needs_py_spy
def test_report_attributes_torch_time_to_the_training_step(recorded: Path, capsys) -> None:
    assert console.main(["pyspy", "report", str(recorded), "--aggregate-leaf-paths", "--top", "0",
                         "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = data["rows"]
    total = data["total_samples"]
    assert total > 50
    assert sum(r["samples"] for r in rows) == total
    assert data["unparsed_frames"] == 0 and data["malformed_records"] == 0
    # Rows are unique once aggregated.
    keys = [(r["name"], r["path"], r["line"], r["library_function_name"], r["library_function_path"],
             r["library_function_line"]) for r in rows]
    assert len(keys) == len(set(keys))
    # Time spent inside torch is attributed to train_step in the user's script.
    in_step = [r for r in rows if r["library_function_name"] == "train_step"]
    assert sum(r["samples"] for r in in_step) > 0.1 * total
    assert all(r["library_function_path"].endswith("tiny_train.py") for r in in_step)
    assert any(r["path"].startswith("site-packages/torch/") for r in in_step)
    assert abs(sum(r["proportion"] for r in rows) - 1.0) < 1e-9


@pytest.mark.slow
@needs_py_spy
def test_report_table_and_library_name(recorded: Path, capsys) -> None:
    assert console.main(["pyspy", "report", str(recorded), "--library-name", "torch.nn", "--top", "5"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    for column in ("name", "path", "line", "library_function_name", "library_function_path",
                   "library_function_line", "proportion (n)"):
        assert column in header
    body = out.splitlines()[2:7]
    assert len(body) == 5
    assert all(re.search(r"\d+\.\d\d% \(\d+\)$", line) for line in body)
    assert any("site-packages/torch/nn/" in line for line in body)


@pytest.mark.slow
@needs_py_spy
def test_aggregation_merges_rows_without_losing_samples(recorded: Path) -> None:
    profile = read_profiles([str(recorded)])
    plain = report_rows(profile, top=None)
    merged = report_rows(profile, aggregate_leaf_paths=True, top=None)
    assert len(merged) < len(plain)
    assert sum(r.samples for r in plain) == sum(r.samples for r in merged) == profile.total_samples


@pytest.mark.slow
@needs_py_spy
def test_speedscope_file_of_a_real_recording(recorded: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "flame.speedscope.json"
    assert console.main(["pyspy", "speedscope", str(recorded), str(recorded), "-o", str(out),
                         "--title", "tiny"]) == 0
    assert "open it at https://www.speedscope.app" in capsys.readouterr().err
    document = json.loads(out.read_text())
    assert document["$schema"] == SCHEMA and document["name"] == "tiny"
    frames = document["shared"]["frames"]
    (profile,) = document["profiles"]
    assert profile["type"] == "sampled" and profile["name"] == "tiny"
    assert len(profile["samples"]) == len(profile["weights"])
    assert all(0 <= i < len(frames) for sample in profile["samples"] for i in sample)
    total = read_profiles([str(recorded)]).total_samples
    assert profile["endValue"] == sum(profile["weights"]) == 2 * total  # the file given twice: merged
    step = [f for f in frames if f["name"].startswith("train_step (")]
    assert step and all(f["file"].endswith("tiny_train.py") and f["line"] > 0 for f in step)
    assert not any("launcher.py" in f["name"] for f in frames)  # the launcher's frames are dropped
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_speedscope_document_shares_frames_root_first() -> None:
    text = ('process 7:"python t.py";thread (7): MainThread;main (/p/t.py:3);f (/p/t.py:9) 4\n'
            'process 7:"python t.py";thread (7): MainThread;main (/p/t.py:3);0x7f (libc.so.6) 1\n')
    document = speedscope_document(parse_raw_text(text), "t")
    frames = document["shared"]["frames"]
    assert frames[:3] == [{"name": "process 7: python t.py"}, {"name": "thread (7): MainThread"},
                          {"name": "main (/p/t.py:3)", "file": "/p/t.py", "line": 3}]
    assert {"name": "0x7f (libc.so.6)", "file": "libc.so.6"} in frames
    (profile,) = document["profiles"]
    leaves = [frames[sample[-1]]["name"] for sample in profile["samples"]]
    assert leaves == ["f (/p/t.py:9)", "0x7f (libc.so.6)"]
    assert profile["weights"] == [4, 1] and profile["endValue"] == 5


def test_speedscope_output_that_cannot_be_written(tmp_path: Path, capsys) -> None:
    raw = tmp_path / "p.txt"
    raw.write_text("main (a.py:1) 3\n")
    (tmp_path / "file").write_text("")
    assert console.main(["pyspy", "speedscope", str(raw), "-o", str(tmp_path / "file" / "x.json")]) == 2
    assert "cannot be written" in capsys.readouterr().err


def test_report_missing_file(capsys) -> None:
    assert console.main(["pyspy", "report", "/nonexistent/p.txt"]) == 2
    assert "/nonexistent/p.txt: no such file" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# The raw-format parser on the frame forms py-spy writes.


def test_parse_frame_forms() -> None:
    f = parse_frame("train_step (/home/u/proj/train.py:12)")
    assert (f.name, f.path, f.line, f.kind) == ("train_step", "/home/u/proj/train.py", 12, PYTHON)
    f = parse_frame("_disable_dynamo.<locals>.inner (torch/_compile.py:47)")
    assert (f.name, f.line) == ("_disable_dynamo.<locals>.inner", 47)
    f = parse_frame("_find_and_load (<frozen importlib._bootstrap>:1176)")
    assert (f.path, f.line, f.kind) == ("<frozen importlib._bootstrap>", 1176, PYTHON)
    f = parse_frame("0x7fc4ab84524a (libc.so.6)")
    assert (f.name, f.path, f.line, f.kind) == ("0x7fc4ab84524a", "libc.so.6", None, NATIVE)
    f = parse_frame("at::native::add(at::Tensor const&) (libtorch_cpu.so)")
    assert (f.name, f.kind) == ("at::native::add(at::Tensor const&)", NATIVE)
    assert parse_frame("thread (3968): MainThread").kind == THREAD
    assert parse_frame("thread (0x7F12AB)").kind == THREAD
    assert parse_frame("train (train.py)").line is None  # --nolineno
    assert parse_frame("garbage without location").kind == UNKNOWN
    assert parse_frame("").kind == UNKNOWN


def test_parse_raw_text_with_multiline_process_frames_and_garbage() -> None:
    text = (
        'process 10:"python launcher.py";process 11:"python -c import a; b\nprint(1)";'
        "thread (11): MainThread;f (x.py:1);g (x.py:2) 5\n"
        'process 10:"python launcher.py";process 11:"python -c import a; b\nprint(1)" 2\n'
        "f (x.py:1);???;g (x.py:3) 4\n"
        "this line has no count\n"
        "\n"
        "f (x.py:1) 1\n"
    )
    profile = parse_raw_text(text)
    assert profile.total_samples == 12
    assert profile.malformed_records == 1
    assert profile.unparsed_frames == 1 and profile.unparsed_frame_samples == 4
    first = next(s for s in profile.stacks if s.count == 5)
    kinds = [f.kind for f in first.frames]
    assert kinds == [PROCESS, PROCESS, THREAD, PYTHON, PYTHON]
    assert first.frames[1].path == "python -c import a; b\nprint(1)"
    assert any("not in a py-spy frame format" in note for note in profile.problems())


@pytest.mark.parametrize("launcher", ["torchprof_args/analysis/pyspy/launcher.py",
                                      "torchprof_args/pyspy/launcher.py", "torchprof_args/_pyspy_child.py"],
                         ids=["launcher", "beside-analysis", "before-the-pyspy-package"])
def test_launcher_frames_are_stripped(launcher: str) -> None:
    text = (
        f'process 1:"/usr/bin/python /x/{launcher} s -- python t.py";'
        'process 2:"python t.py";step (t.py:3) 7\n'
        f'process 1:"/usr/bin/python /x/{launcher} s -- python t.py";'
        f"<module> ({launcher.rsplit('/', 1)[1]}:60);Popen.wait (subprocess.py:1264) 9\n"
    )
    text += f'process 1:"";<module> (/x/{launcher}:60);Popen.wait (subprocess.py:1264) 2\n'  # no command line
    profile = parse_raw_text(text)
    assert profile.launcher_samples == 11
    assert profile.total_samples == 7
    (stack,) = profile.stacks
    assert [f.name for f in stack.frames] == ["2", "step"]


def test_program_seen_before_exec_keeps_its_samples() -> None:
    """py-spy keeps the command line it first read for a pid: a child caught between fork and exec
    (the launcher's preexec_fn) shows the launcher's command line on every later sample."""
    launcher = 'process 1:"/usr/bin/python /x/torchprof_args/analysis/pyspy/launcher.py s -- python t.py";'
    stale_child = 'process 2:"/usr/bin/python /x/torchprof_args/analysis/pyspy/launcher.py s -- python t.py";'
    text = (f"{launcher}{stale_child}step (t.py:3) 7\n"
            f"{launcher}<module> (launcher.py:60);Popen.wait (subprocess.py:1264) 9\n")
    profile = parse_raw_text(text)
    assert profile.launcher_samples == 9
    assert profile.total_samples == 7
    (stack,) = profile.stacks
    assert [f.name for f in stack.frames] == ["step"]
    # a busy host: py-spy read the child's stale command line but not its parent, so the stale
    # launcher frame is the stack's only process; its Python frames are the program's, kept
    alone = parse_raw_text(f"{stale_child}step (t.py:3) 5\n{launcher[:-1]} 5\n")
    assert alone.total_samples == 5 and alone.launcher_samples == 5
    assert [f.name for f in alone.stacks[0].frames] == ["step"]


def test_record_command_runs_the_launcher_that_the_parser_strips() -> None:
    from torchprof_args.analysis.pyspy.launcher import LAUNCHER_MARKER
    from torchprof_args.analysis.pyspy.record import record_command

    argv = record_command("py-spy", "out.txt", "status", ["python", "t.py"])
    launcher = argv[argv.index("--") + 2]
    assert Path(launcher).is_file() and launcher.endswith(LAUNCHER_MARKER)
    assert argv[argv.index("--") + 1:] == [sys.executable, launcher, "status", "--", "python", "t.py"]


def test_paths_and_libraries() -> None:
    assert shorten_path("/v/lib/python3.11/site-packages/torch/nn/modules/conv.py") == \
        "site-packages/torch/nn/modules/conv.py"
    assert shorten_path("/usr/lib/python3/dist-packages/numpy/core.py") == "dist-packages/numpy/core.py"
    assert shorten_path("/usr/local/lib/python3.11/multiprocessing/util.py") == "multiprocessing/util.py"
    assert in_library("/src/megatron/core/transformer/attention.py", "megatron.core")
    assert in_library("site-packages/megatron/training.py", "megatron")
    assert not in_library("site-packages/megatron_extra/x.py", "megatron")
    assert in_library("/home/u/train.py", "train")


def test_report_rows_pick_leaf_and_library_frame() -> None:
    text = (
        "<module> (/p/train.py:30);train_step (/p/train.py:12);"
        "forward (/v/lib/python3.11/site-packages/torch/nn/modules/linear.py:125) 6\n"
        "<module> (/p/train.py:30);eval_step (/p/train.py:20);"
        "forward (/v/lib/python3.11/site-packages/torch/nn/modules/linear.py:125) 2\n"
        "<module> (/p/train.py:30);train_step (/p/train.py:12);helper (/p/train.py:40);"
        "forward (/v/lib/python3.11/site-packages/torch/nn/modules/linear.py:125) 2\n"
    )
    rows = report_rows(parse_raw_text(text))
    assert [(r.name, r.library_function_name, r.library_function_line, r.samples) for r in rows] == [
        ("forward", "train_step", 12, 6),
        ("forward", "eval_step", 20, 2),
        ("forward", "helper", 40, 2),
    ]
    assert rows[0].path == "site-packages/torch/nn/modules/linear.py"
    assert rows[0].proportion == pytest.approx(0.6)
    by_torch = report_rows(parse_raw_text(text), library="torch")
    assert {r.library_function_path for r in by_torch} == {"site-packages/torch/nn/modules/linear.py"}
    merged = report_rows(parse_raw_text(text), library="torch", aggregate_leaf_paths=True)
    assert [(r.name, r.samples) for r in merged] == [("forward", 10)]


@pytest.mark.slow
@needs_py_spy
def test_sigterm_to_the_wrapper_still_writes_the_profile_and_stops_the_command(tmp_path: Path) -> None:
    import signal
    import time

    pid_file = tmp_path / "child.pid"
    script = tmp_path / "long.py"
    script.write_text(
        "import os, sys, time\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "t = time.time()\n"
        "while time.time() - t < 60: pass\n"
    )
    out_dir = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchprof_args", "pyspy", "record", "-o", str(out_dir), "--",
         sys.executable, str(script)],
        env=_env(), start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.time() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.time() < deadline, "the profiled command did not start"
            time.sleep(0.1)
        time.sleep(1.0)  # let py-spy take some samples
        proc.send_signal(signal.SIGTERM)  # like a job script's `kill`, to the wrapper only
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, output
    (profile,) = out_dir.iterdir()
    assert "<module> (" in profile.read_text()
    child = int(pid_file.read_text())
    deadline = time.time() + 10
    while True:  # the command got SIGTERM when py-spy's launcher went away
        try:
            os.kill(child, 0)
            status = Path(f"/proc/{child}/status").read_text()
        except (ProcessLookupError, FileNotFoundError):
            break
        if re.search(r"^State:\s+Z", status, re.M):  # exited, not yet reaped by init
            break
        assert time.time() < deadline, "the profiled command outlived py-spy"
        time.sleep(0.1)
