"""In one process, against a real Megatron-LM tree (first on PYTHONPATH, with tests/megatron_cpu):
install()/uninstall() on its training module, its argument parser with our provider, and the
refusals at parse time through integrations/megatron/pretrain_gpt.py.  Writes a JSON result to
argv[1]; the test asserts on it."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

import megatron.training.training as training  # noqa: E402
import torch.distributed  # noqa: E402
from megatron.training.arguments import parse_args  # noqa: E402

import torchprof_args.megatron as tpm  # noqa: E402

MEGATRON_FLAGS = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                  "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "2",
                  "--global-batch-size", "4", "--train-iters", "4", "--lr", "1e-3", "--mock-data",
                  "--tokenizer-type", "NullTokenizer", "--vocab-size", "128"]


def check_install() -> dict:
    names = ("train", "training_log", "checkpoint_and_decide_exit")
    originals = {name: getattr(training, name) for name in names}
    tpm.install()
    patched = {name: getattr(training, name) for name in names}
    tpm.install()  # idempotent
    result = {
        "patched": [name for name in names if patched[name] is not originals[name]],
        "idempotent": all(getattr(training, name) is patched[name] for name in names),
        "installed": tpm.installed(),
    }
    tpm.uninstall()
    result["restored"] = all(getattr(training, name) is originals[name] for name in names)
    result["installed_after_uninstall"] = tpm.installed()
    return result


def check_parse(workdir: Path) -> dict:
    def mine(parser):  # noqa: ANN001, ANN202  (returns None: allowed)
        parser.add_argument("--my-flag", type=int, default=3)

    sys.argv = ["pretrain_gpt.py", *MEGATRON_FLAGS, "--tensorboard-dir", str(workdir / "tb"),
                "--log-interval", "7", "--timing-log-level", "2", "--torch-profile",
                "--torch-profile-parallel-ranks", "dp=0", "tp=0-1", "--my-flag", "5"]
    args = parse_args(extra_args_provider=tpm.compose_args_providers(mine, tpm.extra_args_provider))
    return {"my_flag": args.my_flag, "tensorboard_dir": args.tensorboard_dir,
            "log_interval": args.log_interval, "timing_log_level": args.timing_log_level,
            "torch_profile": args.torch_profile,
            "parallel_ranks": [[axis, list(ids)] for axis, ids in args.torch_profile_parallel_ranks],
            "num_layers": args.num_layers}


def run_example_main(argv: list[str]) -> dict:
    """integrations/megatron/pretrain_gpt.py's main() with ``argv``; records what got built."""
    spec = importlib.util.spec_from_file_location("torchprof_pretrain_gpt",
                                                  REPO / "integrations" / "megatron" / "pretrain_gpt.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    built: list[str] = []
    example.gpt.model_provider = lambda *a, **k: built.append("model")
    example.gpt.train_valid_test_datasets_provider = lambda *a, **k: built.append("data")
    sys.argv = ["pretrain_gpt.py", *MEGATRON_FLAGS, *argv]
    stderr = io.StringIO()
    code = None
    with contextlib.redirect_stderr(stderr):
        try:
            example.main()
        except SystemExit as exc:
            code = exc.code
    errors = [line for line in stderr.getvalue().splitlines() if "error:" in line]
    return {"exit_code": code, "errors": errors, "built": built,
            "distributed": torch.distributed.is_initialized(), "installed": tpm.installed()}


def main() -> None:
    result_path, workdir = Path(sys.argv[1]), Path(sys.argv[2])
    os.chdir(workdir)
    os.environ.update(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0")
    result = {
        "config_container": tpm.pretrain_takes_config_container(),
        "install": check_install(),
        "parse": check_parse(workdir),
        "conflict": run_example_main(["--torch-profile", "--profile", "--use-pytorch-profiler"]),
        "bad_rank": run_example_main(["--torch-profile", "--torch-profile-ranks", "5"]),
    }
    tpm.uninstall()
    result_path.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
