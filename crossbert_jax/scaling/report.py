"""The sweep report: Markdown with the run table, fits, sample efficiency, claim checks, and plots.

Every number comes from the runs' metrics rows and ROOT/plan.json; the claim section states what
was measured at this scale, with the seed count, and never more: its verdicts come from the
seed-paired intervals of `claims` (also written as claims.json). A point is (size, objective,
seed, budget): a plain run or a WSD branch; WSD stable runs are not points.
"""

import json
import math
import pathlib

import numpy as np

from crossbert_jax.scaling import claims as claims_lib
from crossbert_jax.scaling import collect as collect_lib
from crossbert_jax.scaling import laws, plots, throughput
from crossbert_jax.scaling import plan as plan_lib
from crossbert_jax.scaling.collect import RunResult


def _fmt(x: float, digits: int = 3) -> str:
  return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}g}"


def _percent(x: float) -> str:
  return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.0f}%"


def _machines(results: list[RunResult]) -> tuple[list[str], int]:
  """(the machines these runs name, sorted; how many runs name none: from before runs recorded it)."""
  return sorted({m for r in results for m in r.machines}), sum(not r.machines for r in results)


def _machines_line(results: list[RunResult]) -> str:
  seen, unknown = _machines(results)
  counts = [f"{m} ({sum(m in r.machines for r in results)} runs)" for m in seen]
  return ("Machines: " + ("; ".join(counts) if counts else "not recorded (runs from before the sweep recorded them)") +
          (f"; not recorded for {unknown} of {len(results)} runs" if unknown and counts else "") + ".")


def _seed_counts(results: list[RunResult], size: str) -> str:
  """Finished seeds at a size: one number, or the range over objectives while some are training."""
  counts = sorted({
      len({r.run.seed
           for r in results
           if r.done and r.run.size == size and r.run.label == label})
      for label in {r.run.label for r in results if r.run.size == size}})
  return f"{size} {counts[0]}" if len(counts) == 1 else f"{size} {counts[0]}-{counts[-1]} by objective"


def _ratio(x: float, base: float) -> str:
  return f"{x / base:.2f}x" if math.isfinite(x) and math.isfinite(base) and base > 0 else "n/a (not finished)"


def _mean_std(values: list[float]) -> str:
  v = [x for x in values if math.isfinite(x)]
  if not v:
    return "n/a"
  return f"{np.mean(v):.4f}" + (f" ± {np.std(v, ddof=1):.4f} (n={len(v)})" if len(v) > 1 else "")


def _nanmean(values: list[float]) -> float:
  """Mean of the finite values; NaN (no warning) when there is none."""
  v = [x for x in values if math.isfinite(x)]
  return float(np.mean(v)) if v else float("nan")


def _by(results: list[RunResult], size: str, label: str, budget: int | None = None,
        seed: int | None = None) -> list[RunResult]:
  """The points of (size, objective), of one budget index and one seed when given."""
  return [
      r for r in results if r.run.size == size and r.run.label == label and
      (budget is None or r.run.budget_index == budget) and (seed is None or r.run.seed == seed)]


def _budgets(results: list[RunResult], size: str) -> list[tuple[int, float]]:
  """(budget index, FLOPs budget) of the size's points, ascending."""
  return sorted({(r.run.budget_index, r.run.flops_budget) for r in results if r.run.size == size})


def _where(results: list[RunResult], size: str, budget: tuple[int, float]) -> str:
  """The size's name, with the budget where the size has several."""
  return size if len(_budgets(results, size)) < 2 else f"{size} @ {budget[1]:.3g}"


def _find(spec: dict, objective: str, ratio: float, views: int) -> str | None:
  for label, o in spec["objectives"].items():
    if (o["objective"] == objective and abs(o["ratio"] - ratio) < 1e-9 and o["views"] == views and
        o.get("reconstructor_width", 1.0) == 1.0):
      return label
  return None


def _run_table(results: list[RunResult], keys: list[str]) -> list[str]:
  avg = [k for k in keys if k.startswith("avg/")]
  head = [
      "run", "objective", "ratio", "K", "steps", "FLOPs", "tokens", "wall s", "goodput", "tokens/s", "final loss", *avg]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in results:
    o = r.run.overrides
    status = "" if r.done else f" (partial: step {r.steps_logged})"
    cells = [
        r.run.name + status, r.run.objective, o["masking.ratio"], o["masking.views"], r.run.steps,
        _fmt(r.run.flops),
        _fmt(float(r.run.steps * r.run.tokens_per_step)),
        _fmt(r.wall_s, 4),
        _percent(r.goodput),
        _fmt(r.tokens_per_second, 4),
        _fmt(r.final_loss, 4), *[_fmt(r.final_probe(k), 3) for k in avg]]
    lines.append("| " + " | ".join(str(c) for c in cells) + " |")
  return lines


