"""The report says "no fit" where its power-law fits failed, and shows what its throughput ratio was taken under.

The sweeps are run folders written as the trainer writes them (plan.json, metrics.jsonl,
sweep_done.json), the report's input format; the fits are scipy's, on those points.
"""

import json
import math
import os
import re
import time

import jax.numpy as jnp
import numpy as np

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as config_plan
from crossbert_jax.run import metrics, recorder
from crossbert_jax.scaling import collect, fit, plots, report
from crossbert_jax.scaling import plan as plan_lib

OBJECTIVES = {
    "bert_r15": dict(objective="mlm", ratio=0.15, views=1), "cb_r50_k1": dict(objective="crossbert", ratio=0.5,
                                                                              views=1)}
STEPS = 100
NUMBER_WITH_INTERVAL = re.compile(r"\d\.\d+ \[\d")  # "0.210 [0.210, 0.210]": a number shown as a finding.


def _sweep(root, log_steps, row=lambda label, step: {}):
  """One finished run per objective (size xs, seed 0) logging loss and probes at `log_steps`; `row` adds keys."""
  spec = {
      "name": "fake", "variant": "tiny", "data_path": "builtin", "tokenizer_vocab_size": 512, "common": {},
      "sizes": {"xs": dict(embed_dim=32, num_heads=2, num_layers=1, mlp_dim=64, flops=1e12)}, "objectives": OBJECTIVES,
      "seeds": [0], "warmup_fraction": 0.1, "probes": dict(count=4, tasks="sst2", data_dir="/nonexistent",
                                                           max_examples=0)}
  runs = []
  rng = np.random.default_rng(0)
  for label, o in OBJECTIVES.items():
    run = plan_lib.Run(f"xs__{label}__s0", "xs", label, 0, o["objective"], {
        "eval.tasks": "sst2", "eval.data_dir": "/nonexistent", "masking.ratio": o["ratio"], "masking.views": o["views"]
    }, 1e12, 1e10, STEPS, 4096)
    runs.append(run)
    folder = root / "runs" / run.name
    folder.mkdir(parents=True)
    rows = []
    for step in log_steps:
      noise = 1 + 0.004 * rng.standard_normal()
      score = 0.5 + 0.3 * (1 - (step / 10) ** -0.5) * noise
      rows.append({
          "step": step, "loss": (5.0 + 3.0 * (step / 10) ** -0.4) * noise, "tokens_per_second": 1000.0,
          "probe/sst2/linear": score, "probe/sst2/knn": score - 0.05, **row(label, step)})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / plan_lib.DONE_FILE).write_text(json.dumps({"steps": STEPS}))
  plan_lib.save_plan(root, spec, runs)


def _section(text, title):
  return text.split(f"## {title}")[1].split("\n## ")[0]


def test_fits_from_four_points_read_no_fit_in_the_markdown_and_the_json(tmp_path):
  """4 points per objective: only the resamples that permute the data (~9%) have 4 distinct values, and they all
  give the one fit, a zero-width "interval". The report says no fit and why; with 40 points it shows the fits."""
  _sweep(tmp_path / "few", [25, 50, 75, 100])
  text = report.write_report(tmp_path / "few", tmp_path / "few_out").read_text()
  fits = _section(text, "Power-law fits")
  rows = [l for l in fits.splitlines() if l.startswith("| bert_r15") or l.startswith("| cb_r50_k1")]
  assert len(rows) == 2 and not NUMBER_WITH_INTERVAL.search(fits), fits
  for line in rows:
    cells = [c.strip() for c in line.split("|")[2:-1]]
    assert len(cells) == 3 and all(
        c.startswith("no fit: only ") and "bootstrap resamples gave a fit" in c for c in cells), cells
  found = json.loads((tmp_path / "few_out" / "fits.json").read_text())
  assert len(found["fits"]) == 2 * 3 and found["rule"]["min_bootstrap_fraction"] == fit.MIN_BOOT_FRACTION
  for row in found["fits"]:
    assert row["fit"] is False and "bootstrap resamples gave a fit" in row["reason"], row
    assert all(row[k] is None for k in ("alpha", "alpha_ci", "e", "e_ci", "a", "c0")), row

  _sweep(tmp_path / "many", list(range(12, STEPS + 1, 2)))  # 45 points past warmup: the fits are made.
  text = report.write_report(tmp_path / "many", tmp_path / "many_out").read_text()
  assert "no fit:" not in _section(text, "Power-law fits")
  found = json.loads((tmp_path / "many_out" / "fits.json").read_text())
  loss = [r for r in found["fits"] if r["target"] == "loss"]
  assert loss and all(r["fit"] and r["reason"] is None and r["bootstrap_fits"] >= 100 for r in loss), loss
  assert all(r["alpha_ci"][0] < r["alpha"] < r["alpha_ci"][1] for r in found["fits"]), found["fits"]


