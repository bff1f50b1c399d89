#!/usr/bin/env bash
# The accelerator check in one command: versions found, wheels installed from .whl/ only (no
# network), then tools/accelerator_check.py, its log and JSON under OUT (default results/accelerator).
#
#   bash tools/accelerator_check.sh [OUT] [--dry_run] [--steps=a,b|all] [--cases=a,b] [--xla_gpu_preset=NAME]
#
# OUT defaults to $OUT when set (the folder a lent machine sends back), else results/accelerator;
# the runs it trains go to a temporary folder, deleted at the end, so OUT holds only the JSON and
# the log. Without --dry_run it needs an accelerator: with jax on the CPU it stops at once (exit 2).
# SIGTERM or SIGINT stops the check and every process it started (exit 143 / 130).
#
# Wheels for what the machine lacks are made here, on a machine with pip access, into the ignored
# .whl/ folder of the checkout (docs/accelerator.md lists the command). Budget: 8 minutes on one GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
fail() { echo "error: $*" >&2; exit 2; }

OUT="${OUT:-results/accelerator}"
if [[ $# -gt 0 && $1 != --* ]]; then OUT="$1"; shift; fi
dry_run=0
for arg in "$@"; do
  case "$arg" in
    --dry_run) dry_run=1 ;;
    --steps=?*|--cases=?*|--xla_gpu_preset=?*) ;;
    *) fail "unknown option $arg: use bash tools/accelerator_check.sh [OUT] [--dry_run] [--steps=a,b]" ;;
  esac
done
[[ -e "$OUT" && ! -d "$OUT" ]] && fail "OUT $OUT is a file: give a folder for the JSON and the log"
if (( !dry_run )); then
  backend="$("$PY" -c 'import jax; print(jax.default_backend())' 2>/dev/null)"
  [[ $backend == gpu || $backend == tpu ]] || fail "no GPU found (jax's backend: ${backend:-jax not importable}):" \
    "run this on the lent GPU machine, or pass --dry_run for the tiny shapes on the CPU"
fi
mkdir -p "$OUT" 2>/dev/null || fail "OUT $OUT cannot be made (a file on its path, or no write permission)"
LOG="$OUT/accelerator_check.log"
WORK="$(mktemp -d)"
child=""
stopped=""
stop() {  # Forwarded to `timeout`, which passes it on to its process group: the check and its subprocesses.
  stopped="$1"
  [[ -n $child ]] && kill -TERM "$child" 2>/dev/null
}
trap 'stop TERM' TERM
trap 'stop INT' INT
trap 'rm -rf "$WORK"' EXIT
exec > >(tee -i "$LOG") 2>&1
tee_pid=$!

echo "== $(date -u '+%Y-%m-%d %H:%M:%S') on $(hostname), $($PY --version 2>&1)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if (( dry_run )) && compgen -G ".whl/*.whl" >/dev/null; then
  echo "== dry run: the wheels in .whl/ (made for the lent machine's Python) are not installed"
elif compgen -G ".whl/*.whl" >/dev/null; then
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
if [[ -z $stopped ]]; then
  # 8 minutes on a lent GPU; the dry run's tiny shapes on a shared CPU get longer (they compile as many programs).
  timeout "$(( dry_run ? 1500 : 480 ))" "$PY" tools/accelerator_check.py --out="$OUT" --work="$WORK" "$@" &
  child=$!
  wait "$child"
  rc=$?
  while kill -0 "$child" 2>/dev/null; do  # A trap interrupted `wait`: the check is still stopping.
    wait "$child"
    rc=$?
  done
fi
case "$stopped" in
  TERM) rc=143 ;;
  INT) rc=130 ;;
esac
echo "== exit $rc$([[ -n $stopped ]] && echo " (stopped by SIG$stopped)") ($(date -u '+%H:%M:%S'))"
exec >&- 2>&-
wait "$tee_pid"  # The log is complete when the script exits.
exit "$rc"
