r"""Checks a sweep report's claims.json from its own numbers, without the code that wrote it.

  python tools/check_claims.py docs/results/gutenberg_wsd/claims.json

For every row it recomputes, from the row's per-seed paired differences (`per_seed_diff`) and the
file's `rule` (level, margin): the mean, the sample sd, the t interval mean +- t((1 + level) / 2,
n - 1) * sd / sqrt(n), and the verdict on "A is better than B": "holds" when the interval is above
0; "does not hold" when it is below 0 or inside +-margin; "inconclusive" otherwise or below 2 seeds;
`decisive` (not inconclusive) and `seeds_needed` (the fewest seeds, up to 1000, whose interval at the
same mean and sd would be decisive; null when unknown).
When the file holds the report's `plan` (each label's objective, the finished size x budget cells,
the probes), the rows are also checked against it: every row the plan implies is there once, no
other, and each row's A and B are the objectives its claim compares (a swapped or relabelled row
is a disagreement). The plan's comparisons are rederived here: each CrossBERT r=0.5 (K=1 and K=2,
full-width reconstructor, the first of each) minus each BERT, and K=2 minus K=1.
It prints one line per row that disagrees with what the file says, then a count; exit 0 when every
row agrees, 1 when one does not, 2 when the file cannot be read or holds no rows. Only json, math and scipy's t
quantile are used, so the check does not share the report's code.
"""

import argparse
import json
import math
import pathlib
import sys

from scipy import stats

TOLERANCE = 1e-9
MAX_SEEDS = 1000


class Unreadable(Exception):
  """The file is not a claims.json this check can read (exit 2, not a disagreement)."""


def _seeds_needed(mean: float, sd: float, level: float, margin: float) -> int | None:
  if not (math.isfinite(mean) and math.isfinite(sd)):
    return None
  if sd == 0:
    return 2
  target = max(abs(mean), margin - abs(mean))
  for n in range(2, MAX_SEEDS + 1):
    if stats.t.ppf((1 + level) / 2, n - 1) * sd / math.sqrt(n) < target:
      return n
  return None


def expected(row: dict, level: float, margin: float) -> dict:
  """{mean, lo, hi, seeds, verdict} of one row, from its per-seed differences."""
  d = [x for x in row["per_seed_diff"].values() if x is not None and math.isfinite(x)]
  n = len(d)
  nan = float("nan")
  if n == 0:
    return {
        "mean": nan, "lo": nan, "hi": nan, "sd": nan, "seeds": 0, "verdict": "inconclusive", "decisive": False,
        "seeds_needed": None}
  mean = sum(d) / n
  if n < 2:
    return {
        "mean": mean, "lo": nan, "hi": nan, "sd": nan, "seeds": 1, "verdict": "inconclusive", "decisive": False,
        "seeds_needed": None}
  sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
  half = stats.t.ppf((1 + level) / 2, n - 1) * sd / math.sqrt(n)
  lo, hi = mean - half, mean + half
  if lo > 0:
    verdict = "holds"
  elif hi < 0 or (lo >= -margin and hi <= margin):
    verdict = "does not hold"
  else:
    verdict = "inconclusive"
  return {
      "mean": mean, "lo": lo, "hi": hi, "sd": sd, "seeds": n, "verdict": verdict, "decisive": verdict != "inconclusive",
      "seeds_needed": _seeds_needed(mean, sd, level, margin)}


def _same(a, b) -> bool:
  a = float("nan") if a is None else a
  b = float("nan") if b is None else b
  return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= TOLERANCE


def _kind(o: dict) -> tuple | None:
  """("mlm",) for BERT, ("crossbert", views) for a full-width r=0.5 CrossBERT, None otherwise."""
  if o["objective"] == "mlm" and o["views"] == 1:
    return ("mlm",)
  if o["objective"] == "crossbert" and abs(o["ratio"] - 0.5) < 1e-9 and (o.get("reconstructor_width") or 1.0) == 1.0:
    return ("crossbert", o["views"])
  return None


