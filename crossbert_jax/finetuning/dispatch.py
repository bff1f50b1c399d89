"""`finetune --executor=ray`: every trial of the grid as its own process on a Ray cluster, one per device.

A trial is the finetune command narrowed to one grid point and seed (`recipe.trial_argv`); here each is a Ray
task (the sweep's `scaling/ray_host.train`, which the command passes in: the trial's process, its output in
--output_dir/logs/<task>/<trial>.log, dying with its task) holding `--trial_cpus` CPUs and `--trial_gpus` GPUs,
so Ray runs as many at once as the cluster has room for. Two waves: first MNLI's trials and every task that starts from the pretrained encoder, then RTE,
MRPC and STS-B, which start from MNLI's best trial (only when MNLI runs here). A trial that exits 2 (a bad
input) fails and is not retried; one that crashes, exits 75 or loses its host is started again (it resumes from
its checkpoint) up to `max_retries` times. A finished trial has its result.json and is skipped, so the same
command again runs only what is left. SIGTERM / Ctrl-C: every running trial gets SIGTERM (it saves and exits
75), then `Stopped`. The table is then built by the caller from the finished trials (finetuning/driver.py).
"""

import dataclasses
import pathlib
from typing import Callable

from crossbert_jax.finetuning import recipe
from crossbert_jax.finetuning import trial as trial_lib
from crossbert_jax.run import preemption

_POLL_S = 1.0
EXIT_USER_ERROR = 2


@dataclasses.dataclass
class Job:
  """One trial to run: its argv (the host's Python as ray_host.PYTHON), its log, and its attempts so far."""
  trial: recipe.Trial
  argv: list[str]
  log: str
  attempts: int = 0
  outcome: str = ""  # "" (not ended) | "done" | "failed: <why>"


def waves(jobs: list[Job], mnli_start: bool) -> list[list[Job]]:
  """[the trials that start from the pretrained encoder (MNLI's among them), those that start from MNLI's best]."""
  later = [j for j in jobs if mnli_start and j.trial.task in recipe.FROM_MNLI]
  return [[j for j in jobs if j not in later], later]


def run_on_ray(jobs: list[Job], host_fn: Callable[[list[str], str, str, str], dict], *, cwd: str, cpus: float,
               gpus: float, max_retries: int, mnli_start: bool, grace_s: float, log: Callable[[str],
                                                                                              None]) -> list[Job]:
  """Runs every job's trial as a Ray task of `host_fn(argv, cwd, log, stop_file) -> {"rc": exit status, ...}` (the
  sweep's `scaling/ray_host.train`, which SIGTERMs its process once `stop_file` exists); returns the jobs that
  failed."""
  import ray  # pylint: disable=g-import-not-at-top  (only this executor needs Ray)

  task = ray.remote(host_fn).options(num_cpus=cpus, num_gpus=gpus, max_retries=0)
  failed: list[Job] = []
  with preemption.StopRequest() as stop:
    for i, wave in enumerate(waves(jobs, mnli_start)):
      if i and failed and any(j.trial.task == "mnli" for j in failed):
        for j in wave:
          j.outcome = "failed: waits for MNLI's trials, and one of them failed"
        failed += wave
        continue
      for j in wave:
        _stop_file(j).unlink(missing_ok=True)  # An earlier command's stop.
      running = {task.remote(j.argv, cwd, j.log, str(_stop_file(j))): j for j in wave}
      for j in wave:
        j.attempts = 1
      log(f"[ray] {len(wave)} trial(s) submitted ({cpus:g} CPU, {gpus:g} GPU each)")
      while running:
        if stop.signal_name:
          _stop(ray, running, grace_s, log)
          raise trial_lib.Stopped(f"{stop.signal_name} received; every running trial saved its checkpoint")
        done, _ = ray.wait(list(running), num_returns=1, timeout=_POLL_S)
        for ref in done:
          j = running.pop(ref)
          try:
            rc = ray.get(ref)["rc"]
          except ray.exceptions.RayError as e:  # Its host or worker was lost: the trial resumes elsewhere.
            rc, why = None, f"lost ({type(e).__name__})"
          else:
            why = f"exit {rc}"
          if rc == 0:
            j.outcome = "done"
            log(f"[ray] {j.trial.task} {j.trial.name}: done")
          elif rc == EXIT_USER_ERROR or j.attempts > max_retries:
            j.outcome = f"failed: {why}" + (f" after {j.attempts} attempts" if j.attempts > 1 else "")
            failed.append(j)
            log(f"[ray] {j.trial.task} {j.trial.name}: {j.outcome}; see {j.log}")
          else:
            j.attempts += 1
            log(f"[ray] {j.trial.task} {j.trial.name}: {why}; starting it again "
                f"({j.attempts - 1}/{max_retries}), from its checkpoint")
            running[task.remote(j.argv, cwd, j.log, str(_stop_file(j)))] = j
  return failed


def _stop_file(j: Job) -> pathlib.Path:
  """Made by `_stop` beside the trial's log: its host task SIGTERMs the trial (Ray's graceful cancel is best effort)."""
  return pathlib.Path(j.log).with_suffix(".stop")


def _stop(ray, running: dict, grace_s: float, log: Callable[[str], None]) -> None:
  """SIGTERM to every running trial (its stop file, which its task polls), then wait up to `grace_s` for their saves."""
  log(f"[ray] stopping: SIGTERM to {len(running)} trial(s); waiting up to {grace_s:.0f} s for their checkpoints")
  for j in running.values():
    _stop_file(j).write_text("stop\n")
  ray.wait(list(running), num_returns=len(running), timeout=grace_s)
  for j in running.values():
    _stop_file(j).unlink(missing_ok=True)
