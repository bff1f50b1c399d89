"""Training phases and the batch ramp: validation, the lr across phases, tokens per step,
resume checks, and real runs: exact resume at and across phase boundaries, a kill -9 near one.

The exact-resume runs are the train command in this process (`run_command`: the tests' 8 fake CPU devices and
the session's compilation cache, so each phase's step compiles once), where the process boundary is not the
point; the kill -9 and the elastic resume (2 processes, then 1) are subprocesses.
"""

import json
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import phases as phases_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.hf import files as hf_files
from crossbert_jax.run import load, metrics, resume
from crossbert_jax.training import optimizer
from tests.helpers import ROOT, run_command, run_module


def _tiny(phases=(), **overrides) -> ml_collections.ConfigDict:
  c = config_lib.get_config("crossbert", "tiny")
  for key, value in overrides.items():
    *sections, name = key.split("__")
    node = c
    for section in sections:
      node = node[section]
    node[name] = value
  c.train.phases = tuple(phases)
  return c


# -- Validation ---------------------------------------------------------------------------------


def test_a_key_outside_the_declared_set_is_refused_naming_phase_key_and_set():
  c = _tiny(({"steps": 100}, {"model.num_layers": 4}), train__steps=200)
  with pytest.raises(
      UserError, match=r"train.phases\[1\] sets 'model.num_layers', which a phase cannot "
      r"change; a phase may set 'steps' and data.seq_len, .*model.local_rope_theta"):
    plan_lib.build(c)


@pytest.mark.parametrize("phases, steps, match", [
    (({"steps": 100}, {"steps": 50}), 200, r"the phases' steps sum to 150 but train.steps=200"),
    (({"data.seq_len": 128}, {"steps": 50}), 200, r"train.phases\[0\]: 'steps' must be an integer >= 1 \(only the"),
    (({"steps": 250}, {}), 200, r"train.phases\[1\]: 'steps' must be an integer >= 1, got None"),
    (({"steps": 100}, {"data.seq_len": 3}), 200, r"config data.seq_len: must be >= 4, got 3 \(in phase 1 \(steps "
     r"101-200, batch 16 x L=3\)\)"),
    (({"steps": 100}, {"model.rope_theta": "big"
                      }), 200, r"model.rope_theta='big' is a str, but model.rope_theta takes a float"),
    (({"steps": 100}, "L=128"), 200, r"train.phases\[1\]: 'L=128' is not a dict"),])
def test_bad_phases_are_one_line_errors(phases, steps, match):
  with pytest.raises(UserError, match=match):
    plan_lib.build(_tiny(phases, train__steps=steps))


def test_the_last_phase_may_omit_steps_and_no_phases_is_one_phase_with_the_config_itself():
  c = _tiny(({"steps": 120, "data.seq_len": 32}, {"data.seq_len": 128, "train.batch_size": 4}))
  plan_lib.build(c)
  ps = phases_lib.expand(c)
  assert [(p.start, p.end, p.tokens_per_step, p.stream) for p in ps] == [(0, 120, 16 * 32, 0), (120, 300, 4 * 128, 1)]
  plain = _tiny()
  (only,) = phases_lib.expand(plain)
  assert only.config is plain and (only.start, only.end, only.read_batch) == (0, plain.train.steps, 16)


def test_nth_phase_is_the_one_bench_times():
  """bench --phase=N: phase N's batch, length and RoPE (a plain config is its own phase 0)."""
  c = plan_lib.build(
      _tiny(({"steps": 120,
              "data.seq_len": 32}, {"data.seq_len": 128, "train.batch_size": 4, "model.rope_theta": 80_000.0})))
  first, second = (c.phase(i, "--phase").config for i in (0, 1))
  assert (first.data.seq_len, first.train.batch_size) == (32, 16)
  assert (second.data.seq_len, second.train.batch_size, second.model.rope_theta) == (128, 4, 80_000.0)
  plain = plan_lib.build(_tiny())
  assert plain.phase(0, "--phase").config == plain.settings
  with pytest.raises(UserError, match=r"--phase=2: the config has 2 phase\(s\); give 0-1"):
    c.phase(2, "--phase")


