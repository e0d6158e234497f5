#!/usr/bin/env bash
# Launch the DeepSpeed example with the deepspeed launcher (single node), profiled by torchprof-args.
# Usage: integrations/deepspeed/launch.sh [extra flags...]
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "${HERE}/../.." && pwd)

deepspeed --num_gpus "${NUM_GPUS:-2}" --master_port "${MASTER_PORT:-29500}" "${HERE}/train_ds.py" \
  --deepspeed_config "${DS_CONFIG:-${REPO}/configs/ds_config.json}" \
  --train-iters "${TRAIN_ITERS:-8}" \
  --torch-profile \
  --torch-profile-dir "${PROF_DIR:-./prof}" \
  --torch-profile-ranks all \
  --torch-profile-active 2 \
  "$@"