def _contrast_table(spec: dict, results: list[RunResult], contrast: list[RunResult]) -> list[str]:
  """Each (size, objective)'s final probe averages after its contrastive stage (mean ± std over seeds), beside
  its points' (the encoders the stage started from); finished contrastive runs only."""
  stage = spec["contrast"]
  head = [
      f"`configs/contrast.py:{stage['variant']}` on `{stage.get('data_path') or spec['data_path']}` after every "
      "point, its probes at its last step (finished runs; mean ± std over seeds; `before`: the points it started "
      "from).", ""]
  done = [r for r in contrast if r.done]
  if not done:
    return head + [f"No contrastive run has finished yet ({len(contrast)} logged)."]
  avg = [k for k in collect_lib.probe_keys(done) if k.startswith("avg/")]
  cols = [c for k in avg for c in (k, f"{k} before")]
  lines = [
      "| size | objective | point's FLOPs | runs | final loss | " + " | ".join(cols) + " |",
      "|" + "---|" * (5 + len(cols))]
  source = {r.run.name: r for r in results}
  groups: dict[tuple, list[RunResult]] = {}
  for r in done:
    groups.setdefault((r.run.size, r.run.label, r.run.budget_index), []).append(r)
  for (size, label, budget), rs in groups.items():
    flops = plan_lib.budgets(spec["sizes"][size])[budget]  # The budget its points trained for (scaled as planned).
    cells = [size, label, _fmt(flops), len(rs), _mean_std([r.final_loss for r in rs])]
    for k in avg:
      before = [source[r.run.fork_from].final_probe(k) for r in rs if r.run.fork_from in source]
      cells += [_mean_std([r.final_probe(k) for r in rs]), _mean_std(before) if before else "-"]
    lines.append("| " + " | ".join(str(c) for c in cells) + " |")
  return head + lines


def _config_lines(spec: dict) -> list[str]:
  lines = ["| size | d | heads | layers | mlp | FLOPs budget |", "|---|---|---|---|---|---|"]
  for name, s in spec["sizes"].items():
    budgets = s["flops"] if isinstance(s["flops"], (list, tuple)) else [s["flops"]]
    lines.append(f"| {name} | {s['embed_dim']} | {s['num_heads']} | {s['num_layers']} | {s['mlp_dim']} | " +
                 ", ".join(f"{b:.3g}" for b in budgets) + " |")
  lines += ["", "| objective | config | ratio | K | reconstructor width |", "|---|---|---|---|---|"]
  for label, o in spec["objectives"].items():
    lines.append(f"| {label} | {o['objective']} | {o['ratio']} | {o['views']} | {o.get('reconstructor_width', 1.0)} |")
  return lines


def _efficiency(spec, results, sizes, keys) -> list[str]:
  """Tokens each objective needs to reach BERT r=0.15's final probe score; K=2 vs K=1."""
  bert = _find(spec, "mlm", 0.15, 1)
  k1, k2 = _find(spec, "crossbert", 0.5, 1), _find(spec, "crossbert", 0.5, 2)
  avg = [k for k in keys if k.startswith("avg/")]
  if not bert or not avg:
    return ["Needs a BERT r=0.15 objective and probes in the spec."]
  lines = [
      f"Reference: {bert}'s final score (seed mean). Tokens to reach it (linear interpolation between probes; "
      "n/a = not reached within the budget).", "",
      "| size | probe | target | " + " | ".join(spec["objectives"]) + " | K=2 / K=1 tokens |",
      "|---|---|---|" + "---|" * (len(spec["objectives"]) + 1)]
  for size in sizes:
    for budget in _budgets(results, size):
      for key in avg:
        target = _nanmean([r.final_probe(key) for r in _by(results, size, bert, budget[0])])
        if not math.isfinite(target):
          continue
        need = {
            label: _nanmean([
                collect_lib.tokens_to_reach(_by(results, size, label, seed=seed), key, target)
                for seed in sorted({r.run.seed
                                    for r in _by(results, size, label)})]) for label in spec["objectives"]}
        ratio = need[k2] / need[k1] if k1 and k2 and need[k1] > 0 else float("nan")
        lines.append(f"| {_where(results, size, budget)} | {key} | {target:.4f} | " +
                     " | ".join(_fmt(need[l]) for l in spec["objectives"]) + f" | {_fmt(ratio)} |")
  return lines


