#!/usr/bin/env bash
# The accelerator check in one command: versions found, wheels installed from .whl/ only (no
# network), then tools/accelerator_check.py, its log and JSON under OUT (default results/accelerator).
#
#   bash tools/accelerator_check.sh [OUT] [--dry_run]
#
# OUT defaults to $OUT when set (the folder a lent machine sends back), else results/accelerator;
# the runs it trains go to a temporary folder, so OUT holds only the JSON and the log.
#
# Wheels for what the machine lacks are made here, on a machine with pip access, into the ignored
# .whl/ folder of the checkout (docs/accelerator.md lists the command). Budget: 8 minutes on one GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${OUT:-results/accelerator}}"
shift || true
mkdir -p "$OUT"
LOG="$OUT/accelerator_check.log"
PY="${PYTHON:-python3}"
{
  echo "== $(date -u '+%Y-%m-%d %H:%M:%S') on $(hostname), $($PY --version 2>&1)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  if compgen -G ".whl/*.whl" >/dev/null; then
    echo "== installing $(ls .whl/*.whl | wc -l) wheels from .whl/ (no index)"
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || { echo "error: installing .whl/ failed"; exit 2; }
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  echo "== versions found"
  $PY - <<'PYEOF'
import importlib.metadata as m
for name in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax", "orbax-checkpoint", "grain",
             "ml-collections", "array-record", "sentencepiece", "transformers", "torch"):
  try:
    print(f"  {name} {m.version(name)}")
  except m.PackageNotFoundError:
    print(f"  {name} missing")
PYEOF
  export PYTHONUNBUFFERED=1
  WORK="$(mktemp -d)"
  timeout 480 $PY tools/accelerator_check.py --out="$OUT" --work="$WORK" "$@"
  rc=$?
  echo "== exit $rc ($(date -u '+%H:%M:%S'))"
  exit $rc
} 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
