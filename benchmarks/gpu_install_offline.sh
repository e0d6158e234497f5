#!/usr/bin/env bash
# Install what `make gpu-check` needs from a wheelhouse made by gpu_wheelhouse.sh, with no package
# registry, into the GPU machine's existing (CUDA) torch environment.  torch is never installed or
# changed: torchprof-args (and HolisticTraceAnalysis, whose jupyterlab dependency is left out) go in
# with --no-deps, the other dependencies resolved from the wheelhouse alone.
#
#   benchmarks/gpu_install_offline.sh [DIR]   (default ./wheelhouse; PYTHON: that environment's python)
set -euo pipefail

wheelhouse=${1:-wheelhouse}
python=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1

"$python" -c 'import torch' 2>/dev/null || {
    echo "gpu_install_offline: $python cannot import torch; use the environment that has the CUDA torch" >&2
    exit 1
}
"$python" -m pip install --no-index --find-links "$wheelhouse" -r "$wheelhouse/requirements-gpu-check.txt"
"$python" -m pip install --no-index --find-links "$wheelhouse" --no-deps --force-reinstall \
    -r "$wheelhouse/requirements-gpu-check-nodeps.txt"
"$python" -c 'import torch, torchprof_args.analysis
print("gpu_install_offline: ready, torch", torch.__version__, "CUDA", torch.version.cuda,
      "available" if torch.cuda.is_available() else "NOT available")'
