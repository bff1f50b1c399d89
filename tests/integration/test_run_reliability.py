"""The training run's refusals and reports (issues 49 and 54): resume against filled-in defaults, W&B
without a login on a terminal and offline, profile.hosts and a window cut short or over a save, a
damaged goodput.json, hooks checked where made, step times and the ETA without the save or compile,
and `compile`'s progress lines through a file. In process, except where the terminal or the
process's own stdout is the point."""

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.run import goodput, hooks as hooks_lib, metrics, profile, resume, trainer, wandb_logger
from tests.helpers import ROOT, cpu_env


def _tiny(spm_model: str, **keys):
  c = config_lib.get_config("crossbert", "tiny")
  with c.unlocked():
    c.data.tokenizer, c.model.vocab_size = spm_model, 512
    c.train.steps, c.train.warmup_steps = 4, 1
    c.metrics.progress_bar = c.metrics.tensorboard = False
    for key, value in keys.items():
      section, name = key.split(".")
      c[section][name] = value
  return c


# -- Resume: a key the saved config lacks is compared at its filled-in default ---------------------


def test_resume_refuses_a_change_of_a_key_the_checkpoint_predates_as_of_one_it_holds(spm_model):
  """A checkpoint written before masking.exclude_special existed ran with today's default (True):
  resuming with False is refused in the same words as when its config holds the key."""
  saved = _tiny(spm_model).to_dict()
  now = plan_lib.build(_tiny(spm_model, **{"masking.exclude_special": False}))
  old = json.loads(json.dumps(saved))
  del old["masking"]["exclude_special"]
  errors = []
  for config in (saved, old):
    with pytest.raises(
        UserError, match=r"made with masking\.exclude_special=True \(config: False\); these cannot "
        r"change on resume") as e:
      resume.check("runs/x", 2, config, None, now, {}, 1)
    errors.append(str(e.value))
  assert errors[0] == errors[1]
  # Unchanged, it resumes silently: the filled-in default equals the config's.
  assert resume.check("runs/x", 2, old, None, plan_lib.build(_tiny(spm_model)), {}, 1) == ([], True)


# -- W&B ------------------------------------------------------------------------------------------


def _no_login_env(tmp_path, **extra) -> dict[str, str]:
  """No W&B credentials: no key, an empty home and W&B config folder, no mode."""
  home = tmp_path / "home"
  (home / "wandb").mkdir(parents=True)
  env = cpu_env(HOME=str(home), WANDB_CONFIG_DIR=str(home / "wandb"), WANDB_DIR=str(tmp_path), **extra)
  for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_SILENT", "NETRC", "WANDB_IDENTITY_TOKEN_FILE"):
    env.pop(key, None)
  env.update(extra)
  return env