def _seed_spread(spec, results, sizes, keys) -> list[str]:
  """Mean +- standard deviation over seeds, for the sizes that have several."""
  avg = [k for k in keys if k.startswith("avg/")]
  metrics = [("final loss", lambda r: r.final_loss), ("tokens/s", lambda r: r.tokens_per_second)]
  metrics[1:1] = [(k, lambda r, k=k: r.final_probe(k)) for k in avg]
  lines = [
      "| size | objective | seeds | " + " | ".join(m for m, _ in metrics) + " |",
      "|---|---|---|" + "---|" * len(metrics)]
  for size in sizes:
    for budget in _budgets(results, size):
      for label in spec["objectives"]:
        runs = _by(results, size, label, budget[0])
        if len(runs) < 2:
          continue
        cells = []
        for _, f in metrics:
          x = np.array([f(r) for r in runs], float)
          x = x[np.isfinite(x)]
          cells.append(f"{_fmt(x.mean(), 4)} +- {_fmt(x.std(ddof=1), 2)}" if len(x) > 1 else "n/a")
        lines.append(f"| {_where(results, size, budget)} | {label} | {len(runs)} | " + " | ".join(cells) + " |")
  if len(lines) == 2:
    return ["One seed per run: no seed spread measured."]
  return ["Mean +- standard deviation over seeds (sample sd), per size with several seeds.", "", *lines]


def _verdicts(found: dict, claim: str, sizes: list[str]) -> list[str]:
  """One line per size: the verdicts of `claim` at its largest budget (from the interval table)."""
  out = []
  for size in sizes:
    rows = [r for r in found["rows"] if r["claim"] == claim and r["size"] == size]
    if rows:
      top = max(r["budget_index"] for r in rows)
      out.append(f"- {size}: " +
                 "; ".join(f"{r['a']} - {r['b']} {r['probe']} {claims_lib.fmt_diff(r['mean_diff'])} ({r['verdict']})"
                           for r in rows
                           if r["budget_index"] == top))
  return out or ["- not measured (the spec lacks the objectives)"]


def _claims(spec, results, sizes, keys, found: dict) -> list[str]:
  """The paper's four claims: (2) and (3) by the intervals above, (1) and (4) as measured numbers."""
  bert = _find(spec, "mlm", 0.15, 1)
  seeds = ", ".join(_seed_counts(results, size) for size in sizes)
  mean = lambda rs, f: _nanmean([f(r) for r in rs])
  top = lambda size, label: _by(results, size, label, _budgets(results, size)[-1][0])
  out = [
      f"Finished seeds per size: {seeds}. Claims (2) and (3) are read from the intervals above (each size's "
      "largest budget here); (1) and (4) are measured numbers, not tests.", ""]
  out.append("**(1) Throughput, CrossBERT at r >= 0.5 over BERT r=0.15** (median over runs of each run's "
             "median training tokens/s, timed in training, not interleaved: the steps' spread and the load are under "
             "Throughput, and a ratio taken under load is not a finding; only runs of one machine compare):")
  fast = [label for label, o in spec["objectives"].items() if o["objective"] == "crossbert" and o["ratio"] >= 0.5]
  for size in sizes:
    compared = [r for label in [bert, *fast] if label for r in _by(results, size, label)]
    seen, unknown = _machines(compared)
    if len(seen) > 1:
      out.append(f"- {size}: n/a: its runs span {len(seen)} machines ({'; '.join(seen)}), whose tokens/s do not "
                 "compare; `python -m crossbert_jax.bench` times every objective on one machine")
      continue
    base = throughput.median_tps(_by(results, size, bert)) if bert else float("nan")
    parts = [f"{label} " + _ratio(throughput.median_tps(_by(results, size, label)), base) for label in fast]
    caveat = (f" (machine not recorded for {unknown} of {len(compared)} runs: that they shared one is not "
              "checked)" if unknown else "")
    out.append(f"- {size}: " + ", ".join(parts) + caveat)
    out.append(f"  - 1-min load average over these runs' logged steps: median (max) {throughput.load(compared)}")
  out += [
      "", "**(2) Sample efficiency, K=2 over K=1** at r=0.5 (K=2 minus K=1 at equal tokens):",
      *_verdicts(found, "k2_vs_k1_sample_efficiency", sizes)]
  out += [
      "", "**(3) Frozen probes vs BERT** (CrossBERT minus BERT at equal FLOPs):",
      *_verdicts(found, "crossbert_vs_bert", sizes)]
  out += [
      "", "**(4) Monotonic scaling** (final loss falls and average linear probe rises with size, at each "
      "size's largest budget):"]
  for label in spec["objectives"]:
    losses = [mean(top(s, label), lambda r: r.final_loss) for s in sizes]
    probe = [mean(top(s, label), lambda r: r.final_probe("avg/linear")) for s in sizes]

    def verdict(values, better):
      if len(sizes) < 2:
        return "n/a: one size"
      if not all(math.isfinite(v) for v in values):
        return "incomplete: a size has no finished run"
      return "monotonic" if all(better(a, b) for a, b in zip(values, values[1:])) else "not monotonic"

    mono_l = verdict(losses, lambda a, b: a > b)
    mono_p = verdict(probe, lambda a, b: a < b)
    out.append(f"- {label}: loss {' -> '.join(_fmt(x, 4) for x in losses)} ({mono_l}); "
               f"avg/linear {' -> '.join(_fmt(x, 4) for x in probe)} ({mono_p})")
  return out


