"""tools/fault_inject.py's arguments: a bad --init_from is refused in one line, exit 2, before the workdir is
cleared."""

import sys

import pytest

from tools import fault_inject


@pytest.mark.parametrize("args,message", [
    (["--command=contrast", "--init_from={tmp}/nowhere"], "is not a pretraining run or import"),
    (["--command=contrast"], "is not a pretraining run or import"),
    (["--init_from={tmp}"], "--init_from is for --command=contrast"),])
def test_bad_init_from_is_refused_and_the_workdir_kept(tmp_path, monkeypatch, capsys, args, message):
  workdir = tmp_path / "fi"
  workdir.mkdir()
  (workdir / "keep").write_text("a file of an earlier run")
  argv = ["fault_inject.py", f"--workdir={workdir}", *(a.format(tmp=tmp_path) for a in args)]
  monkeypatch.setattr(sys, "argv", argv)
  assert fault_inject.main() == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("fault_inject: ") and message in err, err
  assert (workdir / "keep").read_text() == "a file of an earlier run"


def test_the_runs_see_one_cpu_device_and_keep_the_callers_other_xla_flags(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0")
  env = fault_inject.one_cpu_env()
  assert env["XLA_FLAGS"] == "--xla_backend_optimization_level=0" and env["JAX_PLATFORMS"] == "cpu"
