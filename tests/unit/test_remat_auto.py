"""model.remat="auto": the least recomputation whose compiled train step fits the memory budget."""

import jax
import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.model import layers
from crossbert_jax.perf import aot
from crossbert_jax.training import memory, program, sharding

GIB = memory.GIB


def _plan(budget_gib: float = 0.0, remat: str = "auto") -> plan_lib.RunPlan:
  c = config_lib.get_config("crossbert", "tiny")
  c.unlock()
  c.model.num_layers, c.model.scan_layers = 4, True  # Scanned, as the pod variants.
  c.model.remat, c.model.memory_budget_gib = remat, budget_gib
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 1, 1
  c.lock()
  return plan_lib.build(c)


@pytest.fixture(scope="module")
def mesh():
  return sharding.make_mesh(_plan().mesh, devices=[jax.devices()[0]])


@pytest.fixture(scope="module")
def totals(mesh) -> dict[str, int]:
  """Each fixed remat's compiled step size on this CPU (none > dots > full)."""
  out = {}
  for mode in memory.REMAT_ORDER:
    compiled = program.TrainProgram(_plan(remat=mode), mesh).lower().compile()
    out[mode] = memory.compiled_memory(compiled)["total_bytes"]
  assert out["none"] > out["dots"] > out["full"], out
  return out


@pytest.mark.integration  # Compiles the step at three remat levels: 30-50 s in all.
@pytest.mark.parametrize("expect", ["none", "dots", "full", "over"])
def test_auto_chooses_the_least_recompute_that_fits(mesh, totals, expect, capsys):
  """A declared budget just above each candidate's size picks it; below every one, full and says so."""
  budget = {
      "none": totals["none"] + 1024, "dots": (totals["none"] + totals["dots"]) // 2,
      "full": (totals["dots"] + totals["full"]) // 2, "over": totals["full"] // 2}[expect]
  p = program.TrainProgram(_plan(budget / GIB), mesh)
  chosen = "full" if expect == "over" else expect
  assert p.config.model.remat == chosen
  assert [r["remat"] for r in p.remat_choice] == list(memory.REMAT_ORDER[:memory.REMAT_ORDER.index(chosen) + 1])
  assert [r["total_bytes"] for r in p.remat_choice] == [totals[r["remat"]] for r in p.remat_choice]
  line = capsys.readouterr().out.strip().splitlines()[-1]
  assert line.startswith(f"model.remat=auto: chose {chosen}, ")
  assert ("DOES NOT FIT" in line) == (expect == "over"), line


def test_no_budget_known_chooses_none(mesh, capsys):
  p = program.TrainProgram(_plan(0.0), mesh)  # A CPU has no memory size.
  assert p.config.model.remat == "none" and len(p.remat_choice) == 1
  assert "no memory size known for cpu" in capsys.readouterr().out


@pytest.mark.integration  # Compiles the step at three remat levels: 30-50 s in all.
def test_compile_reports_the_choice():
  """`compile` (its 8 fake devices here) reports the remat auto chose and the candidates it compiled."""
  c = config_lib.from_dict(_plan(1.0).to_dict())
  c.unlock()
  c.mesh.fsdp = -1
  c.lock()
  report = aot.compile_train_step(plan_lib.build(c))
  assert report["remat"] == "none" and [r["remat"] for r in report["remat_choice"]] == ["none"]
  assert "remat=none" in aot.format_report(report, params=False)


def test_a_negative_budget_is_refused():
  c = config_lib.get_config("crossbert", "tiny")
  c.model.memory_budget_gib = -1.0
  with pytest.raises(UserError, match="model.memory_budget_gib"):
    plan_lib.build(c)


def test_auto_is_none_outside_a_train_program():
  """Forwards (init, evaluation, export) of a run trained with auto recompute nothing."""
  assert layers.remat(layers.GeGLU, "auto") is layers.GeGLU
