"""The suite's tiers (tests/conftest.py): each test carries its folder's marker unless it names one, a
unit-tier test that starts a process or trains fails by name, every test has its tier's time limit, and
a command's main runs in-process as its CLI would (tests/helpers.py's run_main)."""

import signal
import subprocess

import pytest

from crossbert_jax.run import trainer


def test_a_test_carries_its_folders_tier_and_time_limit(request):
  assert request.node.get_closest_marker("unit") is not None
  assert request.node.get_closest_marker("integration") is None
  assert request.node.get_closest_marker("timeout").args == (300,)  # conftest.TIMEOUTS


def test_a_unit_test_that_starts_a_process_fails_by_name(request):
  with pytest.raises(pytest.fail.Exception) as e:
    subprocess.run(["true"], check=True)
  assert str(e.value).startswith(f"{request.node.nodeid} starts a subprocess (true): the unit tier starts no process")
  assert "move the test to tests/integration" in str(e.value)


def test_a_unit_test_that_trains_fails_by_name(request, tmp_path):
  run = trainer.Trainer.__new__(trainer.Trainer)  # Trainer.train is refused before it reads anything.
  run.workdir = tmp_path
  with pytest.raises(pytest.fail.Exception, match=f"^{request.node.nodeid} trains \\({tmp_path}\\): the unit tier"):
    run.train()


@pytest.mark.integration
def test_a_test_that_names_its_tier_may_start_a_process(request):
  assert request.node.get_closest_marker("unit") is None
  assert request.node.get_closest_marker("timeout").args == (900,)
  assert subprocess.run(["true"], check=True).returncode == 0


def test_a_command_runs_in_process_as_its_cli(command, tmp_path):
  """A bad flag and a bad config key are one line and exit 2 (the flag parser's); the flags are reset
  after, so the next call (another command sharing --config) parses afresh."""
  proc = command("crossbert_jax.compile", "--config=configs/crossbert.py:tiny", "--nope=1")
  assert proc.returncode == 2 and proc.stderr.startswith("error: Unknown command line flag 'nope'"), proc.stderr
  proc = command("crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={tmp_path}",
                 "--config.model.nope=1")
  assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
  assert proc.stderr.startswith("error: unknown config key 'nope' in the override --config.model.nope"), proc.stderr
  assert not list(tmp_path.iterdir())


def test_a_checked_command_that_fails_fails_the_test(command, tmp_path):
  with pytest.raises(pytest.fail.Exception, match="unknown config key 'nope'"):
    command("crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={tmp_path}",
            "--config.model.nope=1", check=True)


def test_the_signal_handlers_a_command_installs_are_undone(command, tmp_path, monkeypatch):
  """A command that takes over SIGTERM and SIGINT (the sweep's driver does) leaves this process's own handlers."""
  (tmp_path / "takes_signals.py").write_text("import signal\n\n\ndef main(argv):\n"
                                             "  signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                             "  signal.signal(signal.SIGINT, signal.SIG_IGN)\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  # This process's own handlers, set here: a shell that starts the suite in the background ignores SIGINT already.
  own = lambda signum, frame: None
  saved = {s: signal.signal(s, own) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    assert command("takes_signals").returncode == 0
    assert {s: signal.getsignal(s) for s in saved} == {s: own for s in saved}
  finally:
    for s, handler in saved.items():
      signal.signal(s, handler)


@pytest.mark.xdist_group("tiers_probe")
def test_an_xdist_group_reaches_the_scheduler(request):
  """Under `--dist loadgroup` (every tier's `WORKERS=2`), a grouped test's node id carries '@group', which is what
  sends the group to one worker (the README tour and the docs commands test share one session clone that way);
  pytest 9.2 had dropped xdist 3.8's suffix, and both workers ran the tour (conftest.py)."""
  if not getattr(request.config.option, "loadgroup", False):
    pytest.skip("not on an xdist worker with --dist loadgroup (WORKERS=1)")
  assert request.node.nodeid.endswith("@tiers_probe"), request.node.nodeid
