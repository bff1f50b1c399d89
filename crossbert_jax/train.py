r"""Pretrain CrossBERT or flat BERT on a device mesh.

  python -m crossbert_jax.train --config=configs/crossbert.py:tiny --workdir=runs/cb \
      --config.data.tokenizer=runs/tok/spm.model [--config.key=value ...]

Library: crossbert_jax.run.trainer.run, with the hooks of `standard_hooks` (the frozen probes every
eval.every_steps steps). Exit status 0, 2 or 75 (crossbert_jax.core.errors).
Manual: docs/training.md.
"""

import time

_STARTED = time.time()  # Before the imports: goodput counts them as start-up (run/goodput.py).

import sys  # noqa: E402
from typing import Callable  # noqa: E402

import jax  # noqa: E402
import numpy as np
from absl import app, flags, logging
from jax.experimental import multihost_utils
from ml_collections import config_flags

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import xla_flags
from crossbert_jax.core.errors import (EXIT_STOPPED, UserError, exit_on_user_error, no_positional, parse_flags_or_exit,
                                       require)
from crossbert_jax.evaluation import runner
from crossbert_jax.hf import import_config
from crossbert_jax.run import compile_cache, fork, hooks as hooks_lib
from crossbert_jax.run.trainer import run

FLAGS = flags.FLAGS
_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file and variant, e.g. configs/crossbert.py:tiny.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (local or gs://): checkpoints, metrics, config.")
_DISTRIBUTED = flags.DEFINE_bool(
    "jax_distributed", False, "Call jax.distributed.initialize(): multi-host TPU pods and GPU clusters "
    "(auto-detected there), or CPU processes with the three flags below.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (CPU multi-process).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes (CPU multi-process).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index (CPU multi-process).")
_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache", "", "JAX persistent compilation cache folder (local or gs://); default "
    "$JAX_COMPILATION_CACHE_DIR if set, else WORKDIR/compilation_cache, so a restarted run skips recompiling; "
    "'none' turns it off.")
_BREAK_LOCK = flags.DEFINE_bool(
    "break_lock", False, "Take over the workdir's lock (workdir/lock.json) even if its holder looks alive: "
    "only when that run is known to be dead (a stale or dead-pid lock is broken without it).")


def _check_probe_inputs(c) -> None:
  """A bad eval.tasks / eval.data_dir fails now, not at the first probe after training.

  Process 0 scores the probes, so it alone reads the task data; every process learns the verdict
  (a one-sided exit would leave the others waiting in a collective).
  """
  error = None
  if jax.process_index() == 0:
    try:
      runner.check_probe_inputs(c)
    except UserError as e:
      error = e
  if jax.process_count() > 1:
    ok = bool(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
    if not ok and error is None:
      raise UserError("process 0 could not read the probe tasks (config eval.*; see its error line)")
  if error is not None:
    raise error


def standard_hooks(c) -> list[hooks_lib.Hook]:
  """The hooks a run of `c` adds after each step's metrics row: the frozen probes (eval.tasks) every
  eval.every_steps steps (0: never), scored into that step's row. Pass them to `run(..., hooks=...)`."""
  return [hooks_lib.Hook("probes", c.eval.every_steps, runner.probe_hook)]


@exit_on_user_error
def main(argv):
  train_main(argv)


def train_main(argv, check: Callable[[plan_lib.RunPlan], None] = lambda c: None) -> None:
  """The command's body (this command's and `crossbert_jax.contrast`'s, which passes `check`: its refusal of
  another objective's config)."""
  no_positional(argv, "; use --config=..., --workdir=..., --config.key=value")
  require("workdir", advice=": the run directory for checkpoints and metrics")
  xla_flags.set_cpu_flags()  # Before the first JAX computation (jax.distributed included).
  xla_flags.set_gpu_flags()
  if _DISTRIBUTED.value:
    if jax.config.jax_platforms == "cpu" or _COORDINATOR.value:
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  logging.set_verbosity(logging.WARNING)
  compile_cache.enable(_WORKDIR.value, _COMPILATION_CACHE.value)
  # from_hf: the imported model's shape, a fork's through its source's train.init_from.
  c = plan_lib.build(import_config.resolve(fork.with_source_init(config_lib.from_flag(_CONFIG.value))))
  check(c)
  _check_probe_inputs(c)
  last = run(c, _WORKDIR.value, break_lock=_BREAK_LOCK.value, started=_STARTED, hooks=standard_hooks(c))
  good = f"; {last['goodput_line']}" if "goodput_line" in last else ""
  if last["status"] == "stopped":
    if jax.process_index() == 0:
      print(
          f"stopped: step {last.get('step')} saved in {_WORKDIR.value}; rerun the same command to resume "
          f"(exit {EXIT_STOPPED}){good}", file=sys.stderr, flush=True)
    sys.exit(EXIT_STOPPED)
  if last["status"] == "finished" and "loss" in last and jax.process_index() == 0:
    print(
        f"done: step {last['step']}, loss {last['first_loss']:.4f} (first step of this run) -> "
        f"{last['loss']:.4f}, accuracy {last['accuracy']:.4f} ({_WORKDIR.value}){good}", flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags_or_exit)
