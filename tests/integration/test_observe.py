"""Observing a run: the profiler's trace window, the offline W&B run, goodput (run/profile.py,
run/wandb_logger.py, run/goodput.py), with the real jax.profiler and wandb.

The fast tests read the session's `tiny_run` (5 steps, steps 3-4 traced, W&B offline); the slow
ones kill and resume a run, and trace the benchmark's L=256 step.
"""

import glob
import json
import re
import signal
import struct
import subprocess
import sys
import time

import jax
import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.run import goodput, metrics, profile, trace_summary, wandb_logger
from tests.helpers import ROOT, cpu_env, run_command, run_module


def wandb_history(workdir) -> tuple[dict[str, str], list[dict]]:
  """({run id: its group}, history rows) of the offline W&B runs under workdir/wandb, read back from their .wandb
  files: wandb's own Record protobuf in its LevelDB-style log (7-byte file header; records of
  crc32 (4), length (2), type (1: full, 2: first, 3: middle, 4: last) in 32 KiB blocks)."""
  from wandb.proto import wandb_internal_pb2  # pylint: disable=g-import-not-at-top

  ids, rows = {}, []
  for path in sorted(glob.glob(f"{workdir}/wandb/offline-run-*/run-*.wandb")):
    data, pos, records, part = open(path, "rb").read(), 7, [], b""
    assert data[:4] == b":W&B", path
    while pos + 7 <= len(data):
      if 32768 - pos % 32768 < 7:
        pos += 32768 - pos % 32768
        continue
      _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
      if kind == 0:
        break
      chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
      part = chunk if kind in (1, 2) else part + chunk
      if kind in (1, 4):
        records.append(part)
    for raw in records:
      record = wandb_internal_pb2.Record()
      record.ParseFromString(raw)
      kind = record.WhichOneof("record_type")
      if kind == "run":
        ids[record.run.run_id] = record.run.run_group
      elif kind == "history":
        row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        rows.append({"step": row["_step"], **{k: v for k, v in row.items() if not k.startswith("_")}})
  return ids, rows


def test_trace_holds_exactly_the_asked_steps_and_the_train_step(tiny_run):
  assert profile.read_record(tiny_run) == [3, 4]
  (xplane,) = glob.glob(f"{tiny_run}/profile/plugins/profile/*/*.xplane.pb")
  planes = list(jax.profiler.ProfileData.from_file(xplane).planes)
  events = [e for p in planes for line in p.lines for e in line.events]
  assert sorted(dict(e.stats)["step_num"] for e in events if e.name == profile.STEP_NAME) == [3, 4]
  modules = {dict(e.stats).get("hlo_module") for e in events}
  assert "jit__train_step" in modules, sorted(m for m in modules if m)
  s = trace_summary.summarize(xplane, profile.STEP_NAME)
  assert s["steps"] == 2 and 0 < s["matmul_fraction"] < 1 and s["compute_s"] <= s["span_s"]
  out = (tiny_run.parent / "train.out").read_text()
  assert "profile: traced steps 3-4" in out and "profile summary (steps 3-4" in out, out[-2000:]


def test_wandb_offline_history_equals_metrics_jsonl(tiny_run):
  ids, rows = wandb_history(tiny_run)
  assert set(ids) == {json.loads((tiny_run / wandb_logger.RUN_FILE).read_text())["id"]}
  assert rows == metrics.read_metrics(tiny_run)


def test_goodput_row_and_done_line(tiny_run):
  last = metrics.read_metrics(tiny_run)[-1]
  shares = [v for k, v in last.items() if k == "goodput" or (k.startswith("goodput/") and k != "goodput/wall_s")]
  assert len(shares) == 1 + len(goodput.CAUSES) and sum(shares) == pytest.approx(1.0, abs=1e-9)
  assert last["goodput/compile"] > 0 and last["goodput/startup"] > 0 and last["loss"] is not None
  (attempt,) = goodput.read(tiny_run)
  assert attempt["status"] == "finished" and attempt["seconds"]["profile"] >= 0
  assert re.search(r"^done: step 5, .*; goodput \d+%: ", (tiny_run.parent / "train.out").read_text(), re.M)


