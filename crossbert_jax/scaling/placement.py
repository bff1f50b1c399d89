"""Where a planned run trains on a cluster: its hosts, what each host needs, what it waits for.

A spec's size may set `hosts` (trainer processes per run, one per host; default 1), `resources`
(what each host needs, e.g. {"TPU": 4} or {"GPU": 8}; default {"CPU": 1}) and `slice` (a TPU
slice, "v5p:2x2x4": its hosts and chips come from the topology, gang-scheduled through the
slice's head resource). The spec may set `max_concurrent` (runs at once; default: as many as the
cluster holds) and `max_retries` (restarts of a run after a preemption, a lost host or a crash;
default 3). A WSD branch waits for its stable run. The `local` executor ignores all of this.
"""

import dataclasses
import math
from typing import Any

from crossbert_jax.core.errors import UserError
from crossbert_jax.scaling import plan as plan_lib
from crossbert_jax.training import sharding

DEFAULT_RETRIES = 3
EXECUTORS = ("local", "ray", "slurm")


@dataclasses.dataclass(frozen=True)
class Placement:
  """One run as a cluster sees it."""
  run: plan_lib.Run
  hosts: int  # Trainer processes, one per host, started together or not at all.
  bundle: dict[str, float]  # What each host needs.
  slice: str = ""  # A TPU slice "<version>:<topology>" (its head resource claims it whole), or "".
  after: str = ""  # The run that must finish first (a branch's stable run, a contrastive run's point), or "".


def check_executor(name: str) -> str:
  """The executor's name, or UserError naming the ones there are."""
  if name not in EXECUTORS:
    raise UserError(f"--executor={name}: unknown executor; use one of {', '.join(EXECUTORS)}")
  return name


def _positive_int(value: Any, where: str, minimum: int = 1) -> int:
  if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
    raise UserError(f"{where}={value!r}: must be an integer >= {minimum}")
  return value


