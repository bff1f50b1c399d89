"""The report's claims: paired t intervals against scipy, verdict rules, and the real report on fake sweeps.

The sweeps are run folders written as the trainer writes them (plan.json, metrics.jsonl,
sweep_done.json): that is the report's input format. Their probe scores are constructed so that
each verdict is known: CrossBERT K=1 beats BERT by about 0.05 at every seed, K=2 ties BERT within
+-0.003 at equal FLOPs; every difference is checked against the one constructed.
"""

import dataclasses
import json
import math
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from crossbert_jax.scaling import claims, collect, report
from crossbert_jax.scaling import plan as plan_lib
from tests.helpers import ROOT

OBJECTIVES = {
    "bert_r15": dict(objective="mlm", ratio=0.15, views=1),
    "cb_r50_k1": dict(objective="crossbert", ratio=0.5, views=1), "cb_r50_k2": dict(objective="crossbert", ratio=0.5,
                                                                                    views=2)}
TPS = 4096  # Tokens per step.


def test_paired_interval_matches_scipy():
  d = [0.012, 0.031, 0.018, 0.025]
  iv = claims.paired_interval(d)
  ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.95)
  assert iv["n"] == 4 and iv["mean"] == pytest.approx(np.mean(d))
  assert (iv["lo"], iv["hi"]) == (pytest.approx(ci.low), pytest.approx(ci.high))
  assert iv["sd"] == pytest.approx(np.std(d, ddof=1))
  one = claims.paired_interval([0.5, float("nan")])
  assert one["n"] == 1 and math.isnan(one["lo"]) and claims.verdict(one) == "inconclusive"


@pytest.mark.parametrize("lo,hi,expected", [(0.001, 0.05, "holds"), (-0.05, -0.001, "does not hold"),
                                            (-0.009, 0.008, "does not hold"), (-0.011, 0.005, "inconclusive"),
                                            (-0.02, 0.03, "inconclusive")])
def test_verdict_reads_the_interval_only(lo, hi, expected):
  assert claims.verdict({"mean": (lo + hi) / 2, "lo": lo, "hi": hi, "sd": 0.01, "n": 3}) == expected


@pytest.mark.parametrize("mean,sd", [(0.004, 0.006), (0.03, 0.02), (0.0, 0.004)])
def test_seeds_needed_is_the_first_decisive_count(mean, sd):
  n = claims.seeds_needed({"mean": mean, "sd": sd, "lo": 0.0, "hi": 0.0, "n": 3})
  half = lambda k: stats.t.ppf(0.975, k - 1) * sd / math.sqrt(k)
  decide = lambda k: claims.verdict({"mean": mean, "lo": mean - half(k), "hi": mean + half(k), "sd": sd, "n": k})
  assert n is not None and decide(n) != "inconclusive"
  assert n == 2 or decide(n - 1) == "inconclusive"


def test_dropped_tasks_are_at_chance_for_every_objective():
  def result(label, seed, scores):
    run = plan_lib.Run(f"xs__{label}__s{seed}", "xs", label, seed, "mlm", {}, 1e12, 1e9, 100, TPS)
    return collect.RunResult(run, True, 100, np.zeros((0, 2)), {k: [(100, v)] for k, v in scores.items()}, 1.0, 1.0)

  # rte sits at chance (0.53) everywhere; cola leaves it for one objective only: it stays in.
  results = [
      result(l, s, {"sst2/linear": 0.7, "rte/linear": 0.535, "cola/linear": 0.05 if l == "cb_r50_k1" else 0.0})
      for l in OBJECTIVES
      for s in range(3)]
  assert claims.dropped_tasks(results, {"sst2": 0.5, "rte": 0.53, "cola": 0.0}, "linear") == ["rte"]
  assert claims.dropped_tasks(results, {"sst2": 0.75, "rte": 0.53, "cola": 0.1}, "linear") == []  # Never all.


