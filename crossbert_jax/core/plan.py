"""The run plan: a config validated once, as typed frozen sections, with its phases expanded once.

The commands take the user's ml_collections config (files, `--config.key=value` flags) and call
`build(c)`, the one place a config is validated (`core/config.validate`, then every phase's config)
and its phases expanded (`core/phases.expand`). What runs reads the `RunPlan` or one of its sections
(`plan.model`, `plan.train`, ...; core/sections.py). A few functions edit a ConfigDict before `build`
(run/fork.with_source_init and hf/import_config.resolve make a changed copy; the sweep plan and the
benchmarks make theirs and build them: docs/architecture.md):

  train command: ConfigDict -> plan.build -> RunPlan -> run/trainer.run -> Trainer
      -> training/program.TrainProgram(phase.config) -> objectives (model, loss) -> the jitted step

A `Settings` is one configuration of the run's keys (a phase's, or the run's own); a `RunPlan` is
the run's `Settings` with its phases (each a `core/phases.Phase` whose `config` is that phase's
`Settings`). A saved config (checkpoint, config.json) becomes a plan with `of_saved`, which fills
keys added since with today's defaults and skips validation: the run was validated when it trained.
"""

import dataclasses
import json
from typing import Any, Mapping

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import objectives, sections
from crossbert_jax.core import phases as phases_lib
from crossbert_jax.core.errors import UserError


class Extra(Mapping):
  """An objective's own config section (declared by its `configure`): read-only, by key or attribute."""
  def __init__(self, name: str, values: dict[str, Any]):
    self._name, self._values = name, dict(values)

  def __getattr__(self, key: str) -> Any:
    try:
      return self.__dict__["_values"][key]
    except KeyError:
      raise AttributeError(f"{self.__dict__['_name']}.{key}") from None

  def __getitem__(self, key: str) -> Any:
    return self._values[key]

  def __iter__(self):
    return iter(self._values)

  def __len__(self) -> int:
    return len(self._values)

  def to_dict(self) -> dict[str, Any]:
    return dict(self._values)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings(sections.Section):
  """One configuration of every key: the objective's name and the typed sections."""

  objective: str
  model: sections.Model
  reconstructor: sections.Reconstructor
  mlm: sections.Mlm
  masking: sections.Masking
  data: sections.Data
  train: sections.Train
  checkpoint: sections.Checkpoint
  mesh: sections.Mesh
  eval: sections.Eval
  metrics: sections.Metrics
  profile: sections.Profile
  extra: tuple[tuple[str, Any], ...] = ()  # Sections an objective adds, by name.

  def __getattr__(self, name: str) -> Any:  # Only called for names that are not fields: the extra sections.
    for key, section in self.__dict__.get("extra", ()):
      if key == name:
        return section
    raise AttributeError(name)

  def keys(self) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(self) if f.name != "extra") + tuple(k for k, _ in self.extra)

  @property
  def spec(self) -> objectives.ObjectiveSpec:
    """The objective's data spec (core/objectives.py)."""
    return objectives.get(self.objective)

  def to_json(self) -> str:
    """The config as config.json and the checkpoints store it."""
    return json.dumps(self.to_dict(), indent=2)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunPlan(Settings):
  """The run's settings and its phases, in order (one phase, with the run's settings, when it declares none)."""

  phases: tuple[phases_lib.Phase, ...] = ()

  def keys(self) -> tuple[str, ...]:
    return tuple(k for k in super().keys() if k != "phases")

  @property
  def settings(self) -> Settings:
    """The run's own settings, without the phases."""
    return Settings(**_fields(self))

  def phase(self, index: int, flag: str) -> phases_lib.Phase:
    """Phase `index`, chosen by the command's `flag` (UserError naming the range)."""
    if not 0 <= index < len(self.phases):
      raise UserError(f"{flag}={index}: the config has {len(self.phases)} phase(s); give 0-{len(self.phases) - 1}")
    return self.phases[index]


def with_keys(s, values: dict[str, Any]):
  """A copy of `s` (Settings or RunPlan) with the dotted keys in `values` replaced (a plan's phases too)."""
  out = _replaced(s, values)
  if isinstance(s, RunPlan):
    out = dataclasses.replace(
        out, phases=tuple(dataclasses.replace(p, config=_replaced(p.config, values)) for p in s.phases))
  return out


def _replaced(s: Settings, values: dict[str, Any]) -> Settings:
  by_section: dict[str, dict[str, Any]] = {}
  for key, value in values.items():
    section, name = key.split(".")
    by_section.setdefault(section, {})[name] = value
  own = {k for k, _ in s.extra}  # An objective's sections (typed ones; Extra mappings are not replaced).
  extra = tuple(
      (k, dataclasses.replace(section, **by_section[k]) if k in by_section else section) for k, section in s.extra)
  return dataclasses.replace(
      s, extra=extra, **{k: dataclasses.replace(getattr(s, k), **v) for k, v in by_section.items() if k not in own})


def settings_of(values: dict[str, Any]) -> Settings:
  """Typed settings from a config's `to_dict()` (every schema key present)."""
  typed = {cls.NAME: sections.from_dict(cls, values[cls.NAME]) for cls in sections.SECTIONS}
  known = {"objective", *typed}
  extra = tuple(
      (k, sections.from_dict(sections.OBJECTIVE_SECTIONS[k], v) if k in sections.OBJECTIVE_SECTIONS else Extra(k, v))
      for k, v in values.items()
      if k not in known)
  return Settings(objective=values["objective"], extra=extra, **typed)


def build(c) -> RunPlan:
  """Validates `c` (an ml_collections config from get_config) once and returns its plan; UserError
  (one line, naming the key and the phase) for any inconsistency."""
  config_lib.validate(c)
  return _plan(c, validate_phases=phases_lib.has_phases(c))


def of_saved(saved: dict[str, Any]) -> RunPlan:
  """The plan of a saved config (a checkpoint's, config.json's), keys added since at today's defaults;
  not validated again (it was when the run trained)."""
  return _plan(config_lib.from_dict(saved), validate_phases=False)


def _plan(c, validate_phases: bool) -> RunPlan:
  """`c` with its phases expanded (the one call of `phases.expand`), each phase's config validated if
  asked, as a typed RunPlan."""
  phases = phases_lib.expand(c)
  for phase in phases if validate_phases else ():
    try:
      config_lib.validate(phase.config)
    except UserError as e:
      raise UserError(f"{e} (in {phase.describe()})") from None
  typed = [dataclasses.replace(p, config=settings_of(p.config.to_dict())) for p in phases]
  return RunPlan(phases=tuple(typed), **_fields(settings_of(c.to_dict())))


def _fields(s: Settings) -> dict[str, Any]:
  """The Settings fields of `s` (a RunPlan's, without its phases)."""
  return {f.name: getattr(s, f.name) for f in dataclasses.fields(Settings)}