def test_an_exponent_run_to_its_bound_is_no_fit():
  """Errors that rise with compute: curve_fit stops at alpha = 0 (E + A, a constant: E and A undetermined)."""
  c = np.geomspace(1e12, 1e14, 8)
  law = fit.fit_power_law(c, 2.0 + 0.01 * np.arange(8))
  assert law.alpha is None and law.e is None and law.alpha_ci is None and not law.fitted, law
  assert "bound" in law.note and law.reason


def test_the_fit_figure_labels_a_failed_fit_no_fit_and_draws_no_curve():
  c = np.array([1e12, 2e12, 4e12, 8e12])
  points = {"few": (c, 3.0 + c / 1e12 * -0.1), "many": (np.geomspace(1e12, 1e14, 12), None)}
  points["many"] = (points["many"][0], 2.0 + 1.5 * (points["many"][0] / 1e12) ** -0.3)
  laws = {label: fit.fit_power_law(*xy, n_boot=50) for label, xy in points.items()}
  fig = plots.fits_figure(points, laws, "training loss")
  legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
  plots.plt.close(fig)
  assert legend[0] == f"few: no fit ({laws['few'].reason})" and not re.search(r"\d", legend[0]), legend
  assert legend[1].startswith("many: alpha 0.3") and "[" in legend[1], legend
  assert len(fig.axes[0].get_lines()) == 1, "a curve is drawn for the failed fit"


def test_the_throughput_shows_the_steps_spread_and_the_load_it_was_taken_under(tmp_path):
  """Rows with varying tokens/s and load: the report gives each objective's median, the steps' p10-p90 and the
  load (median and max), says it is timed in training and that a ratio under load is not a finding."""
  tps = {"bert_r15": 1000.0, "cb_r50_k1": 400.0}
  load = {"bert_r15": 1.0, "cb_r50_k1": 6.0}  # The K=1 run shared the machine.
  _sweep(
      tmp_path / "s", list(range(10, STEPS + 1, 10)), lambda label, step: {
          "tokens_per_second": tps[label] * (0.5 + step / STEPS), "load_avg_1m": load[label] + step / 100})
  text = report.write_report(tmp_path / "s", tmp_path / "out").read_text()
  section = _section(text, "Throughput")
  assert "Timed in training" in section and "A ratio taken under load is not a finding" in section, section
  steps = {label: np.array([tps[label] * (0.5 + s / STEPS) for s in range(20, STEPS + 1, 10)]) for label in tps}
  for label in tps:  # The first logged step (10) is left out.
    lo, hi = np.percentile(steps[label], [10, 90])
    loads = np.array([load[label] + s / 100 for s in range(20, STEPS + 1, 10)])
    row = f"| xs | {label} | 1 | {np.median(steps[label]):,.0f} | {lo:,.0f}-{hi:,.0f} | " \
          f"{np.median(loads):.2f} ({loads.max():.2f}) |"
    assert row in section, (row, section)
  claim = text.split("**(1) Throughput")[1].split("**(2)")[0]
  assert "- xs: cb_r50_k1 0.40x" in claim and "a ratio taken under load is not a finding" in claim, claim
  both = np.concatenate([load[label] + np.arange(20, STEPS + 1, 10) / 100 for label in load])
  assert f"median (max) {np.median(both):.2f} ({both.max():.2f})" in claim, claim


def test_rows_record_the_load_average(tmp_path):
  """The trainer's rows carry the host's 1-minute load average, what the report shows beside tokens/s."""
  c = config_lib.get_config("crossbert", "tiny")
  c.metrics.log_every = 1
  logger = metrics.MetricsLogger(str(tmp_path), total_steps=c.train.steps, start_step=0, enabled=True,
                                 tensorboard=False, progress_bar=False)
  rec = recorder.StepRecorder(config_plan.build(c), 1, logger, lambda s: s * 100, recorder.Progress(doing=""),
                              recorder.Outcome(), str(tmp_path), lambda line: None)
  before = os.getloadavg()[0]
  for step in (1, 2, 3):
    rec.dispatched(step, {"loss": jnp.float32(2.0), "accuracy": jnp.float32(0.5)}, time.perf_counter(), 0.0)
  rec.flush()
  logger.close()
  after = os.getloadavg()[0]
  rows = metrics.read_metrics(str(tmp_path))
  assert [r["step"] for r in rows] == [1, 2, 3]
  assert all(isinstance(r.get("load_avg_1m"), float) and math.isfinite(r["load_avg_1m"]) for r in rows), rows
  assert all(min(before, after) - 1 <= r["load_avg_1m"] <= max(before, after) + 1 for r in rows), (before, rows, after)
  # The report reads them back, the first logged step left out.
  plan_run = plan_lib.Run("r", "xs", "bert_r15", 0, "mlm", {}, 1e12, 1e10, 3, 4096)
  (tmp_path / plan_lib.DONE_FILE).write_text("{}")
  result = collect._result(plan_run, tmp_path)  # pylint: disable=protected-access
  assert list(result.step_load) == [r["load_avg_1m"] for r in rows[1:]]