def test_goodput_counts_the_gap_after_an_unfinished_attempt():
  a = {"start": 0.0, "end": 10.0, "status": "running", "seconds": {"productive": 6.0, "compile": 4.0}}
  b = {"start": 15.0, "end": 30.0, "status": "finished", "seconds": {"productive": 10.0, "recomputed": 5.0}}
  seconds = goodput.totals([a, b])
  assert seconds["preemption"] == 5.0 and sum(seconds.values()) == 30.0
  assert goodput.line(seconds) == "goodput 53%: recomputed 17%, preemption 17%, compile 13%"
  assert goodput.totals([{**a, "status": "finished"}, b])["preemption"] == 0.0


@pytest.mark.parametrize("key,value,says", [
    ("start_step", -1, "profile.start_step: must be >= 0"),
    ("start_step", 1, "step 1 compiles"),
    ("start_step", 299, "ends past the last step (train.steps=300)"),
    ("hosts", "first", "profile.hosts"),])
def test_bad_profile_window_is_one_line(key, value, says):
  c = config_lib.get_config("crossbert", "tiny")
  c.profile[key] = value
  with pytest.raises(UserError, match=re.escape(says)):
    plan_lib.build(c)


def test_bad_profile_window_exits_2_before_training(tmp_path):
  proc = run_command("crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={tmp_path / 'w'}",
                     "--config.profile.start_step=299")
  assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: config profile.start_step")
  assert not (tmp_path / "w").exists()