def test_wandb_without_a_login_on_a_terminal_warns_once_and_goes_on_without_prompting(tmp_path, spm_model):
  """On a real pseudo-terminal (where wandb.init would ask "Enter your choice" and wait), with no
  credentials and not offline: W&B's start is one warning line and no W&B run (the trainer goes on
  without it, as without a terminal); nothing is asked. The process's terminal is the point."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  script = (f"from crossbert_jax.core import config, plan\n"
            f"from crossbert_jax.run import wandb_logger\n"
            f"c = config.get_config('crossbert', 'tiny')\n"
            f"c.metrics.wandb, c.data.tokenizer, c.model.vocab_size = True, {spm_model!r}, 512\n"
            f"sink = wandb_logger.start(plan.build(c), __import__('etils').epath.Path({str(workdir)!r}), print)\n"
            f"print('sink:', sink)\n")
  main, child = pty.openpty()
  proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=_no_login_env(tmp_path), stdin=child,
                          stdout=child, stderr=child, start_new_session=True)
  os.close(child)
  out, deadline = b"", time.monotonic() + 240
  try:
    while time.monotonic() < deadline and b"Enter your choice" not in out:
      ready, _, _ = select.select([main], [], [], 1.0)
      if ready:
        try:
          chunk = os.read(main, 4096)
        except OSError:  # The terminal closed: the process exited.
          break
        if not chunk:
          break
        out += chunk
      elif proc.poll() is not None:
        break
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
    rc = proc.wait()
    os.close(main)
  text = out.decode(errors="replace")
  assert "Enter your choice" not in text, f"W&B prompted on the terminal:\n{text[-2000:]}"
  assert rc == 0, f"exit {rc}:\n{text[-2000:]}"
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  assert lines == [
      "warning: config metrics.wandb=True but W&B has no login (WANDB_API_KEY or `wandb login`) and is not offline "
      "(WANDB_MODE=offline); training goes on without W&B", "sink: None"], text[-2000:]
  assert not (workdir / "wandb").exists()


def test_wandb_offline_says_where_the_run_is_and_how_to_upload_it(tmp_path, spm_model, monkeypatch):
  """WANDB_MODE=offline: one line at the start naming the offline run's folder and `wandb sync` for it."""
  import wandb  # pylint: disable=g-import-not-at-top
  home = tmp_path / "home"
  (home / "wandb").mkdir(parents=True)
  for key, value in dict(HOME=str(home), WANDB_CONFIG_DIR=str(home / "wandb"), WANDB_MODE="offline",
                         WANDB_SILENT="true").items():
    monkeypatch.setenv(key, value)
  monkeypatch.delenv("WANDB_API_KEY", raising=False)
  wandb.teardown()  # The W&B settings of this process are read from the environment at its first setup.
  workdir = tmp_path / "run"
  workdir.mkdir()
  lines = []
  try:
    sink = wandb_logger.start(plan_lib.build(_tiny(spm_model, **{"metrics.wandb": True})), workdir, lines.append)
    assert sink is not None
    sink.log(1, {"loss": 1.0})
    sink.close()
  finally:
    wandb.teardown()
  assert len(lines) == 1, lines
  offline = next((workdir / "wandb").glob("offline-run-*"))
  assert lines[0] == f"W&B: offline run {offline.name.split('-')[-1]} written to {offline}; `wandb sync {offline}` " \
                     "uploads it"


def test_a_wandb_project_with_a_slash_is_refused_up_front(spm_model):
  with pytest.raises(UserError) as e:
    plan_lib.build(_tiny(spm_model, **{"metrics.wandb": True, "metrics.wandb_project": "team/proj"}))
  assert str(e.value) == ("config metrics.wandb_project: 'team/proj' holds /: give the team as "
                          "metrics.wandb_entity='team' and the project as metrics.wandb_project='proj'")
  with pytest.raises(UserError, match=r"'a#b' holds #: W&B project names cannot hold"):
    plan_lib.build(_tiny(spm_model, **{"metrics.wandb": True, "metrics.wandb_project": "a#b"}))
  plan_lib.build(_tiny(spm_model, **{"metrics.wandb_project": "team/proj"}))  # W&B off: not read.


# -- Profile --------------------------------------------------------------------------------------


def test_profile_hosts_beyond_the_runs_processes_are_refused_before_any_work(tmp_path, spm_model):
  c = _tiny(spm_model, **{"profile.start_step": 2, "profile.steps": 1, "profile.hosts": "0,99"})
  workdir = tmp_path / "run"
  with pytest.raises(UserError) as e:
    trainer.run(plan_lib.build(c), str(workdir))
  assert str(e.value) == ("config profile.hosts: '0,99' names process 99, but this run has 1 process(es) (0-0): "
                          "name those, or 'all'")
  assert not workdir.exists()


