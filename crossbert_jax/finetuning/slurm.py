"""`finetune --executor=slurm`: every trial of the grid as its own SLURM batch job, one per device.

Each unfinished trial gets --output_dir/slurm/<task>/<trial>/trial.sbatch (the sweep's batch script,
run/slurm_jobs.job_script: one task holding `--trial_cpus` CPUs and `--trial_gpus` GPUs, SIGTERM 120 s
before the time limit, requeued on exit 75, so a stopped trial resumes from its checkpoint) and is submitted
with `sbatch --parsable`. The trials that start from MNLI's best (RTE, MRPC, STS-B, when MNLI runs) are
submitted with `--dependency=afterok:<every unfinished MNLI trial's job>` and `--kill-on-invalid-dep=yes`, so
they start only once MNLI's best is known and are cancelled if an MNLI trial fails. The job id is kept in
job.json and the trial's exit status in exit.json: the same command again submits nothing that SLURM still
holds (a failed squeue submits nothing), skips finished trials, resubmits the others (a crash is retried this
way) and names the trials that ended with exit 2 (a bad input) instead of resubmitting them (until their
exit.json is deleted). Partition,
account and time limit come from SLURM's own SBATCH_PARTITION, SBATCH_ACCOUNT and SBATCH_TIMELIMIT.
"""

import dataclasses
import json
import pathlib
import shlex
import subprocess
from typing import Callable

from crossbert_jax.core import outputs
from crossbert_jax.core.errors import UserError
from crossbert_jax.finetuning import dispatch
from crossbert_jax.run import slurm_jobs

FOLDER, SCRIPT, JOB_FILE, EXIT_FILE = "slurm", "trial.sbatch", "job.json", "exit.json"


@dataclasses.dataclass
class Submitted:
  """What a submission left: the trials SLURM holds now (submitted or re-attached) and those that failed."""
  held: int
  failed: list[dispatch.Job]


def check_resources(cpus: float, gpus: float) -> None:
  """UserError for what a batch script cannot ask for: SLURM gives whole CPUs and GPUs."""
  for name, what, amount, least in (("trial_cpus", "CPUs", cpus, 1), ("trial_gpus", "GPUs", gpus, 0)):
    if amount != int(amount) or amount < least:
      raise UserError(f"--{name}={amount:g}: --executor=slurm asks for whole {what} per trial; give an integer >= "
                      f"{least}")


def trial_dir(out: pathlib.Path, job: dispatch.Job) -> pathlib.Path:
  return out / FOLDER / job.trial.task / job.trial.name


def script(job: dispatch.Job, out: pathlib.Path, repo: str, cpus: int, gpus: int) -> str:
  """The batch script of one trial: its command on one task, its output appended to its log."""
  folder = trial_dir(out, job)
  sbatch = [
      f"--job-name=ft-{job.trial.task}-{job.trial.name}", "--nodes=1", "--ntasks=1", f"--cpus-per-task={cpus}",
      *([f"--gpus={gpus}"] if gpus else []), f"--output={folder}/slurm-%j.out"]
  return slurm_jobs.job_script(
      f"{job.trial.task} {job.trial.name}: written by `python -m crossbert_jax.finetune --executor=slurm` "
      "(finetuning/slurm.py)", sbatch, repo, job.argv, job.log, folder / EXIT_FILE)


def submit(jobs: list[dispatch.Job], out: pathlib.Path, *, repo: str, cpus: int, gpus: int, mnli_start: bool,
           dry_run: bool = False, log: Callable[[str], None] = print) -> Submitted:
  """Submits every job's trial not held by SLURM already (or, with `dry_run`, prints its sbatch line and script),
  MNLI's dependants after MNLI's jobs; what SLURM holds now and the trials that failed."""
  held_any = not dry_run and any((trial_dir(out, j) / JOB_FILE).is_file() for j in jobs)
  queued = slurm_jobs.queued() if held_any else set()  # Before any submission: a failed squeue submits nothing.
  ids: dict[int, str] = {}  # id(job) -> its SLURM job.
  held, failed = 0, []
  first, later = dispatch.waves(jobs, mnli_start)
  for job in first + later:
    folder = trial_dir(out, job)
    what = f"{job.trial.task} {job.trial.name}"
    record = slurm_jobs.read_record(folder / JOB_FILE)
    if not dry_run and record.get("job", "") in queued:
      ids[id(job)], held = record["job"], held + 1
      log(f"[slurm] {what}: job {record['job']} is queued or running, left as it is")
      continue
    if not dry_run and slurm_jobs.read_record(folder / EXIT_FILE).get("rc") == dispatch.EXIT_USER_ERROR:
      job.outcome = f"failed: exit 2, a bad input (see {job.log}; once fixed, delete {folder / EXIT_FILE} to resubmit)"
      failed.append(job)
      continue
    after = []
    if job in later:
      mnli = [j for j in first if j.trial.task == "mnli"]
      if any(j in failed for j in mnli):
        job.outcome = "failed: waits for MNLI's trials, and one of them failed"
        failed.append(job)
        continue
      after = [ids[id(j)] for j in mnli]
    argv = [
        "sbatch", "--parsable",
        *([f"--dependency=afterok:{':'.join(after)}", "--kill-on-invalid-dep=yes"] if after else []),
        str(folder / SCRIPT)]
    text = script(job, out, repo, cpus, gpus)
    if dry_run:
      ids[id(job)] = f"JOB_OF_{job.trial.task}_{job.trial.name}"  # A placeholder: the id sbatch would print.
      log(f"# {shlex.join(argv)}\n{text}")
      continue
    folder.mkdir(parents=True, exist_ok=True)
    pathlib.Path(job.log).parent.mkdir(parents=True, exist_ok=True)
    outputs.write_atomic(folder / SCRIPT, text)
    (folder / EXIT_FILE).unlink(missing_ok=True)  # A new attempt: the last one's status no longer holds.
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
      raise UserError(f"sbatch refused {what} ({' '.join(proc.stderr.split())[:200]}); fix the partition or "
                      "limits (SBATCH_PARTITION, SBATCH_ACCOUNT) or --trial_cpus/--trial_gpus, then rerun")
    ids[id(job)], held = proc.stdout.strip().split(";")[0], held + 1
    outputs.write_atomic(folder / JOB_FILE, json.dumps({"job": ids[id(job)], "after": after}))
    log(f"[slurm] {what}: submitted as job {ids[id(job)]}" + (f" (after {len(after)} MNLI job(s))" if after else ""))
  return Submitted(held, failed)
