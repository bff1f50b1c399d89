"""The report's claims: seed-paired differences with 95% t intervals, and a verdict by rule.

For every size and budget: each CrossBERT r=0.5 objective minus each BERT objective on the average
probe score at equal training FLOPs (the ladder's budgets), and K=2 minus K=1 at equal training
tokens (sample efficiency: the other side's score interpolated, in log tokens, between its own
budgets). A difference is paired by seed; its interval is mean +- t(0.975, n-1) * sd / sqrt(n).

Verdict on "A is better than B": "holds" when the interval is above 0; "does not hold" when it is
below 0, or inside +-MARGIN (no difference larger than MARGIN); otherwise "inconclusive". An
interval is decisive when it is not inconclusive; where it is not, `seeds_needed` says how many
seeds would make it so if the paired mean and sd stayed as measured.

The average probe leaves out the tasks at chance for every objective: those whose seed-mean score
is within CHANCE_MARGIN of the constant predictor's at every (size, budget, objective).
"""

import math
from typing import Any

import numpy as np
from scipy import stats

from crossbert_jax.core.errors import UserError
from crossbert_jax.evaluation import probes as probes_lib
from crossbert_jax.evaluation import tasks as tasks_lib
from crossbert_jax.scaling import collect as collect_lib
from crossbert_jax.scaling.collect import RunResult

MARGIN = 0.01  # An interval inside +-MARGIN answers "no difference larger than MARGIN".
CHANCE_MARGIN = 0.01  # A task's seed-mean score within this of its chance level is at chance.
LEVEL = 0.95
MAX_SEEDS = 1000  # seeds_needed gives up beyond this.
KINDS = collect_lib.PROBE_KINDS
VERDICTS = ("holds", "does not hold", "inconclusive")

# ----------------------------------------------------------------------------- statistics


def paired_interval(diffs: list[float]) -> dict[str, float]:
  """{mean, lo, hi, sd, n} of seed-paired differences (NaNs dropped); lo/hi/sd NaN below 2 seeds."""
  d = np.array([x for x in diffs if math.isfinite(x)], float)
  n = len(d)
  if n == 0:
    return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "sd": float("nan"), "n": 0}
  mean = float(d.mean())
  if n < 2:
    return {"mean": mean, "lo": float("nan"), "hi": float("nan"), "sd": float("nan"), "n": 1}
  sd = float(d.std(ddof=1))
  half = float(stats.t.ppf(0.5 + LEVEL / 2, n - 1)) * sd / math.sqrt(n)
  return {"mean": mean, "lo": mean - half, "hi": mean + half, "sd": sd, "n": n}


def verdict(iv: dict[str, float]) -> str:
  """"holds" / "does not hold" / "inconclusive" for "A is better than B", from the interval only."""
  lo, hi = iv["lo"], iv["hi"]
  if not (math.isfinite(lo) and math.isfinite(hi)):
    return "inconclusive"
  if lo > 0:
    return "holds"
  if hi < 0 or (lo >= -MARGIN and hi <= MARGIN):
    return "does not hold"
  return "inconclusive"


def seeds_needed(iv: dict[str, float]) -> int | None:
  """Seeds for a decisive interval if the mean and sd stayed as measured (None: unknown or > MAX_SEEDS)."""
  mean, sd = abs(iv["mean"]), iv["sd"]
  if not (math.isfinite(mean) and math.isfinite(sd)):
    return None
  if sd == 0:
    return 2
  # Excluding zero needs a half-width under |mean|; "inside +-MARGIN" needs at most MARGIN - |mean|.
  target = max(mean, MARGIN - mean)
  for n in range(2, MAX_SEEDS + 1):
    if stats.t.ppf(0.5 + LEVEL / 2, n - 1) * sd / math.sqrt(n) < target:
      return n
  return None


# ----------------------------------------------------------------------------- chance and the average


def eval_protocol(results: list[RunResult]) -> dict[str, Any]:
  """The in-training probe settings of the runs (eval.* overrides; defaults for keys old plans lack)."""
  o = results[0].run.overrides
  return {
      "tasks": o.get("eval.tasks", ""), "data_dir": o.get("eval.data_dir", ""),
      "max_examples": o.get("eval.max_examples", 2000), "splits": o.get("eval.splits",
                                                                        "first"), "seed": o.get("eval.seed", 0)}