def planned_rows(plan: dict) -> list[tuple]:
  """(claim, A, B, size, budget index, probe) of every row the plan implies."""
  labels = {
      kind: [label for label, o in plan["objectives"].items() if _kind(o) == kind]
      for kind in (("mlm",), ("crossbert", 1), ("crossbert", 2))}
  k1, k2 = labels[("crossbert", 1)][:1], labels[("crossbert", 2)][:1]
  pairs = [("crossbert_vs_bert", cb, bert) for cb in k1 + k2 for bert in labels[("mlm",)]]
  pairs += [("k2_vs_k1_sample_efficiency", k2[0], k1[0])] if k1 and k2 else []
  return [(claim, a, b, size, budget, probe)
          for claim, a, b in pairs
          for size, budget in plan["cells"]
          for probe in plan["probes"]]


def against_plan(found: dict) -> list[str]:
  """One line per planned row that is missing or repeated, and per row the plan does not imply."""
  if "plan" not in found:
    return []
  keys = [(r["claim"], r["a"], r["b"], r["size"], r["budget_index"], r["probe"]) for r in found["rows"]]
  want = planned_rows(found["plan"])
  problems = [f"row {' '.join(map(str, k))} is missing (the plan implies it)" for k in want if k not in keys]
  problems += [
      f"row {' '.join(map(str, k))} is not one the plan implies (wrong or swapped labels?)" for k in keys
      if k not in want]
  problems += [f"row {' '.join(map(str, k))} appears {keys.count(k)} times" for k in set(keys) if keys.count(k) > 1]
  return problems


def check(found: dict) -> list[str]:
  """One line per row whose stated numbers or verdict differ from the recomputed ones."""
  level, margin = found["rule"]["level"], found["rule"]["margin"]
  if not found["rows"]:
    raise Unreadable("it holds no rows (a report with claims writes at least one)")
  problems = []
  for i, row in enumerate(found["rows"]):
    ci95 = row["ci95"]
    if not isinstance(ci95, list) or len(ci95) != 2:
      raise Unreadable(f"row {i} has ci95={ci95!r}, not a [lo, hi] pair")
    want = expected(row, level, margin)
    got = {
        "mean": row["mean_diff"], "lo": ci95[0], "hi": ci95[1], "sd": row["sd"], "seeds": row["seeds"],
        "verdict": row["verdict"], "decisive": row["decisive"], "seeds_needed": row["seeds_needed"]}
    bad = [k for k in ("mean", "lo", "hi", "sd") if not _same(got[k], want[k])]
    bad += [k for k in ("seeds", "verdict", "decisive", "seeds_needed") if got[k] != want[k]]
    if bad:
      name = f"{row['claim']} {row['a']} - {row['b']} {row['size']} budget {row['budget_index']} {row['probe']}"
      problems.append(f"{name}: " + ", ".join(f"{k} is {got[k]}, recomputed {want[k]}" for k in bad))
  return problems


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("claims", help="A report's claims.json.")
  path = pathlib.Path(ap.parse_args().claims)
  try:
    found = json.loads(path.read_text())
    problems = check(found)
    planned = against_plan(found)
  except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, Unreadable) as e:
    print(
        f"error: {path} is not a readable claims.json ({type(e).__name__}: {e}); give the claims.json beside "
        "a report.md written by `python -m crossbert_jax.report`", file=sys.stderr)
    return 2
  plan = ("no plan in the file: the rows' labels and completeness are not checked" if "plan" not in found else
          f"{len(planned)} disagreement(s) with the plan" if planned else "the rows are exactly the plan's")
  print("\n".join(problems + planned + [
      f"{len(found['rows']) - len(problems)} of {len(found['rows'])} rows agree "
      f"with their per-seed differences; {plan}"]))
  return 1 if problems or planned else 0


if __name__ == "__main__":
  sys.exit(main())
