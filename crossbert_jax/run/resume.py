"""What may change when a run resumes: each config key is refused, allowed with a warning, or silent.

Refused (one line naming every differing key): anything that changes the params' shapes or
meaning or what the data iterator's saved position points at -- `objective`, `model.*`
(except `remat`, `dtype`, `init_std`, the attention kernel keys, `loss_chunk` and `head_dtype`), `reconstructor.*`, `masking.*`, `mlm.*`, `train.seed`,
and `data.path` / `mixture` / `format` / `text_field` / `text_unit` / `seq_len` / `shuffle_seed` -- and a
tokenizer whose file content or special ids differ from those the run was trained with (its sha256,
vocabulary size and special ids are stored in every checkpoint; older ones lack the special ids).
A key the saved config lacks (a checkpoint written before the key existed) is compared at the
default `plan.of_saved` fills in, as the run trained with it. Allowed with a one-line warning: every other key (runtime keys such as `model.remat`,
`data.worker_count`, `metrics.log_every`, `checkpoint.*`, `mesh.*`, `eval.*`, and the
optimizer). A change of the learning-rate schedule (`train.steps`, `learning_rate`,
`warmup_steps`, `decay`, `decay_fraction`, `decay_shape`, `final_lr_ratio`) names the jump: the lr of the next step before and
after. Silent: `train.stop_at_step`, `train.fork_from`, `metrics.progress_bar`, `profile.*`.

A run with phases (`core/phases.py`, in the checkpoint's config or the new one): the keys a phase
may set are compared per trained step instead, through the phases: a change of what steps
1 .. STEP trained on (a phase boundary, or its sequence length, batch size, data or RoPE
thetas: `phases.TRAINED_KEYS`) is refused, naming the steps and the key; later phases may
change freely (so a finished run can be extended by a context-extension phase). The lr jump
is the phases' schedule before and after. A change of the gcd batch a stream is read in
(`Phase.read_batch`) starts the stream of the checkpoint's phase over, with a warning.
"""

import hashlib
import json
from typing import Any

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import objectives
from crossbert_jax.core import phases as phases_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import pipeline
from crossbert_jax.data import tokenizer as tokenizer_lib
from crossbert_jax.run import checkpoint
from crossbert_jax.training import optimizer

# Beside these, every objective's own sections (`ObjectiveSpec.sections`: the reconstructor, the mlm corruption).
_REFUSED_SECTIONS = ("model", "masking")
# Numerics-preserving runtime choices: the attention kernel and its blocks, the loss chunking.
_ALLOWED_IN_REFUSED = {
    "model.remat", "model.dtype", "model.init_std", "model.attention", "model.attention_block_q",
    "model.attention_block_kv", "model.attention_chunked_min_len", "model.loss_chunk", "model.head_dtype"}
_REFUSED_KEYS = {
    "objective", "train.seed", "data.path", "data.mixture", "data.format", "data.text_field", "data.text_unit",
    "data.seq_len", "data.shuffle_seed"}
# A fork's source matters only until the fork has a checkpoint of its own.
_SILENT = {
    "train.stop_at_step", "train.fork_from", "metrics.progress_bar", "data.tokenizer", "profile.start_step",
    "profile.steps", "profile.hosts"}  # The tokenizer: by content below.
_SCHEDULE = ("steps", "learning_rate", "warmup_steps", "decay", "decay_fraction", "decay_shape", "final_lr_ratio")


def tokenizer_identity(path: str, tok: tokenizer_lib.AnyTokenizer) -> dict[str, Any]:
  """What a checkpoint records of its tokenizer: {path, sha256 of its file (a folder's tokenizer.json),
  vocab_size, special_ids} -- the role ids too, as files beside a tokenizer.json can move them."""
  return {
      "path": str(path), "sha256": hashlib.sha256(tok.content).hexdigest(), "vocab_size": int(tok.vocab_size),
      "special_ids": {role: int(i) for role, i in tok.special_ids._asdict().items() if role != "reserved"}}


def tokenizer_change(old: dict[str, Any], new: dict[str, Any], flag: str) -> str | None:
  """How tokenizer identity `new` (given by `flag`) differs from `old`, a checkpoint's record; None if it does not.

  Checkpoints written before the special ids were recorded are compared by the file alone."""
  if old["sha256"] != new["sha256"]:
    return (f"the tokenizer {old['path']} (sha256 {old['sha256'][:12]}, {old['vocab_size']} pieces), but "
            f"{flag}={new['path']} differs (sha256 {new['sha256'][:12]}, {new['vocab_size']} pieces)")
  if "special_ids" in old and old["special_ids"] != new["special_ids"]:
    moved = ", ".join(f"{role} {old['special_ids'].get(role)} -> {i}" for role, i in new["special_ids"].items()
                      if old["special_ids"].get(role) != i)
    return (f"the tokenizer {old['path']}, but {flag}={new['path']}, the same file, gives other special ids "
            f"({moved}; special_tokens_map.json / tokenizer_config.json beside it name other tokens)")
  return None


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _refused_sections() -> set[str]:
  return {*_REFUSED_SECTIONS, *(s for name in objectives.names() for s in objectives.get(name).sections)}


def _refused(key: str) -> bool:
  return key in _REFUSED_KEYS or (key.split(".")[0] in _refused_sections() and key not in _ALLOWED_IN_REFUSED)


def stream_view(saved: dict, step: int) -> dict:
  """The saved config as the data stream of `step`'s phase saw it (its keys, the batch it is read in)."""
  plan = plan_lib.of_saved(saved)
  if len(plan.phases) == 1 and not plan.train.phases:
    return saved
  phase = phases_lib.phase_at(plan.phases, step)
  view = json.loads(json.dumps(phase.config.to_dict()))
  view["train"]["batch_size"] = phase.read_batch
  return view


