"""The Hugging Face example (``integrations/huggingface/train_gpt2.py``) with a slow trace flush on
rank 0: its export (``--torch-profile-export inline``: on the training thread) takes
``HF_EXPORT_DELAY`` seconds longer, more than the Trainer's collective timeout (``--ddp_timeout``).
Every rank waits at the fence instead of in DDP's next all-reduce, and both finish."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from helpers import faults  # tests/ is on PYTHONPATH (helpers.processes.subprocess_env)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integrations" / "huggingface"))
import train_gpt2  # noqa: E402

if __name__ == "__main__":
    if os.environ.get("RANK") == "0":
        faults.delay_exports(float(os.environ["HF_EXPORT_DELAY"]))
    sys.exit(train_gpt2.main())
