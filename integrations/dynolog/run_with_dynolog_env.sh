#!/usr/bin/env bash
# Run a training command with KINETO_USE_DAEMON=1 set *before* Python and torch start, so that
# torch registers with a running dynolog (`dyno gputrace`).  Setting it inside the training script
# is too late: torch reads it when it is imported (torchprof-args warns, with the rank, if so).
#
#   srun integrations/dynolog/run_with_dynolog_env.sh python train.py ...
#   torchrun --no-python ... integrations/dynolog/run_with_dynolog_env.sh python train.py ...
#
# KINETO_DAEMON_INIT_DELAY_S is not set: on torch 2.3-2.6 it fails with "External init callback
# must run in same thread as registerClient"; export it yourself only for torch < 2.3.
set -euo pipefail
if [ "$#" -eq 0 ]; then
    echo "usage: $0 COMMAND [ARG...]" >&2
    exit 2
fi
export KINETO_USE_DAEMON="${KINETO_USE_DAEMON:-1}"
exec "$@"
