"""A run's params for evaluation and export: `load_run` reads only the params of a checkpoint
(newest readable, or a given step), placed on one device or sharded over the local ones;
`run_tokenizer` its tokenizer, checked against the one the checkpoint records; `init_params` recomputes
the params it started from."""

import sys
from typing import Any

import jax
from etils import epath

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import sections
from crossbert_jax.core import phases as phases_lib
from crossbert_jax.core.errors import UserError, one_line
from crossbert_jax.data import tokenizer as tokenizer_lib
from crossbert_jax.run import checkpoint, resume


def _params_placement(c: plan_lib.Settings, abstract: Any) -> Any:
  """Shardings for the params: one local device when they fit in a fraction of its memory, else
  FSDP over a mesh of all local devices (the model's own logical axes)."""
  from crossbert_jax.training import program, sharding  # Local: program imports the model stack.

  devices = jax.local_devices()
  nbytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(abstract))
  limit = (devices[0].memory_stats() or {}).get("bytes_limit") if hasattr(devices[0], "memory_stats") else None
  if len(devices) == 1 or limit is None or nbytes <= _ONE_DEVICE_FRACTION * limit:
    one = jax.sharding.SingleDeviceSharding(devices[0])
    return jax.tree.map(lambda _: one, abstract)
  mesh_cfg = sections.Mesh(data=1, fsdp=-1, tensor=1, rules=())
  mesh = sharding.make_mesh(mesh_cfg, devices=devices)
  return program.param_shardings(c, mesh, sharding.logical_rules(mesh_cfg))


# Params up to this fraction of one device's memory are restored onto it; larger ones are sharded.
_ONE_DEVICE_FRACTION = 0.5


def load_run(workdir: str | epath.Path, step: int | None = None) -> tuple[plan_lib.Settings, Any, int]:
  """(config, params, step) of a training run's checkpoint (latest if `step` is None).

  The config is that of the step's phase (`core/phases.py`): in a run with phases, the sequence
  length, RoPE thetas and data the checkpoint was last trained with, which evaluation uses and
  export writes into the Hugging Face config; a run without phases, its own config.

  For evaluation and export: restores only the params item of the state (Orbax partial restore:
  no optimizer is built and its state is never read), onto the first local device, or sharded
  over all local devices when they would not fit on one (`_params_placement`). The params are
  the model's full tree: "encoder" plus "reconstructor" or "head".
  """
  from crossbert_jax.training import program  # Local: program imports the model stack.

  directory = epath.Path(str(workdir))
  if not checkpoint.CheckpointLayout.of(directory).directory.exists():
    raise UserError(f"--workdir {directory} holds no {checkpoint.DIRECTORY}/: point it at a training run's workdir")
  ckpt = checkpoint.Checkpointer.reader(directory, read_only=False)
  try:
    steps = ckpt.all_steps()
    if not steps:
      raise UserError(f"--workdir {directory} holds no finished checkpoint yet")
    if step is not None and step not in steps:
      raise UserError(f"--step={step}: {directory} has checkpoints at steps {sorted(steps)}")

    def attempt(candidate: int) -> tuple[Any, str | None]:
      try:
        # A run with phases: the config its step was trained under (seq_len, RoPE thetas, batch, data).
        saved = plan_lib.of_saved(ckpt.saved_config(candidate))
        config = phases_lib.phase_at(saved.phases, candidate).config
        abstract = program.abstract_params(config)
        return (config, ckpt.restore_params(candidate, abstract, _params_placement(config, abstract))), None
      except UserError:
        raise
      except Exception as e:  # noqa: BLE001 - any unreadable item means a damaged step.
        return None, one_line(e)

    def passed_over(candidate: int, reason: str) -> None:  # Left in place: the trainer, not a reader, sets it aside.
      if step is not None or candidate == min(steps):
        fix = "pick another --step" if step is not None else "no readable checkpoint is left"
        raise UserError(f"checkpoint step {candidate} in {directory} is unreadable ({reason}); {fix}")
      print(f"warning: checkpoint step {candidate} in {directory} is unreadable ({reason}); trying the previous one",
            file=sys.stderr, flush=True)

    # The newest readable step; an explicit --step must be readable.
    step, (config, params) = checkpoint.first_readable([step] if step is not None else sorted(steps, reverse=True),
                                                       attempt, passed_over)
  finally:
    ckpt.close()
  return config, params, step


def run_tokenizer(workdir: str | epath.Path, config: plan_lib.Settings, step: int,
                  path: str = "") -> tokenizer_lib.AnyTokenizer:
  """The tokenizer of checkpoint `step` of the run in `workdir`: `path` (a --tokenizer), else the run's
  data.tokenizer; refused when it is not the tokenizer (file and special ids) that the checkpoint records."""
  flag = "--tokenizer" if path else "data.tokenizer"
  path = path or tokenizer_lib.resolve_for_run(config.data.tokenizer, str(workdir))
  tok = tokenizer_lib.Tokenizer.load(path)
  ckpt = checkpoint.Checkpointer.reader(epath.Path(str(workdir)), read_only=False)  # As load_run: no warnings.
  try:
    recorded = ckpt.saved_meta(step).tokenizer
  finally:
    ckpt.close()
  change = recorded and resume.tokenizer_change(recorded, resume.tokenizer_identity(path, tok), flag)
  if change:
    raise UserError(f"--workdir {workdir} (step {step}) was trained with {change}: pass --tokenizer=PATH, the "
                    "tokenizer the run was trained with")
  if not recorded and tok.vocab_size > config.model.vocab_size:  # Older checkpoints: ids past the table embed as NaN.
    raise UserError(f"{flag}={path} has {tok.vocab_size} pieces, more than the model's vocabulary "
                    f"(model.vocab_size={config.model.vocab_size}) of {workdir}: pass --tokenizer=PATH, the "
                    "tokenizer the run was trained with")
  return tok


def load_for_evaluation(workdir: str | epath.Path, step: int | None = None,
                        tokenizer_path: str = "") -> tuple[plan_lib.Settings, Any, tokenizer_lib.AnyTokenizer, int]:
  """(config, params, its checked tokenizer, step) of a run's checkpoint: what the evaluation commands
  score (`evaluation/run_models.py`)."""
  config, params, step = load_run(workdir, step)
  return config, params, run_tokenizer(workdir, config, step, tokenizer_path), step


def init_params(config: plan_lib.Settings) -> Any:
  """The params a fresh run of `config` starts from (its step 0, before any `train.init_from`).

  The model's init with `train.seed`, as `TrainProgram.init_state` draws it: JAX's partitionable
  RNG gives the same bits unsharded as under the trainer's shardings. On CPU it is compiled without
  XLA's backend optimisations (tiny: 1.6 s instead of 9-15 s on 2 cores), so the initialisers' float
  math may round differently: within 1e-7 of the trainer's values, not bitwise. On one device.
  """
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from crossbert_jax.training import objectives  # Local, as program in load_run.

  key = jax.random.key(config.train.seed)
  lowered = jax.jit(lambda k: nn.unbox(objectives.init_params(config, k))).lower(key)
  options = {"xla_backend_optimization_level": 0} if jax.default_backend() == "cpu" else {}
  return lowered.compile(compiler_options=options)(key)