def test_batch_ramp_stairs_pin_the_tokens_per_step_of_each_phase():
  c = _tiny(({"steps": 200, "data.seq_len": 64}, {"data.seq_len": 128, "train.batch_size": 8}), train__batch_size=32,
            train__batch_ramp__start=8, train__batch_ramp__steps=30, train__batch_ramp__stages=3)
  plan_lib.build(c)
  ps = phases_lib.expand(c)
  assert [(p.start, p.end) for p in ps] == [(0, 10), (10, 20), (20, 30), (30, 200), (200, 300)]
  assert [p.tokens_per_step for p in ps] == [8 * 64, 16 * 64, 24 * 64, 32 * 64, 8 * 128]
  # The stairs and their phase read one stream, 8 rows at a time; the 128-token phase its own.
  assert [(p.stream, p.read_batch, p.reads_per_step) for p in ps] == [(0, 8, 1), (0, 8, 2), (0, 8, 3), (0, 8, 4),
                                                                      (1, 8, 1)]
  assert phases_lib.tokens_between(ps, 0, 300) == 10 * 64 * (8 + 16 + 24) + 170 * 32 * 64 + 100 * 8 * 128
  # The stairs change no schedule key: the lr is the schedule asked for, step by step.
  steps = jnp.arange(300)  # int32, as the optimizer state's count.
  np.testing.assert_array_equal(np.asarray(optimizer.run_schedule(plan_lib.build(c))(steps)),
                                np.asarray(optimizer.learning_rate_schedule(c.train)(steps)))
  # By tokens: each stair takes a third of them at its own batch (rounded up to whole steps).
  c.train.batch_ramp.steps, c.train.batch_ramp.tokens = 0, 3 * 8 * 64 * 10
  assert [p.end - p.start for p in phases_lib.expand(c)][:3] == [10, 5, 4]


@pytest.mark.parametrize("ramp, match", [
    ({"start": 5}, r"batch_ramp.start=5 must be below the first phase's batch size 16 and divide it"),
    ({"start": 8, "stages": 2}, r"from 8 to 16 in multiples of 8 there are at most 1 stairs"),
    ({"start": 4, "steps": 10, "tokens": 10}, r"set exactly one of train.batch_ramp.steps and"),
    ({"start": 4, "steps": 300, "stages": 3}, r"takes 300 steps in 3 stairs .* the first phase has 300"),
    ({"start": -4}, r"train.batch_ramp.start=-4 is negative"),
    ({"start": 4, "steps": 0, "tokens": -5}, r"train.batch_ramp.tokens=-5 is negative"),])
def test_bad_batch_ramps_are_one_line_errors(ramp, match):
  c = _tiny()
  for k, v in {"steps": 12, "stages": 3, **ramp}.items():
    c.train.batch_ramp[k] = v
  with pytest.raises(UserError, match=match):
    plan_lib.build(c)


def test_lr_of_every_step_is_a_pure_function_of_step_and_config_across_phases():
  # 10 steps, warmup 2, linear decay to 0.1 x peak; the second phase lowers the peak to 1e-3.
  c = _tiny(({"steps": 5}, {"train.learning_rate": 1e-3}), train__steps=10, train__warmup_steps=2,
            train__decay="linear", train__learning_rate=3e-3)
  lr = optimizer.run_schedule(plan_lib.build(c))
  want = [
      1.5e-3,
      3e-3,
      3e-3,
      3e-3 - 2.7e-3 / 8,
      3e-3 - 2 * 2.7e-3 / 8,  # Phase 0: warmup, then its decay.
      1e-3 - 3 * 0.9e-3 / 8,
      1e-3 - 4 * 0.9e-3 / 8,
      1e-3 - 5 * 0.9e-3 / 8,
      1e-3 - 6 * 0.9e-3 / 8,
      1e-3 - 7 * 0.9e-3 / 8]  # Phase 1: the same decay at its own peak, ending at 1e-4.
  np.testing.assert_allclose([float(lr(i)) for i in range(10)], want, rtol=1e-6)
  # Without phases: the plain schedule, unchanged.
  plain = _tiny()
  assert [float(optimizer.run_schedule(plan_lib.build(plain))(i)) for i in (0, 50, 299)] == \
      [float(optimizer.learning_rate_schedule(plain.train)(i)) for i in (0, 50, 299)]


# -- Resume checks ------------------------------------------------------------------------------


def _saved(c) -> dict:
  return json.loads(json.dumps(c.to_dict()))


def _check(saved_cfg, step, now):
  return resume.check("wd", step, _saved(saved_cfg), None, plan_lib.build(now), {"sha256": "x"}, 1)


