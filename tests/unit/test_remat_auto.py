"""model.remat="auto" and train.grad_accum=0 ("auto"): the least recomputation, and the fewest micro-batches,
whose compiled train step fits the memory budget."""

import types

import jax
import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.model import layers
from crossbert_jax.perf import aot
from crossbert_jax.training import memory, program, sharding

GIB = memory.GIB


def _plan(budget_gib: float = 0.0, remat: str = "auto", grad_accum: int = 1) -> plan_lib.RunPlan:
  c = config_lib.get_config("crossbert", "tiny")
  c.unlock()
  c.model.num_layers, c.model.scan_layers = 4, True  # Scanned, as the pod variants.
  c.model.remat, c.model.memory_budget_gib = remat, budget_gib
  c.train.grad_accum = grad_accum
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
  assert [r["remat"] for r in p.fit_choice] == list(memory.REMAT_ORDER[:memory.REMAT_ORDER.index(chosen) + 1])
  assert [r["total_bytes"] for r in p.fit_choice] == [totals[r["remat"]] for r in p.fit_choice]
  assert {r["grad_accum"] for r in p.fit_choice} == {1}
  line = capsys.readouterr().out.strip().splitlines()[-1]
  assert line.startswith(f"model.remat=auto: chose {chosen}; ")
  assert ("DOES NOT FIT" in line) == (expect == "over"), line


def test_no_budget_known_chooses_none(mesh, capsys):
  p = program.TrainProgram(_plan(0.0), mesh)  # A CPU has no memory size.
  assert p.config.model.remat == "none" and len(p.fit_choice) == 1
  assert "no memory size known for cpu" in capsys.readouterr().out


@pytest.mark.integration  # Compiles the step at three remat levels: 30-50 s in all.
def test_compile_reports_the_choice():
  """`compile` (its 8 fake devices here) reports the remat auto chose and the candidates it compiled."""
  c = config_lib.from_dict(_plan(1.0).to_dict())
  c.unlock()
  c.mesh.fsdp = -1
  c.lock()
  c.train.grad_accum = 0
  c.lock()
  report = aot.compile_train_step(plan_lib.build(c))
  assert report["remat"] == "none" and report["grad_accum"] == 1
  assert [(r["remat"], r["grad_accum"]) for r in report["fit_choice"]] == [("none", 1)]
  # The chosen candidate's compile is the report's: the step was not compiled twice.
  assert report["compile_seconds"] == report["fit_choice"][0]["compile_seconds"]
  text = aot.format_report(report, params=False)
  assert "remat=none" in text and "grad_accum 1)" in text


def test_a_negative_budget_is_refused():
  c = config_lib.get_config("crossbert", "tiny")
  c.model.memory_budget_gib = -1.0
  with pytest.raises(UserError, match="model.memory_budget_gib"):
    plan_lib.build(c)


def test_auto_is_none_outside_a_train_program():
  """Forwards (init, evaluation, export) of a run trained with auto recompute nothing."""
  assert layers.remat(layers.GeGLU, "auto") is layers.GeGLU


@pytest.mark.integration  # Six compiles of a 4-layer tiny step: about 30 s.
def test_grad_accum_auto_chooses_the_largest_micro_batch_that_fits(mesh, capsys):
  """A budget between the compiled sizes at 2 and 4 micro-batches picks 4; the program then steps with 4."""
  size = lambda a: memory.compiled_memory(
      program.TrainProgram(_plan(remat="none", grad_accum=a), mesh).lower().compile())["total_bytes"]
  at2, at4 = size(2), size(4)
  assert at2 > at4, (at2, at4)
  p = program.TrainProgram(_plan((at2 + at4) / 2 / GIB, remat="none", grad_accum=0), mesh)
  assert p.config.train.grad_accum == 4 and p.config.model.remat == "none"
  assert [r["grad_accum"] for r in p.fit_choice] == [1, 16, 4, 2]  # First, last, then a bisection.
  line = capsys.readouterr().out.strip().splitlines()[-1]
  assert line.startswith("train.grad_accum=0 (auto): chose 4 (4 sequences per device a micro-batch); fits"), line
  state = p.init_state()
  rows = {
      k: jax.numpy.zeros(s.shape, s.dtype) + (1 if k == "segment_ids" else 5) for k, s in p.shaped_inputs()[1].items()}
  _, metrics = p.jitted_step(state, p.global_batch(jax.tree.map(lambda a: jax.device_get(a), rows)))
  assert jax.numpy.isfinite(metrics["loss"])


