"""The README's tour, run as written, in order, in a folder laid out like a fresh clone (tests/tour.py).

Each command is the README's own line; only the flags in tour.SMALLER are appended (fewer steps and
examples), so a renamed flag, a config that refuses the tokenizer or a missing input fails here.
The TPU compile line runs in `make test-tpu` (tests/unit/test_compile.py), where libtpu is installed.
"""

import json
import pathlib
import shlex

import pytest

from tests.tour import module_of, tour_commands

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_tour_is_the_commands_this_test_runs():
  """What the test below runs and skips is exactly the README's block (fast: no command runs)."""
  commands = tour_commands((ROOT / "README.md").read_text())
  assert commands[0] == "source .venv/bin/activate" and "make setup-tpu" in commands
  modules = [module_of(shlex.split(c)) for c in commands if c.startswith("python ")]
  assert modules == [
      "crossbert_jax.tokenizer", "crossbert_jax.prepare", "crossbert_jax.train", "crossbert_jax.train",
      "crossbert_jax.evaluate", "tools/mteb_local_data.py", "crossbert_jax.mteb_eval", "crossbert_jax.export",
      "crossbert_jax.sweep", "crossbert_jax.report"]
  compile_line = [c for c in commands if "crossbert_jax.compile" in c]
  assert len(compile_line) == 1 and compile_line[0].startswith("JAX_PLATFORMS=cpu .venv-tpu/bin/python -m ")


def test_the_tours_tpu_compile_fits_its_topology():
  """The compile line's config and topology agree (mesh, param and batch divisibility over its chips),
  checked on an abstract mesh here; the compile itself needs libtpu (about 5 min on 2 cores)."""
  import importlib.util
  import math

  from jax.sharding import AbstractMesh, AxisType

  from crossbert_jax.training import program, sharding

  line = next(c for c in tour_commands((ROOT / "README.md").read_text()) if "crossbert_jax.compile" in c)
  flags = dict(a[2:].split("=", 1) for a in shlex.split(line) if a.startswith("--"))
  path, variant = flags["config"].split(":")
  spec = importlib.util.spec_from_file_location("tour_config", ROOT / path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(variant)
  chips = math.prod(int(n) for n in flags["topology"].split(":")[1].split("x"))
  mesh = AbstractMesh(sharding.mesh_shape(c.mesh, chips), sharding.MESH_AXES, axis_types=(AxisType.Auto,) * 3)
  program.param_shardings(c, mesh, sharding.logical_rules(c.mesh))
  micro = c.train.batch_size // c.train.grad_accum
  assert micro % (mesh.shape["data"] * mesh.shape["fsdp"]) == 0, (micro, dict(mesh.shape))


@pytest.mark.slow
@pytest.mark.xdist_group("tour_clone")  # One worker makes the session's clone for both.
def test_readme_tour_runs_as_written(tour_clone):
  """The session's `tour_clone` ran every tour command (a failing one fails here, by its line); what they wrote.
  The docs commands test goes on in the same clone and leaves these outputs as they are."""
  runs = tour_clone / "runs"
  record = json.loads((runs / "cb" / "eval_results.json").read_text())
  assert record["step"] == 12 and "stsb/cosine/test/spearman" in record["scores"]
  card = (runs / "cb_hf" / "README.md").read_text()
  assert "Frozen probes (`python -m crossbert_jax.evaluate`) at step 12" in card
  table = json.loads((runs / "mteb" / "mteb_table.json").read_text())
  assert len(table["tasks"]) == 41
  assert (runs / "reports" / "tour" / "report.md").is_file()
