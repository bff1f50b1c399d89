"""Output folders and files of the commands: checked before any slow work, written atomically.

One rule for every command that writes a folder (`export`, `export import`, `pooler --output` /
`--export`, `report`, `mteb_eval --output_dir`): an output may never be, contain or sit inside one
of the command's inputs, never holds (or sits inside) a training run's checkpoints, and replaces a
non-empty folder only with `--force`. `staged_output_dir` then writes into a temporary sibling and
swaps it in at the end, so a failure or a kill leaves the old folder or the new one, never a mix;
`staged_files` moves a staged set of files into a folder that keeps its other files (the report);
`check_added_to` checks such a folder alone (mteb_eval's results, which it adds to and resumes
from), and `removed_unless_written` takes back the folders a failed start made. Files
(`compile --out`, `bench --out`, `embed_bench --out`, `evaluate --output`, `tokenizer --output`):
`check_output_file` refuses an existing one unless the command was given `--force`. `write_atomic`
writes one file whole (a state file several processes may write and read at once).
"""

import contextlib
import errno
import os
import re
import tempfile
import uuid
from typing import Iterator, Mapping, Sequence

from absl import logging
from etils import epath

from crossbert_jax.core.errors import UserError

# Siblings of an output folder: `.NAME.tmp-ID` is being written, `.NAME.old-ID` is the folder it
# replaces, set aside until the new one is in place.
_STAGING = r"\.{name}\.(tmp|old)-[0-9a-f]{{8}}"
CHECKPOINTS = "checkpoints"  # The folder of a training run that no output may replace.


def absolute(path: str | os.PathLike) -> epath.Path:
  """`path` made absolute (symlinks resolved) when local; object-store paths as they are."""
  return epath.Path(path) if "://" in str(path) else epath.Path(os.path.realpath(str(path)))


def holds_checkpoints(folder: epath.Path, depth: int = 4) -> bool:
  """True if `folder` or a folder up to `depth` levels below it (a sweep's ROOT/runs/NAME) holds a
  training run's checkpoints/."""
  if (folder / CHECKPOINTS).is_dir():
    return True
  return depth > 0 and any(child.is_dir() and not child.name.startswith(".") and holds_checkpoints(child, depth - 1)
                           for child in folder.iterdir())


def relation(output: epath.Path, other: epath.Path) -> str | None:
  """"is", "is inside", "contains" or None: where absolute path `output` stands to `other`."""
  if output == other:
    return "is"
  if other in output.parents:
    return "is inside"
  if output in other.parents:
    return "contains"
  return None


def check_output_dir(path: str | os.PathLike, force: bool, *, flag: str = "--output",
                     inputs: Mapping[str, str | os.PathLike | None] | None = None, may_sit_inside: Sequence[str] = (),
                     inside_run_ok: bool = False) -> epath.Path:
  """Refuses an output folder that would overwrite user data, an input or a training run.

  `inputs`: {flag: path} of what the command reads (a workdir, an HF folder): the output may not
  be, contain or sit inside any of them, except sit inside those whose flag is in `may_sit_inside`.
  `inside_run_ok`: the output may sit inside a training run (the pooler's default
  <workdir>/pooler) but still not inside its checkpoints/. Returns the absolute output path.
  """
  output = _check_location(path, flag, inputs, may_sit_inside, inside_run_ok)
  if output.exists() and any(output.iterdir()):
    if holds_checkpoints(output):
      raise UserError(f"{flag} {path} holds training checkpoints: choose another folder "
                      "(--force never deletes a training run)")
    if not force:
      raise UserError(f"{flag} {path} exists and is not empty: choose a new folder or pass --force")
  return output


Inputs = Mapping[str, str | os.PathLike | None] | Sequence[tuple[str, str | os.PathLike | None]]


def _check_location(path: str | os.PathLike, flag: str, inputs: Inputs | None, may_sit_inside: Sequence[str],
                    inside_run_ok: bool, writes_inside: bool = False,
                    harm: str = "--force would delete it") -> epath.Path:
  """The absolute output folder, refused when it is an input's, a run's or a file's place.

  `inputs`: {flag: path}, or (flag, path) pairs when a flag is repeated (several --workdir); `harm`: what
  writing there would do to an input, for the error line."""
  output = absolute(path)
  for name, given in (inputs.items() if isinstance(inputs, Mapping) else inputs or ()):
    if not given:
      continue
    where = relation(output, absolute(given))
    if where and not (where == "is inside" and name in may_sit_inside):
      raise UserError(f"{flag} {path} {where} {name} {given}: an output may not be, contain or sit inside "
                      f"an input ({harm}); choose a {flag} outside it")
  for folder in output.parents:
    # A folder inside a run (even another run) would be replaced with everything in it.
    checkpoints = folder / CHECKPOINTS
    if not checkpoints.is_dir() or (inside_run_ok and checkpoints not in (output, *output.parents)):
      continue
    raise UserError(f"{flag} {path} is inside {folder}, which holds training checkpoints: "
                    f"choose a {flag} outside any training run")
  check_folder_path(path, flag, writes_inside=writes_inside)
  return output


