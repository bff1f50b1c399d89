"""scaling/ray_host.train without Ray (called in a thread, as a Ray worker calls it): the trainer's exit status,
its output appended to the log, and the driver's stop file turned into SIGTERM (the trainer saves and exits 75)."""

import sys
import threading
import time

from crossbert_jax.scaling import ray_host

# A stand-in trainer: exits 75 on SIGTERM, as the train command does once it has saved.
TRAINER = """
import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("SIGTERM received: saving", flush=True), sys.exit(75)))
pathlib.Path(sys.argv[1]).touch()
time.sleep(float(sys.argv[2]))
print("done", flush=True)
"""


def _train_in_thread(tmp_path, seconds: float) -> tuple[threading.Thread, dict]:
  script = tmp_path / "trainer.py"
  script.write_text(TRAINER)
  result = {}
  cmd = [ray_host.PYTHON, str(script), str(tmp_path / "started"), str(seconds)]
  run = lambda: result.update(
      ray_host.train(cmd, str(tmp_path), str(tmp_path / "run" / "train.log"), str(tmp_path / "run" / "sweep_stop")))
  thread = threading.Thread(target=run)
  thread.start()
  deadline = time.time() + 60
  while not (tmp_path / "started").exists() and time.time() < deadline:
    time.sleep(0.05)
  return thread, result


def test_the_stop_file_sigterms_the_trainer_and_its_exit_status_comes_back(tmp_path):
  thread, result = _train_in_thread(tmp_path, 120)
  (tmp_path / "run" / "sweep_stop").write_text("SIGTERM received\n")
  thread.join(timeout=60)
  assert not thread.is_alive() and result["rc"] == 75, result
  log = (tmp_path / "run" / "train.log").read_text()
  assert log.startswith(f"$ {sys.executable} ") and "SIGTERM received: saving" in log and "done" not in log, log


def test_without_a_stop_the_trainer_runs_to_its_end(tmp_path):
  thread, result = _train_in_thread(tmp_path, 0.5)
  thread.join(timeout=60)
  assert result["rc"] == 0 and "done" in (tmp_path / "run" / "train.log").read_text()
