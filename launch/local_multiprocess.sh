#!/usr/bin/env bash
# N CPU processes on this machine through jax.distributed (gloo collectives): the multi-host
# code path (per-process data shards, global batch from local slices) without a pod.
#   launch/local_multiprocess.sh 2 --config=configs/crossbert.py:tiny --workdir=runs/mp \
#       --config.data.tokenizer=runs/demo/tokenizer/spm.model
# MODULE=crossbert_jax.contrast runs the contrastive stage instead of pretraining (any command with --jax_distributed).
# XLA_FLAGS set by the caller are kept; each process gets DEVICES_PER_PROCESS CPU devices (default 2) after them.
set -euo pipefail
n="${1:?usage: $0 NUM_PROCESSES --config=... --workdir=... [flags]}"; shift
port="${PORT:-$((20000 + RANDOM % 10000))}"
devices="${DEVICES_PER_PROCESS:-2}"
module="${MODULE:-crossbert_jax.train}"
pids=()
for ((i = 0; i < n; i++)); do
  XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_force_host_platform_device_count=${devices}" JAX_PLATFORMS=cpu \
    python -m "$module" "$@" --jax_distributed --coordinator_address="localhost:${port}" \
    --num_processes="$n" --process_id="$i" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit "$status"