def _json_safe(x):
  """NaN and infinities as null (claims.json is strict JSON)."""
  if isinstance(x, float) and not math.isfinite(x):
    return None
  if isinstance(x, dict):
    return {k: _json_safe(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_json_safe(v) for v in x]
  return x


def write_report(root: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
  """Writes out/report.md and its PNGs from the sweep in `root`; returns the report's path."""
  spec, results, missing = collect_lib.collect(root)
  out.mkdir(parents=True, exist_ok=True)
  labels = [l for l in spec["objectives"] if any(r.run.label == l for r in results)]
  sizes = [s for s in spec["sizes"] if any(r.run.size == s for r in results)]
  keys = collect_lib.probe_keys(results)
  fit_lines, fit_figs = laws.section(results, labels, keys, out)
  figs = [
      plots.loss_vs_flops(results, labels, sizes, out / "loss_vs_flops.png"),
      plots.throughput_bars(throughput.bars(results, labels, sizes), labels, sizes, out / "throughput.png")]
  if keys:
    figs.insert(1, plots.probes_vs_flops(results, labels, keys, out / "probes_vs_flops.png"))
  found = claims_lib.evaluate(spec, results)
  (out / "claims.json").write_text(json.dumps(_json_safe(found), indent=1) + "\n")
  done = sum(r.done for r in results)
  stable = [r for r in plan_lib.load_plan(root)[1] if r.kind == "stable"]
  trunks = (f" WSD stable runs (not points): {sum(plan_lib.is_done(root / 'runs' / r.name) for r in stable)} of "
            f"{len(stable)} finished." if stable else "")
  n = spec["probes"]["max_examples"]
  per_split = f"{n} examples per split," if n else "whole splits,"
  partial = len(results) - done
  md = [
      f"# Scaling sweep: {spec['name']}", "", f"{done} of {len(results) + len(missing)} points finished" +
      (f" ({partial} still training: the plots and tables include them, marked partial under Every run; the "
       "claims use finished points only)" if partial else "") +
      (f"; not started: {', '.join(missing)}" if missing else "") +
      f".{trunks} Data: `{spec['data_path']}`; probes: `{spec['probes']['tasks']}` "
      f"({per_split} {spec['probes']['count']} per run).", "", "## Ladder", "", *_config_lines(spec), "",
      "## Training loss vs FLOPs", "", f"![loss]({figs[0]})", ""]
  if keys:
    md += [
        "## Frozen probes vs FLOPs", "", "Mean-pooled frozen encoder; linear and KNN probes per task, and their "
        "average over tasks.", "", f"![probes]({figs[1]})", ""]
  md += [
      "## Throughput", "",
      _machines_line(results), "", *throughput.table(results, labels, sizes), "", f"![throughput]({figs[-1]})", "",
      "## Sample efficiency", "", *_efficiency(spec, results, sizes, keys), "", "## Power-law fits", "", *fit_lines, "",
      *[f"![fit]({f})" for f in fit_figs], "", "## Seed spread", "", *_seed_spread(spec, results, sizes, keys), "",
      "## Claims, by seed-paired 95% intervals", "", *claims_lib.markdown(spec, found), "",
      "## What the paper claims, as measured here", "", *_claims(spec, results, sizes, keys, found), ""]
  if "contrast" in spec:
    md += [
        "## After the contrastive stage", "", *_contrast_table(spec, results, collect_lib.contrast_results(root)), ""]
  md += ["## Every run", "", *_run_table(results, keys), ""]
  path = out / "report.md"
  path.write_text("\n".join(md))
  return path
