"""User-facing errors: one line naming the bad input and the fix, never a traceback."""

import os
import re
import sys
from typing import Callable, Sequence

# Exit statuses of the commands, for schedulers and launch scripts.
EXIT_OK = 0  # Finished (or nothing left to do).
EXIT_USER_ERROR = 2  # A bad input or environment (one `error:` line on stderr); rerunning as is won't help.
EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped by SIGTERM/SIGINT after saving a checkpoint; rerun the same command to resume.


class UserError(Exception):
  """A bad input from the user (config, path, data). The message is the whole story."""


def config_error(key: str, msg: str) -> UserError:
  """The one-line error for config key `key` ("config model.embed_dim: must be ...")."""
  return UserError(f"config {key}: {msg}")


def error_line(message: str) -> None:
  """Writes `error: <message>` as one write, so lines of several processes sharing a pipe do not interleave."""
  sys.stderr.write(f"error: {message}\n")
  sys.stderr.flush()


def one_line(error: BaseException, limit: int = 200) -> str:
  """`error` as `Type: message` on one line of at most `limit` characters, for the reason part of an
  error line. TensorStore's trailing pointer to its details (a bound-method repr) is dropped."""
  text = " ".join(f"{type(error).__name__}: {error}".split())
  text = text.split(" See full TensorStore details")[0]
  return text[:limit]


def exit_on_user_error(fn: Callable[..., object]) -> Callable[..., object]:
  """Wraps a CLI entry point: a UserError prints `error: <message>` and exits with status 2."""
  def wrapped(*args, **kwargs):
    try:
      return fn(*args, **kwargs)
    except UserError as e:
      error_line(str(e))
      _quiet_stderr()
      sys.exit(EXIT_USER_ERROR)

  wrapped.__name__ = getattr(fn, "__name__", "main")
  wrapped.__doc__ = fn.__doc__
  return wrapped


def _quiet_stderr() -> None:
  """Sends file descriptor 2 to /dev/null for the rest of the process: the error line stays the last
  word on stderr, also when a library thread still winding down at exit (Orbax's async checkpoint
  writer after a failed save on a full disk) would print its own traceback after it. Only where
  sys.stderr is the process's own descriptor 2 (a command), not a caller's capture of it."""
  sys.stderr.flush()
  try:
    if sys.stderr.fileno() != 2:
      return
  except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError.
    return
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, 2)
  os.close(devnull)


def unexpected_arguments(args: Sequence[str], advice: str, joined: bool = False) -> UserError:
  """The error for a command's positional `args`: `unexpected arguments ['a', 'b']<advice>`, or with `joined`
  `unexpected arguments a b<advice>`. `advice` follows verbatim, its separator included ("; use --x=...")."""
  return UserError(f"unexpected arguments {' '.join(args) if joined else list(args)}{advice}")


def no_positional(argv: Sequence[str], advice: str, joined: bool = False) -> None:
  """The first check of a command's main(argv): refuses any argument after the program name (every
  option is a --flag), with `unexpected_arguments`' line."""
  if len(argv) > 1:
    raise unexpected_arguments(argv[1:], advice, joined)


def require(*names: str, advice: str) -> None:
  """Refuses unless every absl flag in `names` is set (neither None nor ""), in one line naming them all:
  `--a is required<advice>` or `--a and --b are required<advice>`; `advice` follows verbatim."""
  from absl import flags  # Local: this module stays importable without absl.

  if any(flags.FLAGS[name].value in (None, "") for name in names):
    verb = "is" if len(names) == 1 else "are"
    raise UserError(f"{' and '.join(f'--{n}' for n in names)} {verb} required{advice}")


def parse_flags_or_exit(argv: list[str]) -> list[str]:
  """absl `flags_parser` for app.run: a bad flag or --config file/override is one line, exit 2.

  ml_collections' config_flags loads the config file and applies --config.key=value overrides
  while flags are parsed, so their failures (a missing file, an unknown variant or key, a
  value of the wrong type) surface here rather than in main.
  """
  from absl import flags  # Local: this module stays importable without absl.

  try:
    return flags.FLAGS(argv)
  except UserError as e:
    message = str(e)
  except flags.Error as e:
    message = f"{e}; see --helpfull"
  except AttributeError as e:
    message = _no_get_config(e, argv) or _unknown_key(e, argv)
  except KeyError as e:
    message = _unknown_key(e, argv)
  except Exception as e:  # noqa: BLE001 - config files are user input; show one line, not a traceback.
    message = f"could not load --config: {' '.join(str(e).split())}"
  error_line(message)
  sys.exit(2)


def _unknown_key(e: Exception, argv: list[str]) -> str:
  """The line for a config key that a --config.KEY=VALUE override or the config file names but the schema
  lacks (ml_collections raises KeyError or AttributeError naming the key)."""
  locked = re.search(r'Key "([^"]+)" does not exist', str(e))  # A locked ConfigDict's words for a new key.
  key = locked.group(1) if locked else str(e).strip(chr(34)).strip("'")
  if not key or any(c.isspace() for c in key):  # Not a key: the config file's own code failed.
    return f"could not load --config: {' '.join(f'{type(e).__name__}: {e}'.split())}"
  overridden = [a for a in argv if a.startswith("--config.") and f".{key}" in a.split("=")[0]]
  where = (f"in the override {overridden[0].split('=')[0]}"
           if overridden else "(set by the --config file)" if locked else "(the --config file lacks it)")
  return (f"unknown config key {key!r} {where}; every key is declared in crossbert_jax/core/sections.py "
          "(a config file builds on core/config.get_config)")


def _no_get_config(e: AttributeError, argv: list[str]) -> str | None:
  """The line for a --config file that defines no get_config (config_flags calls it); None for another
  AttributeError."""
  given = [a.split("=", 1)[1].split(":", 1)[0] for a in argv if a.startswith("--config=")]
  module_file = getattr(getattr(e, "obj", None), "__file__", None)
  if not given or getattr(e, "name", None) != "get_config" or not module_file:
    return None
  if os.path.realpath(module_file) != os.path.realpath(given[-1]):
    return None
  return (f"--config file {given[-1]} defines no get_config: add `def get_config(variant)` returning "
          "crossbert_jax.core.config.get_config(objective, variant), as configs/crossbert.py does")
