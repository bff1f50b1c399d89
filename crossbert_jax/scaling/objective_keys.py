"""The config keys a sweep sets for an objective beyond the encoder's, per size (scaling/plan.py).

An objective with a decoder of its own follows the encoder's width here; one that is not listed
(the flat BERT baseline, or a new objective that registers nothing) adds no key.
"""

from typing import Any, Callable

# (the spec's size entry, the spec's objective entry) -> {config key: value}.
SweepOverrides = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


def _crossbert(size: dict[str, Any], spec_objective: dict[str, Any]) -> dict[str, Any]:
  # The reconstructor follows the encoder's width (a fraction of it: a lighter decoder).
  w = spec_objective.get("reconstructor_width", 1.0)
  return {
      "reconstructor.embed_dim": int(size["embed_dim"] * w),
      "reconstructor.num_heads": max(1, int(size["num_heads"] * w)), "reconstructor.mlp_dim": int(size["mlp_dim"] * w)}


_OVERRIDES: dict[str, SweepOverrides] = {"crossbert": _crossbert}


def register(objective: str, overrides: SweepOverrides) -> None:
  """Makes a sweep set `overrides(size, spec_objective)` for every run of `objective`."""
  _OVERRIDES[objective] = overrides


def overrides(objective: str, size: dict[str, Any], spec_objective: dict[str, Any]) -> dict[str, Any]:
  """The keys a sweep run of `objective` at `size` sets beyond the encoder's."""
  rule = _OVERRIDES.get(objective)
  return rule(size, spec_objective) if rule else {}
