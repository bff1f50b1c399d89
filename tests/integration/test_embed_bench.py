"""embed_bench end to end on a tiny run and its export: bad options and an earlier --out refused before
any work, another model's export refused before any timing, the run's own export timed and written."""

import json
import shutil

from tests.helpers import run_command, run_module


def _embed_bench(workdir, hf, *flags, in_process=False):
  """The command as a subprocess (its smoke test below), or `in_process` (tests/helpers.py's run_command)."""
  args = ["crossbert_jax.embed_bench", f"--workdir={workdir}", f"--hf={hf}", "--texts=40", "--max_length=64", *flags]
  return run_command(*args) if in_process else run_module(args, check=False)


def _refused(proc, line: str) -> None:
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines() == [line], proc.stderr[-2000:]


def test_bad_options_and_an_earlier_out_are_one_line_before_any_work(tmp_path):
  """Checked before the run is read: no run is needed."""
  run_dir = tmp_path / "run"
  earlier = tmp_path / "ok.json"
  earlier.write_text("earlier results")
  _refused(_embed_bench(run_dir, tmp_path, "--st_batch_size=0", in_process=True),
           "error: --st_batch_size=0: give at least 1")
  _refused(_embed_bench(run_dir, tmp_path, "--texts=-3", in_process=True), "error: --texts=-3: give at least 1")
  _refused(
      _embed_bench(run_dir, tmp_path, f"--out={earlier}", in_process=True),
      f"error: --out {earlier}: {earlier} exists (earlier results): choose a new path, or pass --force to "
      "replace it")
  proc = _embed_bench(run_dir, tmp_path, f"--out={tmp_path}", in_process=True)
  assert proc.returncode == 2 and proc.stderr.strip().startswith("error: --out"), proc.stderr[-2000:]
  assert earlier.read_text() == "earlier results"


def test_another_models_export_is_refused_and_the_runs_own_is_timed(tiny_run, tmp_path):
  """An export whose final norm is 1% off (another model of the same shape) is one line before any timing;
  the run's own export is timed, its parity recorded, and an earlier --out replaced with --force. The export and
  the refusal run in process (run_command); the timed run is the command's one subprocess smoke test."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from safetensors import numpy as st_numpy  # pylint: disable=g-import-not-at-top

  own, other = tmp_path / "hf", tmp_path / "other"
  run_command("crossbert_jax.export", f"--workdir={tiny_run}", f"--output={own}", check=True)
  shutil.copytree(own, other)
  tensors = st_numpy.load_file(other / "model.safetensors")
  tensors["final_norm.weight"] = tensors["final_norm.weight"] * np.float32(1.01)
  st_numpy.save_file(tensors, other / "model.safetensors", metadata={"format": "pt"})
  proc = _embed_bench(tiny_run, other, in_process=True)
  assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
  assert proc.stderr.startswith(f"error: --hf={other} is not this run's export: its embeddings of 40 texts differ "
                                "from --workdir's by up to "), proc.stderr
  assert "texts/s" not in proc.stdout and "ours_s" not in proc.stdout

  out = tmp_path / "bench.json"
  out.write_text("earlier results")
  proc = _embed_bench(tiny_run, own, f"--out={out}", "--force")
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(out.read_text())
  assert result["texts"] == 40 and result["ours_texts_per_s"] > 0 and result["st_texts_per_s"] > 0
  assert result["parity_max_abs_diff"] <= 1e-4 and result["max_abs_diff"] <= 1e-4
