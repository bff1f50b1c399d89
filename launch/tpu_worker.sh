#!/usr/bin/env bash
# On one TPU VM worker (started detached by `launch/tpu.sh run`): the trainer, re-run while it
# exits 75 (EX_TEMPFAIL: stopped, resumable, e.g. a maintenance SIGTERM), each time resuming
# from the workdir's checkpoint. Any other exit code, or logs/STOP (`launch/tpu.sh stop`), ends it.
#   bash launch/tpu_worker.sh --config=configs/crossbert.py:base --workdir=gs://... [flags]
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p logs
echo $$ > logs/worker.pid  # setsid made this the process group leader: `kill -- -PID` stops it all.
RESUMABLE=75
# A handled (not ignored) SIGTERM: the loop survives `stop` to log the exit; the trainer gets it too.
trap 'echo "[$(date -u +%FT%TZ)] $(hostname): SIGTERM"' TERM
max_restarts="${MAX_RESTARTS:-100}"
for ((attempt = 1; ; attempt++)); do
  echo "[$(date -u +%FT%TZ)] $(hostname): attempt $attempt: crossbert_jax.train --jax_distributed $*"
  .venv-tpu/bin/python -m crossbert_jax.train --jax_distributed "$@"
  rc=$?
  echo "[$(date -u +%FT%TZ)] $(hostname): trainer exited with $rc"
  if [[ -e logs/STOP ]]; then echo "stopped (logs/STOP)"; exit "$rc"; fi
  if [[ $rc -ne $RESUMABLE ]]; then exit "$rc"; fi
  if ((attempt > max_restarts)); then echo "giving up after $max_restarts restarts"; exit "$rc"; fi
  sleep "${RESTART_DELAY:-30}"  # Let every worker exit before the next jax.distributed rendezvous.
done
