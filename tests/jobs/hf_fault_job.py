"""The Hugging Face example (``integrations/huggingface/train_gpt2.py``) with a fault, by environment:

* ``HF_EXPORT_DELAY=S``: rank 0's trace export (``--torch-profile-export inline``: on the training
  thread) takes S seconds longer, more than the Trainer's collective timeout (``--ddp_timeout``):
  every rank waits at the fence instead of in DDP's next all-reduce, and both finish.
* ``HF_RAISE_AT_STEP=N``: every rank raises after optimizer step N (a window recording): the
  Trainer calls no ``on_train_end``, the profiler stops at interpreter exit.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from helpers import faults  # tests/ is on PYTHONPATH (helpers.processes.subprocess_env)
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integrations" / "huggingface"))
import train_gpt2  # noqa: E402


class RaiseAtStep(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise RuntimeError(f"injected failure after optimizer step {self.step}")


def main() -> int:
    if os.environ.get("HF_EXPORT_DELAY") and os.environ.get("RANK") == "0":
        faults.delay_exports(float(os.environ["HF_EXPORT_DELAY"]))
    if os.environ.get("HF_RAISE_AT_STEP"):
        build = train_gpt2.build_trainer

        def build_with_fault(*args, **kwargs):
            trainer = build(*args, **kwargs)
            trainer.add_callback(RaiseAtStep(int(os.environ["HF_RAISE_AT_STEP"])))
            return trainer

        train_gpt2.build_trainer = build_with_fault
    return train_gpt2.main()


if __name__ == "__main__":
    sys.exit(main())