def check_added_to(path: str | os.PathLike, flag: str, inputs: Inputs | None = None, *,
                   writes_inside: bool = False) -> epath.Path:
  """Refuses a folder the command adds its files to, keeping the others there (a report folder, mteb_eval's
  results): it may not be, contain or sit inside an input, nor hold or sit inside a training run.

  writes_inside: the files are written in place (as check_folder_path). Returns the absolute path.
  """
  output = _check_location(path, flag, inputs, (), inside_run_ok=False, writes_inside=writes_inside,
                           harm="its files would mix with the input's")
  if output.is_dir() and holds_checkpoints(output):
    raise UserError(f"{flag} {path} holds training checkpoints: choose a folder outside any training run")
  return output


@contextlib.contextmanager
def removed_unless_written(path: str | os.PathLike) -> Iterator[None]:
  """On a failure in the block, removes the folders of `path` it made, as long as no file was written
  there: a failed start leaves no empty output folder. A folder that existed before is never touched."""
  output = absolute(path)
  new = None if "://" in str(output) else next((p for p in reversed([output, *output.parents]) if not p.exists()), None)
  try:
    yield
  except BaseException:
    if new is not None and new.is_dir() and not any(p.is_file() for p in new.rglob("*")):
      new.rmtree()
    raise


def check_folder_path(path: str | os.PathLike, flag: str, *, writes_inside: bool = False) -> None:
  """Refuses a folder path that is a file, or (locally) whose parent cannot be made or written.

  writes_inside: the folder is written in place (a workdir) rather than replaced from a sibling, so an
  existing one must itself be writable; its parent need not be.
  """
  output = absolute(path)
  if output.exists() and not output.is_dir():
    raise UserError(f"{flag} {path} is a file, not a folder: give a folder path (a file is never replaced)")
  if "://" in str(output):
    return
  folder = output if writes_inside and output.exists() else output.parent  # Where the first write goes.
  while not folder.exists() and folder != folder.parent:
    folder = folder.parent
  if not folder.is_dir():
    raise UserError(f"{flag} {path}: {folder} is a file, so no folder can be made below it; choose another path")
  if not os.access(folder, os.W_OK):
    # The words of a failed write (staged_output_dir), said before any slow work.
    reason = (f"{os.strerror(errno.EROFS)}: the disk holding {folder} is read-only"
              if _read_only(folder) else f"{os.strerror(errno.EACCES)}: {folder}")
    raise UserError(f"could not write {output} ({reason}): choose a writable {flag}; "
                    f"nothing at {output} was changed")


def _read_only(folder: epath.Path) -> bool:
  try:
    return bool(os.statvfs(str(folder)).f_flag & os.ST_RDONLY)
  except OSError:
    return False


def check_output_file(path: str, flag: str = "--out", *, force: bool = False, companions: Sequence[str] = (),
                      suffix: str = "") -> epath.Path:
  """Refuses an output file that is a folder or cannot be written (probed locally; nothing is left),
  and, unless `force` (the command's --force), one that exists or whose companion files (the same
  name with each suffix in `companions`, e.g. ".md") exist: earlier results are never replaced
  silently. `suffix` (e.g. ".model"): also refuses a file name with another ending.
  """
  out = epath.Path(path)
  if out.is_dir():
    raise UserError(f"{flag} {path} is a folder: give a file path in it, e.g. {flag}={out}/NAME{suffix or '.json'}")
  if suffix and out.suffix != suffix:
    raise UserError(f"{flag} {path} does not end in {suffix}: give a file path ending in {suffix}, "
                    f"e.g. {flag}={out.with_suffix(suffix)}")
  existing = [p for p in (out, *(out.with_suffix(s) for s in companions)) if p.exists()]
  if existing and not force:
    raise UserError(f"{flag} {path}: {existing[0]} exists (earlier results): choose a new path, "
                    "or pass --force to replace it")
  if "://" in path:
    return out
  folder = out.parent
  while not folder.exists() and folder != folder.parent:
    folder = folder.parent
  if not folder.is_dir():
    raise UserError(f"{flag} {path}: {folder} is a file, so nothing can be written below it; choose another path")
  existed = out.exists()
  try:
    if str(out.parent) not in ("", "."):
      out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a", encoding="utf-8"):
      pass
  except OSError as e:
    raise UserError(f"{flag} {path} cannot be written ({e.strerror or type(e).__name__}); "
                    "choose a writable path") from None
  if not existed:
    out.unlink()
  return out


