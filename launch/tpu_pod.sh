#!/usr/bin/env bash
# Run on every worker of a TPU VM pod slice. jax.distributed.initialize() finds the workers by
# itself; each process reads its own data shard. Workdir, data and tokenizer live on GCS.
#   TPU=my-v5p-64 ZONE=us-east5-a launch/tpu_pod.sh --config=configs/crossbert.py:base \
#       --workdir=gs://bucket/runs/cb_base --config.data.path='gs://bucket/corpus/*.arrayrecord' \
#       --config.data.tokenizer=gs://bucket/spm.model --config.mesh.fsdp=-1
set -euo pipefail
: "${TPU:?set TPU to the TPU VM name}" "${ZONE:?set ZONE}"
repo="${REPO_DIR:-~/crossbert_jax}"
args="$(printf '%q ' "$@")"
gcloud compute tpus tpu-vm ssh "$TPU" --zone="$ZONE" --worker=all --command \
  "cd ${repo} && .venv/bin/python -m crossbert_jax.train --jax_distributed ${args}"