def chance_levels(results: list[RunResult]) -> tuple[dict[str, float], str]:
  """({task: chance level of its headline score}, note); empty with a note when the data is not readable."""
  p = eval_protocol(results)
  out = {}
  try:
    for name in tasks_lib.parse_tasks(p["tasks"]):
      task = tasks_lib.probe_view(tasks_lib.load_task(name, p["data_dir"]), p["splits"])
      out[name] = probes_lib.chance_score(task, p["max_examples"], p["seed"])
  except UserError as e:
    return {}, f"chance levels unknown (the probe data is not readable here: {e}); no task is dropped"
  return out, ""


def _groups(results: list[RunResult]) -> dict[tuple, list[RunResult]]:
  """(size, label, budget_index) -> its results (one per seed)."""
  out: dict[tuple, list[RunResult]] = {}
  for r in results:
    out.setdefault((r.run.size, r.run.label, r.run.budget_index), []).append(r)
  return out


def tasks_of(results: list[RunResult], kind: str) -> list[str]:
  """Every task with a final `kind` probe, sorted."""
  return sorted({k.split("/")[0] for r in results for k in r.probes if k.endswith("/" + kind)} - {"avg"})


def dropped_tasks(results: list[RunResult], chance: dict[str, float], kind: str) -> list[str]:
  """Tasks at chance for every objective on the `kind` probe (never all of them: then none)."""
  tasks = tasks_of(results, kind)
  groups = _groups(results).values()
  dropped = []
  for t in tasks:
    if t not in chance:
      continue
    means = [np.nanmean([r.final_probe(f"{t}/{kind}") for r in g]) for g in groups]
    if all(m <= chance[t] + CHANCE_MARGIN for m in means if math.isfinite(m)):
      dropped.append(t)
  return [] if len(dropped) == len(tasks) else dropped


def average(scores: dict[str, float], tasks: list[str]) -> float:
  """Mean of the tasks' scores; NaN if one is missing."""
  values = [scores.get(t, float("nan")) for t in tasks]
  return float(np.mean(values)) if tasks and all(math.isfinite(v) for v in values) else float("nan")


def final_average(r: RunResult, kind: str, tasks: list[str]) -> float:
  return average({t: r.final_probe(f"{t}/{kind}") for t in tasks}, tasks)


def average_curve(results: list[RunResult], kind: str, tasks: list[str]) -> list[tuple[float, float]]:
  """(tokens, average over `tasks`) of one (size, objective, seed) across its budgets."""
  per_task = {t: dict(collect_lib.curve(results, f"{t}/{kind}")) for t in tasks}
  tokens = sorted(set.intersection(*(set(c) for c in per_task.values()))) if tasks else []
  return [(x, average({t: per_task[t][x] for t in tasks}, tasks)) for x in tokens]


def _interp(points: list[tuple[float, float]], tokens: float) -> float:
  """The curve's score at `tokens`, linear in log tokens; NaN outside its range (no extrapolation)."""
  if not points or not points[0][0] <= tokens <= points[-1][0] or tokens <= 0:
    return float("nan")
  xs, ys = zip(*points)
  return float(np.interp(math.log(tokens), np.log(xs), ys))


# ----------------------------------------------------------------------------- claims


def find(spec: dict, objective: str, ratio: float | None, views: int) -> list[str]:
  """Labels of full-width objectives of this kind (ratio None: any), in spec order."""
  return [
      label for label, o in spec["objectives"].items()
      if o["objective"] == objective and o["views"] == views and o.get("reconstructor_width", 1.0) == 1.0 and
      (ratio is None or abs(o["ratio"] - ratio) < 1e-9)]


def comparisons(spec: dict) -> list[tuple[str, str, str]]:
  """(claim, A, B): each CrossBERT r=0.5 minus each BERT (equal FLOPs); K=2 minus K=1 (equal tokens)."""
  berts = find(spec, "mlm", None, 1)
  k1, k2 = find(spec, "crossbert", 0.5, 1), find(spec, "crossbert", 0.5, 2)
  out = [("crossbert_vs_bert", cb, bert) for cb in k1[:1] + k2[:1] for bert in berts]
  if k1 and k2:
    out.append(("k2_vs_k1_sample_efficiency", k2[0], k1[0]))
  return out


def _row(claim, a, b, size, budget, kind, tasks, seeds, diffs, at, at_tokens=None) -> dict[str, Any]:
  iv = paired_interval(diffs)
  return {
      "claim": claim, "a": a, "b": b, "size": size, "budget_index": budget[0], "budget_flops": budget[1],
      "probe": f"avg/{kind}", "tasks": tasks, "at": at, "at_tokens": at_tokens,
      "per_seed_diff": {str(seed): d for seed, d in zip(seeds, diffs)}, "mean_diff": iv["mean"],
      "ci95": [iv["lo"], iv["hi"]], "sd": iv["sd"], "seeds": iv["n"], "verdict": verdict(iv),
      "decisive": verdict(iv) != "inconclusive", "seeds_needed": seeds_needed(iv)}