def _recover_staging(output: epath.Path) -> None:
  """Undoes what a killed writer left: restores a set-aside folder, deletes staging folders."""
  if not output.parent.is_dir():
    return
  pattern = _STAGING.format(name=re.escape(output.name))
  leftovers = sorted(p for p in output.parent.iterdir() if re.fullmatch(pattern, p.name))
  for path in leftovers:
    if ".old-" in path.name and not output.exists():
      # Killed between the two renames: the set-aside folder is the last complete output.
      path.rename(output)
      logging.warning("restored %s from %s, left by a writer that was killed", output, path)
    elif ".old-" in path.name and "://" in str(output):
      # On object stores a folder rename is per-object copy + delete: a kill mid-rename can leave
      # `output` partial and this copy complete, so it is never deleted automatically.
      logging.warning("kept %s, left by a writer killed while replacing %s: delete it once %s is "
                      "checked", path, output, output)
    else:
      path.rmtree(missing_ok=True)
      logging.warning("removed %s, left by a writer that was killed", path)


@contextlib.contextmanager
def staged_output_dir(path: str | os.PathLike, force: bool, *, flag: str = "--output",
                      inputs: Mapping[str, str | os.PathLike | None] | None = None, may_sit_inside: Sequence[str] = (),
                      inside_run_ok: bool = False) -> Iterator[epath.Path]:
  """Yields a temporary sibling folder; swaps it in for the output only if the body succeeds.

  The output is checked (`check_output_dir`, same arguments) first. The swap renames the old folder aside, the new
  one in, then deletes the old: a kill at any point leaves the output complete (old or new) or
  recoverable by the next writer (`_recover_staging`).
  """
  output = epath.Path(path)
  tag = uuid.uuid4().hex[:8]
  tmp = output.parent / f".{output.name}.tmp-{tag}"
  try:
    _recover_staging(output)
    check_output_dir(output, force, flag=flag, inputs=inputs, may_sit_inside=may_sit_inside,
                     inside_run_ok=inside_run_ok)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp.mkdir()
    try:
      yield tmp
    except BaseException:
      tmp.rmtree(missing_ok=True)
      raise
    old = output.parent / f".{output.name}.old-{tag}"
    if output.exists():
      output.rename(old)
    tmp.rename(output)
    if old.exists():
      old.rmtree() if old.is_dir() else old.unlink()
  except OSError as e:
    if tmp.exists():
      tmp.rmtree(missing_ok=True)
    raise UserError(f"could not write {output} ({e.strerror or type(e).__name__}: {e.filename or e}): "
                    f"free space or choose a writable {flag}; nothing at {output} was changed") from None


@contextlib.contextmanager
def staged_files(path: str | os.PathLike, force: bool, *, marker: str, flag: str = "--output",
                 inputs: Mapping[str, str | os.PathLike | None] | None = None) -> Iterator[epath.Path]:
  """Yields a temporary sibling folder whose files are moved into the output folder at the end.

  For an output folder that also holds files of its own (a report next to hand-written notes):
  other files are kept. `marker` is the file that shows an earlier output (report.md): present,
  it is replaced only with `force`. Each file is moved in with one rename (whole or absent); a
  failure in the body leaves the folder as it was.
  """
  output = check_added_to(path, flag, inputs)
  if (output / marker).exists() and not force:
    raise UserError(f"{flag} {path} already holds {marker}: pass --force to replace it (and the files written "
                    "with it; other files there are kept) or choose a new folder")
  tag = uuid.uuid4().hex[:8]
  tmp = output.parent / f".{output.name}.tmp-{tag}"
  try:
    _recover_staging(output)
    tmp.mkdir(parents=True)
    try:
      yield tmp
    except BaseException:
      tmp.rmtree(missing_ok=True)
      raise
    output.mkdir(parents=True, exist_ok=True)
    for file in sorted(tmp.iterdir(), key=lambda p: p.name == marker):  # The marker last.
      file.replace(output / file.name)
    tmp.rmtree(missing_ok=True)
  except OSError as e:
    if tmp.exists():
      tmp.rmtree(missing_ok=True)
    raise UserError(f"could not write {output} ({e.strerror or type(e).__name__}: {e.filename or e}): "
                    f"free space or choose a writable {flag}") from None


def write_atomic(path: "os.PathLike[str] | str", text: str) -> None:
  """Writes `path` so that a reader sees the old content or the new, whole: locally through a temporary file of
  its own (fsynced) and a rename; on gs:// directly (an object appears whole when its upload ends)."""
  if "://" in str(path):
    epath.Path(path).write_text(text)
    return
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.fspath(path.parent), prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, os.fspath(path))
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    raise