def _fake_compile(per_sequence: dict[str, int], batch: int, fixed: int = 1000):
  """A stand-in for XLA's compile whose memory analysis grows with the micro-batch and the remat's
  activations: the search's order and bisection, without compiles."""
  def compile_step(c):
    temp = per_sequence[c.model.remat] * batch // c.train.grad_accum
    return types.SimpleNamespace(memory_analysis=lambda: types.SimpleNamespace(
        argument_size_in_bytes=fixed, output_size_in_bytes=fixed, alias_size_in_bytes=fixed, temp_size_in_bytes=temp,
        generated_code_size_in_bytes=0))

  return compile_step


PER_SEQUENCE = {"none": 4000, "dots": 200, "full": 100}  # Bytes a sequence of activations, by remat.


@pytest.mark.parametrize(
    "remat,budget,chosen,tried",
    [
        # grad_accum auto alone (remat none): 1 does not fit, 16 does, bisection 4 (fits), 2 (does not).
        ("none", 1000 + 4000 * 16 // 4, ("none", 4), [("none", 1), ("none", 16), ("none", 4), ("none", 2)]),
        # Both auto: none fits at no micro-batch, dots at 2 (its first and last, then 4 and 2 fit).
        ("auto", 1000 + 200 * 16 // 2, ("dots", 2), [("none", 1), ("none", 16), ("dots", 1), ("dots", 16), ("dots", 4),
                                                     ("dots", 2)]),
        # The whole batch fits at once: one compile.
        ("auto", 10 ** 9, ("none", 1), [("none", 1)]),])
def test_the_search_compiles_first_last_then_bisects(mesh, remat, budget, chosen, tried):
  c = plan_lib.with_keys(_plan(budget / GIB, remat=remat, grad_accum=0), {})
  out, rows, compiled = memory.choose_fit(c, mesh, _fake_compile(PER_SEQUENCE, c.train.batch_size),
                                          say=lambda line: None)
  assert (out.model.remat, out.train.grad_accum) == chosen
  assert [(r["remat"], r["grad_accum"]) for r in rows] == tried
  temp = compiled[0].memory_analysis().temp_size_in_bytes  # The chosen candidate's program, kept, and its seconds.
  assert temp == PER_SEQUENCE[chosen[0]] * c.train.batch_size // chosen[1]


def test_nothing_fits_takes_the_most_frugal_and_says_so(mesh):
  c = _plan(500 / GIB, remat="auto", grad_accum=0)  # Below the fixed 1,000 bytes: nothing fits.
  lines = []
  out, _, compiled = memory.choose_fit(c, mesh, _fake_compile(PER_SEQUENCE, c.train.batch_size), say=lines.append)
  assert (out.model.remat, out.train.grad_accum) == ("full", 16)
  assert "model.remat=auto: chose full; train.grad_accum=0 (auto): chose 16" in lines[0]
  assert "DOES NOT FIT even so" in lines[0] and compiled is None  # Its caller compiles (and refuses) it.


def test_a_candidate_xla_refuses_for_memory_does_not_fit(mesh):
  """XLA may refuse a program over the chip's memory as it compiles (RESOURCE_EXHAUSTED): the search goes on."""
  c = _plan(10 ** 9 / GIB, remat="none", grad_accum=0)
  fake = _fake_compile(PER_SEQUENCE, c.train.batch_size)

  def compile_step(cand):
    if cand.train.grad_accum < 4:
      raise RuntimeError("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm.")
    return fake(cand)

  lines = []
  out, rows, _ = memory.choose_fit(c, mesh, compile_step, say=lines.append)
  assert out.train.grad_accum == 4 and [(r["grad_accum"], r["total_bytes"] is None) for r in rows] == [(1, True),
                                                                                                       (16, False),
                                                                                                       (4, False),
                                                                                                       (2, True)]
  assert "none/1 out of memory in XLA's compile" in lines[0]
  with pytest.raises(ValueError, match="not memory"):  # Any other compile error is not swallowed.
    memory.choose_fit(c, mesh, lambda cand: (_ for _ in ()).throw(ValueError("not memory")), say=lines.append)


def test_accum_candidates_keep_the_micro_batch_divisible_by_the_shards():
  assert memory.accum_candidates(16, 1) == [1, 2, 4, 8, 16]
  assert memory.accum_candidates(16, 4) == [1, 2, 4]
  assert memory.accum_candidates(12, 2) == [1, 2, 3, 6]