def test_a_profile_window_cut_by_stop_at_step_or_over_a_save_is_said_and_what_was_traced_is_summarised(
    tmp_path, spm_model, capsys):
  """Window 3-5, the run stops after step 4 (train.stop_at_step), a save at step 3: a warning names the
  save (and a window clear of it); the trace of steps 3-4 is written, summarised and recorded."""
  c = _tiny(
      spm_model, **{
          "train.steps": 6, "train.stop_at_step": 4, "checkpoint.every_steps": 3, "profile.start_step": 3,
          "profile.steps": 3})
  workdir = tmp_path / "run"
  trainer.run(plan_lib.build(c), str(workdir))
  out, err = capsys.readouterr()
  assert ("warning: the profile window 3-5 overlaps a checkpoint save (step 3): the trace counts their time as "
          "the steps'") in err
  assert ("profile: this start ends at step 4 (train.steps / train.stop_at_step), inside the window 3-5: traces "
          "steps 3-4 only") in out
  assert "profile: traced steps 3-4 into" in out and "steps 3-4" in out.split("profile: traced steps 3-4")[1]
  assert profile.read_record(workdir) == [3, 4]
  assert list((workdir / "profile").rglob("*.xplane.pb"))


def test_a_stop_inside_the_profile_window_ends_the_trace_there(tmp_path, spm_model):
  """A run that stops inside the window (here a signal at step 3): the trace of the steps done is
  stopped, summarised and recorded, not dropped."""
  c = _tiny(spm_model, **{"train.steps": 6, "checkpoint.every_steps": 100, "profile.start_step": 2, "profile.steps": 4})

  def stop_at_3(info: hooks_lib.StepInfo) -> None:
    if info.step == 2:
      os.kill(os.getpid(), signal.SIGTERM)  # Seen by the next step's stop check: the run stops at step 3.

  workdir = tmp_path / "run"
  result = trainer.run(plan_lib.build(c), str(workdir), hooks=[hooks_lib.Hook("stop", 1, stop_at_3)])
  assert result["status"] == "stopped" and result["step"] == 3, result
  assert profile.read_record(workdir) == [2, 3]


# -- Goodput --------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["[]", "null", '{"attempts": 3}', "{not json"])
def test_a_damaged_goodput_file_is_warned_of_and_recounted(tmp_path, damage):
  (tmp_path / goodput.GOODPUT_FILE).write_text(damage)
  lines = []
  ledger = goodput.Ledger(tmp_path, time.time() - 2.0, True, warn=lines.append)
  ledger.step(1, 0.5, None)
  assert len(lines) == 1 and lines[0].startswith(f"warning: {tmp_path / goodput.GOODPUT_FILE} ") and (
      "goodput is recounted afresh; the file is kept as goodput.json.damaged") in lines[0]
  assert ledger.totals("finished")["productive"] == pytest.approx(0.5)
  ledger.write("finished")
  assert [a["status"] for a in goodput.read(tmp_path)] == ["finished"]
  assert (tmp_path / "goodput.json.damaged").read_text() == damage


def test_a_goodput_attempt_without_its_numbers_is_dropped_and_the_others_kept(tmp_path):
  good = {"start": 1.0, "end": 5.0, "status": "stopped", "seconds": {"productive": 3.0, "startup": 1.0}}
  (tmp_path / goodput.GOODPUT_FILE).write_text(json.dumps({"attempts": [good, {"start": 6.0, "status": "running"}]}))
  lines = []
  ledger = goodput.Ledger(tmp_path, time.time(), True, warn=lines.append)
  assert len(lines) == 1 and "has 1 of 2 attempt(s) without their numbers: goodput is recounted from its 1 good" \
                             " attempt(s) on" in lines[0]
  assert ledger.totals("finished")["productive"] == pytest.approx(3.0)


def test_a_run_over_a_null_goodput_file_trains_and_rewrites_it(tmp_path, spm_model, capsys):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / goodput.GOODPUT_FILE).write_text("null")
  result = trainer.run(plan_lib.build(_tiny(spm_model, **{"train.steps": 2})), str(workdir))
  assert result["status"] == "finished" and result["goodput_line"].startswith("goodput ")
  assert sum("goodput.json" in line for line in capsys.readouterr().err.splitlines()) == 1
  assert [a["status"] for a in goodput.read(workdir)] == ["finished"]


