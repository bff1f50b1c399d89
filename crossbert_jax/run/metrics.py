"""Training metrics: one JSON line per log call, TensorBoard scalars and a tqdm progress bar.

`workdir/metrics.jsonl` holds one object per `MetricsLogger.log` call: {"step": int, <key>: value}.
Non-finite floats (NaN, +-inf) are written as JSON null, because NaN / Infinity are not valid JSON
and would break strict readers. A resumed run appends, so a step logged before a restart and
re-run after it appears twice; readers that want one row per step keep the last one.

Object stores (gs://) cannot append (gcsfs silently overwrites), so a remote workdir gets one
segment per process start instead, `metrics.<UTC start time>.jsonl`, rewritten whole at most every
REMOTE_FLUSH_SECONDS and at close. `read_metrics` merges metrics.jsonl and the segments in time
order, and joins the goodput row an attempt logs after its final save (run/goodput.py) to its
step's row; read metrics only through it.
"""

import datetime
import json
import math
import sys
import time
from typing import Any, Mapping

import numpy as np
import tqdm
from absl import logging
from etils import epath

from crossbert_jax.core.errors import UserError

METRICS_FILE = "metrics.jsonl"
SEGMENT_GLOB = "metrics.*Z.jsonl"
# Each flush of a remote segment re-uploads it: at most this often (a kill loses at most this much).
REMOTE_FLUSH_SECONDS = 30.0
TENSORBOARD_DIR = "tensorboard"
# Progress-bar postfix label -> scalar keys that feed it, first present wins.
POSTFIX_KEYS = {
    "loss": ("loss",),
    "acc": ("accuracy",),
    "tok/s": ("tokens_per_second",),
    "wait": ("data_wait_fraction",),}


def _to_json_value(value: Any) -> int | float | None:
  """A Python int (integer or bool input) or float; None for a non-finite float."""
  # np.asarray covers Python, numpy and jax scalars and 0-d arrays alike.
  array = np.asarray(value)
  if array.dtype.kind in "iub":
    return int(array)
  out = float(array)
  return out if math.isfinite(out) else None


def _import_tensorboardx():
  """tensorboardX, imported lazily (it pulls in protobuf, which disabled processes never need) and
  without torch: its writer module imports torch only to accept torch tensors, which we never log,
  and that import is 2-3 s of every training process's start-up where torch is installed (it is,
  for the exports' checks against transformers). A process that has already imported torch keeps it.
  """
  blocked = "torch" not in sys.modules
  if blocked:
    sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX catches.
  try:
    import tensorboardX  # pylint: disable=g-import-not-at-top
  finally:
    if blocked and sys.modules.get("torch", 0) is None:
      del sys.modules["torch"]
  return tensorboardX


def tensorboard_writer(logdir: str, flush_secs: int = 30):
  """A tensorboardX SummaryWriter on `logdir` (local or gs://), imported without torch."""
  return _import_tensorboardx().SummaryWriter(logdir, flush_secs=flush_secs)


