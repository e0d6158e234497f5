"""``make demo``: a 2-rank CPU training job of a small GPT with the seed's profiling flag block.

Launches ``torchrun --nproc_per_node 2 integrations/demo/train_lm.py`` (gloo), then prints where
the traces and summaries went and how to open them.  Extra arguments are passed to the trainer.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OUTPUT = REPO / "demo_output"

SEED_FLAG_BLOCK = [
    "--torch-profile",
    "--torch-profile-ranks", "0", "1",
    "--torch-profile-wait", "0",
    "--torch-profile-warmup", "1",
    "--torch-profile-active", "1",
    "--torch-profile-repeat", "1",
    "--torch-profile-skip-first", "1",
    "--torch-profile-with-flops",
    "--torch-profile-profile-memory",
    "--torch-profile-with-stack",
    "--torch-profile-with-modules",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str]) -> int:
    if OUTPUT.exists():
        shutil.rmtree(OUTPUT)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
        f"--master_port={free_port()}", str(HERE / "train_lm.py"), "--train-iters", "20",
        "--log-interval", "2", "--tensorboard-dir", str(OUTPUT / "tensorboard"), *SEED_FLAG_BLOCK, *argv,
    ]
    print("$ " + " ".join(command[2:]), flush=True)
    # The ranks run this checkout's package, whatever else the environment has installed.
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    code = subprocess.run(command, cwd=REPO, env=env).returncode
    if code != 0:
        print(f"demo: the training job failed with exit code {code}", file=sys.stderr)
        return code
    # One folder per profiled cycle (iter000003-000003/), every rank's trace in it, and the
    # files the publisher derived from each trace (summary sidecars the tools read, operator
    # tables) in its summaries/.
    traces = sorted((OUTPUT / "tensorboard").glob("iter*/*.pt.trace.json*"))
    tables = sorted((OUTPUT / "tensorboard").glob("iter*/summaries/*.operator_table.txt"))
    print("\n=== torchprof-args demo finished ===")
    print(f"traces ({len(traces)}):")
    for trace in traces:
        print(f"  {trace.relative_to(REPO)}  ({trace.stat().st_size / 1e6:.1f} MB)")
    if tables:
        print(f"per-rank operator tables ({len(tables)}):")
        for table in tables:
            print(f"  {table.relative_to(REPO)}")
    if traces:
        print("\n$ .venv/bin/torchprof summary " + str((OUTPUT / "tensorboard").relative_to(REPO)),
              flush=True)
        subprocess.run([sys.executable, "-m", "torchprof_args", "summary", str(OUTPUT / "tensorboard")],
                       cwd=REPO, env=env)
    dashboard = OUTPUT / "timings.html"
    subprocess.run([sys.executable, "-m", "torchprof_args", "dashboard", str(OUTPUT / "tensorboard"),
                    "-o", str(dashboard)], cwd=REPO, env=env, check=False)
    print("\nhow to open them:")
    print("  Perfetto UI: open https://ui.perfetto.dev and drag a .pt.trace.json.gz file onto it")
    print("               (traces over ~1 GB: `torchprof split TRACE --max-mb 500` first)")
    print("  HTA:         TraceAnalysis("
          f"trace_dir='{(OUTPUT / 'tensorboard').relative_to(REPO)}/iter000003-000003')"
          " reads one cycle's ranks")
    print("  TensorBoard: pip install torch-tb-profiler tensorboard; "
          f"tensorboard --logdir {(OUTPUT / 'tensorboard').relative_to(REPO)}")
    print(f"  summary:     .venv/bin/torchprof summary {(OUTPUT / 'tensorboard').relative_to(REPO)}")
    print(f"  step timers: open {dashboard.relative_to(REPO)} in a browser (no network needed); "
          "wandb offline run: wandb sync " + str((OUTPUT / 'tensorboard' / 'wandb').relative_to(REPO)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
