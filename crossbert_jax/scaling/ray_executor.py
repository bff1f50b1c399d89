"""`sweep --executor=ray`: every run of a ladder on a Ray cluster, multi-host runs gang-scheduled.

Each attempt at a run reserves a placement group of one bundle per host (a TPU slice: Ray's
slice placement group, which claims the slice's `TPU-<type>-head` resource and then one bundle on
each of its hosts, as Levanter/Marin do), so all of its hosts start together or none does. A
zero-CPU task in bundle 0 names the coordinator (host 0's address and a free port); then one
task per bundle runs one trainer process (scaling/ray_host.py) with jax.distributed's
coordinator, process count and id. The first host to end decides the attempt
(placement.verdict): exit 0 on every host is done; exit 2 fails the run (not retried); exit 75,
a crash, or a host Ray lost cancels the other hosts (their trainers die with their workers) and
restarts the whole run, which resumes from its workdir's checkpoint, up to `max_retries` times.
Runs start in plan order as far as `max_concurrent` lets them; Ray queues a placement group until
the cluster has room; a WSD branch starts when its stable run is done.

The driver holds no state the root does not: a run is done when ROOT/runs/<name>/sweep_done.json
exists. Killed, its tasks and placement groups die with its Ray job; the same command again
restarts the unfinished runs from their checkpoints and skips the finished ones. Stopped (SIGTERM,
Ctrl-C: `Driver.stop`), it first has every trainer save and records those attempts as "stopped".
"""

import dataclasses
import json
import os
import pathlib
import socket
import time
import uuid

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from crossbert_jax.core import outputs
from crossbert_jax.core.errors import UserError
from crossbert_jax.run import lock as lock_lib
from crossbert_jax.run import metrics
from crossbert_jax.scaling import attempts as attempts_lib
from crossbert_jax.scaling import placement as placement_lib
from crossbert_jax.scaling import plan as plan_lib
from crossbert_jax.scaling import ray_host
from crossbert_jax.scaling import runner

_POLL_S = 1.0  # The driver's reaction time.
STOP_FILE = "sweep_stop"  # In a run's folder while the driver stops it (Driver.stop).
_TICK_S = 5.0  # How often running attempts' wall times are written.
_SUMMARY_S = 60.0  # How often the summary line is printed.


def connect(address: str, source: str = "") -> None:
  """Joins the Ray cluster at `address` ("auto": the one on this machine), or UserError naming `source`
  (where the address came from: "--ray_address=...", or "RAY_ADDRESS=... (from the environment)")."""
  if ray.is_initialized():
    return
  source = source or f"--ray_address={address}"
  advice = "start one with `ray start --head` or pass the head's address (host:6379)"
  hostport = address.split("://", 1)[-1]
  if address != "auto" and "://" not in address and ":" in hostport:
    host, port = hostport.rsplit(":", 1)
    try:
      socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError) as e:
      raise UserError(f"{source}: no Ray cluster answers there ({e}); {advice}") from None
    if why := _not_ray(hostport):
      raise UserError(f"{source}: something answers there but not a Ray cluster's GCS ({why}); {advice}")
  try:
    ray.init(address=address, logging_level="WARNING", log_to_driver=False, configure_logging=False)
  except (ConnectionError, RuntimeError, ValueError) as e:
    raise UserError(f"{source}: could not join a Ray cluster ({' '.join(str(e).split())[:200]}); {advice}") from None


def _not_ray(hostport: str, timeout: float = 10.0) -> str:
  """'' when a Ray GCS answers at host:port, else why not: one gRPC call (GetClusterId) with a deadline,
  instead of ray.init's retries (tens of seconds of C++ log lines before its own error)."""
  import grpc  # pylint: disable=g-import-not-at-top
  from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc  # pylint: disable=g-import-not-at-top

  with grpc.insecure_channel(hostport) as channel:
    try:
      gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(gcs_service_pb2.GetClusterIdRequest(),
                                                                        timeout=timeout)
    except grpc.RpcError as e:
      if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED,
                      grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
        return f"gRPC {e.code().name} within {timeout:g} s"
  return ""  # Answered, or refused us as a GCS does (e.g. UNAUTHENTICATED without the cluster's token).


