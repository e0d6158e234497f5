"""The trainer integrations stay at the top of the package: ``import torchprof_args`` imports no
training framework, and no module below the framework layer imports an integration module."""

from __future__ import annotations

import ast
import subprocess
import sys

from helpers.paths import REPO
from helpers.processes import subprocess_env

PACKAGE = REPO / "torchprof_args"
FRAMEWORKS = ("transformers", "accelerate", "trl", "lightning", "pytorch_lightning", "torchtitan", "tyro",
              "deepspeed", "megatron")
#: The integration modules: frameworks/ and the public entry modules above it.
ENTRY_MODULES = ("huggingface", "accelerate", "lightning", "torchtitan", "megatron", "deepspeed", "cli")
#: Modules that may import them: the integrations themselves and the commands layer above.
ALLOWED_IMPORTERS = ("torchprof_args.capture.frameworks", "torchprof_args.commands", "torchprof_args.console",
                     *(f"torchprof_args.{name}" for name in ENTRY_MODULES))


def test_import_torchprof_args_imports_no_framework():
    code = ("import sys, torchprof_args; "
            f"found = [m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r}]; "
            "print(found); sys.exit(1 if found else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=subprocess_env())
    assert result.returncode == 0, result.stdout + result.stderr


def _imports(path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def test_nothing_below_the_framework_layer_imports_an_integration():
    integrations = ("torchprof_args.capture.frameworks",
                    *(f"torchprof_args.{name}" for name in ENTRY_MODULES))
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        if module.startswith(ALLOWED_IMPORTERS):
            continue
        bad = sorted(name for name in _imports(path) if name.startswith(integrations)
                     and not (module == "torchprof_args" and name == "torchprof_args.cli"))
        if bad:
            offenders.append(f"{module}: {', '.join(bad)}")
    assert not offenders, offenders
