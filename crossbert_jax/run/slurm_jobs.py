"""SLURM batch jobs of resumable commands, shared by `sweep --executor=slurm` (scaling/slurm_executor.py) and
`finetune --executor=slurm` (finetuning/slurm.py): the batch script (`job_script`: srun of the command, SIGTERM
120 s before the time limit, its exit status recorded, requeued on exit 75), the job records it leaves
(`read_record`), the jobs SLURM still holds (`queued`), and the check that SLURM's commands are here."""

import json
import pathlib
import shlex
import shutil
import subprocess

from crossbert_jax.core.errors import UserError

MAX_REQUEUES = 20  # Requeues after exit 75 (launch/slurm_gpu.sbatch's MAX_REQUEUES).


def job_script(what: str, sbatch: list[str], repo: str, cmd: list[str], output: str, exit_file: pathlib.Path,
               on_exit: str = "") -> str:
  """A batch script that runs `cmd` (a resumable command: exit 75 when stopped) under srun from `repo`, its
  output in `output` (srun's pattern, appended across requeues), SIGTERM 120 s before the time limit, its exit
  status in `exit_file`, then `on_exit` (a shell line that reads $rc), and requeued on exit 75."""
  flags = [*sbatch, "--requeue", "--open-mode=append", "--signal=TERM@120"]
  return "\n".join([
      "#!/usr/bin/env bash", f"# {what}.", *[f"#SBATCH {flag}" for flag in flags], "set -uo pipefail",
      f"cd {shlex.quote(repo)}", f"export PYTHONPATH={shlex.quote(repo)}${{PYTHONPATH:+:$PYTHONPATH}}",
      f"srun --kill-on-bad-exit=1 --gpu-bind=none --output={shlex.quote(output)} {shlex.join(cmd)}", "rc=$?",
      f"printf '{{\"rc\": %d, \"job\": \"%s\", \"restart\": %d}}\\n' \"$rc\" \"$SLURM_JOB_ID\" "
      f"\"${{SLURM_RESTART_COUNT:-0}}\" > {shlex.quote(str(exit_file))}", *([on_exit] if on_exit else []),
      f"if [[ $rc -eq 75 && ${{SLURM_RESTART_COUNT:-0}} -lt {MAX_REQUEUES} ]]; then scontrol requeue \"$SLURM_JOB_ID\"; fi",
      "exit \"$rc\"", ""])


def read_record(path: pathlib.Path) -> dict:
  """A job's record (its job id, its exit status), or {} where none was written; a damaged one is one line."""
  if not path.is_file():
    return {}
  try:
    return json.loads(path.read_text())
  except (ValueError, UnicodeDecodeError):
    raise UserError(f"{path} (a SLURM job's record) is damaged; delete it to let the command submit the job "
                    "again") from None


# Jobs SLURM still holds: waiting, running or being requeued (squeue's default leaves out some of these).
_LIVE_STATES = "PD,R,S,ST,CG,CF,RQ,RH,RF,RS,SI,SO,RD"
TOOLS = ("sbatch", "squeue", "scontrol")  # What the executor calls (the jobs call scontrol to requeue).


def check_tools() -> None:
  """UserError, before anything is written, where SLURM's commands are not installed here."""
  if missing := [t for t in TOOLS if shutil.which(t) is None]:
    raise UserError(f"--executor=slurm: {', '.join(missing)} not found on PATH; run the command on a SLURM login "
                    "node (or load its module), or use another --executor")


def queued() -> set[str]:
  """The ids of the jobs SLURM still holds; UserError when squeue fails (a failure is not an empty queue)."""
  try:
    out = subprocess.run(["squeue", "--noheader", "--format=%i", f"--states={_LIVE_STATES}"], capture_output=True,
                         text=True, timeout=60)
  except (OSError, subprocess.TimeoutExpired) as e:
    raise UserError(f"--executor=slurm: squeue did not answer ({e}); nothing was submitted: rerun once SLURM "
                    "answers, on a SLURM login node") from None
  if out.returncode != 0:
    why = " ".join((out.stderr or out.stdout).split())[:200]
    raise UserError(f"--executor=slurm: squeue failed (exit {out.returncode}: {why}); nothing was submitted, "
                    "since the command cannot tell which jobs SLURM still holds: rerun once squeue answers")
  return set(out.stdout.split())
