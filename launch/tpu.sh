#!/usr/bin/env bash
# A TPU VM slice (one host or a pod) from this checkout, with gcloud:
#   TPU=cb-v5p-64 ZONE=us-east5-a ACCELERATOR=v5p-64 launch/tpu.sh create   # SPOT=1: queued, spot
#   TPU=cb-v5p-64 ZONE=us-east5-a launch/tpu.sh setup    # copy the checkout to every worker, install
#   TPU=cb-v5p-64 ZONE=us-east5-a launch/tpu.sh run --config=configs/crossbert.py:base \
#       --workdir=gs://bucket/runs/cb_base --config.data.path='gs://bucket/corpus/*.arrayrecord' \
#       --config.data.tokenizer=gs://bucket/spm.model
#   TPU=... ZONE=... launch/tpu.sh logs | stop | delete
#   launch/tpu.sh --dry-run COMMAND ...   print every command (gcloud and local) instead of running it
# Env: TPU, ZONE (required); PROJECT; ACCELERATOR, RUNTIME, SPOT=1 (create; SPOT also in delete);
# REPO_DIR (the checkout on the workers, relative to $HOME, default crossbert_jax); WORKER (logs:
# a worker number or all, default 0), LINES (logs, default 50). Details: docs/launch.md.
set -euo pipefail

dry_run=0
if [[ "${1:-}" == "--dry-run" ]]; then dry_run=1; shift; fi
command="${1:-}"
[[ $# -gt 0 ]] && shift
usage="usage: launch/tpu.sh [--dry-run] create|setup|run|logs|stop|delete [trainer flags for run]"

die() { echo "error: $*" >&2; exit 2; }
# Runs a command, or prints it (shell-quoted, one line) under --dry-run.
do_() { if ((dry_run)); then printf '%q ' "$@" | sed 's/ $//'; echo; else "$@"; fi; }

[[ -n "$command" ]] || die "no command; $usage"
[[ -n "${TPU:-}" ]] || die "set TPU to the TPU VM name, e.g. TPU=cb-v5p-64"
[[ -n "${ZONE:-}" ]] || die "set ZONE, e.g. ZONE=us-east5-a"
repo="${REPO_DIR:-crossbert_jax}"
where=(--zone="$ZONE")
[[ -n "${PROJECT:-}" ]] && where+=(--project="$PROJECT")
ssh_all=(gcloud compute tpus tpu-vm ssh "$TPU" "${where[@]}" --worker=all)

runtime_for() {  # The TPU VM image for an accelerator type.
  case "$1" in
    v5p-*) echo v2-alpha-tpuv5 ;;
    v5litepod-*) echo v2-alpha-tpuv5-lite ;;
    v6e-*) echo v2-alpha-tpuv6e ;;
    v4-*) echo tpu-ubuntu2204-base ;;
    *) die "no default RUNTIME for ACCELERATOR=$1; set RUNTIME (gcloud compute tpus versions list)" ;;
  esac
}

case "$command" in
  create)
    [[ -n "${ACCELERATOR:-}" ]] || die "set ACCELERATOR, e.g. ACCELERATOR=v5p-64 (v5p-256 = v5p:4x4x8, 128 chips)"
    runtime="${RUNTIME:-$(runtime_for "$ACCELERATOR")}"
    if [[ "${SPOT:-0}" == 1 ]]; then
      # A queued resource waits for spot capacity instead of failing when there is none.
      do_ gcloud compute tpus queued-resources create "$TPU" "${where[@]}" --node-id="$TPU" \
        --accelerator-type="$ACCELERATOR" --runtime-version="$runtime" --spot
      echo "# queued: wait for state ACTIVE, then setup" >&2
      do_ gcloud compute tpus queued-resources describe "$TPU" "${where[@]}" --format='value(state.state)'
    else
      do_ gcloud compute tpus tpu-vm create "$TPU" "${where[@]}" --accelerator-type="$ACCELERATOR" \
        --version="$runtime"
    fi
    ;;
  setup)
    # The checkout as it is here (tracked and untracked, minus what git ignores), not a git clone.
    cd "$(dirname "$0")/.."
    archive="${TMPDIR:-/tmp}/crossbert_jax-$TPU.tar.gz"
    if ((dry_run)); then
      echo "git ls-files -co --exclude-standard -z | tar --null -T - -czf $(printf '%q' "$archive")"
    else
      git ls-files -co --exclude-standard -z | tar --null -T - -czf "$archive"
    fi
    do_ gcloud compute tpus tpu-vm scp "$archive" "$TPU:crossbert_jax.tar.gz" "${where[@]}" --worker=all
    # Python 3.11 (the pinned stack's), then .venv-tpu: requirements.txt + requirements-tpu.txt (jax[tpu], libtpu).
    install="set -e; mkdir -p ~/$repo && tar -xzf ~/crossbert_jax.tar.gz -C ~/$repo && cd ~/$repo"
    install+=" && (command -v python3.11 >/dev/null || (sudo apt-get update -qq && sudo apt-get install -y -qq python3.11 python3.11-venv))"
    install+=" && (test -x .venv-tpu/bin/python || python3.11 -m venv .venv-tpu)"
    install+=" && .venv-tpu/bin/python -m pip install -q -r requirements.txt -r requirements-tpu.txt"
    install+=" && .venv-tpu/bin/python -m pip install -q --no-deps -e ."
    install+=" && echo \$(hostname): \$(.venv-tpu/bin/python -m pip list 2>/dev/null | grep -E '^(jax|libtpu) ' | tr -s ' ' | paste -sd' ')"
    do_ "${ssh_all[@]}" --command="$install"
    ;;
  run)
    [[ $# -gt 0 ]] || die "run needs the trainer flags, e.g. --config=configs/crossbert.py:base --workdir=gs://..."
    args="$(printf '%q ' "$@")"
    # setsid + nohup: the trainer outlives the SSH session; one log per worker; the loop in
    # tpu_worker.sh re-runs the trainer when it exits 75 (stopped, resumable).
    start="cd ~/$repo && mkdir -p logs && rm -f logs/STOP && (setsid nohup bash launch/tpu_worker.sh ${args% }"
    start+=" > logs/worker-\$(hostname).log 2>&1 < /dev/null &) && echo \$(hostname): started, log ~/$repo/logs/worker-\$(hostname).log"
    do_ "${ssh_all[@]}" --command="$start"
    ;;
  logs)
    worker="${WORKER:-0}"
    do_ gcloud compute tpus tpu-vm ssh "$TPU" "${where[@]}" --worker="$worker" \
      --command="tail -n ${LINES:-50} ~/$repo/logs/worker-*.log"
    ;;
  stop)
    # SIGTERM: the trainer saves a checkpoint and exits; STOP keeps the loop from re-running it.
    do_ "${ssh_all[@]}" --command="cd ~/$repo && touch logs/STOP && (kill -TERM -- -\$(cat logs/worker.pid) 2>/dev/null || true)"
    ;;
  delete)
    if [[ "${SPOT:-0}" == 1 ]]; then
      do_ gcloud compute tpus queued-resources delete "$TPU" "${where[@]}" --force --quiet
    else
      do_ gcloud compute tpus tpu-vm delete "$TPU" "${where[@]}" --quiet
    fi
    ;;
  *) die "unknown command '$command'; $usage" ;;
esac
