"""The demo's tiny GPT (``integrations/demo/model.py``) for the test jobs, loaded from its file:
the demo folder is a set of scripts, not a package."""

from __future__ import annotations

import importlib.util
import sys

from helpers.paths import REPO

_NAME = "torchprof_demo_model"
_spec = importlib.util.spec_from_file_location(_NAME, REPO / "integrations" / "demo" / "model.py")
assert _spec is not None and _spec.loader is not None
model = importlib.util.module_from_spec(_spec)
sys.modules[_NAME] = model
_spec.loader.exec_module(model)

TinyGPT = model.TinyGPT
synthetic_batches = model.synthetic_batches
