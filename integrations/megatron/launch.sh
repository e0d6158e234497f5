#!/usr/bin/env bash
# Launch Megatron-LM's GPT pretraining with torchprof-args profiling (seed flag block).
# Usage: integrations/megatron/launch.sh [model, data and other Megatron-LM flags...]
# Needs your Megatron-LM checkout on PYTHONPATH (core_v0.16 to main: pretrain_gpt.py here runs its
# pretrain_gpt.py with torchprof_args.megatron.install() and the flags' extra_args_provider).
set -euo pipefail

NPROC_PER_NODE=${NPROC_PER_NODE:-2}
TENSORBOARD_DIR=${TENSORBOARD_DIR:-./tensorboard}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

torchrun --nproc_per_node "${NPROC_PER_NODE}" --master_port "${MASTER_PORT:-29500}" \
  "${HERE}/pretrain_gpt.py" \
  --tensor-model-parallel-size "${TP:-2}" \
  --train-iters "${TRAIN_ITERS:-8}" \
  --tensorboard-dir ${TENSORBOARD_DIR} \
  --torch-profile \
  --torch-profile-wait 0 \
  --torch-profile-ranks 0 1 \
  --torch-profile-warmup 1 \
  --torch-profile-active 1 \
  --torch-profile-repeat 1 \
  --torch-profile-skip-first 1 \
  --torch-profile-with-flops \
  --torch-profile-profile-memory \
  --torch-profile-with-stack \
  --torch-profile-with-modules \
  "$@"
