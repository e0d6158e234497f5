#!/usr/bin/env bash
# Fill a wheelhouse with everything `make gpu-check` needs beside torch, for a GPU machine that has
# no package registry: this package as a wheel, and binary wheels of msgspec, isal, numpy, tqdm,
# pytest, pytest-timeout, psutil, HolisticTraceAnalysis and their dependencies.  HTA comes without
# its jupyterlab dependency (a notebook UI the analysis never imports, and a few hundred packages):
# the modules it imports (pandas, plotly, pydot, networkx, yaml) are listed instead, and it is
# installed with --no-deps.  Run this where PyPI is reachable, copy the folder over, then install
# offline with gpu_install_offline.sh.
#
#   benchmarks/gpu_wheelhouse.sh [DIR]        (default: ./wheelhouse, which git ignores)
#
# Environment:
#   PYTHON               the interpreter whose pip downloads (default python3; only pip is used)
#   GPU_PYTHON_VERSIONS  Python versions of the GPU machine, e.g. "3.10 3.12" (default: PYTHON's)
#   GPU_PLATFORM         its wheel platform (default manylinux_2_28_x86_64; aarch64 machines:
#                        manylinux_2_28_aarch64); older manylinux wheels are accepted too
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${1:-wheelhouse}
python=${PYTHON:-python3}
platform=${GPU_PLATFORM:-manylinux_2_28_x86_64}
versions=${GPU_PYTHON_VERSIONS:-$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')}
requirements=(
    "msgspec>=0.18" "numpy" "tqdm" "isal>=1.6"
    "pytest>=7" "pytest-timeout>=2.1" "psutil>=5.9" "pandas" "plotly" "pydot" "networkx" "pyyaml"
    "nvidia-ml-py>=12.535"  # the [gpu] extra: tests/gpu/test_gpu_hardware.py reads NVML
)
without_deps=("HolisticTraceAnalysis>=0.2")

"$python" -m pip --version >/dev/null 2>&1 || { echo "gpu_wheelhouse: $python has no pip" >&2; exit 1; }
mkdir -p "$dest"
export PIP_DISABLE_PIP_VERSION_CHECK=1

echo "gpu_wheelhouse: building torchprof-args from $repo" >&2
[ -e "$repo/build" ] && had_build=1 || had_build=0
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$dest" "$repo"
[ "$had_build" = 1 ] || rm -rf "$repo/build"  # setuptools' scratch folder, when this made it

for version in $versions; do
    echo "gpu_wheelhouse: wheels for CPython $version on $platform" >&2
    "$python" -m pip download --quiet --dest "$dest" --only-binary=:all: --implementation cp \
        --python-version "$version" --platform "$platform" "${requirements[@]}"
    "$python" -m pip download --quiet --dest "$dest" --only-binary=:all: --implementation cp \
        --python-version "$version" --platform "$platform" --no-deps "${without_deps[@]}"
done

printf '%s\n' "${requirements[@]}" > "$dest/requirements-gpu-check.txt"
printf '%s\n' "${without_deps[@]}" torchprof-args > "$dest/requirements-gpu-check-nodeps.txt"
echo "gpu_wheelhouse: $(ls "$dest"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest" >&2
echo "gpu_wheelhouse: on the GPU machine: benchmarks/gpu_install_offline.sh $dest" >&2