def slice_hosts(slice_name: str, where: str) -> tuple[int, int]:
  """(hosts, chips per host) of a TPU slice "v5p:2x2x4"; UserError for a malformed one."""
  version, _, topology = slice_name.partition(":")
  dims = topology.split("x")
  if not version.startswith("v") or not all(d.isdigit() and int(d) > 0 for d in dims) or len(dims) not in (2, 3):
    raise UserError(f"{where}={slice_name!r}: give a TPU slice as <version>:<topology>, e.g. 'v5p:2x2x4' or 'v6e:4x4'")
  chips = math.prod(int(d) for d in dims)
  per_host = 8 if version in ("v5e", "v5litepod", "v6e") and chips == 8 else 4  # Ray's get_chips_per_host.
  return max(1, chips // per_host), min(chips, per_host)


def check_spec(spec: dict) -> None:
  """The spec's placement keys (module docstring), checked; UserError naming the first bad one."""
  for key in ("max_concurrent", "max_retries"):
    if key in spec:
      _positive_int(spec[key], f"spec {key}", 1 if key == "max_concurrent" else 0)
  for name, size in spec["sizes"].items():
    where = f"spec sizes[{name!r}]"
    if "hosts" in size:
      _positive_int(size["hosts"], f"{where}.hosts")
    res = size.get("resources", {})
    if not isinstance(res, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and math.isfinite(v)
        for k, v in res.items()):
      raise UserError(f"{where}.resources={res!r}: must be a dict of resource name -> positive amount per host, "
                      "e.g. {'TPU': 4} or {'GPU': 8}")
    if "slice" in size:
      hosts, _ = slice_hosts(size["slice"], f"{where}.slice")
      if size.get("hosts", hosts) != hosts:
        raise UserError(f"{where}: hosts={size['hosts']} but slice {size['slice']!r} has {hosts} hosts; "
                        "drop hosts (the slice sets it)")


def placements(spec: dict, runs: list[plan_lib.Run]) -> list[Placement]:
  """Every run's placement, in plan order; UserError for a batch its hosts or devices cannot split."""
  out = []
  for run in runs:
    size = spec["sizes"][run.size]
    hosts, bundle = int(size.get("hosts", 1)), dict(size.get("resources") or {"CPU": 1})
    if size.get("slice"):
      hosts, chips = slice_hosts(size["slice"], f"spec sizes[{run.size!r}].slice")
      bundle = dict(size.get("resources") or {"TPU": chips})
    _check_batch(run, spec, hosts, hosts * devices_per_host(bundle))
    after = run.fork_from if run.kind in ("branch", "contrast") else ""
    out.append(Placement(run, hosts, bundle, size.get("slice", ""), after))
  return out


def devices_per_host(bundle: dict[str, float]) -> int:
  """JAX devices one host of `bundle` gives a run: its GPUs or TPU chips, else one CPU device."""
  return max(1, int(bundle.get("GPU", 0)), int(bundle.get("TPU", 0)))


def _check_batch(run: plan_lib.Run, spec: dict, hosts: int, devices: int) -> None:
  """UserError, before anything is queued, for a batch the run's processes and devices cannot split as the
  trainer requires (training/sharding.check_batch_divisible): batch over hosts, micro-batch over data*fsdp."""
  c = plan_lib.run_config(run, spec)
  where, batch = f"spec sizes[{run.size!r}]", c.train.batch_size
  if batch % hosts:
    raise UserError(f"{where}: {hosts} hosts do not divide {run.name}'s batch of {batch} sequences; set "
                    f"train.batch_size to a multiple of {hosts} or change hosts")
  shards = math.prod(sharding.mesh_shape(c.mesh, devices)[:2])  # data * fsdp over the run's devices.
  micro = batch // max(c.train.grad_accum, 1)  # 0 (auto): its candidates start at the whole batch.
  if micro % shards:
    raise UserError(f"{where}: {run.name} has {devices} devices ({hosts} host(s) x {devices // hosts}), whose "
                    f"mesh data*fsdp = {shards} does not divide its micro-batch of {micro} sequences "
                    f"(train.batch_size / grad_accum); set train.batch_size to a multiple of {shards}, or fewer "
                    "hosts or devices")


def plan_lines(places: list[Placement], executor: str, spec: dict) -> list[str]:
  """The placement plan `sweep --dry_run --executor=...` prints: runs, hosts, resources, order."""
  retries = spec.get("max_retries", DEFAULT_RETRIES)
  cap = spec.get("max_concurrent")
  lines = [
      f"placement ({executor}): {len(places)} runs, at most {cap or 'as many as fit'} at once, "
      f"up to {retries} retries each (exit 75, a lost host, a crash; never exit 2)",
      f"{'run':<40} {'hosts':>5}  {'each host':<18} starts after"]
  for p in places:
    each = ", ".join(f"{k}:{v:g}" for k, v in sorted(p.bundle.items())) + (f" ({p.slice})" if p.slice else "")
    lines.append(f"{p.run.name:<40} {p.hosts:>5}  {each:<18} {p.after or '-'}")
  waves, level = [], {}
  for p in places:  # A run's wave: one after the run it waits for.
    level[p.run.name] = level.get(p.after, -1) + 1 if p.after else 0
    while len(waves) <= level[p.run.name]:
      waves.append([])
    waves[level[p.run.name]].append(p.run.name)
  lines += [f"wave {i}: {len(w)} run(s) may train at once" for i, w in enumerate(waves)]
  return lines


def host_command(p: Placement, spec: dict, workdir: str, python: str, index: int, coordinator: str) -> list[str]:
  """argv of host `index`'s trainer: the run's command, joined by jax.distributed when it has hosts.

  CPU/GPU hosts get the coordinator, process count and id; a TPU slice's hosts find them
  themselves (jax.distributed.initialize() reads the TPU VM's metadata).
  """
  cmd = plan_lib.train_command(p.run, spec, workdir, python)
  if p.hosts > 1:
    cmd.append("--jax_distributed")
    if not p.slice:
      cmd += [f"--coordinator_address={coordinator}", f"--num_processes={p.hosts}", f"--process_id={index}"]
  return cmd


def verdict(rc: int | None, lost: str = "") -> tuple[str, str]:
  """("done" | "retry" | "failed", cause) of an attempt from its first host to end (its exit
  status, or `lost`: why Ray lost the host). Exit 2 is a user error: restarting won't help."""
  if lost:
    return "retry", f"host lost ({lost})"
  if rc == 0:
    return "done", "exit 0"
  if rc == 2:
    return "failed", "exit 2 (a user error: not retried)"
  if rc == 75:
    return "retry", "exit 75 (stopped or preempted; resumes from its checkpoint)"
  return "retry", f"exit {rc} (a crash{' or kill' if rc is not None and rc < 0 else ''})"
