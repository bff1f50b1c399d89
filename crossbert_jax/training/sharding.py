"""The one place where logical axis names meet the device mesh.

Mesh axes: ("data", "fsdp", "tensor"). Model code names only logical axes; DEFAULT_RULES (and
`config.mesh.rules` overrides, which take precedence) map them. Rules are applied in order and
a mesh axis is used at most once per array, so activations ("batch", ..., "embed") shard batch
over data x fsdp while params ("vocab"/"embed"/"mlp"/"heads") shard over fsdp and tensor.
"""

import math
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from crossbert_jax.core import sections
from crossbert_jax.core.errors import UserError

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", BATCH_AXES),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("embed", "fsdp"),
    ("kv", None),
    ("length", None),
    ("layers", None),
)


def _rule_error(rule: Any, why: str) -> UserError:
  names = ", ".join(name for name, _ in DEFAULT_RULES)
  return UserError(f"config mesh.rules: {rule!r} {why}; each rule is (logical name, mesh axis | tuple of "
                   f"mesh axes | None) with logical names {names} and mesh axes {', '.join(MESH_AXES)}")


def logical_rules(mesh_cfg: sections.Mesh) -> tuple[tuple[str, Any], ...]:
  """DEFAULT_RULES with `mesh.rules` overrides placed first (earlier rules win)."""
  rules = mesh_cfg.rules
  if isinstance(rules, (str, bytes)) or not isinstance(rules, (list, tuple)):
    raise _rule_error(rules, "is not a sequence of rules")
  known = {name for name, _ in DEFAULT_RULES}
  overrides = []
  for rule in rules:
    if isinstance(rule, (str, bytes)) or not isinstance(rule, (list, tuple)) or len(rule) != 2:
      raise _rule_error(rule, "is not a (logical name, mesh axes) pair")
    name, axes = rule
    # A typo such as "mpl" would otherwise match nothing and silently leave its arrays unsharded.
    if name not in known:
      raise _rule_error(rule, f"names the unknown logical axis {name!r}")
    axes = tuple(axes) if isinstance(axes, (list, tuple)) else axes
    for a in (axes if isinstance(axes, tuple) else (axes,)):
      if a is not None and a not in MESH_AXES:
        raise _rule_error(rule, f"names the unknown mesh axis {a!r}")
    overrides.append((name, axes))
  return tuple(overrides) + DEFAULT_RULES


def mesh_shape(mesh_cfg: sections.Mesh, num_devices: int) -> tuple[int, int, int]:
  """Resolves the single -1 entry; raises UserError if the product is not the device count."""
  sizes = [mesh_cfg[a] for a in MESH_AXES]
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise UserError(f"config mesh: data*fsdp*tensor (without the -1 entry) = {known} does not divide "
                      f"the {num_devices} devices; set mesh.data/fsdp/tensor so their product is {num_devices}")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise UserError(f"config mesh: data*fsdp*tensor = {math.prod(sizes)} but there are {num_devices} devices; "
                    f"make the product {num_devices} or set one of them to -1")
  return tuple(sizes)


def make_mesh(mesh_cfg: sections.Mesh, devices=None) -> Mesh:
  """A ("data", "fsdp", "tensor") mesh over `devices` (default: all), Auto axis types."""
  devices = jax.devices() if devices is None else list(devices)
  shape = mesh_shape(mesh_cfg, len(devices))
  if len(devices) == len(jax.devices()):
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3)
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def logical_to_sharding(logical_tree, mesh: Mesh, rules) -> Any:
  """NamedShardings for a pytree of logical PartitionSpecs (from nn.get_partition_spec)."""
  return nn.logical_to_mesh_sharding(logical_tree, mesh, rules)


def check_divisible(shapes, shardings) -> None:
  """Refuses a param whose sharded dimension the mesh does not divide (before XLA's traceback)."""
  for (path, leaf), sh in zip(jax.tree_util.tree_flatten_with_path(shapes)[0], jax.tree.leaves(shardings)):
    for dim, axes in zip(leaf.shape, sh.spec):
      axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
      ways = math.prod(sh.mesh.shape[a] for a in axes)
      if dim % ways:
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        sizes = ", ".join(f"mesh.{a}={sh.mesh.shape[a]}" for a in axes)
        raise UserError(f"config mesh: param {name} {'x'.join(map(str, leaf.shape))} has a dimension of {dim} "
                        f"split {ways} ways ({sizes}), which does not divide it; set the mesh axes to sizes that "
                        "divide the model's dimensions (e.g. --config.mesh.data=-1 --config.mesh.fsdp=1), or "
                        "train a larger model")


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Batch rows over data x fsdp, the rest replicated."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def global_batch(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Builds the global batch from this process's slice (multi-host safe)."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local_batch.items()}


def check_batch_divisible(batch_size: int, grad_accum: int, mesh: Mesh) -> None:
  """The micro-batch must split evenly over the batch axes and over processes (grad_accum 0, auto: its
  largest candidate, the whole batch, must)."""
  shards = mesh.shape["data"] * mesh.shape["fsdp"]
  micro = batch_size // max(grad_accum, 1)
  if micro % shards:
    raise UserError(f"config train.batch_size: the micro-batch {micro} (batch_size / grad_accum) must be "
                    f"divisible by mesh data*fsdp = {shards}")
  if batch_size % jax.process_count():
    raise UserError(f"config train.batch_size: {batch_size} must be divisible by the "
                    f"{jax.process_count()} processes")
  check_process_layout(np.vectorize(lambda d: d.process_index, otypes=[int])(mesh.devices), dict(mesh.shape))


def check_process_layout(process_ids: np.ndarray, shape: dict[str, int]) -> None:
  """Every batch shard (a data x fsdp coordinate) must live on the devices of one process.

  `process_ids` is the mesh's (data, fsdp, tensor) grid of device process indices. Each process
  feeds its own rows (`global_batch`), so a batch shard spanning processes (e.g. the tensor axis
  crossing hosts) would silently build a smaller global batch from mismatched rows.
  """
  counts = np.bincount(process_ids.ravel())
  for coord in np.ndindex(process_ids.shape[:2]):
    owners = np.unique(process_ids[coord])
    if len(owners) > 1:
      layout = " + ".join(f"{n} on process {p}" for p, n in enumerate(counts))
      raise UserError(f"config mesh {shape}: batch shard (data, fsdp)={coord} spans processes {owners.tolist()} "
                      f"(devices: {layout}); the batch axes must split along process boundaries: make "
                      f"mesh.tensor divide the {int(counts.min())} devices of each process (data*fsdp a multiple "
                      f"of the {len(counts)} processes)")


def make_topology_mesh(mesh_cfg: sections.Mesh, devices) -> Mesh:
  """The mesh over all of `devices` (e.g. a TPU topology's compile-only ones), physically laid out."""
  shape = mesh_shape(mesh_cfg, len(devices))
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=list(devices))