def test_resume_check_refuses_changed_trained_phases_and_allows_later_ones():
  two = lambda first, second: _tiny(({"steps": first}, {"data.seq_len": second}), train__steps=150)
  # A single-phase run extended by a context-extension phase: its trained steps are unchanged.
  lines, restore_data = _check(_tiny(train__steps=100), 100, two(100, 128))
  assert restore_data and any("train.phases" in line for line in lines)
  # Later phases may change; a trained one may not (its boundary or its keys).
  assert _check(two(100, 128), 60, two(100, 256))[1]
  with pytest.raises(UserError, match=r"trained steps 1-100 as one phase, but the config's phases make steps 1-90"):
    _check(two(100, 128), 120, two(90, 128))
  with pytest.raises(UserError, match=r"trained steps 101-120 with data.seq_len=128, but the config's phases give "
                     r"them 256"):
    _check(two(100, 128), 120, two(100, 256))
  # A key a phase sets is compared through the phases, not as the run's data.seq_len.
  moved = _tiny(({"steps": 100, "data.seq_len": 64}, {"data.seq_len": 128}), train__steps=150, data__seq_len=32)
  assert _check(two(100, 128), 120, moved)[1]
  # Without phases the refusal is today's.
  with pytest.raises(UserError, match=r"made with data.seq_len=64 \(config: 128\)"):
    _check(_tiny(), 10, _tiny(data__seq_len=128))


def test_resume_check_restarts_a_stream_read_in_another_batch():
  ramp = lambda full: _tiny(({"steps": 20}, {"steps": 10, "train.batch_size": full}), train__steps=30)
  lines, restore_data = _check(ramp(8), 5, ramp(12))  # gcd 8 -> 4: the stream's reads change.
  assert not restore_data and "starts over" in lines[0]


# -- Real runs ----------------------------------------------------------------------------------

# Steps 1-2: batch 8 x 64 (a ramp stair), 3-4: 16 x 64 (same stream), 5-7: 8 x 128 (its own stream, lr 1e-3).
# (In a subprocess on one device this was 4 / 8 / 4 rows; in this process every batch divides by the 8 devices.)
_PHASES = ("--config.train.steps=7", "--config.train.batch_size=16", "--config.train.warmup_steps=2",
           "--config.train.batch_ramp.start=8", "--config.train.batch_ramp.steps=2",
           "--config.train.batch_ramp.stages=1",
           "--config.train.phases=({'steps': 4}, {'data.seq_len': 128, 'train.batch_size': 8, "
           "'train.learning_rate': 1e-3, 'model.rope_theta': 10000.0})")


def _train(workdir, spm, *extra):
  """The train command in this process (the session's compilation cache: each phase's step compiles once)."""
  return run_command("crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={workdir}",
                     f"--config.data.tokenizer={spm}", "--config.metrics.progress_bar=False",
                     "--config.metrics.tensorboard=False", "--config.checkpoint.every_steps=100", *_PHASES, *extra,
                     check=True)


def _rows(workdir) -> dict[int, dict]:
  return {r["step"]: r for r in metrics.read_metrics(str(workdir))}


def _params(workdir, step):
  import jax
  state = ocp.StandardCheckpointer().restore(pathlib.Path(workdir) / "checkpoints" / str(step) / "state")
  return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(state["params"])}


# Slow (62-117 s in the tiers of 2026-12-07; `make test-slow` and CI): stops at the ramp's stair boundary (step 2:
# the stream continues at twice the reads), at the stream boundary (step 4: the next phase's own stream) and inside
# the last phase (step 5), each resumed. (A second case stopped at step 4 alone: the same boundary, resumed from a
# run that had not stopped before it; it trained the straight run again and was dropped for the tiers' time.)
@pytest.mark.slow
def test_resume_at_phase_boundaries_is_bitwise_and_rows_carry_the_phase(tmp_path, spm_model):
  _train(tmp_path / "straight", spm_model)
  split = tmp_path / "split"
  for stop in (2, 4, 5):
    _train(split, spm_model, f"--config.train.stop_at_step={stop}")
  _train(split, spm_model)
  a, b = _rows(tmp_path / "straight"), _rows(split)
  assert sorted(a) == sorted(b) == list(range(1, 8))
  for s in a:
    for k in ("loss", "accuracy", "grad_norm", "learning_rate", "num_targets", "tokens_seen", "phase"):
      assert a[s][k] == b[s][k], f"step {s}: {k} {a[s][k]} (straight) != {b[s][k]} (resumed)"
  assert [a[s]["phase"] for s in a] == [0, 0, 1, 1, 2, 2, 2]
  tokens = [a[s]["tokens_seen"] - a.get(s - 1, {"tokens_seen": 0})["tokens_seen"] for s in sorted(a)]
  assert tokens == [8 * 64] * 2 + [16 * 64] * 2 + [8 * 128] * 3
  flops = [a[s]["flops_per_step"] for s in sorted(a)]
  assert flops[0] == flops[1] and flops[2] == flops[3] == 2 * flops[0] and flops[4] > flops[0]
  lr = optimizer.run_schedule(plan_lib.of_saved(json.loads((tmp_path / "straight" / "config.json").read_text())))
  np.testing.assert_allclose([a[s]["learning_rate"] for s in sorted(a)], [float(lr(s - 1)) for s in sorted(a)],
                             rtol=1e-6)
  pa, pb = _params(tmp_path / "straight", 7), _params(split, 7)
  assert pa.keys() == pb.keys()
  for k in pa:
    np.testing.assert_array_equal(pa[k], pb[k], err_msg=f"param {k} differs after the resumes")
  # Evaluation and export build the model of a checkpoint's phase: its length and RoPE theta (the
  # run's own theta is the tiny default, 160k; the last phase trains at 10k).
  first, _, step = load.load_run(split, 4)
  assert (step, first.data.seq_len, first.model.rope_theta, first.train.batch_size) == (4, 64, 160_000.0, 16)
  last, _, step = load.load_run(tmp_path / "straight")
  assert (step, last.data.seq_len, last.model.rope_theta, last.train.batch_size) == (7, 128, 10_000.0, 8)
  hf = hf_files.hf_config(last)
  assert hf["max_position_embeddings"] == 128 and hf["global_rope_theta"] == 10_000.0, hf