# -- Hooks ----------------------------------------------------------------------------------------


def test_a_hook_that_could_never_run_as_meant_is_refused_where_it_is_made(tmp_path, spm_model):
  fn = lambda info: None
  with pytest.raises(ValueError, match=r"Hook 'h': every must be >= 0 \(steps; 0: never\), got -2"):
    hooks_lib.Hook("h", -2, fn)
  with pytest.raises(TypeError, match=r"Hook 'h': every must be an int .*got '2' \(str\)"):
    hooks_lib.Hook("h", "2", fn)
  with pytest.raises(TypeError, match=r"every must be an int"):
    hooks_lib.Hook("h", True, fn)
  t = trainer.Trainer.__new__(trainer.Trainer)  # add_hook needs only the hook list, not a run.
  t.hooks = []
  with pytest.raises(ValueError, match=r"got -2"):
    t.add_hook(fn, every=-2, name="h")
  assert t.hooks == []
  workdir = tmp_path / "run"
  with pytest.raises(TypeError, match=r"run's hooks must be hooks\.Hook"):
    trainer.run(plan_lib.build(_tiny(spm_model)), str(workdir), hooks=[fn])
  assert not workdir.exists()


# -- Step times and the ETA -----------------------------------------------------------------------


def test_the_step_after_a_save_and_a_hook_is_timed_without_them_and_the_eta_without_the_compile(
    tmp_path, spm_model, capsys):
  """Step 2 runs a 3 s hook and saves (its first checked save compiles the loss check): neither step 2's
  nor step 3's step_time holds them. The bar shows no ETA at step 1 (it compiled), one from the steps after."""
  c = _tiny(spm_model, **{"checkpoint.every_steps": 2, "metrics.progress_bar": True})
  workdir = tmp_path / "run"
  trainer.run(plan_lib.build(c), str(workdir), hooks=[hooks_lib.Hook("slow", 2, lambda info: time.sleep(3.0))])
  rows = {r["step"]: r for r in metrics.read_metrics(str(workdir)) if "step_time" in r}
  assert rows[2]["step_time"] < 2.5 and rows[3]["step_time"] < 2.5, {s: r["step_time"] for s, r in rows.items()}
  bar = capsys.readouterr().err.replace("\r", "\n").splitlines()
  at = lambda step: [line for line in bar if f" {step}/4 [" in line]
  assert at(1) and all("eta" not in line and "<" not in line for line in at(1)), at(1)
  assert any("eta=" in line for line in at(3)), at(3)


# -- compile's progress through a file ------------------------------------------------------------


def test_compile_progress_reaches_a_file_while_it_compiles(tmp_path):
  """stdout to a file is block-buffered: the progress lines are flushed, so they are there before the
  report (which follows the compile)."""
  out = tmp_path / "compile.out"
  cmd = [sys.executable, "-m", "crossbert_jax.compile", "--config=configs/crossbert.py:tiny", "--print_params=False"]
  with open(out, "w") as f:
    proc = subprocess.Popen(cmd, cwd=ROOT, env=cpu_env(JAX_COMPILATION_CACHE_DIR=""), stdout=f, stderr=subprocess.PIPE,
                            text=True)
  seen_early, deadline = None, time.monotonic() + 300
  while proc.poll() is None and time.monotonic() < deadline:
    text = out.read_text()
    if "compiling" in text and seen_early is None:
      seen_early = "memory" not in text.lower()  # The report (memory table) not yet written.
    time.sleep(0.05)
  if proc.poll() is None:
    proc.kill()
  err = proc.communicate()[1]
  assert proc.returncode == 0, err[-2000:]
  text = out.read_text()
  assert text.startswith("compile: lowering the train step (batch 16 x L=64) for 1 local cpu device(s)\n"
                         "compile: lowered in "), text[:500]
  assert seen_early, "the progress lines reached the file only with the report"
