"""`sweep --executor=slurm`: every run of a ladder as one SLURM batch job, branches after their stable run.

Each unfinished run gets ROOT/runs/<name>/slurm.sbatch (the choices of launch/slurm_gpu.sbatch:
one task per GPU, every GPU visible to each task; run/slurm_jobs.job_script: SIGTERM 120 s before
the time limit, requeue on exit 75) and is submitted with `sbatch --parsable`; a WSD branch (a
contrastive run) with `--dependency=afterok:<its stable run's (its point's) job>`. Multi-node jobs are gang-scheduled by SLURM
itself, and jax.distributed.initialize() reads the coordinator, process count and id from the
SLURM environment. The job writes its trainer's exit status to slurm_exit.json and, on exit 0,
sweep_done.json. The submitted job id is kept in slurm_job.json: the same command again submits
nothing that is queued or running (re-attach; a failed squeue stops it, submitting nothing), skips
finished runs, resubmits the others (a resumable stop), and names the runs that ended with exit 2
(user errors) instead of resubmitting. Only whole CPUs and GPUs per node are expressed: a size
with other resources or a TPU slice is refused (check_placements), as is a machine without sbatch.
"""

import functools
import json
import pathlib
import shlex
import subprocess

from crossbert_jax.core import outputs
from crossbert_jax.core.errors import UserError
from crossbert_jax.run import slurm_jobs
from crossbert_jax.scaling import placement as placement_lib
from crossbert_jax.scaling import plan as plan_lib

JOB_FILE, EXIT_FILE, SCRIPT = "slurm_job.json", "slurm_exit.json", "slurm.sbatch"


def script(p: placement_lib.Placement, spec: dict, root: pathlib.Path, repo: str, python: str) -> str:
  """The batch script of run `p`: its trainer on p.hosts nodes, requeued on exit 75."""
  run_dir = root / "runs" / p.run.name
  gpus = int(p.bundle.get("GPU", 0))
  tasks = max(1, gpus)  # One process per GPU (jax.distributed gives task SLURM_LOCALID that GPU).
  cmd = plan_lib.train_command(p.run, spec, str(run_dir), python)
  if p.hosts * tasks > 1:
    cmd.append("--jax_distributed")
  sbatch = [
      f"--job-name={p.run.name}", f"--nodes={p.hosts}", f"--ntasks-per-node={tasks}",
      f"--cpus-per-task={max(1, int(p.bundle.get('CPU', 1)) // tasks)}", *([f"--gpus-per-node={gpus}"] if gpus else []),
      f"--output={run_dir}/slurm-%j.out"]
  done = (f"if [[ $rc -eq 0 ]]; then printf '{{\"steps\": {p.run.end_step}, \"wall_s\": %d}}\\n' \"$SECONDS\" > "
          f"{shlex.quote(str(run_dir / plan_lib.DONE_FILE))}; fi")
  return slurm_jobs.job_script(
      f"{p.run.name}: written by `python -m crossbert_jax.sweep --executor=slurm` (scaling/slurm_executor.py)", sbatch,
      repo, cmd, f"{run_dir}/train.%t.log", run_dir / EXIT_FILE, done)


def check_placements(places: list[placement_lib.Placement]) -> None:
  """UserError for a size SLURM's batch script cannot express: only whole CPUs and GPUs per node."""
  for p in places:
    where = f"spec sizes[{p.run.size!r}]"
    if p.slice:
      raise UserError(f"{where}.slice={p.slice!r}: the SLURM executor has no TPU slices; use --executor=ray for "
                      "TPU slices, or give the size hosts and resources={'GPU': N}")
    for key, amount in p.bundle.items():
      if key not in ("CPU", "GPU"):
        raise UserError(f"{where}.resources={p.bundle!r}: the SLURM executor asks only for CPUs and GPUs per "
                        f"node, not {key!r}; use --executor=ray for other resources")
      if amount != int(amount):
        raise UserError(f"{where}.resources={p.bundle!r}: SLURM gives whole {key}s ({key}: {amount:g}); "
                        "give a whole number")


def submit(places: list[placement_lib.Placement], spec: dict, root: pathlib.Path, repo: str, python: str, *,
           dry_run: bool = False, log=functools.partial(print, flush=True)) -> list[str]:
  """Submits every unfinished run (or, with `dry_run`, prints its script and sbatch line); the runs that failed."""
  jobs: dict[str, str] = {}
  failed = []
  held_any = not dry_run and any((root / "runs" / p.run.name / JOB_FILE).is_file() for p in places)
  holds = slurm_jobs.queued() if held_any else set()  # Before any submission: a failed squeue submits nothing.
  for p in places:
    run_dir = root / "runs" / p.run.name
    name = p.run.name
    if plan_lib.is_done(run_dir):
      log(f"[slurm] {name}: done, skipped")
      continue
    held = slurm_jobs.read_record(run_dir / JOB_FILE).get("job", "")
    if held and not dry_run and held in holds:
      jobs[name] = held
      log(f"[slurm] {name}: job {held} is queued or running, left as it is")
      continue
    if slurm_jobs.read_record(run_dir / EXIT_FILE).get("rc") == 2 and not dry_run:
      failed.append(f"{name} (exit 2: a user error; see {run_dir}/train.0.log)")
      continue
    after = jobs.get(p.after, "") if p.after else ""
    if p.after and not after and not plan_lib.is_done(root / "runs" / p.after):
      failed.append(f"{name} (waits for {p.after}, which was not submitted)")
      continue
    argv = ["sbatch", "--parsable", *([f"--dependency=afterok:{after}"] if after else []), str(run_dir / SCRIPT)]
    text = script(p, spec, root, repo, python)
    if dry_run:
      jobs[name] = f"JOB_OF_{name}"  # A placeholder: the job id sbatch would print.
      log(f"# {shlex.join(argv)}\n{text}")
      continue
    run_dir.mkdir(parents=True, exist_ok=True)
    outputs.write_atomic(run_dir / SCRIPT, text)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
      raise UserError(f"sbatch refused {name} ({' '.join(out.stderr.split())[:200]}); fix the cluster's "
                      "partition/limits or the spec's hosts/resources, then rerun")
    jobs[name] = out.stdout.strip().split(";")[0]
    outputs.write_atomic(run_dir / JOB_FILE, json.dumps({"job": jobs[name], "after": after}))
    log(f"[slurm] {name}: submitted as job {jobs[name]}" + (f" (after job {after})" if after else ""))
  return failed