def test_a_bad_phase_on_the_command_line_is_one_error_line(tmp_path, spm_model):
  proc = run_command("crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={tmp_path / 'w'}",
                     f"--config.data.tokenizer={spm_model}", "--config.train.phases=({'steps': 300, "
                     "'model.embed_dim': 128},)")
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: config train.phases[0] sets 'model.embed_dim'"), lines


def test_a_later_phase_whose_data_is_missing_is_refused_before_the_first_step(tmp_path, spm_model):
  workdir = tmp_path / "w"
  proc = run_command("crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={workdir}",
                     f"--config.data.tokenizer={spm_model}", "--config.train.steps=4",
                     f"--config.train.phases=({{'steps': 2}}, {{'data.path': '{tmp_path / 'missing.txt'}'}})")
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and "missing.txt' does not exist" in lines[0] and "(in phase 1 (steps 3-4" in lines[0], lines
  assert not (workdir / "checkpoints").exists()


@pytest.mark.slow
def test_kill_9_near_a_phase_boundary_resumes_bitwise(tmp_path):
  # Phases: steps 1-6 at L=64, 7-12 at L=128; checkpoints every 2 steps; kills after steps 5, 6 and 7 are logged.
  proc = subprocess.run([
      sys.executable, "tools/fault_inject.py", "--steps=12", "--kill_after=5,6,7", f"--workdir={tmp_path / 'fi'}",
      "--override=--config.train.phases=({'steps': 6}, {'data.seq_len': 128, "
      "'train.batch_size': 8})"], cwd=ROOT, capture_output=True, text=True, timeout=1500)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "fault_inject: passed: 3 kills" in proc.stdout, proc.stdout[-3000:]


@pytest.mark.slow
def test_elastic_resume_inside_a_phase(tmp_path, two_processes):
  """2 processes train into the 128-token phase; 1 process finishes it (the stream re-sharded in its phase)."""
  from crossbert_jax.run import elastic
  phases = ("--config.train.steps=6", "--config.model.vocab_size=400",
            "--config.train.phases=({'steps': 2}, {'data.seq_len': 128, 'train.batch_size': 8})")
  proc = two_processes(*phases, "--config.train.stop_at_step=4")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert elastic.saved_process_count(tmp_path / "run") == (4, 2)
  proc = run_module([
      "crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={tmp_path / 'run'}",
      f"--config.data.tokenizer={tmp_path / 'spm.model'}", "--config.metrics.progress_bar=False", *phases], check=False)
  assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert "written by 2 process(es) and this run has 1: the data stream first finishes" in proc.stderr
  rows = _rows(tmp_path / "run")
  assert sorted(rows) == list(range(1, 7)) and [rows[s]["phase"] for s in range(1, 7)] == [0, 0, 1, 1, 1, 1]
  assert all(np.isfinite(rows[s]["loss"]) for s in rows)


def test_a_phase_value_of_the_wrong_type_and_a_dict_without_its_comma_are_named_whole():
  """The CLI reads --config.train.phases={'steps': 10} as the dict's keys; a value of the wrong type
  says what the key takes (not XLA's message cut mid-word)."""
  c = config_lib.get_config("crossbert", "tiny").unlock()
  c.train.phases = ("steps",)
  with pytest.raises(UserError, match=r"'steps' is not a dict.*trailing comma"):
    plan_lib.build(c)
  c.train.phases = ({"steps": 100, "train.learning_rate": "fast"}, {})
  with pytest.raises(UserError) as e:
    plan_lib.build(c)
  assert str(e.value).endswith("train.learning_rate='fast' is a str, but train.learning_rate takes a float "
                               f"(e.g. {c.train.learning_rate!r})")