def _check_phases(where: str, step: int, old: plan_lib.RunPlan, now: plan_lib.RunPlan) -> tuple[list[str], bool]:
  """Refuses a change of the trained steps' phases; (warnings, whether the saved data state applies)."""
  a, b = phases_lib.trained(list(old.phases), step), phases_lib.trained(list(now.phases), step)
  for (a0, a1, av), (b0, b1, bv) in zip(a, b):
    if (a0, a1) != (b0, b1):
      raise UserError(f"{where} trained steps {a0}-{a1} as one phase, but the config's phases make steps {b0}-{b1} "
                      "one; the phases of steps already trained cannot change: keep their steps, change later ones")
    diff = [k for k in av if av[k] != bv.get(k)]
    if diff:
      k = diff[0]
      raise UserError(f"{where} trained steps {a0}-{a1} with {k}={av[k]!r}, but the config's phases give them "
                      f"{bv.get(k)!r}; the phases of steps already trained cannot change: keep their keys, change "
                      "later phases")
  if len(a) != len(b):
    raise UserError(f"{where} trained {len(a)} phase(s) up to it, but the config's phases make it {len(b)}; the "
                    "phases of steps already trained cannot change")
  was, now_phase = phases_lib.phase_at(old.phases, step), phases_lib.phase_at(now.phases, step)
  if was.read_batch != now_phase.read_batch:
    return [
        f"warning: the phases' batch sizes change how the stream of {now_phase.describe()} is read "
        f"({was.read_batch} -> {now_phase.read_batch} rows at a time), so that stream starts over from its first "
        "batch"], False
  return [], True


def check(workdir: str, step: int, saved: dict, meta: checkpoint.CheckpointMeta | None, now: plan_lib.RunPlan,
          tokenizer: dict[str, Any], process_count: int, saved_process_count: int | None = None, *,
          forking: bool = False) -> tuple[list[str], bool]:
  """(warning lines, whether the saved data-iterator state applies); UserError if refused.

  `saved_process_count`: the processes that wrote the checkpoint, if known. When it differs from
  `process_count` the stream is re-sharded (training/elastic.py), which re-packs the old rounds
  with their own bins, so a batch-size change does not restart it. `forking`: the checkpoint is
  another run's, which a fork starts from (the refusals' fixes say so).
  """
  where = f"--workdir {workdir} holds a checkpoint (step {step})"
  recorded = meta.tokenizer if meta is not None else None
  if recorded is not None and (change := tokenizer_change(recorded, tokenizer, "data.tokenizer")):
    fix = ("fork with the source's tokenizer or from a run trained with this one"
           if forking else "resume with the run's tokenizer or use a new --workdir")
    raise UserError(f"{where} trained with {change}; {fix}")
  old = plan_lib.of_saved(saved)  # Once: its phases and its schedule.
  # The saved config with the keys added since at today's defaults (as the run is read back), so a key
  # its checkpoint lacks is compared like one it holds; as saved: tuples become lists.
  a, b = _flat(json.loads(json.dumps(old.to_dict()))), _flat(json.loads(json.dumps(now.to_dict())))
  changed = sorted(k for k in b if k in a and a[k] != b[k] and k not in _SILENT)
  phased = phases_lib.has_phases(now) or phases_lib.has_phases(old)
  phase_lines, phase_data = _check_phases(where, step, old, now) if phased else ([], True)
  refused = [k for k in changed if _refused(k) and not (phased and k in phases_lib.OVERRIDABLE)]
  if refused:
    diffs = ", ".join(f"{k}={a[k]!r} (config: {b[k]!r})" for k in refused)
    fix = ("cannot change in a fork: use the source's values or fork from a compatible run"
           if forking else "cannot change on resume: use the checkpoint's values or a new --workdir")
    raise UserError(f"{where} made with {diffs}; these {fix}")
  warnings, restore_data = phase_lines, phase_data
  for k in changed:
    warnings.append(f"warning: resuming with {k}={b[k]!r} (checkpoint: {a[k]!r})")
  schedule_changed = [k for k in _SCHEDULE if f"train.{k}" in changed]
  if phased and any(k == "train.phases" or k.startswith("train.batch_ramp.") for k in changed):
    schedule_changed.append("phases")
  if schedule_changed:
    # One phase: its train section's schedule; phases: each step at its phase's.
    before, after = float(optimizer.run_schedule(old)(step)), float(optimizer.run_schedule(now)(step))
    jump = (f"step {step + 1} runs at lr {after:.4g} instead of {before:.4g}"
            if f"{after:.4g}" != f"{before:.4g}" else f"step {step + 1} keeps lr {after:.4g}, later steps differ")
    warnings.append(f"warning: {', '.join('train.' + k for k in schedule_changed)} changed the learning-rate "
                    f"schedule: {jump}")
  if "data.worker_count" in changed:
    restore_data = False
    warnings.append(f"warning: data.worker_count {a['data.worker_count']} -> {b['data.worker_count']}: Grain's "
                    "multiprocess order depends on the worker count, so the data stream starts over from its "
                    "first batch (documents read before this step are read again)")
  if "train.batch_size" in changed and saved_process_count in (None, process_count) and not phased:
    bins = lambda batch: pipeline.packing_bins(batch // process_count)
    if bins(a["train.batch_size"]) != bins(b["train.batch_size"]):
      restore_data = False
      warnings.append("warning: the new batch size changes the number of packing bins, so the data stream "
                      "starts over from its first batch")
  return warnings, restore_data
