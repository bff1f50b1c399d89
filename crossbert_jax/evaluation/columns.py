"""The models an evaluation command scores, as table columns: each source's absolute path, a model given
twice refused, the column labels (with one '+pooler' column per pooler trained on a model), and the folder
where a training run's embeddings are cached.

Used by the evaluate and mteb_eval commands; a run's checkpoint as an embedder is
evaluation/run_models.py (the commands read the checkpoint with run/load.py, a higher layer).
"""

import hashlib
import os
import uuid
from typing import Sequence

from etils import epath

from crossbert_jax.core.errors import UserError
from crossbert_jax.evaluation import embedder as embedder_lib
from crossbert_jax.evaluation import pooler as pooler_lib


def absolute(path: str) -> str:
  """`path` made absolute (local paths); URLs such as gs://... are absolute already."""
  return path if "://" in path else str(epath.Path(path).resolve())


def user_cache_root() -> epath.Path:
  """The per-user embedding cache: $XDG_CACHE_HOME (default ~/.cache)/crossbert_jax/eval_cache."""
  root = os.environ.get("XDG_CACHE_HOME") or str(epath.Path("~/.cache").expanduser())
  return epath.Path(root) / "crossbert_jax" / "eval_cache"


def writable(folder: epath.Path) -> OSError | None:
  """None if a file can be created in `folder` (made if missing), else the error."""
  try:
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".write-test-{uuid.uuid4().hex[:8]}"
    probe.write_bytes(b"")
    probe.unlink()
  except OSError as e:
    return e
  return None


def run_cache_dir(workdir: str) -> epath.Path:
  """<workdir>/eval_cache, or the user cache when the run cannot be written (says so on stdout)."""
  default = epath.Path(workdir) / "eval_cache"
  error = writable(default)
  if error is None:
    return default
  # A read-only (e.g. shared or archived) run still evaluates; its embeddings are cached per user.
  fallback = user_cache_root() / hashlib.sha256(absolute(workdir).encode()).hexdigest()[:16]
  print(f"note: {default} is not writable ({error.strerror or error}); caching embeddings in {fallback}", flush=True)
  return fallback


def check_distinct(sources: Sequence[tuple[str, str]]) -> None:
  """Refuses a --workdir or --hf given twice (two spellings of one folder): its columns would be copies."""
  seen: dict[tuple[str, str], str] = {}
  for kind, source in sources:
    key = (kind, absolute(source))
    if key in seen:
      raise UserError(f"--{kind}={source} is --{kind}={seen[key]} again: give each model once")
    seen[key] = source


def column_label(label: str, source: str, taken: Sequence[str]) -> str:
  """`label` (the run folder's name @ step), or `label (source)` when an earlier column has it: another
  run whose folder has the same name."""
  return label if label not in taken else f"{label} ({source})"


def with_poolers(emb: embedder_lib.Embedder, label: str, poolers: list[pooler_lib.LoadedPooler],
                 used: set[int]) -> list[tuple[str, embedder_lib.Embedder]]:
  """(label, embedder) of the model, then one '+pooler' column per pooler trained on it; adds the index of
  each pooler used to `used`."""
  out = [(label, emb)]
  for i, p in enumerate(poolers):
    if p.meta.get("identity") == emb.identity:  # PoolerEmbedder refuses --layers/--pooling it was not trained on.
      out.append((f"{label}+pooler{i or ''}", pooler_lib.PoolerEmbedder(emb, p)))
      used.add(i)
  return out