def claim_rows(spec: dict, results: list[RunResult], kept: dict[str, list[str]]) -> list[dict[str, Any]]:
  """One row per (claim, A, B, size, budget, probe): the paired mean difference, interval and verdict."""
  groups = _groups(results)
  sizes = [s for s in spec["sizes"] if any(r.run.size == s for r in results)]
  rows = []
  for claim, a, b in comparisons(spec):
    for size in sizes:
      budgets = sorted({(r.run.budget_index, r.run.flops_budget) for r in results if r.run.size == size})
      for budget in budgets:
        ga = {r.run.seed: r for r in groups.get((size, a, budget[0]), [])}
        gb = {r.run.seed: r for r in groups.get((size, b, budget[0]), [])}
        seeds = sorted(set(ga) & set(gb))
        for kind in KINDS:
          tasks = kept[kind]
          if claim == "crossbert_vs_bert":
            diffs = [final_average(ga[s], kind, tasks) - final_average(gb[s], kind, tasks) for s in seeds]
            rows.append(_row(claim, a, b, size, budget, kind, tasks, seeds, diffs, "equal FLOPs"))
            continue
          diffs, at, tokens = _equal_tokens(ga, gb, seeds, groups, size, a, b, kind, tasks)
          rows.append(_row(claim, a, b, size, budget, kind, tasks, seeds, diffs, at, tokens))
  return rows


def _equal_tokens(ga, gb, seeds, groups, size, a, b, kind, tasks) -> tuple[list[float], str, float | None]:
  """A's point minus B's curve at A's tokens, or (outside B's range) A's curve minus B's point."""
  def seed_curve(label, seed):
    return average_curve([
        r for (sz, lb, _), rs in groups.items() if sz == size and lb == label
        for r in rs if r.run.seed == seed], kind, tasks)

  if not seeds:
    return [], "equal tokens", None
  s0 = seeds[0]
  tok_a = float(ga[s0].run.steps * ga[s0].run.tokens_per_step)
  tok_b = float(gb[s0].run.steps * gb[s0].run.tokens_per_step)
  if math.isfinite(_interp(seed_curve(b, s0), tok_a)):
    return ([final_average(ga[s], kind, tasks) - _interp(seed_curve(b, s), tok_a) for s in seeds],
            f"equal tokens ({tok_a:.3g}, {a}'s)", tok_a)
  return ([_interp(seed_curve(a, s), tok_b) - final_average(gb[s], kind, tasks) for s in seeds],
          f"equal tokens ({tok_b:.3g}, {b}'s)", tok_b)


# ----------------------------------------------------------------------------- the report's section


def _seeds_needed_text(row: dict[str, Any]) -> str:
  """The 'seeds for a decisive interval' cell: a count, or why there is none."""
  if row["seeds"] == 0:
    return "n/a: no finished pair of runs yet"
  if row["seeds"] == 1:
    return "unknown: one paired seed has no spread"
  return str(row["seeds_needed"]) if row["seeds_needed"] else f"more than {MAX_SEEDS}"


def fmt_diff(x: float | None, digits: int = 4) -> str:
  return "n/a" if x is None or not math.isfinite(x) else f"{x:+.{digits}f}"


def evaluate(spec: dict, results: list[RunResult]) -> dict[str, Any]:
  """Everything claims.json holds: chance levels, dropped tasks, the rule and one row per claim.

  Only finished points count: a run still training has no final probe yet (or an early one).
  """
  finished = [r for r in results if r.done]
  rule = {
      "level": LEVEL, "margin": MARGIN, "chance_margin": CHANCE_MARGIN, "holds": "interval above 0",
      "does not hold": f"interval below 0, or inside +-{MARGIN}",
      "inconclusive": "otherwise (or fewer than 2 paired seeds)"}
  if not finished:
    return {
        "rule": rule, "chance": {}, "chance_note": "no point has finished yet", "dropped": {k: [] for k in KINDS},
        "kept": {k: [] for k in KINDS}, "rows": []}
  chance, note = chance_levels(finished)
  dropped = {kind: dropped_tasks(finished, chance, kind) for kind in KINDS}
  kept = {kind: [t for t in tasks_of(finished, kind) if t not in dropped[kind]] for kind in KINDS}
  return {
      "rule": rule, "chance": chance, "chance_note": note, "dropped": dropped, "kept": kept,
      "plan": plan_of(spec, finished), "rows": claim_rows(spec, finished, kept)}


