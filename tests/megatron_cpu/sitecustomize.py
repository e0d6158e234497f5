"""Run Megatron-LM's real ``pretrain()`` on CPU ranks (gloo): every CPU workaround the tests need.

Put this folder first on ``PYTHONPATH`` of a Megatron-LM process (``tests/megatron_lm.py``
does); Python imports it at start-up.  Megatron-LM expects a GPU in many places, so:

* ``torch.cuda`` calls made *by Megatron-LM's code* see one device that is really the CPU:
  ``is_available()`` is True for callers in ``megatron.*`` only (torch itself, the DataLoader and
  torchprof_args still see the truth: no CUDA), device queries answer 0, synchronisation,
  streams and events are host-side, the "CUDA" RNG is the CPU one;
* a torch function mode rewrites ``device="cuda"`` (or a device index) to the CPU in factory
  calls, ``Tensor.to`` and ``Tensor.cuda``;
* the few Megatron-LM modules that import triton unguarded (batch-invariant kernels, MoE paged
  stashing: options the tests do not use) are stub modules when triton is absent; the dataset
  index helpers are not compiled into Megatron-LM's (read-only) tree:
  the compiled ``helpers_cpp`` of the installed megatron-core package is used (same helpers.cpp);
* ``typing.override`` (Python 3.12, imported by core_v0.19.0) comes from ``typing_extensions``.

Only for tests and demos on machines without a GPU.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import time
import types
import typing

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

if not hasattr(typing, "override"):
    import typing_extensions

    typing.override = typing_extensions.override


#: Megatron-LM modules that import triton unguarded (kernels for options the tests do not use).
_NEEDS_TRITON = {
    "megatron.core.transformer.custom_layers.batch_invariant_kernels",  # core_v0.16.1
    "megatron.core.transformer.moe.ops.paged_stash",  # core_v0.19.0: MoE paged stashing
}


def _needs_triton(name: str):  # noqa: ANN202
    if name.startswith("__"):
        raise AttributeError(name)

    def unavailable(*args, **kwargs):  # noqa: ANN202
        raise RuntimeError(f"{name} needs triton, which is not installed")

    return unavailable


class _NoTritonFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stub modules for :data:`_NEEDS_TRITON`: any function in them raises if called."""

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001, ANN201
        if fullname not in _NEEDS_TRITON:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):  # noqa: ANN001, ANN201
        module = types.ModuleType(spec.name)
        module.__getattr__ = _needs_triton  # type: ignore[method-assign]
        return module

    def exec_module(self, module) -> None:  # noqa: ANN001
        return None


if importlib.util.find_spec("triton") is None:
    sys.meta_path.insert(0, _NoTritonFinder())


class _HelpersFinder(importlib.abc.MetaPathFinder):
    """``megatron.core.datasets.helpers_cpp`` from the installed megatron-core package."""

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001, ANN201
        if fullname != "megatron.core.datasets.helpers_cpp":
            return None
        for entry in sys.path:
            folder = os.path.join(entry or ".", "megatron", "core", "datasets")
            if not os.path.isdir(folder):
                continue
            for name in sorted(os.listdir(folder)):
                if name.startswith("helpers_cpp") and name.endswith(".so"):
                    location = os.path.join(folder, name)
                    loader = importlib.machinery.ExtensionFileLoader(fullname, location)
                    return importlib.util.spec_from_file_location(fullname, location, loader=loader)
        return None


sys.meta_path.insert(0, _HelpersFinder())


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs ``patches[name](module)`` right after module ``name`` is executed."""

    def __init__(self, patches: dict) -> None:
        self.patches = patches

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001, ANN201
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module) -> None:  # noqa: ANN001
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def _no_compile(module) -> None:  # noqa: ANN001
    module.compile_helpers = lambda: None  # helpers_cpp comes from the installed megatron-core


def _no_fused_kernels(module) -> None:  # noqa: ANN001
    module.load = lambda args: None  # core_v0.16.1 builds CUDA kernels with nvcc at start-up


sys.meta_path.insert(0, _PatchAfterImport({"megatron.core.datasets.utils": _no_compile,
                                           "megatron.legacy.fused_kernels": _no_fused_kernels}))


def _from_megatron() -> bool:
    """Whether the first caller outside this module is Megatron-LM's code."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    return frame is not None and frame.f_globals.get("__name__", "").startswith("megatron")