def _task_options(bundle: dict[str, float]) -> dict:
  rest = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
  return {"num_cpus": bundle.get("CPU", 0), "num_gpus": bundle.get("GPU", 0), "resources": rest}


def check_capacity(places: list[placement_lib.Placement], address: str) -> None:
  """UserError, before anything starts, for a run that needs more hosts or resources than the cluster has."""
  nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
  for p in {(p.run.size): p for p in places}.values():
    if p.slice:
      version, _, topology = p.slice.partition(":")
      head = f"TPU-{ray.util.tpu.infer_tpu_pod_type_from_topology(topology, version)}-head"
      if not any(head in n for n in nodes):
        raise UserError(f"spec sizes[{p.run.size!r}].slice={p.slice!r}: the Ray cluster at {address} has no {head} "
                        "resource (no such slice); add the slice to the cluster or pick one it has")
      continue
    fits = sum(min(int(n.get(k, 0) // v) for k, v in p.bundle.items()) for n in nodes)
    if fits < p.hosts:
      total = {k: sum(n.get(k, 0) for n in nodes) for k in p.bundle}
      raise UserError(f"spec sizes[{p.run.size!r}]: a run needs {p.hosts} host(s) of {p.bundle} but the Ray cluster "
                      f"at {address} has room for {fits} ({len(nodes)} node(s), {total} in all); lower hosts/resources "
                      "or add nodes")


def check_shared_root(root: pathlib.Path) -> None:
  """With more than one node, every node must see ROOT (a shared file system): UserError naming one that does not."""
  nodes = [n for n in ray.nodes() if n["Alive"]]
  if len(nodes) < 2:
    return
  marker = root / f".shared-check-{uuid.uuid4().hex}"
  root.mkdir(parents=True, exist_ok=True)
  marker.write_text("x")
  try:
    see = ray.remote(num_cpus=0)(pathlib.Path.is_file)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # pylint: disable=g-import-not-at-top
    refs = {
        n["NodeManagerAddress"]: see.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(marker) for n in nodes}
    blind = [ip for ip, ref in refs.items() if not ray.get(ref, timeout=120)]
  finally:
    marker.unlink(missing_ok=True)
  if blind:
    raise UserError(f"--root={root} is not visible on Ray node(s) {', '.join(blind)}: with {len(nodes)} nodes "
                    "the root must be on a file system every node mounts at the same path (NFS, Filestore, GCSFuse)")


def _lock_busy(run_dir: pathlib.Path) -> bool:
  """True while a trainer of an earlier attempt (a lost host's, a killed driver's) may still hold the
  run's workdir lock: the run waits, rather than start a trainer the lock refuses with exit 2. A
  dead pid on this host or a stale heartbeat frees it (the trainer breaks such a lock itself)."""
  try:
    held = json.loads((run_dir / lock_lib.LOCK_FILE).read_text())
  except (OSError, ValueError):
    return False
  if time.time() - float(held.get("heartbeat", 0)) > lock_lib.STALE_S:
    return False
  if held.get("host") == socket.gethostname() and isinstance(held.get("pid"), int):
    try:
      os.kill(held["pid"], 0)
    except ProcessLookupError:
      return False
    except PermissionError:
      return True
  return True


@dataclasses.dataclass
class _Run:
  """The driver's view of one run."""
  p: placement_lib.Placement
  record: attempts_lib.Record
  state: str = "queued"  # queued | placing | starting | training | done | failed
  retries: int = 0
  pg: object = None
  t_asked: float = 0.0  # When its placement group was requested.
  t_placed: float = 0.0  # When Ray granted it (every host reserved).
  hosts: list = dataclasses.field(default_factory=list)
  refs: dict = dataclasses.field(default_factory=dict)  # ObjectRef -> "ready" | "where" | host index.
  ended: dict = dataclasses.field(default_factory=dict)  # host index -> exit status.
  cause: str = ""


class Driver:
  """Starts, watches and restarts the runs; `drive()` returns the names of the runs that failed."""
  def __init__(self, spec: dict, places: list[placement_lib.Placement], root: pathlib.Path, log,
               requested: list[str] | None = None):
    self.spec, self.root, self.log = spec, root, log
    # Stop requests (signal names), appended by the sweep's signal handler: `drive` raises Stopped at its next
    # poll. (A handler that raised would raise inside ray.wait's C++ call, which Ray turns into a SystemError.)
    self.requested = requested if requested is not None else []
    self.cwd = str(pathlib.Path.cwd())
    self.max_retries = spec.get("max_retries", placement_lib.DEFAULT_RETRIES)
    self.cap = spec.get("max_concurrent") or len(places)
    self.runs = {p.run.name: _Run(p, attempts_lib.Record(root / "runs" / p.run.name, "ray")) for p in places}
    self.dispatch_s: list[float] = []
    for r in self.runs.values():
      if plan_lib.is_done(self._dir(r)):
        r.state = "done"
        self.log(f"[ray] {r.p.run.name}: done, skipped")

  def _dir(self, r: _Run) -> pathlib.Path:
    return self.root / "runs" / r.p.run.name

  def _stop_file(self, r: _Run) -> pathlib.Path:
    """Made by `stop`: the run's host tasks poll it and SIGTERM their trainers (ray_host.train)."""
    return self._dir(r) / STOP_FILE

  def _ready(self, r: _Run) -> bool:
    after = self.runs.get(r.p.after)
    return (r.state == "queued" and (after is None or after.state == "done") and not _lock_busy(self._dir(r)))

  def _blocked(self, r: _Run) -> bool:
    """True if a run it waits for (directly or not) failed: it cannot start in this sweep."""
    after = self.runs.get(r.p.after)
    return after is not None and (after.state == "failed" or self._blocked(after))

  def _place(self, r: _Run) -> None:
    """Reserves the run's hosts: a placement group Ray grants whole or not at all."""
    if r.p.slice:
      version, _, topology = r.p.slice.partition(":")
      r.pg = ray.util.tpu.slice_placement_group(topology, version).placement_group
    else:
      r.pg = placement_group([dict(r.p.bundle)] * r.p.hosts, strategy="PACK")
    r.state, r.refs, r.ended, r.hosts, r.t_asked = "placing", {r.pg.ready(): "ready"}, {}, [], time.time()

  def _in_bundle(self, r: _Run, fn, index: int, **options):
    strategy = PlacementGroupSchedulingStrategy(placement_group=r.pg, placement_group_bundle_index=index)
    return ray.remote(fn).options(scheduling_strategy=strategy, max_retries=0, **options)

  def _on_ready(self, r: _Run) -> None:
    r.t_placed = time.time()
    r.state = "starting"
    for i in range(r.p.hosts):
      r.refs[self._in_bundle(r, ray_host.where, i, num_cpus=0).remote()] = ("where", i)

  def _on_where(self, r: _Run, index: int, info: dict) -> None:
    r.hosts.append((index, info))
    if len(r.hosts) < r.p.hosts:
      return
    r.hosts.sort(key=lambda x: x[0])
    head = r.hosts[0][1]
    coordinator = f"{head['ip']}:{head['port']}"
    self._stop_file(r).unlink(missing_ok=True)  # An earlier driver's stop.
    for i in range(r.p.hosts):
      cmd = placement_lib.host_command(r.p, self.spec, str(self._dir(r)), ray_host.PYTHON, i, coordinator)
      log = self._dir(r) / ("train.log" if i == 0 else f"train.host{i}.log")
      task = self._in_bundle(r, ray_host.train, i, **_task_options(r.p.bundle))
      r.refs[task.remote(cmd, self.cwd, str(log), str(self._stop_file(r)))] = ("host", i)
    r.state = "training"

  def _end_attempt(self, r: _Run, outcome: str, cause: str) -> None:
    """Stops what is left of the attempt, frees its hosts, records it and decides what comes next."""
    for ref, what in r.refs.items():
      if what != "ready":
        ray.cancel(ref, force=True)
    r.refs = {}
    if r.pg is not None:
      remove_placement_group(r.pg)
      r.pg = None
    name = r.p.run.name
    wall = r.record.end(outcome, cause)
    if outcome == "done":
      outputs.write_atomic(self._dir(r) / plan_lib.DONE_FILE, json.dumps({"steps": r.p.run.end_step, "wall_s": wall}))
      r.state = "done"
      self.log(f"[ray] {name}: finished in {wall:.0f} s")
    elif outcome == "retry" and r.retries < self.max_retries:
      r.retries += 1
      r.state = "queued"
      self.log(f"[ray] {name}: attempt ended: {cause}; restarting the run ({r.retries}/{self.max_retries})")
    else:
      r.state, r.cause = "failed", cause if outcome == "failed" else f"{cause}, after {r.retries} retries"
      self.log(f"[ray] {name}: failed: {r.cause}; see {self._dir(r) / 'train.log'}")

  def _on_host(self, r: _Run, index: int, result: dict | None, lost: str = "") -> None:
    if lost:
      self._end_attempt(r, *placement_lib.verdict(None, lost=f"host {index}: {lost}"))
      return
    r.ended[index] = result["rc"]
    if r.record.attempts[-1]["dispatch_s"] is None:  # Hosts granted -> the first reporting host's trainer started.
      self.dispatch_s.append(result["spawned"] - r.t_placed)
      r.record.attempts[-1]["dispatch_s"] = round(self.dispatch_s[-1], 3)
    if result["rc"] != 0:
      outcome, cause = placement_lib.verdict(result["rc"])
      self._end_attempt(r, outcome, f"host {index}: {cause}")
    elif len(r.ended) == r.p.hosts:
      last = _last_step(self._dir(r))
      if last >= r.p.run.end_step:
        self._end_attempt(r, "done", "exit 0")
      else:
        self._end_attempt(r, "failed", f"exit 0 at step {last} of {r.p.run.end_step}")

  def _handle(self, ref, r: _Run) -> None:
    what = r.refs.pop(ref)
    try:
      value = ray.get(ref)
    except ray.exceptions.RayError as e:
      if what == "ready" or r.state not in ("placing", "starting", "training"):
        raise
      self._on_host(r, what[1], None, lost=type(e).__name__)
      return
    if what == "ready":
      self._on_ready(r)
    elif what[0] == "where":
      self._on_where(r, what[1], value)
      if len(r.hosts) == r.p.hosts:
        machines = [info["machine"] for _, info in r.hosts]
        r.record.start([info["ip"] for _, info in r.hosts], machines, r.t_placed - r.t_asked)
        self.log(f"[ray] {r.p.run.name}: attempt {len(r.record.attempts)} started on {r.p.hosts} host(s) "
                 f"({', '.join(sorted({i['ip'] for _, i in r.hosts}))})")
    else:
      self._on_host(r, what[1], value)

  def summary(self) -> str:
    """'runs: D done, R running, Q queued, F failed; cluster: CPU 2/2 in use'."""
    states = [r.state for r in self.runs.values()]
    running = sum(s in ("placing", "starting", "training") for s in states)
    total = ray.cluster_resources()
    kinds = sorted({k for r in self.runs.values() for k in r.p.bundle})
    held = lambda k: sum(
        r.p.bundle.get(k, 0) * r.p.hosts for r in self.runs.values() if r.state in ("starting", "training"))
    used = ", ".join(f"{k} {held(k):g}/{total.get(k, 0):g}" for k in kinds)
    return (f"[ray] runs: {states.count('done')} done, {running} running, {states.count('queued')} queued, "
            f"{states.count('failed')} failed; cluster: {used} in use")

  def drive(self) -> list[str]:
    """Runs every unfinished run to its end; the names of those that failed."""
    last_tick = last_summary = time.time()
    while True:
      if self.requested:
        raise runner.Stopped(f"{self.requested[0]} received; rerun the same sweep command to resume")
      active = [r for r in self.runs.values() if r.state in ("placing", "starting", "training")]
      for r in self.runs.values():
        if len(active) >= self.cap:
          break
        if self._ready(r):
          self._place(r)
          active.append(r)
      if not active:
        if not any(r.state == "queued" and not self._blocked(r) for r in self.runs.values()):
          break
        time.sleep(_POLL_S)  # A run waits for an earlier attempt's lock to go.
        continue
      owner = {ref: r for r in active for ref in r.refs}
      done, _ = ray.wait(list(owner), num_returns=1, timeout=_POLL_S)
      for ref in done:
        if ref in owner[ref].refs:
          self._handle(ref, owner[ref])
      now = time.time()
      if now - last_tick > _TICK_S:
        last_tick = now
        for r in active:
          if r.state == "training":
            r.record.tick()
      if now - last_summary > _SUMMARY_S:
        last_summary = now
        self.log(self.summary())
    self.log(self.summary())
    return [f"{r.p.run.name} ({r.cause})" for r in self.runs.values() if r.state == "failed"] + [
        f"{r.p.run.name} (waits for {r.p.after}, which failed)" for r in self.runs.values() if r.state == "queued"]

  def stop(self, why: str) -> None:
    """After a stop request: every trainer gets SIGTERM (its run's stop file, which the run's host tasks poll: it
    saves and exits 75), the driver waits for them (up to ray_host.STOP_GRACE_S), frees their hosts and closes their
    attempts as "stopped", so the same command resumes them from their checkpoints. (Not Ray's graceful cancel:
    best effort, it once had not reached a running task after 120 s.)"""
    live = [r for r in self.runs.values() if r.state in ("placing", "starting", "training")]
    hosts = {ref: r for r in live for ref, what in r.refs.items() if what != "ready" and what[0] == "host"}
    training = {id(r): r for r in hosts.values()}.values()
    for r in training:
      self._stop_file(r).write_text(why + "\n")
    if hosts:
      self.log(f"[ray] stopping: SIGTERM to the trainers of {len(training)} run(s); "
               f"waiting up to {ray_host.STOP_GRACE_S:.0f} s for their checkpoints")
      ray.wait(list(hosts), num_returns=len(hosts), timeout=ray_host.STOP_GRACE_S + 5)  # Past the hosts' own wait.
    for r in live:
      rcs, exits = [], []
      for ref, what in r.refs.items():
        if what != "ready" and what[0] == "host":
          try:
            rcs.append(ray.get(ref, timeout=0)["rc"])
            exits.append(f"host {what[1]}: exit {rcs[-1]}")
          except Exception as e:  # noqa: BLE001 - a cancelled, lost or still running host task: say which.
            exits.append(f"host {what[1]}: {type(e).__name__}")
        elif what != "ready":  # A zero-CPU "where" task: nothing to save.
          ray.cancel(ref, force=True)
      self._stop_file(r).unlink(missing_ok=True)  # Its hosts have ended, or their grace is over.
      finished = len(rcs) + len(r.ended) == r.p.hosts and not any(rcs) and not any(r.ended.values())
      if r.record.attempts and r.record.attempts[-1].get("outcome") == "running":
        if finished and _last_step(self._dir(r)) >= r.p.run.end_step:  # It ended before the stop reached it.
          self._end_attempt(r, "done", "exit 0")
          continue
        r.record.end("stopped", f"{why} ({', '.join(exits) or 'no trainer yet'}); resumes from its checkpoint")
      r.refs = {}
      if r.pg is not None:
        remove_placement_group(r.pg)
        r.pg = None
      r.state = "queued"


def _last_step(run_dir: pathlib.Path) -> int:
  try:
    return max((int(r["step"]) for r in metrics.read_metrics(str(run_dir))), default=0)
  except UserError:
    return 0
