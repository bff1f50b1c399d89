"""Mesh checks for pods: `mesh.rules` validation and batch shards that must not span processes."""

import ml_collections
import numpy as np
import pytest

from crossbert_jax.core.errors import UserError
from crossbert_jax.training import sharding


def _rules(rules):
  return ml_collections.ConfigDict({"data": 1, "fsdp": -1, "tensor": 1, "rules": rules})


@pytest.mark.parametrize("rules,needle", [
    ((("mpl", "tensor"),), "unknown logical axis 'mpl'"),
    ((("mlp", "tensr"),), "unknown mesh axis 'tensr'"),
    ((("mlp",),), "not a (logical name, mesh axes) pair"),
    (("mlp",), "not a (logical name, mesh axes) pair"),
    ((("mlp", "tensor", "fsdp"),), "not a (logical name, mesh axes) pair"),
    ("mlp", "not a sequence of rules"),
    (((3, "tensor"),), "unknown logical axis 3"),])
def test_bad_mesh_rules_are_one_line(rules, needle):
  with pytest.raises(UserError) as err:
    sharding.logical_rules(_rules(rules))
  msg = str(err.value)
  assert needle in msg and "\n" not in msg, f"mesh.rules={rules!r}: {msg!r}"
  assert "mlp" in msg and "tensor" in msg, f"the error should list the logical names and mesh axes: {msg!r}"


def test_good_mesh_rules_go_first():
  rules = sharding.logical_rules(_rules((("mlp", None), ["embed", ["fsdp", "tensor"]])))
  assert rules[:2] == (("mlp", None), ("embed", ("fsdp", "tensor"))), rules[:2]
  assert rules[2:] == sharding.DEFAULT_RULES


@pytest.mark.parametrize("tensor,ok", [(1, True), (2, True), (4, True), (8, False)])
def test_process_layout_of_two_hosts_with_four_devices(tensor, ok):
  # The (data, fsdp, tensor) grid of process indices jax.make_mesh builds for 2 processes x 4 devices.
  owners = np.repeat([0, 1], 4).reshape(1, 8 // tensor, tensor)
  if ok:
    sharding.check_process_layout(owners, {"data": 1, "fsdp": 8 // tensor, "tensor": tensor})
  else:
    with pytest.raises(UserError, match=r"spans processes \[0, 1\].*4 on process 0 \+ 4 on process 1"):
      sharding.check_process_layout(owners, {"data": 1, "fsdp": 1, "tensor": 8})


def test_two_processes_refuse_tensor_axis_across_hosts(tmp_path, two_processes):
  """2 processes x 2 devices with mesh.tensor=4: each batch shard would span both hosts."""
  proc = two_processes("--config.train.steps=2", "--config.mesh.tensor=4", timeout=300)
  assert proc.returncode == 2, f"expected exit 2, got {proc.returncode}:\n{proc.stderr[-3000:]}"
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert "'tensor': 4" in errors[0] and "2 on process 0 + 2 on process 1" in errors[0], errors[0]
  assert not (tmp_path / "run" / "checkpoints").exists(), "refused before training"