def plan_of(spec: dict, finished: list[RunResult]) -> dict[str, Any]:
  """What the rows must cover, for tools/check_claims.py: each label's objective, the finished
  (size, budget) cells, the probe kinds."""
  keys = ("objective", "ratio", "views", "reconstructor_width")
  return {
      "objectives": {
          label: {k: o.get(k, 1.0 if k == "reconstructor_width" else None) for k in keys}
          for label, o in spec["objectives"].items()},
      "cells": sorted({(r.run.size, r.run.budget_index) for r in finished}, key=lambda cell:
                      (list(spec["sizes"]).index(cell[0]), cell[1])), "probes": [f"avg/{kind}" for kind in KINDS]}


def markdown(spec: dict, found: dict[str, Any]) -> list[str]:
  """The claims section: the rule, the tasks left out, one table per claim, the power at the largest size."""
  chance = ", ".join(f"{t} {c:.3f}" for t, c in found["chance"].items())
  lines = [
      f"Seed-paired differences A - B of the average probe score with {LEVEL:.0%} t intervals (over seeds). "
      f"A claim (A better than B) **holds** when the interval is above 0, **does not hold** when it is below 0 "
      f"or inside +-{MARGIN} (no difference larger than {MARGIN}), and is **inconclusive** otherwise. "
      "Verdicts come from the intervals only; they are also in `claims.json`.", ""]
  lines.append(f"Chance levels (constant predictor, same protocol): {chance}." if chance else found["chance_note"] +
               ".")
  for kind in KINDS:
    d = found["dropped"][kind]
    lines.append(f"- avg/{kind}: " + (f"left out {', '.join(d)} (within {CHANCE_MARGIN} of chance for every "
                                      f"objective, size and budget); " if d else "no task left out; ") +
                 f"averaged over {', '.join(found['kept'][kind]) or 'none'}.")
  titles = {
      "crossbert_vs_bert": "CrossBERT minus BERT, equal training FLOPs",
      "k2_vs_k1_sample_efficiency": "K=2 minus K=1 (r=0.5), equal training tokens: sample efficiency"}
  for claim, title in titles.items():
    rows = [r for r in found["rows"] if r["claim"] == claim]
    if not rows:
      continue
    lines += [
        "", f"**{title}**", "", "| A - B | size | budget (FLOPs) | probe | at | mean | 95% interval | seeds | "
        "verdict | seeds for a decisive interval |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
      need = "-" if r["decisive"] else _seeds_needed_text(r)
      lines.append(f"| {r['a']} - {r['b']} | {r['size']} | {r['budget_flops']:.3g} | {r['probe']} | {r['at']} | "
                   f"{fmt_diff(r['mean_diff'])} | [{fmt_diff(r['ci95'][0])}, {fmt_diff(r['ci95'][1])}] | "
                   f"{r['seeds']} | {r['verdict']} | {need} |")
  lines += ["", *power(found["rows"], list(spec["sizes"])[-1])]  # The spec's largest, finished or not.
  return lines


def power(rows: list[dict[str, Any]], size: str | None) -> list[str]:
  """The power target: at the largest size, is every CrossBERT-vs-BERT interval decisive; if not, the seeds it needs."""
  at = [r for r in rows if r["size"] == size and r["claim"] == "crossbert_vs_bert"]
  if not at:
    return [
        f"**Power at the largest size ({size})**: no CrossBERT-vs-BERT comparison there (no finished pair "
        "of points yet, or the spec lacks the objectives)."]
  weak = [r for r in at if not r["decisive"]]
  head = (f"**Power at the largest size ({size})**: {len(at) - len(weak)} of {len(at)} CrossBERT-vs-BERT intervals "
          "are decisive (exclude 0, or lie inside +-" + f"{MARGIN}).")
  if not weak:
    return [head + " The target is met."]
  lines = [
      head + " Not decisive, with the seeds that would make each decisive if the measured paired mean and "
      "sd stayed as they are:", ""]
  for r in weak:
    need = _seeds_needed_text(r)
    lines.append(f"- {r['a']} - {r['b']}, budget {r['budget_flops']:.3g}, {r['probe']}: {r['seeds']} seeds, "
                 f"mean {fmt_diff(r['mean_diff'])}, sd {fmt_diff(r['sd'])}; seeds for a decisive interval: {need}")
  return lines
