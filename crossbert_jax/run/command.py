"""What the training commands share (`train`, `contrast`): their flags, the plan from them, the run and its last line.

`define_flags(config)` defines the flags in the calling command's module load (a test's `run_main` reloads
the command, which defines them afresh); `plan_of(flags)` sets up the process (XLA flags,
jax.distributed, the compilation cache) and builds the validated plan; `agreed(check)` runs a check
on process 0 whose verdict every process learns; `run_and_report` trains and prints the outcome
(exit EXIT_STOPPED after a stop signal). The commands add their hooks (the frozen probes) on top.
"""

import dataclasses
import sys
from typing import Any, Callable, Sequence

import jax
import numpy as np
from absl import flags, logging
from jax.experimental import multihost_utils

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import xla_flags
from crossbert_jax.core.errors import EXIT_STOPPED, UserError, no_positional, require
from crossbert_jax.hf import import_config
from crossbert_jax.run import compile_cache, fork, hooks as hooks_lib
from crossbert_jax.run.trainer import run


@dataclasses.dataclass(frozen=True)
class Flags:
  """The flag holders of a training command."""
  config: Any
  workdir: Any
  jax_distributed: Any
  coordinator_address: Any
  num_processes: Any
  process_id: Any
  compilation_cache: Any
  break_lock: Any


def define_flags(config: Any) -> Flags:
  """Defines a training command's flags beside its --config (the command's `config_flags.DEFINE_config_file`:
  only the commands and core's front end see ml_collections)."""
  return Flags(
      config=config, workdir=flags.DEFINE_string("workdir", None,
                                                 "Run directory (local or gs://): checkpoints, metrics, config."),
      jax_distributed=flags.DEFINE_bool(
          "jax_distributed", False, "Call jax.distributed.initialize(): multi-host TPU pods and GPU clusters "
          "(auto-detected there), or CPU processes with the three flags below."),
      coordinator_address=flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (CPU "
                                              "multi-process)."),
      num_processes=flags.DEFINE_integer("num_processes", None, "Number of processes (CPU multi-process)."),
      process_id=flags.DEFINE_integer("process_id", None, "This process's index (CPU multi-process)."),
      compilation_cache=flags.DEFINE_string(
          "compilation_cache", "", "JAX persistent compilation cache folder (local or gs://); default "
          "$JAX_COMPILATION_CACHE_DIR if set, else WORKDIR/compilation_cache, so a restarted run skips recompiling; "
          "'none' turns it off."), break_lock=flags.DEFINE_bool(
              "break_lock", False, "Take over the workdir's lock (workdir/lock.json) even if its holder looks alive: "
              "only when that run is known to be dead (a stale or dead-pid lock is broken without it)."))


def plan_of(f: Flags, argv: Sequence[str]) -> plan_lib.RunPlan:
  """The process set up (XLA flags, jax.distributed, the compilation cache) and the validated plan of the flags."""
  no_positional(argv, "; use --config=..., --workdir=..., --config.key=value")
  require("workdir", advice=": the run directory for checkpoints and metrics")
  xla_flags.set_cpu_flags()  # Before the first JAX computation (jax.distributed included).
  xla_flags.set_gpu_flags()
  if f.jax_distributed.value:
    if jax.config.jax_platforms == "cpu" or f.coordinator_address.value:
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f.coordinator_address.value, f.num_processes.value, f.process_id.value)
  logging.set_verbosity(logging.WARNING)
  compile_cache.enable(f.workdir.value, f.compilation_cache.value)
  # from_hf and the contrastive stage: the source's shape, a fork's through its source's train.init_from.
  return plan_lib.build(import_config.resolve(fork.with_source_init(config_lib.from_flag(f.config.value))))


def agreed(check: Callable[[], None], what: str) -> None:
  """Runs `check` on process 0 (it raises UserError to refuse); every process learns the verdict (a
  one-sided exit would leave the others waiting in a collective). `what` names it for the other processes."""
  error = None
  if jax.process_index() == 0:
    try:
      check()
    except UserError as e:
      error = e
  if jax.process_count() > 1:
    ok = bool(multihost_utils.broadcast_one_to_all(np.int32(error is None)))
    if not ok and error is None:
      raise UserError(f"process 0 could not read {what}; see its error line")
  if error is not None:
    raise error


def run_and_report(c: plan_lib.RunPlan, f: Flags, started: float, hooks: Sequence[hooks_lib.Hook]) -> None:
  """Trains `c` in --workdir; prints `done: ...` (process 0), or `stopped: ...` and exits EXIT_STOPPED."""
  last = run(c, f.workdir.value, break_lock=f.break_lock.value, started=started, hooks=hooks)
  good = f"; {last['goodput_line']}" if "goodput_line" in last else ""
  if last["status"] == "stopped":
    if jax.process_index() == 0:
      print(
          f"stopped: step {last.get('step')} saved in {f.workdir.value}; rerun the same command to resume "
          f"(exit {EXIT_STOPPED}){good}", file=sys.stderr, flush=True)
    sys.exit(EXIT_STOPPED)
  if last["status"] == "finished" and "loss" in last and jax.process_index() == 0:
    print(
        f"done: step {last['step']}, loss {last['first_loss']:.4f} (first step of this run) -> "
        f"{last['loss']:.4f}, accuracy {last['accuracy']:.4f} ({f.workdir.value}){good}", flush=True)