class MetricsLogger:
  """Appends metrics to workdir/metrics.jsonl, TensorBoard and a progress bar (process 0 only)."""
  def __init__(self, workdir: str, *, total_steps: int, start_step: int, enabled: bool, tensorboard: bool,
               progress_bar: bool, eta_by_work: bool = False, sink: Any = None):
    """`eta_by_work`: the bar shows the ETA `log` is given (the trainer's: without the compiling steps,
    priced by work where phases' steps differ), not tqdm's own (which counts the first step's compile);
    `sink`: another tracker that gets every row (`log(step, scalars)`, `close()`; run/wandb_logger.py)."""
    self._enabled = enabled
    self._sink = sink if enabled else None
    self._file = None
    self._writer = None
    self._bar = None
    if not enabled:
      return
    workdir = epath.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    remote = "://" in str(workdir)
    if remote:
      stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
      self._file = _Segment(workdir / f"metrics.{stamp}.jsonl")
    else:
      self._file = _open_for_append(workdir / METRICS_FILE)
    if tensorboard:
      # tensorboardX writes gs:// itself (google-cloud-storage, whole-file uploads on flush).
      self._writer = tensorboard_writer(str(workdir / TENSORBOARD_DIR), REMOTE_FLUSH_SECONDS if remote else 30)
    if progress_bar:
      fmt = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]" if eta_by_work else None
      self._bar = tqdm.tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True, bar_format=fmt)

  def log(self, step: int, scalars: Mapping[str, Any], eta_s: float | None = None) -> None:
    """Records `scalars` at `step` in metrics.jsonl, TensorBoard and the progress bar (`eta_s`: its ETA)."""
    if not self._enabled:
      return
    if "step" in scalars:
      raise ValueError("scalars must not contain 'step'; it is passed separately")
    step = int(step)
    row = {"step": step}
    row.update((k, _to_json_value(v)) for k, v in scalars.items())
    self._file.write(json.dumps(row, allow_nan=False) + "\n")
    self._file.flush()  # Local: every row; remote: at most every REMOTE_FLUSH_SECONDS.
    if self._writer is not None:
      for key, value in scalars.items():
        # Keys like "train/loss" become TensorBoard tag groups; NaN is kept so it shows up there.
        self._writer.add_scalar(key, float(np.asarray(value)), global_step=step)
    if self._sink is not None:
      self._sink.log(step, {k: v for k, v in row.items() if k != "step" and v is not None})
    if self._bar is not None:
      if step > self._bar.n:
        self._bar.update(step - self._bar.n)
      postfix = {} if eta_s is None else {"eta": tqdm.tqdm.format_interval(eta_s)}
      for label, keys in POSTFIX_KEYS.items():
        key = next((k for k in keys if k in scalars), None)
        if key is not None:
          postfix[label] = f"{float(np.asarray(scalars[key])):.4g}"
      if postfix:
        self._bar.set_postfix(postfix, refresh=False)
      self._bar.refresh()

  def log_text(self, msg: str) -> None:
    """Prints one line above the progress bar."""
    if self._enabled:
      tqdm.tqdm.write(msg)

  def close(self) -> None:
    """Flushes and closes the metrics file, TensorBoard writer and progress bar."""
    if self._file is not None:
      self._file.close()
      self._file = None
    if self._writer is not None:
      self._writer.close()
      self._writer = None
    if self._bar is not None:
      self._bar.close()
      self._bar = None
    if self._sink is not None:
      self._sink.close()
      self._sink = None

  def __enter__(self) -> "MetricsLogger":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def _open_for_append(path: epath.Path):
  # A run killed mid-write leaves a last line without "\n"; end it so appended lines stay whole.
  needs_newline = False
  if path.exists():
    with path.open("rb") as f:
      f.seek(0, 2)
      if f.tell() > 0:
        f.seek(-1, 2)
        needs_newline = f.read(1) != b"\n"
  file = path.open("a")
  if needs_newline:
    file.write("\n")
    file.flush()
  return file


class _Segment:
  """A file-like metrics segment on an object store: kept in memory, rewritten whole on flush."""
  def __init__(self, path: epath.Path):
    self._path = path
    self._lines: list[str] = []
    self._flushed_at = time.monotonic()
    self._dirty = False

  def write(self, text: str) -> None:
    self._lines.append(text)
    self._dirty = True

  def flush(self, force: bool = False) -> None:
    if self._dirty and (force or time.monotonic() - self._flushed_at >= REMOTE_FLUSH_SECONDS):
      self._path.write_text("".join(self._lines))
      self._flushed_at, self._dirty = time.monotonic(), False

  def close(self) -> None:
    self.flush(force=True)


def metrics_files(workdir: str | epath.Path) -> list[epath.Path]:
  """workdir/metrics.jsonl (if any), then the remote segments in start-time order."""
  workdir = epath.Path(workdir)
  files = [workdir / METRICS_FILE] if (workdir / METRICS_FILE).exists() else []
  return files + sorted(workdir.glob(SEGMENT_GLOB), key=lambda p: p.name) if workdir.exists() else files


def read_metrics(workdir: str | epath.Path) -> list[dict[str, Any]]:
  """All rows of a workdir's metrics (metrics.jsonl, then segments) in order (null = non-finite)."""
  files = metrics_files(workdir)
  if not files:
    raise UserError(f"{epath.Path(workdir) / METRICS_FILE} does not exist (nor metrics.*.jsonl "
                    f"segments): is {workdir} a training workdir?")
  rows, bad = [], 0
  for path in files:
    for line in path.read_text().splitlines():
      if not line.strip():
        continue
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        # Only a run killed mid-write leaves such a line; the rest of the file is still good.
        bad += 1
  if bad:
    logging.warning("%s: skipped %d truncated line(s)", workdir, bad)
  return _merge_goodput(rows)


def _merge_goodput(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """Rows with a goodput row (goodput* keys only, logged after the final save) joined to its step's row."""
  out: list[dict[str, Any]] = []
  for row in rows:
    if out and out[-1]["step"] == row.get("step") and all(k == "step" or k.startswith("goodput") for k in row):
      out[-1] = {**out[-1], **row}
    else:
      out.append(row)
  return out
