"""tools/peer_modernbert.py (the accelerator check's peer) at a tiny shape on the CPU, when torch is here."""

import importlib.util
import json

import pytest

from crossbert_jax.training import flops, program
from tests import helpers

pytest.importorskip("torch")
pytest.importorskip("transformers")


def _peer():
  spec = importlib.util.spec_from_file_location("peer_modernbert", helpers.ROOT / "tools" / "peer_modernbert.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_peer_trains_our_shape_and_counts_our_flops(tmp_path):
  peer = _peer()
  out = tmp_path / "peer.json"
  assert peer.main([
      f"--out={out}", "--shape=tiny", "--batch=2", "--seq_len=64", "--steps=2", "--warmup=1", "--compile=eager",
      "--device=cpu"]) == 0
  report = json.loads(out.read_text())
  row = report["variants"]["sdpa"]
  assert row["median_step_s"] > 0 and row["tokens_per_s"] == pytest.approx(2 * 64 / row["median_step_s"])
  assert row["mfu"] is None and report["chip"] is None  # No peak known for a CPU.
  assert report["variants"]["flash_attention_2"] == {"skipped": "flash_attn is not installed"}
  assert report["best"] == "sdpa" and report["best_tokens_per_s"] == row["tokens_per_s"]
  # The same model as ours: the same parameter count as our MLM model at this shape and layer pattern,
  # and the FLOPs per step are our formula's for it.
  ours = peer.our_plan("tiny", 2, 64)
  assert ours.model.global_every == 3 and ours.objective == "mlm"
  assert row["params"] == flops.param_counts(program.abstract_params(ours))["total"]
  assert report["train_flops_per_step"] == flops.train_flops_per_step(ours)
  assert 6.0 < row["loss"] < 8.0  # About log(1024) at init.


def test_a_bad_option_is_one_line_and_exit_2(tmp_path, capsys):
  peer = _peer()
  assert peer.main([f"--out={tmp_path / 'p.json'}", "--compile=jit"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: --compile=jit") and not (tmp_path / "p.json").exists()