def _distinct(value):  # noqa: ANN001, ANN202
    """A function object of its own (torch._dynamo refuses one object under two torch.cuda names)."""
    if isinstance(value, type) or not callable(value):
        return value

    def replacement(*args, **kwargs):  # noqa: ANN202
        return value(*args, **kwargs)

    return replacement


def _patch_torch() -> None:
    import torch
    from torch.overrides import TorchFunctionMode

    cuda = torch.cuda
    real_is_available = cuda.is_available

    def is_available() -> bool:
        return True if _from_megatron() else real_is_available()

    class Event:
        def __init__(self, *args, **kwargs) -> None:
            self.time = 0.0

        def record(self, *args, **kwargs) -> None:
            self.time = time.perf_counter()

        def synchronize(self) -> None:
            pass

        def wait(self, *args, **kwargs) -> None:
            pass

        def query(self) -> bool:
            return True

        def elapsed_time(self, end: Event) -> float:
            return (end.time - self.time) * 1000.0

    class Stream:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def wait_stream(self, *args, **kwargs) -> None:
            pass

        def wait_event(self, *args, **kwargs) -> None:
            pass

        def synchronize(self) -> None:
            pass

        def record_event(self, event=None):  # noqa: ANN001, ANN201
            return event or Event()

        def __enter__(self):  # noqa: ANN204
            return self

        def __exit__(self, *exc) -> None:
            pass

    stream = Stream()
    noop = lambda *args, **kwargs: None  # noqa: E731
    zero = lambda *args, **kwargs: 0  # noqa: E731
    replacements = {
        "is_available": is_available, "current_device": zero, "device_count": lambda: 1,
        "set_device": noop, "synchronize": noop, "empty_cache": noop, "Event": Event, "Stream": Stream,
        "current_stream": lambda *a, **k: stream, "default_stream": lambda *a, **k: stream,
        "stream": lambda *a, **k: contextlib.nullcontext(), "set_stream": noop,
        "get_rng_state": lambda *a, **k: torch.get_rng_state(),
        "set_rng_state": lambda state, *a, **k: torch.set_rng_state(state),
        "manual_seed": lambda seed: None, "manual_seed_all": lambda seed: None,
        "memory_allocated": zero, "memory_reserved": zero, "max_memory_allocated": zero,
        "max_memory_reserved": zero, "memory_stats": lambda *a, **k: {},
        "reset_peak_memory_stats": noop, "get_device_capability": lambda *a, **k: (9, 0),
        "get_device_name": lambda *a, **k: "cpu",
        "get_device_properties": lambda *a, **k: types.SimpleNamespace(
            name="cpu", major=9, minor=0, total_memory=1 << 34, multi_processor_count=1),
    }
    for name, value in replacements.items():
        setattr(cuda, name, _distinct(value))
    cuda.random.get_rng_state = _distinct(lambda *a, **k: torch.get_rng_state())
    cuda.random.set_rng_state = _distinct(lambda state, *a, **k: torch.set_rng_state(state))
    cuda.default_generators = (torch.default_generator,)
    cuda._lazy_call = _distinct(lambda callback, **kwargs: callback())

    def to_cpu(device):  # noqa: ANN001, ANN202
        if isinstance(device, int) and not isinstance(device, bool):
            return torch.device("cpu")
        if isinstance(device, str) and device.startswith("cuda"):
            return torch.device("cpu")
        if isinstance(device, torch.device) and device.type == "cuda":
            return torch.device("cpu")
        return device

    class CudaToCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            kwargs = dict(kwargs or {})
            if "device" in kwargs:
                kwargs["device"] = to_cpu(kwargs["device"])
            if func is torch.Tensor.cuda:
                return args[0]
            if func is torch.Tensor.to:
                args = (args[0], *(to_cpu(a) for a in args[1:]))
            if kwargs.pop("non_blocking", None) is not None and func is not torch.Tensor.to:
                pass
            return func(*args, **kwargs)

    CudaToCpu().__enter__()


_patch_torch()
