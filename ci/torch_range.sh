#!/usr/bin/env bash
# The supported torch range's smoke test: builds a venv with one torch release (from PyPI) and runs a
# subset of the suite on it.  Usage: ci/torch_range.sh [--build-only] VERSION [VENV_DIR]   (e.g. 2.9.1)
#
# --build-only builds the venv and runs no test (.ci/run builds both releases' venvs in the
# background while lint runs, then runs each smoke with no download left to do).
# VENV_DIR defaults to /tmp/venvs/torch-VERSION and is reused when it already holds that torch.
# PyPI's x86_64 torch wheels are CUDA builds (several GB with their nvidia-* dependencies).
# The last line says which torch passed or failed; the exit status is pytest's.
set -euo pipefail
BUILD_ONLY=0
if [ "${1:-}" = "--build-only" ]; then BUILD_ONLY=1; shift; fi
VERSION=${1:?usage: ci/torch_range.sh [--build-only] TORCH_VERSION [VENV_DIR]}
VENV=${2:-/tmp/venvs/torch-$VERSION}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
STAMP=$VENV/.torchprof-torch-$VERSION
export PIP_DISABLE_PIP_VERSION_CHECK=1
start=$(date +%s)

if [ ! -f "$STAMP" ]; then
    echo "torch $VERSION: building $VENV"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    # The package's own requirements, read from setup.py (torch apart: the release asked for).
    deps=$(sed -n 's/.*install_requires=\[\(.*\)\],/\1/p' "$REPO/setup.py" | tr -d '" ' | tr ',' '\n' \
           | grep -v '^torch')
    # A pip configuration may constrain torch (a cap for the repository's own venv): this venv
    # wants exactly VERSION, so its own constraint file replaces any configured one.
    echo "torch==$VERSION" > "$VENV/constraints.txt"
    PIP_CONSTRAINT="$VENV/constraints.txt" "$VENV/bin/pip" install -q "torch==$VERSION" $deps \
        "pytest>=7" "pytest-timeout>=2.1" psutil
    touch "$STAMP"
fi
built=$(date +%s)
if [ "$BUILD_ONLY" -eq 1 ]; then
    echo "torch $VERSION: venv ready in $VENV ($((built - start)) s)"
    exit 0
fi

# A fenced 2-rank flush, summary and diff, flags, timers and metrics, on-demand, hang, the
# execution trace (version-specific leftovers), corrupt traces, the torch-range checks, and PyTorch's
# private memory profiler (memory categories in the forked exporter, their correction).
TESTS=(
    tests/test_flush_timeout.py::test_torchprofiler_fences_the_flush_and_both_ranks_finish
    "tests/test_profiler.py::test_cycles_are_traced_and_published"
    tests/test_profiler.py::test_profiler_options_reach_torch
    tests/test_profiler.py::test_summary_sidecar_and_operator_table_are_written_in_the_summaries_folder
    tests/test_analysis.py::test_cli_summary_json_and_report
    tests/test_analysis_many.py::test_diff_of_run_folders_uses_sidecars
    tests/test_flags.py
    tests/test_timers.py
    tests/test_metrics.py
    tests/test_ondemand.py::test_window_is_traced_answered_and_named_like_the_answer
    tests/test_ondemand_ranks.py
    tests/test_flight_recorder.py
    tests/test_execution_trace.py
    tests/test_corrupt_traces.py
    tests/test_torch_support.py
    tests/test_memory_categories.py
    tests/test_memory_export.py
)
cd "$REPO"
set +e
PYTHONPATH="$REPO" "$VENV/bin/python" -m pytest -q -p no:cacheprovider -k "not wandb and not tensorboard" \
    "${TESTS[@]}" 2>&1 | tee "$VENV/smoke.log"
status=${PIPESTATUS[0]}
set -e
end=$(date +%s)
summary=$(grep -E '(passed|failed|error)' "$VENV/smoke.log" | tail -1 | tr -d '=' | sed 's/^ *//')
verdict=$([ "$status" -eq 0 ] && echo PASSED || echo FAILED)
echo "torch $VERSION: smoke $verdict ($summary; venv $((built - start)) s, tests $((end - built)) s)"
exit "$status"
