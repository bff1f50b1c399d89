"""Weights & Biases (`metrics.wandb=True`): the metrics.jsonl scalars and the run's config, from process 0.

The W&B run id is kept in WORKDIR/wandb_run.json, so a resumed run continues the same W&B run
(`resume="allow"`); a fork (or a WSD decay branch) is a new W&B run in the group of its source
(the source's own group, else the source's run id); `metrics.wandb_group` names a group outright
(a sweep sets its name, so its runs group). WANDB_MODE=offline writes the run under
WORKDIR/wandb/ and says so at the start (`wandb sync DIR` uploads it later). W&B never stops training
and never prompts: a missing package, no login while not offline (where wandb.init would ask on a
terminal), or a failing call is one warning line, and the run goes on without W&B. `open_run` is the part a
fine-tuning trial shares (finetuning/trial.py: a W&B run per trial, its id in the trial's folder).
"""

import json
import secrets
import tempfile
from typing import Any, Callable

from etils import epath

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.run import fork

RUN_FILE = "wandb_run.json"


def _source_group(c: plan_lib.Settings) -> str:
  """A fork's group: its source's group or W&B run id, else the source workdir's name."""
  source, _ = fork.parse(c.train.fork_from)
  path = epath.Path(source) / RUN_FILE
  try:
    record = json.loads(path.read_text()) if path.exists() else {}
  except (OSError, ValueError):
    record = {}
  return record.get("group") or record.get("id") or epath.Path(source).name


class WandbSink:
  """Logs each metrics row to W&B; turns itself off (one warning) on the first failure."""
  def __init__(self, run: Any, warn: Callable[[str], None]):
    self._run, self._warn = run, warn

  def log(self, step: int, scalars: dict[str, float]) -> None:
    if self._run is None:
      return
    try:
      self._run.log(dict(scalars), step=int(step))
    except Exception as e:  # pylint: disable=broad-except
      self._fail(e)

  def close(self) -> None:
    if self._run is not None:
      try:
        self._run.finish()
      except Exception as e:  # pylint: disable=broad-except
        self._fail(e)
      self._run = None

  def _fail(self, e: Exception) -> None:
    self._warn(f"warning: W&B failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
               "training goes on without it (metrics.jsonl has every row)")
    self._run = None


def start(c: plan_lib.Settings, workdir: epath.Path, warn: Callable[[str], None]) -> WandbSink | None:
  """The W&B run of this workdir (new, or the one it started), or None (W&B off, missing or failing)."""
  m = c.metrics
  if not m.wandb:
    return None
  group = m.wandb_group or (_source_group(c) if c.train.fork_from else "")
  return open_run(workdir, project=m.wandb_project, entity=m.wandb_entity, name=m.wandb_run_name or workdir.name,
                  group=group, tags=tuple(m.wandb_tags), config=c.to_dict(), warn=warn,
                  flag="config metrics.wandb=True")


def open_run(workdir: epath.Path, *, project: str, entity: str, name: str, group: str, tags: tuple[str, ...],
             config: dict[str, Any], warn: Callable[[str], None], flag: str) -> WandbSink | None:
  """The W&B run of `workdir`: the one its RUN_FILE names (resumed), else a new one in `group`; None (one warning
  naming `flag`, the setting that asked for W&B) when wandb is missing, not logged in while online, or fails."""
  try:
    import wandb  # pylint: disable=g-import-not-at-top
  except ImportError:
    warn(f"warning: {flag} but the wandb package is not installed (pip install -r requirements.txt); training "
         "goes on without W&B")
    return None
  path = workdir / RUN_FILE
  try:
    # WANDB_MODE or `wandb offline`'s setting; silent: the login check prints no "Loaded credentials" lines.
    mode = wandb.setup(settings=wandb.Settings(silent=True)).settings.mode
    if mode not in ("offline", "dryrun", "disabled") and not wandb.login(prompt=False, verify=False):
      # wandb.init would prompt ("Enter your choice") on a terminal and wait for an answer: never.
      warn(f"warning: {flag} but W&B has no login (WANDB_API_KEY or `wandb login`) and is not offline "
           "(WANDB_MODE=offline); training goes on without W&B")
      return None
    record = json.loads(path.read_text()) if path.exists() else {}
    if not record:
      record = {"id": secrets.token_hex(4), "group": group}  # W&B ids: [a-z0-9], 8 chars.
      path.write_text(json.dumps(record))
    local = "://" not in str(workdir)
    run = wandb.init(project=project, entity=entity or None, name=name, id=record["id"], resume="allow",
                     group=record["group"] or None, tags=list(tags), config=config,
                     dir=str(workdir) if local else tempfile.mkdtemp(prefix="crossbert-wandb-"),
                     settings=wandb.Settings(console="off", silent=True))
  except Exception as e:  # pylint: disable=broad-except
    sink = WandbSink(None, warn)
    sink._fail(e)  # pylint: disable=protected-access
    return None
  mode = getattr(run.settings, "mode", mode)
  if mode in ("offline", "dryrun"):
    where = getattr(run.settings, "sync_dir", None) or str(workdir / "wandb")
    warn(f"W&B: offline run {record['id']} written to {where}; `wandb sync {where}` uploads it")
  elif mode != "disabled":
    warn(f"W&B: {getattr(run, 'url', None) or record['id']}")
  return WandbSink(run, warn)