def _write_run(root, run, probe_steps, scores, old_format=False):
  """A finished run's folder: metrics rows with loss and throughput, probe rows at `probe_steps`."""
  folder = root / "runs" / run.name
  folder.mkdir(parents=True)
  rows = []
  start = run.fork_step if run.kind == "branch" else 0
  for step in range(start + 1, run.steps + 1):
    if step % 10 and step not in probe_steps and step != run.steps:
      continue
    row = {"step": step, "loss": 8.0 - step / run.steps, "tokens_per_second": 1000.0}
    if step in probe_steps:
      row.update({f"probe/{k}": v(step) for k, v in scores.items()})
    rows.append(row)
  (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  (folder / plan_lib.DONE_FILE).write_text(json.dumps({"steps": run.steps}))


def _spec(flops, tasks="sst2,stsb", data_dir="/nonexistent"):
  return {
      "name": "fake", "variant": "tiny", "data_path": "builtin", "tokenizer_vocab_size": 512, "common": {},
      "sizes": {"xs": dict(embed_dim=32, num_heads=2, num_layers=1, mlp_dim=64, flops=flops)}, "objectives": OBJECTIVES,
      "seeds": [0, 1, 2], "warmup_fraction": 0.1, "probes": dict(count=1, tasks=tasks, data_dir=data_dir,
                                                                 max_examples=0)}


# Average-probe score of each objective at training tokens t (per seed), linear in log tokens: K=1 is
# BERT + 0.05; K=2 (half the tokens of BERT at equal FLOPs) makes up exactly that, +-0.001.
NOISE = {0: 0.0, 1: 0.02, 2: -0.015}


def _score(label, seed, tokens):
  base = 0.55 + 0.02 * math.log10(tokens / 1e5)
  if label == "cb_r50_k1":
    return base + 0.05 + 0.003 * seed
  if label == "cb_r50_k2":
    return base + 0.02 * math.log10(2) + 0.001 * (seed - 1)
  return base + NOISE[seed] * 0.1


def _wsd_sweep(root, data_dir="/nonexistent"):
  """Three budgets as WSD branches of one stable run per (objective, seed); steps differ by objective."""
  budgets = [1e12, 3e12, 1e13]
  spec = _spec(budgets, data_dir=data_dir)
  runs = []
  for label, o in OBJECTIVES.items():
    per_step = {"bert_r15": 1e10, "cb_r50_k1": 1e10, "cb_r50_k2": 2e10}[label]
    for seed in range(3):
      steps = [int(b / per_step) for b in budgets]
      stable = plan_lib.Run(f"xs__{label}__s{seed}__stable", "xs", label, seed, o["objective"], {
          "eval.tasks": "sst2,stsb", "eval.data_dir": data_dir, "masking.ratio": o["ratio"], "masking.views": o["views"]
      }, budgets[-1], per_step, steps[-1], TPS, kind="stable")
      runs.append(stable)
      _write_run(root, stable, set(), {})
      for i, (b, t) in enumerate(zip(budgets, steps)):
        branch = dataclasses.replace(stable, name=f"xs__{label}__s{seed}__T{t}", flops_budget=b, steps=t, kind="branch",
                                     fork_from=stable.name, fork_step=int(0.8 * t), budget_index=i)
        runs.append(branch)
        score = lambda step, label=label, seed=seed: _score(label, seed, step * TPS)
        # stsb stays at chance (0) for every objective; sst2 carries the whole average.
        _write_run(root, branch, {t - 1, t}, {
            "sst2/linear": score, "sst2/knn": score, "stsb/linear": lambda s: 0.004, "stsb/knn": lambda s: -0.002})
  plan_lib.save_plan(root, spec, runs)
  return spec, runs


@pytest.mark.slow
def test_report_claims_on_wsd_branches(tmp_path, shared_data):
  root = tmp_path / "sweep"
  _wsd_sweep(root, data_dir=str(shared_data))
  out = tmp_path / "report"
  report.write_report(root, out)
  found = json.loads((out / "claims.json").read_text())
  assert found["dropped"] == {"linear": ["stsb"], "knn": ["stsb"]}, found["dropped"]
  assert found["chance"]["stsb"] == 0.0 and 0.4 < found["chance"]["sst2"] < 0.6
  rows = found["rows"]
  # 2 CrossBERT objectives x 1 BERT + K=2 vs K=1, x 3 budgets x 2 probes.
  assert len(rows) == 3 * 3 * 2 and {r["seeds"] for r in rows} == {3}
  by = lambda claim, a, i: [r for r in rows if r["claim"] == claim and r["a"] == a and r["budget_index"] == i]
  for i in range(3):
    k1 = by("crossbert_vs_bert", "cb_r50_k1", i)
    assert all(r["verdict"] == "holds" and r["ci95"][0] > 0 for r in k1), k1
    assert all(r["b"] == "bert_r15" and r["tasks"] == ["sst2"] for r in k1)
    k2 = by("crossbert_vs_bert", "cb_r50_k2", i)
    assert all(r["verdict"] == "does not hold" and -0.01 <= r["ci95"][0] <= r["ci95"][1] <= 0.01 for r in k2), k2
  for r in rows:
    mean = np.mean([_diff(r, s) for s in range(3)])
    assert r["mean_diff"] == pytest.approx(mean, abs=1e-9), r
  eff = [r for r in rows if r["claim"] == "k2_vs_k1_sample_efficiency"]
  assert len(eff) == 6 and all("equal tokens" in r["at"] for r in eff)
  text = (out / "report.md").read_text()
  assert "## Claims, by seed-paired 95% intervals" in text and "left out stsb" in text
  assert "**Power at the largest size (xs)**" in text and "WSD stable runs (not points): 9 of 9 finished" in text
  assert "__stable" not in text.split("## Every run")[1], "a stable run is listed as a point"


def _diff(row, seed):
  """The expected paired difference of a claim row for one seed, from the constructed scores."""
  steps = {"bert_r15": 1e10, "cb_r50_k1": 1e10, "cb_r50_k2": 2e10}
  tokens = lambda label: int(row["budget_flops"] / steps[label]) * TPS
  if row["claim"] == "crossbert_vs_bert":
    return _score(row["a"], seed, tokens(row["a"])) - _score(row["b"], seed, tokens(row["b"]))
  at = row["at_tokens"]
  return _score(row["a"], seed, at) - _score(row["b"], seed, at)  # Log-linear scores: interpolation is exact.


def _plain_runs(root, probe_steps) -> list:
  """Finished plain runs (one budget, 100 steps) of every objective x 3 seeds, sst2 probed at `probe_steps`."""
  runs = []
  for label, o in OBJECTIVES.items():
    for seed in range(3):
      run = plan_lib.Run(f"xs__{label}__s{seed}", "xs", label, seed, o["objective"], {
          "eval.tasks": "sst2", "eval.data_dir": "/nonexistent", "masking.ratio": o["ratio"],
          "masking.views": o["views"]}, 1e12, 1e10, 100, TPS)
      runs.append(run)
      score = lambda step, label=label, seed=seed: _score(label, seed, step * TPS)
      _write_run(root, run, probe_steps, {"sst2/linear": score, "sst2/knn": score})
  return runs


def test_report_reads_an_old_plan_without_the_new_run_fields(tmp_path):
  """A plan.json from before WSD (no kind / fork / budget fields): one budget, every run a point."""
  root = tmp_path / "old"
  spec = _spec(1e12, tasks="sst2", data_dir="/nonexistent")
  runs = _plain_runs(root, {25, 50, 75, 100})
  saved = [{
      k: v
      for k, v in dataclasses.asdict(r).items()
      if k not in ("kind", "fork_from", "fork_step", "budget_index")}
           for r in runs]
  root.mkdir(exist_ok=True)
  (root / plan_lib.PLAN_FILE).write_text(json.dumps({"spec": spec, "runs": saved}))
  spec, results, missing = collect.collect(root)  # The report's own input path, without its plots and fits.
  assert not missing and len(results) == 9 and {r.run.kind for r in results} == {"run"}
  found = claims.evaluate(spec, results)
  assert found["chance"] == {} and "no task is dropped" in found["chance_note"]
  k1 = [r for r in found["rows"] if r["a"] == "cb_r50_k1" and r["claim"] == "crossbert_vs_bert"]
  assert len(k1) == 2 and all(r["verdict"] == "holds" and r["budget_index"] == 0 for r in k1)
  eff = [r for r in found["rows"] if r["claim"] == "k2_vs_k1_sample_efficiency"]
  assert eff and all(r["seeds"] == 3 for r in eff), eff  # In-run probes make each seed's curve.
  spread = "\n".join(report._seed_spread(spec, results, ["xs"], ["avg/knn"]))  # pylint: disable=protected-access
  assert "| xs | bert_r15 | 3 |" in spread  # One budget: the size's name alone, as before WSD.
  text = "\n".join(claims.markdown(spec, found))
  assert "no task left out" in text and "**Power at the largest size (xs)**" in text


def test_a_run_still_training_is_no_point_of_the_claims(tmp_path):
  """A run without sweep_done.json (its probes so far are early ones) is left out of every interval; the
  power line names the spec's largest size even when none of its points has finished."""
  root = tmp_path / "live"
  spec = _spec(1e12, tasks="sst2", data_dir="/nonexistent")
  spec["sizes"]["s"] = dict(embed_dim=48, num_heads=2, num_layers=1, mlp_dim=96, flops=2e12)
  runs = _plain_runs(root, {50, 100})
  (root / "runs" / runs[0].name / plan_lib.DONE_FILE).unlink()  # bert_r15 seed 0: still training.
  plan_lib.save_plan(root, spec, runs)
  spec, results, _ = collect.collect(root)
  found = claims.evaluate(spec, results)
  vs_bert = [r for r in found["rows"] if r["claim"] == "crossbert_vs_bert"]
  assert vs_bert and {r["seeds"] for r in vs_bert} == {2}, "the unfinished seed is paired"
  assert {r["seeds"] for r in found["rows"] if r["claim"] == "k2_vs_k1_sample_efficiency"} == {3}
  text = "\n".join(claims.markdown(spec, found))
  assert "**Power at the largest size (s)**: no CrossBERT-vs-BERT comparison there" in text
  assert claims.evaluate(spec, [r for r in results if not r.done])["rows"] == []
  text = report.write_report(root, tmp_path / "report").read_text()
  assert "8 of 9 points finished (1 still training: the plots and tables include them" in text
  assert f"{runs[0].name} (partial: step 100)" in text


def test_an_objective_not_started_reads_n_a_not_nan(tmp_path):
  """A sweep where one objective has no run yet: its cells say why they are empty, never 'nan'."""
  root = tmp_path / "live"
  spec = _spec(1e12, tasks="sst2", data_dir="/nonexistent")
  runs = _plain_runs(root, {50, 100})
  for run in runs:
    if run.label == "cb_r50_k2":
      shutil.rmtree(root / "runs" / run.name)  # Not started: in the plan, no folder.
  plan_lib.save_plan(root, spec, runs)
  text = report.write_report(root, tmp_path / "report").read_text()
  assert not re.search(r"\bnan|nan\b", text), [l for l in text.splitlines() if re.search(r"\bnan|nan\b", l)]
  assert "cb_r50_k2 n/a (not finished)" in text  # Throughput ratio.
  assert "n/a: no finished pair of runs yet" in text  # Seeds for a decisive K=2 interval.
  assert "cb_r50_k2 - cb_r50_k1 avg/linear n/a (inconclusive)" in text
  _check_claims_json(tmp_path / "report" / "claims.json")


def _check_claims_json(path):
  """tools/check_claims.py agrees with every row the report wrote, and names a row whose verdict is changed."""
  check = lambda: subprocess.run([sys.executable, str(ROOT / "tools" / "check_claims.py"),
                                  str(path)], capture_output=True, text=True, timeout=120)
  found = json.loads(path.read_text())
  paired = [r for r in found["rows"] if r["seeds"] >= 2]
  assert paired and any(r["seeds"] == 0 for r in found["rows"]), "both kinds of row are checked"
  done = check()
  assert done.returncode == 0 and f"{len(found['rows'])} of {len(found['rows'])} rows agree" in done.stdout, done
  row = paired[0]
  row["verdict"] = "holds" if row["verdict"] != "holds" else "inconclusive"
  path.write_text(json.dumps(found))
  done = check()
  assert done.returncode == 1 and f"{row['a']} - {row['b']} {row['size']}" in done.stdout, done
  assert f"verdict is {row['verdict']}, recomputed" in done.stdout, done.stdout
  path.write_text("{")
  done = check()
  assert done.returncode == 2 and done.stderr.startswith("error:") and len(done.stderr.splitlines()) == 1, done


def test_throughput_compares_only_runs_of_one_machine(tmp_path):
  """Tokens/s ratios are printed when the runs name one machine (or none: caveated), n/a when they span two."""
  root = tmp_path / "mixed"
  spec = _spec(1e12, tasks="sst2", data_dir="/nonexistent")
  runs = _plain_runs(root, {50, 100})
  plan_lib.save_plan(root, spec, runs)

  def report_text(machine_of):
    for run in runs:
      (root / "runs" / run.name / "sweep_wall.json").write_text(json.dumps({"wall_s": 1.0, **machine_of(run)}))
    spec_, results, _ = collect.collect(root)
    found = claims.evaluate(spec_, results)
    return "\n".join(report._claims(spec_, results, ["xs"], ["avg/linear"], found))  # pylint: disable=protected-access

  one = report_text(lambda run: {"machines": ["CPU A, 2 CPUs"]})
  assert "- xs: cb_r50_k1 1.00x, cb_r50_k2 1.00x\n" in one + "\n", one
  old = report_text(lambda run: {})  # Runs from before the field: ratios, with the caveat.
  assert "cb_r50_k1 1.00x, cb_r50_k2 1.00x (machine not recorded for 9 of 9 runs" in old, old
  two = report_text(lambda run: {"machines": ["CPU B, 8 CPUs" if run.label == "bert_r15" else "CPU A, 2 CPUs"]})
  assert "- xs: n/a: its runs span 2 machines (CPU A, 2 CPUs; CPU B, 8 CPUs)" in two and "1.00x" not in two, two
  assert "Finished seeds per size: xs 3." in two


def test_check_claims_checks_every_field_and_refuses_unreadable_rows(tmp_path):
  """On the committed study's claims.json: a changed sd / decisive / seeds_needed is a disagreement (exit 1);
  a one-element ci95 or a file with no rows cannot be checked (one line, exit 2)."""
  committed = json.loads((ROOT / "docs" / "results" / "gutenberg_wsd" / "claims.json").read_text())
  path = tmp_path / "claims.json"
  run = lambda: subprocess.run([sys.executable, str(ROOT / "tools" / "check_claims.py"),
                                str(path)], capture_output=True, text=True, timeout=120)
  paired = next(i for i, r in enumerate(committed["rows"]) if r["seeds"] >= 2)
  for key, value in (("sd", 1.0), ("decisive", None), ("seeds_needed", 999)):
    found = json.loads(json.dumps(committed))
    row = found["rows"][paired]
    row[key] = (not row[key]) if value is None else value
    path.write_text(json.dumps(found))
    done = run()
    assert done.returncode == 1 and f"{key} is {row[key]}, recomputed" in done.stdout, (key, done.stdout[-800:])
  for change in (lambda f: f["rows"][paired].update(ci95=[0.1]), lambda f: f.update(rows=[])):
    found = json.loads(json.dumps(committed))
    change(found)
    path.write_text(json.dumps(found))
    done = run()
    assert done.returncode == 2 and done.stderr.startswith("error:") and len(done.stderr.splitlines()) == 1, done


def test_check_claims_checks_the_rows_against_the_plan(tmp_path):
  """A row deleted, repeated, or with its labels swapped (its differences negated, so its numbers still
  agree) disagrees with the plan the report wrote beside the rows (exit 1)."""
  committed = json.loads((ROOT / "docs" / "results" / "gutenberg_wsd" / "claims.json").read_text())
  path = tmp_path / "claims.json"

  def run(change):
    found = json.loads(json.dumps(committed))
    change(found)
    path.write_text(json.dumps(found))
    return subprocess.run([sys.executable, str(ROOT / "tools" / "check_claims.py"),
                           str(path)], capture_output=True, text=True, timeout=120)

  assert "the rows are exactly the plan's" in run(lambda f: None).stdout

  def swap(found):  # A reads as B: the per-seed differences negated, the rest recomputed by the checker too.
    row = found["rows"][0]
    row["a"], row["b"] = row["b"], row["a"]
    row["per_seed_diff"] = {seed: -d for seed, d in row["per_seed_diff"].items()}

  first = committed["rows"][0]
  name = f"{first['claim']} {first['a']} {first['b']} {first['size']} {first['budget_index']} {first['probe']}"
  for change, needle in ((lambda f: f["rows"].pop(0), f"row {name} is missing"),
                         (lambda f: f["rows"].append(f["rows"][0]),
                          f"row {name} appears 2 times"), (swap, "is not one the plan implies")):
    done = run(change)
    assert done.returncode == 1 and needle in done.stdout, (needle, done.stdout[-800:])
