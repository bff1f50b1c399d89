"""What `run` (run/trainer.py) checks before a process start trains, and what it cleans after a failed one.

`load_tokenizer` loads the run's tokenizer and checks it against the model's vocabulary;
`check_phase` refuses a phase the run cannot train (its data path, its batch on the mesh and the
processes) before any work; `drop_empty_new_folders` removes what a failed start created and left empty.
"""

import os

import jax
from etils import epath

from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import phases as phases_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import pipeline, tokenizer as tokenizer_lib
from crossbert_jax.training import sharding


def load_tokenizer(c: plan_lib.Settings) -> tokenizer_lib.Tokenizer:
  """The run's tokenizer, checked against the model's vocabulary."""
  if not c.data.tokenizer:
    raise UserError("config data.tokenizer is empty: train one with `python -m crossbert_jax.tokenizer "
                    "--input=builtin --vocab_size=N --output=FILE.model` and pass --config.data.tokenizer=FILE.model")
  tok = tokenizer_lib.Tokenizer.load(c.data.tokenizer)
  if tok.vocab_size > c.model.vocab_size:
    raise UserError(f"config model.vocab_size={c.model.vocab_size} is smaller than the tokenizer's vocabulary (ids "
                    f"0-{tok.vocab_size - 1}, {c.data.tokenizer}): set --config.model.vocab_size>={tok.vocab_size}")
  return tok


def drop_empty_new_folders(workdir: epath.Path, before: set[str], created: bool) -> None:
  """After a failed start: removes the folders this start made that hold no file (checkpoints/,
  compilation_cache/, the workdir itself when it made it). Anything holding a file stays."""
  if not workdir.is_dir():
    return
  for entry in workdir.iterdir():
    if entry.name not in before and entry.is_dir() and not any(files for _, _, files in os.walk(entry)):
      entry.rmtree()
  if created and not any(workdir.iterdir()):
    workdir.rmdir()


def check_phase(c: plan_lib.Settings, phases: list[phases_lib.Phase], phase: phases_lib.Phase,
                mesh: jax.sharding.Mesh) -> None:
  """UserError for a phase the run cannot train: its data path, its batch on this mesh and processes."""
  if phase.index > 0 and phase.stream != phases[phase.index - 1].stream:
    pipeline.check_paths(phase.config.data)  # Before the tokenizer loads; `feed.check_streams` reads it then.
  sharding.check_batch_divisible(phase.config.train.batch_size, c.train.grad_accum, mesh)
  if phase.read_batch % jax.process_count():
    raise UserError(f"config train.batch_size: the phases' data stream is read {phase.read_batch} rows at a "
                    f"time, which {jax.process_count()} processes cannot split; make the batch sizes of "
                    "consecutive phases multiples of the process count")
