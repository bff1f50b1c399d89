"""Sharding: 1 device == 8 devices, params/opt state really sharded, mesh errors, accumulation."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.training import objectives, program as program_lib, sharding

STEPS = 3
LOSS_RTOL = 1e-5
# The suite's conftest gives 8 fake CPU devices; on one accelerator (tools/accelerator_check.py) these skip.
needs_8_devices = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices (the suite's fake CPU devices)")


def _config(data=1, fsdp=1, tensor=1, grad_accum=1):
  c = config_lib.get_config("crossbert", "tiny")
  with c.unlocked():
    c.model.embed_dim, c.model.num_heads, c.model.num_layers, c.model.mlp_dim = 32, 2, 2, 64
    c.model.vocab_size = 64
    c.reconstructor.embed_dim, c.reconstructor.num_heads = 32, 2
    c.reconstructor.mlp_dim, c.reconstructor.num_layers = 64, 1
    c.data.seq_len, c.train.batch_size, c.train.grad_accum = 16, 8, grad_accum
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = data, fsdp, tensor
  plan_lib.build(c)
  return c


def _batch(c, seed=0):
  """Random tokens 5..vocab; two packed segments per row of varying lengths, then pads; positions restart."""
  rng = np.random.default_rng(seed)
  b, seq_len = c.train.batch_size, c.data.seq_len
  seg = np.zeros((b, seq_len), np.int32)
  pos = np.zeros((b, seq_len), np.int32)
  for row in range(b):
    n1 = int(rng.integers(3, seq_len // 2))
    n2 = int(rng.integers(2, seq_len - n1 + 1))
    seg[row, :n1], seg[row, n1:n1 + n2] = 1, 2
    pos[row, :n1], pos[row, n1:n1 + n2] = np.arange(n1), np.arange(n2)
  tokens = np.where(seg > 0, rng.integers(5, c.model.vocab_size, (b, seq_len)), 0).astype(np.int32)
  return {"tokens": tokens, "segment_ids": seg, "positions": pos}


def _run(c, devices, batch, steps=STEPS, host_state=None):
  """Runs `steps` train steps; returns (final state, metrics per step, host copy of the initial state).

  host_state: start from this (numpy) state instead of TrainProgram.init_state (saves an init compile).
  """
  mesh = sharding.make_mesh(c.mesh, devices=devices)
  train_program = program_lib.TrainProgram(c, mesh)
  if host_state is None:
    state = train_program.init_state()
  else:
    state = jax.device_put(host_state, train_program.shardings)
  train_step = train_program.step
  initial = jax.tree.map(np.asarray, state)  # Host copy: the step donates the state.
  gb = sharding.global_batch(batch, mesh)
  metrics = []
  for _ in range(steps):
    state, m = train_step(state, gb)
    metrics.append({k: float(v) for k, v in m.items()})
  return state, metrics, initial


@pytest.fixture(scope="module")
def runs():
  batch = _batch(_config())
  one = _run(_config(), jax.devices()[:1], batch)
  eight = _run(_config(data=2, fsdp=2, tensor=2), jax.devices(), batch)
  return batch, one, eight


@pytest.mark.integration  # Train steps on 1 and 8 devices (the module's `runs`): over a minute on 2 cores.
@needs_8_devices
def test_one_device_equals_eight_devices(runs):
  assert len(jax.devices()) == 8, "conftest must provide 8 fake CPU devices"
  _, (_, m1, _), (_, m8, _) = runs
  for i, (a, b) in enumerate(zip(m1, m8)):
    for key in ("loss", "grad_norm", "num_targets", "accuracy"):
      np.testing.assert_allclose(
          b[key], a[key], rtol=LOSS_RTOL, atol=1e-7,
          err_msg=(f"step {i}: {key} on 8 devices (data=2, fsdp=2, tensor=2) differs from 1 device by more than "
                   f"rtol={LOSS_RTOL} (fp32): sharding changes the computation"))
  assert m1[0]["loss"] != m1[-1]["loss"], "the state did not change over the steps"


def _leaf(tree, path):
  for k in path:
    tree = tree[k]
  return tree


SHARDED = {
    # param path: (full shape, per-device shard shape on data=2, fsdp=2, tensor=2)
    ("encoder", "layers_0", "attn", "Wqkv", "kernel"): ((32, 3, 2, 16), (16, 3, 1, 16)),  # embed/fsdp, heads/tensor
    ("encoder", "embeddings", "tok_embeddings", "embedding"): ((64, 32), (32, 16)),  # vocab/tensor, embed/fsdp
    ("encoder", "layers_1", "mlp", "Wi", "kernel"): ((32, 2, 64), (16, 2, 32)),  # embed/fsdp, mlp/tensor
    ("reconstructor", "head", "kernel"): ((32, 64), (16, 32)),}


@pytest.mark.integration  # Train steps on 1 and 8 devices (the module's `runs`): over a minute on 2 cores.
@needs_8_devices
def test_params_and_adam_moments_are_sharded(runs):
  _, _, (state, _, _) = runs
  moments = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(state.opt_state)[0]:
    names = [getattr(k, "name", getattr(k, "key", None)) for k in path]
    for moment in ("mu", "nu"):
      if moment in names:
        param_path = tuple(n for n in names[names.index(moment) + 1:] if n is not None)
        moments[(moment,) + param_path] = leaf
  for path, (full, shard) in SHARDED.items():
    param = _leaf(state.params, path)
    assert param.shape == full, f"{'/'.join(path)}: shape {param.shape}, expected {full}"
    got = param.addressable_shards[0].data.shape
    assert got == shard, f"param {'/'.join(path)} is not sharded as expected: shard {got}, expected {shard} ({param.sharding.spec})"
    for moment in ("mu", "nu"):
      assert (moment,) + path in moments, f"no Adam {moment} found for {'/'.join(path)}"
      m = moments[(moment,) + path]
      assert m.addressable_shards[0].data.shape == shard, (
          f"Adam {moment} of {'/'.join(path)} has shard {m.addressable_shards[0].data.shape}, expected the param's {shard}"
      )


def _mesh_cfg(data, fsdp, tensor):
  return ml_collections.ConfigDict({"data": data, "fsdp": fsdp, "tensor": tensor, "rules": ()})


@pytest.mark.parametrize("sizes,devices,expected", [((2, -1, 2), 8, (2, 2, 2)), ((1, -1, 1), 8, (1, 8, 1)),
                                                    ((-1, 1, 2), 8, (4, 1, 2)), ((1, 1, 1), 1, (1, 1, 1))])
def test_mesh_shape_resolves_minus_one(sizes, devices, expected):
  assert sharding.mesh_shape(_mesh_cfg(*sizes), devices) == expected, f"mesh {sizes} on {devices} devices"


@pytest.mark.parametrize("sizes,devices", [((3, 1, 1), 8), ((2, 2, 1), 8), ((3, -1, 1), 8), ((2, 1, 1), 1)])
def test_mesh_shape_mismatch_is_user_error(sizes, devices):
  with pytest.raises(UserError) as err:
    sharding.mesh_shape(_mesh_cfg(*sizes), devices)
  assert "mesh" in str(err.value) and "\n" not in str(err.value), f"mesh {sizes} on {devices}: {err.value!r}"


@needs_8_devices
def test_make_mesh_checks_device_count():
  with pytest.raises(UserError, match="mesh"):
    sharding.make_mesh(_mesh_cfg(2, 2, 2), devices=jax.devices()[:1])
  mesh = sharding.make_mesh(_mesh_cfg(1, 1, 1), devices=jax.devices()[:1])
  assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 1}
  mesh = sharding.make_mesh(_mesh_cfg(2, -1, 1))
  assert dict(mesh.shape) == {"data": 2, "fsdp": 4, "tensor": 1} and mesh.devices.size == 8


@pytest.mark.integration  # Train steps on 1 and 8 devices (the module's `runs`): over a minute on 2 cores.
@needs_8_devices
def test_grad_accum_is_exact(runs):
  """Micro-batch i draws its masks from fold_in(step_key, i), so masks differ from grad_accum=1; the
  check is that accumulation is exact: the step's loss/grad_norm equal the summed micro-batch losses and
  gradients divided once by the total target count."""
  batch, (_, m1, initial), _ = runs
  c = _config(grad_accum=2)
  _, m2, _ = _run(c, jax.devices()[:1], batch, steps=1, host_state=initial)
  params = initial.params
  loss_fn = objectives.make_loss_fn(c)
  step_key = jax.random.fold_in(jax.random.fold_in(jax.random.key(c.train.seed), 1), 0)
  half = c.train.batch_size // 2
  total, targets, grads = 0.0, 0.0, None
  micro = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))  # One compile for both micro-batches.
  for i in range(2):
    mb = {k: jnp.asarray(v[i * half:(i + 1) * half]) for k, v in batch.items()}
    (loss_sum, stats), g = micro(params, mb, jax.random.fold_in(step_key, i))
    total, targets = total + float(loss_sum), targets + float(stats.num_targets)
    grads = g if grads is None else jax.tree.map(jnp.add, grads, g)
  grad_norm = float(optax.tree.norm(jax.tree.map(lambda g: g / targets, grads)))
  np.testing.assert_allclose(m2[0]["num_targets"], targets, err_msg="grad_accum=2 counts targets wrongly")
  np.testing.assert_allclose(m2[0]["loss"], total / targets, rtol=1e-5,
                             err_msg="grad_accum=2 loss is not sum(micro losses) / total targets (tol 1e-5)")
  np.testing.assert_allclose(m2[0]["grad_norm"], grad_norm, rtol=1e-5,
                             err_msg="grad_accum=2 grad_norm is not |sum(micro grads)| / total targets (tol 1e-5)")
  np.testing.assert_allclose(m2[0]["loss"], m1[0]["loss"], rtol=0.05,
                             err_msg="grad_accum=2 loss is far from grad_accum=1 on the same batch (5%, masks differ)")


@needs_8_devices
def test_a_param_the_mesh_does_not_divide_is_one_config_line():
  """fsdp=8 over an embedding width of 20: refused naming the param and the mesh axis, not XLA's
  IndivisibleError traceback from inside the lowering (as `compile --topology` on 128 chips gave)."""
  c = config_lib.get_config("crossbert", "tiny")
  c.model.embed_dim, c.model.num_heads, c.model.mlp_dim = 20, 2, 40
  c.mesh.data, c.mesh.fsdp = 1, 8
  mesh = sharding.make_mesh(c.mesh)
  with pytest.raises(UserError, match=r"config mesh: param \S+ .* split 8 ways \(mesh.fsdp=8\)"):
    program_lib.param_shardings(c, mesh, sharding.logical_rules(c.mesh))
  c.mesh.data, c.mesh.fsdp = 2, 4  # 20 splits 4 ways: accepted.
  program_lib.param_shardings(c, sharding.make_mesh(c.mesh), sharding.logical_rules(c.mesh))
