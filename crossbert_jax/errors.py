"""User-facing errors: one line naming the bad input and the fix, never a traceback."""

import sys
from typing import Callable


class UserError(Exception):
  """A bad input from the user (config, path, data). The message is the whole story."""


def exit_on_user_error(fn: Callable[..., object]) -> Callable[..., object]:
  """Wraps a CLI entry point: a UserError prints `error: <message>` and exits with status 2."""

  def wrapped(*args, **kwargs):
    try:
      return fn(*args, **kwargs)
    except UserError as e:
      print(f"error: {e}", file=sys.stderr, flush=True)
      sys.exit(2)

  wrapped.__name__ = getattr(fn, "__name__", "main")
  wrapped.__doc__ = fn.__doc__
  return wrapped
