"""The pre-flight compile: the real train step on the local devices and on a TPU topology (libtpu).

The topology tests run only where libtpu is installed (`make setup-tpu`; `.ci/run` runs them in
.venv-tpu); the local-device tests run everywhere on the 8 fake CPU devices.
"""

import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.perf import aot
from crossbert_jax.training import flops, optimizer, program as program_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
needs_libtpu = pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed (make setup-tpu; .ci/run "
                                  "runs this in .venv-tpu)")


def _tiny(**overrides):
  c = config_lib.get_config("crossbert", "tiny")
  c.unlock()
  for key, value in overrides.items():
    section, name = key.split(".")
    c[section][name] = value
  c.lock()
  return c


def _cli(*args: str) -> subprocess.CompletedProcess:
  env = {
      **os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
      "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
  return subprocess.run([sys.executable, "-m", "crossbert_jax.compile", *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=300)


def _error_lines(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if line.startswith("error:") or line.startswith("Traceback")]


def _check_memory(report, num_devices):
  m = report["memory"]
  for key in ("argument_bytes", "temp_bytes", "output_bytes", "total_bytes"):
    assert isinstance(m[key], int) and m[key] >= 0, key
  assert m["total_bytes"] == (m["argument_bytes"] + m["output_bytes"] - m["alias_bytes"] + m["temp_bytes"] +
                              m["generated_code_bytes"])
  # The donated state comes back in place: every output byte but the metrics aliases an argument
  # (TPU pads each scalar metric to a tile).
  assert 0 <= m["output_bytes"] - m["alias_bytes"] < 64 * 1024
  # Arguments hold this device's shard of the params and of AdamW's two moments (fp32), plus the
  # batch. The CPU layout is dense; TPU pads the minor dims of these tiny arrays to (8, 128) tiles.
  params = aot.shard_bytes(report)
  batch = 3 * 4 * report["batch_size"] * report["seq_len"] // num_devices
  slack = 4096 if report["platform"] == "cpu" else 3 * (3 * params + batch)
  assert 3 * params + batch <= m["argument_bytes"] <= 3 * params + batch + slack
  assert m["temp_bytes"] > 0


def test_local_devices_report_memory_flops_and_the_param_sharding():
  c = _tiny()
  report = aot.compile_train_step(plan_lib.build(c))
  assert report["num_devices"] == 8 and report["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
  _check_memory(report, 8)
  assert report["memory"]["hbm_bytes"] is None and report["memory"]["fits"] is None  # CPU: no HBM.
  assert report["flops"]["analytic_per_device"] == pytest.approx(flops.train_flops_per_step(c) / 8)
  rows = {r["path"]: r for r in report["params"]["table"]}
  emb = rows["encoder/embeddings/tok_embeddings/embedding"]
  assert emb["logical"] == ["vocab", "embed"] and emb["spec"] == ["tensor", "fsdp"]
  assert emb["shard_shape"] == [c.model.vocab_size, c.model.embed_dim // 8]
  assert sum(math.prod(r["shape"]) for r in rows.values()) == report["params"]["total"]
  text = aot.format_report(report)
  assert "temporaries" in text and "encoder/embeddings/tok_embeddings/embedding" in text


def test_a_batch_that_does_not_shard_and_a_mesh_that_does_not_divide_are_user_errors():
  with pytest.raises(UserError, match="train.batch_size.*divisible by mesh data\\*fsdp = 8"):
    aot.compile_train_step(plan_lib.build(_tiny(**{"train.batch_size": 12})))
  with pytest.raises(UserError, match="config mesh"):
    aot.compile_train_step(plan_lib.build(_tiny(**{"mesh.fsdp": 3})))


def test_cli_mesh_that_does_not_divide_exits_2_with_one_line(command):
  r = command("crossbert_jax.compile", "--config=configs/crossbert.py:tiny", "--config.mesh.fsdp=3")
  assert r.returncode == 2, r.stderr[-2000:]
  assert _error_lines(r.stderr) == [line for line in _error_lines(r.stderr) if "config mesh" in line]
  assert len(_error_lines(r.stderr)) == 1


def test_an_existing_out_file_is_replaced_only_with_force(tmp_path, command):
  """`--out` an earlier report: one line before any compile, the file as it was; --force replaces it
  (the phases test below)."""
  out = tmp_path / "compile.json"
  out.write_text("earlier results")
  r = command("crossbert_jax.compile", "--config=configs/crossbert.py:tiny", f"--out={out}")
  assert r.returncode == 2, r.stderr[-2000:]
  assert _error_lines(r.stderr) == [
      f"error: --out {out}: {out} exists (earlier results): choose a new path, "
      "or pass --force to replace it"]
  assert out.read_text() == "earlier results" and "compiled in" not in r.stdout


def test_an_unknown_generation_is_named_with_libtpu_or_without():
  with pytest.raises(
      UserError, match=r"^--topology=v9:2x2: unknown TPU generation 'v9'; use one of v2, v3, v4, "
      r"v5e, v5p, v5, v6e, tpu7x, e\.g\. v5p:4x4x8"):
    aot.topology_devices("v9:2x2")


def test_config_files_that_fail_are_one_line_naming_the_file(tmp_path, command):
  """A --config file with no get_config, one that adds a key the schema lacks, one whose code fails."""
  files = {
      "none.py": "x = 1\n", "adds.py": "from crossbert_jax.core import config\ndef get_config(v='tiny'):\n"
                                       "  c = config.get_config('crossbert', v)\n  c.model.nope = 1\n  return c\n",
      "fails.py": "import os\ndef get_config(v='tiny'):\n  return os.get_config()\n"}
  lines = {}
  for name, text in files.items():
    (tmp_path / name).write_text(text)
    r = command("crossbert_jax.compile", f"--config={tmp_path / name}:tiny")
    assert r.returncode == 2 and "Traceback" not in r.stderr, (name, r.stderr[-2000:])
    (lines[name],) = r.stderr.strip().splitlines()
  assert lines["none.py"] == (f"error: --config file {tmp_path / 'none.py'} defines no get_config: add `def "
                              "get_config(variant)` returning crossbert_jax.core.config.get_config(objective, "
                              "variant), as configs/crossbert.py does")
  assert lines["adds.py"].startswith("error: unknown config key 'nope' (set by the --config file); ")
  assert lines[
      "fails.py"] == "error: could not load --config: AttributeError: module 'os' has no attribute 'get_config'"


@pytest.mark.skipif(HAS_LIBTPU, reason="checks the message when libtpu is absent")
def test_without_libtpu_a_topology_says_how_to_install_it():
  with pytest.raises(UserError, match="libtpu is not installed.*make setup-tpu"):
    aot.topology_devices("v5p:2x2x2")


def test_hbm_table_lookup():
  class Kind:
    platform = "tpu"

    def __init__(self, kind):
      self.device_kind = kind

    def memory_stats(self):
      raise RuntimeError("compile-only device")

  assert aot.hbm_bytes(Kind("TPU v5")) == 95 * aot.GIB
  assert aot.hbm_bytes(Kind("TPU v5 lite")) == 16 * aot.GIB
  assert aot.hbm_bytes(Kind("NVIDIA A100-SXM4-80GB")) == 80 * aot.GIB
  assert aot.hbm_bytes(Kind("NVIDIA GH200 480GB")) == 96 * aot.GIB
  assert aot.hbm_bytes(Kind("Unknown chip")) is None
  assert aot.hbm_bytes(jax.devices()[0]) is None  # CPU.


@pytest.mark.integration  # The compile command's subprocess smoke test (its real argv, exit status and stderr).
@needs_libtpu
def test_topology_tiny_compiles_for_v5p_2x2x2_and_reports_memory(tmp_path):
  out = tmp_path / "compile.json"
  r = _cli("--config=configs/crossbert.py:tiny", "--topology=v5p:2x2x2", f"--out={out}")
  assert r.returncode == 0, r.stderr[-3000:]
  assert not r.stderr, r.stderr[-3000:]  # libtpu's start-up lines (no metadata server here) are silenced.
  report = json.loads(out.read_text())
  assert report["platform"] == "tpu" and report["device_kind"] == "TPU v5" and report["num_devices"] == 8
  _check_memory(report, 8)
  assert report["memory"]["hbm_bytes"] == 95 * aot.GIB and report["memory"]["fits"] is True
  assert report["flops"]["xla_per_device"] > 0
  assert "total" in r.stdout and "fits" in r.stdout and "per-device shard" in r.stdout


@pytest.mark.integration
@needs_libtpu
def test_topology_oversized_batch_exits_2_with_one_line():
  # 2^20 sequences on 4 v5e chips (16 GiB each): XLA's memory planner rejects it at compile time.
  r = _cli("--config=configs/crossbert.py:tiny", "--topology=v5e:2x2", "--config.train.batch_size=1048576")
  assert r.returncode == 2, r.stderr[-3000:]
  errors = _error_lines(r.stderr)
  assert r.stderr.splitlines() == errors
  assert len(errors) == 1 and "does not fit on v5e:2x2" in errors[0] and "RESOURCE_EXHAUSTED" in errors[0], errors
  assert "--config.model.remat=full" in errors[0]


@pytest.mark.parametrize("objective", ["crossbert", "mlm"])
def test_pod_variants_compute_in_bf16_with_scan_and_full_remat_and_keep_fp32_state(objective):
  for variant in ("base", "large"):
    c = config_lib.get_config(objective, variant)
    assert (c.model.dtype, c.model.scan_layers, c.model.remat) == ("bfloat16", True, "full"), variant
  state = jax.eval_shape(lambda k: program_lib.create_state(c, optimizer.make_optimizer(c.train), k), jax.random.key(0))
  dtypes = {str(x.dtype) for x in jax.tree.leaves((state.params, state.opt_state)) if x.ndim}
  assert dtypes == {"float32"}  # Params and AdamW moments stay fp32; only the compute is bf16.
  small = config_lib.get_config(objective, "small").model
  assert (small.dtype, small.scan_layers, small.remat) == ("float32", False, "none")


@pytest.mark.integration  # The compile command's subprocess smoke test on CPU (the topology ones need libtpu).
def test_every_phase_is_compiled_and_reported_one_row_each(tmp_path):
  out = tmp_path / "compile.json"
  out.write_text("an earlier report")  # Replaced: --force.
  # The recipe without its ramp stair (one compile less): 160 steps of 16 x 64, 40 of 8 x 128.
  r = _cli("--config=configs/crossbert.py:tiny_recipe", "--config.train.batch_ramp.start=0", f"--out={out}",
           "--print_params=False", "--force")
  assert r.returncode == 0, r.stderr[-3000:]
  report = json.loads(out.read_text())
  rows = report["phases"]
  assert [(x["phase"], x["first_step"], x["last_step"], x["batch_size"], x["seq_len"]) for x in rows] == [
      (0, 1, 160, 16, 64), (1, 161, 200, 8, 128)]
  assert all(x["total_bytes"] > 0 and x["temp_bytes"] > 0 and x["error"] is None for x in rows)
  # The 128-token phase needs the most temporaries; the details printed above the table are its.
  assert rows[1]["temp_bytes"] > rows[0]["temp_bytes"] and report["seq_len"] == 128
  table = r.stdout[r.stdout.index("phases ("):].splitlines()
  assert [line.split()[:4] for line in table[3:5]] == [["0", "1-160", "16", "x"], ["1", "161-200", "8", "x"]]
  # A phase that does not fit is refused naming it (as on a chip with less memory than the step needs).
  report["phases"][1].update(fits=False)
  report["memory"]["hbm_bytes"] = rows[1]["total_bytes"] // 2
  with pytest.raises(UserError, match=r"phase 1 \(steps 161-200, batch 8 x L=128\): the train step needs"):
    aot.check_fits(report, config_lib.get_config("crossbert", "tiny"))


def test_a_phase_whose_batch_does_not_shard_is_refused_before_any_compile(monkeypatch):
  """The 8,192-token phase's batch is checked with the others' before the first (slow) compile."""
  import importlib.util as util
  spec = util.spec_from_file_location("recipes", ROOT / "configs" / "crossbert.py")
  recipes = util.module_from_spec(spec)
  spec.loader.exec_module(recipes)
  c = recipes.get_config("tiny_recipe")
  c.train.phases = (c.train.phases[0], {**c.train.phases[1], "train.batch_size": 4})  # 4 rows on 8 devices.

  def compiled(*args, **kwargs):
    raise AssertionError("a phase was compiled before every phase's batch was checked")

  monkeypatch.setattr(aot, "_compile_one", compiled)
  assert len(jax.devices()) == 8
  with pytest.raises(
      UserError, match=r"must be divisible by mesh data\*fsdp = 8 \(in phase 2 \(steps 161-200, "
      r"batch 4 x L=128\)\)"):
    aot.compile_train_step(plan_lib.build(c))