def test_wandb_missing_is_one_warning(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError, as without the package.
  c = config_lib.get_config("crossbert", "tiny")
  c.metrics.wandb = True
  warnings = []
  from etils import epath  # pylint: disable=g-import-not-at-top

  assert wandb_logger.start(c, epath.Path(tmp_path), warnings.append) is None
  assert len(warnings) == 1 and "wandb package is not installed" in warnings[0]


def _start(workdir, spm, *extra):
  return run_module([
      "crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={workdir}",
      f"--config.data.tokenizer={spm}", "--config.model.vocab_size=512", "--config.train.steps=30",
      "--config.checkpoint.every_steps=10", "--config.metrics.progress_bar=False", "--config.metrics.tensorboard=False",
      "--config.profile.start_step=12", "--config.profile.steps=2", "--config.metrics.wandb=True", *extra],
                    env=cpu_env(WANDB_MODE="offline", WANDB_SILENT="true"), wait=False)


@pytest.mark.slow  # Two process starts and a kill: about a minute on 2 cores.
def test_kill9_resume_counts_badput_continues_wandb_and_does_not_reprofile(tmp_path, spm_model):
  run = tmp_path / "run"
  proc = _start(run, spm_model)
  try:
    deadline = time.time() + 400
    while time.time() < deadline and max((r["step"] for r in _rows(run)), default=0) < 16:
      assert proc.poll() is None, proc.stderr.read()[-2000:]
      time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  finally:
    if proc.poll() is None:
      proc.kill()
  killed_at = max(r["step"] for r in _rows(run))
  assert profile.read_record(run) == [12, 13] and killed_at > 10
  resumed = _start(run, spm_model)
  out, err = resumed.communicate(timeout=600)
  assert resumed.returncode == 0, err[-2000:]
  assert "resuming from step 10" in out + err and "profile:" not in out + err, "steps 12-13 were traced already"
  assert len(glob.glob(f"{run}/profile/plugins/profile/*/*.xplane.pb")) == 1
  first, second = goodput.read(run)
  assert first["status"] == "running" and second["status"] == "finished"
  assert second["seconds"]["recomputed"] > 0 and second["seconds"]["compile"] > 0
  seconds = goodput.totals([first, second])
  assert seconds["preemption"] > 0
  last = metrics.read_metrics(run)[-1]
  assert last["goodput/recomputed"] == pytest.approx(seconds["recomputed"] / sum(seconds.values()), rel=1e-3)
  shares = [v for k, v in last.items() if k.startswith("goodput") and k != "goodput/wall_s"]
  assert sum(shares) == pytest.approx(1.0, abs=1e-9)
  assert re.search(r"^done: step 30, .*; goodput \d+%: .*recomputed", out, re.M), out
  ids, rows = wandb_history(run)
  assert set(ids) == {json.loads((run / wandb_logger.RUN_FILE).read_text())["id"]}, "one W&B run over the restart"
  # The resumed attempt logs steps 11-30 to the same run; what the killed one's W&B service had not
  # written when the kill took it down too is lost to W&B (metrics.jsonl has every row).
  assert set(range(11, 31)) <= {r["step"] for r in rows}


def _rows(run):
  return metrics.read_metrics(run) if metrics.metrics_files(run) else []


def _benchmark_matmul_share(objective_column: int) -> float:
  """The matmul rows' share of the L=256 step in docs/benchmarks.md ("Where the L=256 step goes")."""
  text = (ROOT / "docs" / "benchmarks.md").read_text()
  table = text[text.index("Where the L=256 step goes"):].split("\n\n")[1]
  shares = [
      float(row.split("|")[objective_column].strip().rstrip("%"))
      for row in table.splitlines()[2:]
      if "matmul" in row.split("|")[1] or "YNNPACK" in row.split("|")[1]]
  return sum(shares) / 100


_TRACE_BENCHMARK_STEP = """
import glob, json, sys, jax
from crossbert_jax.core import config as config_lib, xla_flags
xla_flags.set_cpu_flags()
from crossbert_jax.run import profile, trace_summary
from crossbert_jax.perf import benchmark
from crossbert_jax.training import program as program_lib, sharding
_, _, edit = next(case for case in benchmark.CASES if case[0] == "cb_r0.5_k1")
c = benchmark.case_config(config_lib.get_config("crossbert", "small"), edit, 256)
program = program_lib.TrainProgram(c, sharding.make_mesh(c.mesh, devices=[jax.devices()[0]]))
state, batch = program.init_state(), program.global_batch(benchmark.random_batch(c))
for i in range(3):  # The first compiles; steps 1-2 are traced.
  if i == 1:
    jax.profiler.start_trace(sys.argv[1])
  with jax.profiler.StepTraceAnnotation(profile.STEP_NAME, step_num=i):
    state, out = program.step(state, batch)
    jax.block_until_ready(out)
jax.profiler.stop_trace()
(xplane,) = glob.glob(sys.argv[1] + "/**/*.xplane.pb", recursive=True)
print(json.dumps(trace_summary.summarize(xplane, profile.STEP_NAME)))
"""


@pytest.mark.slow  # Compiles and traces the small model's L=256 step: about 90 s on 2 cores.
def test_trace_summary_matmul_share_agrees_with_the_benchmark(tmp_path):
  """The summary's matmul share of a traced CrossBERT K=1 L=256 step (the benchmark's own case,
  batch and XLA flags) is the benchmark's breakdown's (72%) within 10 points."""
  # XLA_FLAGS="": the benchmark's code generation, not the suite's -O0 (helpers.TEST_XLA_FLAGS), which makes
  # the elementwise ops slower and the matmul share smaller.
  proc = subprocess.run([sys.executable, "-c", _TRACE_BENCHMARK_STEP,
                         str(tmp_path)], cwd=ROOT, env=cpu_env(XLA_FLAGS=""), capture_output=True, text=True,
                        timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  s = json.loads(proc.stdout.strip().splitlines()[-1])
  expected = _benchmark_matmul_share(6)  # The CrossBERT K=1 share column.
  assert expected == pytest.approx(0.72)
  print(trace_summary.format_summary(s, "cb_r0.5_k1 L=256"))
  assert abs(s["matmul_fraction"] - expected) <= 0.10, trace_summary.format_summary(s, "cb_r0.5_k1 L=256")


def test_a_fork_is_a_new_wandb_run_in_its_sources_group(tmp_path, monkeypatch):
  from etils import epath  # pylint: disable=g-import-not-at-top

  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  source, fork_dir = tmp_path / "source", tmp_path / "fork"
  source.mkdir()
  fork_dir.mkdir()
  (source / wandb_logger.RUN_FILE).write_text(json.dumps({"id": "src12345", "group": ""}))
  c = config_lib.get_config("crossbert", "tiny")
  c.metrics.wandb, c.train.fork_from = True, f"{source}:4"
  warnings = []
  sink = wandb_logger.start(c, epath.Path(fork_dir), warnings.append)
  assert sink is not None and len(warnings) == 1 and warnings[0].startswith("W&B: offline run ")  # And `wandb sync`.
  sink.log(5, {"loss": 1.5})
  sink.close()
  # run.finish() only *informs* wandb's service that the run ended (a publish, not a request): the
  # service closes the run's .wandb file later. In a process that lives on (this pytest session) the
  # file is complete only once the service has shut down, which teardown waits for (CI read it
  # empty under load; a command's process tears down at exit).
  import wandb  # pylint: disable=g-import-not-at-top
  wandb.teardown()
  record = json.loads((fork_dir / wandb_logger.RUN_FILE).read_text())
  assert record["group"] == "src12345" and record["id"] != "src12345"
  ids, rows = wandb_history(fork_dir)
  assert ids == {record["id"]: "src12345"} and rows == [{"step": 5, "loss": 1.5}]


def test_a_sweeps_runs_share_its_wandb_group():
  from crossbert_jax.scaling import plan as plan_lib  # pylint: disable=g-import-not-at-top

  run = plan_lib.Run(name="xs__cb__s0", size="xs", label="cb", seed=0, objective="crossbert", overrides={},
                     flops_budget=10.0, flops_per_step=1.0, steps=10, tokens_per_step=1)
  assert "--config.metrics.wandb_group=mysweep" in plan_lib.train_command(run, {"variant": "tiny"}, "/r/mysweep/runs/x")


def test_trace_summary_reads_a_gpu_trace(tmp_path):
  """The H200 bench trace (docs/results/accelerator, 3 CrossBERT steps, no step annotations then):
  its ops are the kernels on the GPU's stream line, and their busy time is the measured step."""
  import gzip  # pylint: disable=g-import-not-at-top

  run = ROOT / "docs/results/accelerator/2026-12-04-run3-profile"
  measured_s = json.loads((run / "accelerator_check.json").read_text())["steps"]["bench"]["cases"]["cb_r0.5_k1"]
  xplane = tmp_path / "gpu.xplane.pb"
  xplane.write_bytes(gzip.decompress((run / "profile_cb_r0.5_k1.xplane.pb.gz").read_bytes()))
  planes = list(jax.profiler.ProfileData.from_file(str(xplane)).planes)
  devices = trace_summary._device_planes(planes)  # pylint: disable=protected-access
  ops = trace_summary._ops(planes, devices)  # pylint: disable=protected-access
  assert [p.name for p in devices] == ["/device:GPU:0"] and len(ops) > 1000
  busy_per_step = trace_summary._union([(a, b) for _, a, b, _ in ops]) / 3e9  # pylint: disable=protected-access
  assert 0.9 * measured_s["median_step_s"] < busy_per_step <= measured_s["median_step_s"]
  kernels = {name for name, _, _, is_matmul in ops if is_matmul}
  assert any(k.startswith("nvjet_") for k in kernels) and any("xmma_gemm" in k for k in kernels)
  assert not any("convert" in k and "gemm" not in k for k in kernels), "an elementwise convert counted as a matmul"
