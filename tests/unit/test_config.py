"""Config schema: every shipped variant validates; each inconsistency is one line naming the key."""

import importlib.util
import pathlib

import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import UserError

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG_FILES = ("configs/crossbert.py", "configs/bert.py")


def _load_config_file(rel_path: str):
  """Imports a config file the way config_flags.DEFINE_config_file does (by path, not by package)."""
  spec = importlib.util.spec_from_file_location(pathlib.Path(rel_path).stem + "_config", ROOT / rel_path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("variant", config_lib.VARIANTS)
@pytest.mark.parametrize("path", CONFIG_FILES)
def test_shipped_configs_validate(path, variant):
  c = _load_config_file(path).get_config(variant)
  plan_lib.build(c)
  assert c.objective == ("crossbert" if "crossbert" in path else "mlm"), f"{path}:{variant} has objective {c.objective}"
  assert c.is_locked, f"{path}:{variant} must return a locked config (typos in overrides must fail)"


def test_unknown_variant_and_objective_are_user_errors():
  for args, key in ((("crossbert", "huge"), "variant"), (("electra", "tiny"), "objective")):
    with pytest.raises(UserError) as err:
      config_lib.get_config(*args)
    assert key in str(err.value) and "\n" not in str(err.value), f"get_config{args}: {err.value!r}"


# (objective, {section.key: value}, the key the message must name)
INVALID = [
    ("crossbert", {"model.num_heads": 3}, "model.num_heads"),
    ("crossbert", {"model.num_heads": 64}, "model.num_heads"),  # Head dim 1: odd, no RoPE pairs.
    ("crossbert", {"masking.ratio": 0.0}, "masking.ratio"),
    ("mlm", {"masking.ratio": 1.2}, "masking.ratio"),
    ("crossbert", {"masking.ratio": 0.3}, "masking.ratio"),  # views=2 needs ratio 0.5.
    ("crossbert", {"masking.views": 3, "masking.ratio": 2 / 3, "data.seq_len": 64}, "data.seq_len"),
    ("crossbert", {"masking.views": 0}, "masking.views"),
    ("mlm", {"masking.views": 2, "masking.ratio": 0.5}, "masking.views"),
    ("crossbert", {"masking.reconstruct_ratio": 0.0}, "masking.reconstruct_ratio"),
    ("mlm", {"masking.reconstruct_ratio": 0.5}, "masking.reconstruct_ratio"),
    ("crossbert", {"train.grad_accum": 3}, "train.grad_accum"),
    ("crossbert", {"train.grad_accum": -1}, "train.grad_accum"),  # 0 is auto (training/memory.py).
    ("crossbert", {"train.decay": "exponential"}, "train.decay"),
    ("crossbert", {"model.remat": "some"}, "model.remat"),
    ("crossbert", {"model.dtype": "float16"}, "model.dtype"),
    ("crossbert", {"mesh.data": -1, "mesh.fsdp": -1}, "mesh"),
    ("crossbert", {"mesh.tensor": 0}, "mesh.tensor"),
    ("crossbert", {"reconstructor.tie_head": True, "reconstructor.embed_dim": 32,
                   "reconstructor.num_heads": 2}, "reconstructor.tie_head"),
    ("crossbert", {"reconstructor.num_heads": 3}, "reconstructor.num_heads"),
    ("crossbert", {"model.local_window": 5}, "model.local_window"),
    ("crossbert", {"model.global_every": 0}, "model.global_every"),
    ("crossbert", {"model.scan_layers": True, "model.num_layers": 1}, "model.scan_layers"),
    ("crossbert", {"mlm.mask_prob": 0.95, "mlm.random_prob": 0.1}, "mlm.mask_prob"),
    ("crossbert", {"data.seq_len": 2}, "data.seq_len"),
    ("crossbert", {"data.format": "csv"}, "data.format"),
    ("crossbert", {"train.learning_rate": 0.0}, "train.learning_rate"),
    ("crossbert", {"train.final_lr_ratio": 1.5}, "train.final_lr_ratio"),
    ("crossbert", {"checkpoint.keep": 0}, "checkpoint.keep"),]


@pytest.mark.parametrize("objective,overrides,key", INVALID,
                         ids=[f"{o}-{'-'.join(f'{k}={v}' for k, v in d.items())}" for o, d, _ in INVALID])
def test_invalid_config_is_one_line_naming_the_key(objective, overrides, key):
  c = config_lib.get_config(objective, "tiny")
  with c.unlocked():
    for dotted, value in overrides.items():
      section, name = dotted.split(".")
      c[section][name] = value
  with pytest.raises(UserError) as err:
    plan_lib.build(c)
  msg = str(err.value)
  assert "\n" not in msg, f"the error must be a single line: {msg!r}"
  assert msg.startswith(f"config {key}"), f"{overrides}: the message must name {key!r} first, got {msg!r}"


TRAIN_PY = ROOT / "crossbert_jax" / "train.py"


@pytest.mark.skipif(not TRAIN_PY.exists(), reason="crossbert_jax/train.py does not exist yet")
def test_cli_bad_config_exits_2_with_one_line(tmp_path, command):
  proc = command("crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={tmp_path / 'run'}",
                 "--config.masking.ratio=1.5")
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert proc.returncode == 2, f"a bad config must exit with status 2, got {proc.returncode}; stderr:\n{proc.stderr[-2000:]}"
  assert "Traceback" not in proc.stderr, f"a user error must not print a traceback:\n{proc.stderr[-2000:]}"
  assert len(lines) == 1 and lines[0].startswith("error: config masking.ratio: "), (
      f"stderr must be exactly one line 'error: config masking.ratio: ...', got:\n{proc.stderr[-2000:]}")


def test_config_saved_by_an_older_version_gets_todays_defaults_for_new_keys():
  saved = config_lib.get_config("mlm", "small").to_dict()
  del saved["model"]["attention"], saved["masking"]["exclude_special"]
  saved["model"]["embed_dim"] = 96
  c = config_lib.from_dict(saved)
  assert c.model.attention == "auto" and c.masking.exclude_special is True
  assert c.model.embed_dim == 96 and c.objective == "mlm" and c.data.seq_len == saved["data"]["seq_len"]
  assert isinstance(c.mesh.rules, tuple)


def test_set_cpu_flags_appends_once_and_respects_explicit_choices(monkeypatch):
  from crossbert_jax.core import xla_flags
  env = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
  flags = xla_flags.set_cpu_flags(env)
  assert flags == env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x " + " ".join(xla_flags.CPU_FLAGS)
  assert xla_flags.set_cpu_flags(env) == flags  # Idempotent.
  explicit = {"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type=dot"}
  assert xla_flags.set_cpu_flags(explicit) == "--xla_cpu_experimental_ynn_fusion_type=dot"
  assert xla_flags.set_cpu_flags({xla_flags.OPT_OUT: "0"}) == ""
  monkeypatch.setattr(xla_flags, "_jaxlib_version", lambda: "0.11.0")  # Not measured: XLA may not know the flag.
  assert xla_flags.set_cpu_flags({"XLA_FLAGS": "--a"}) == "--a"
