"""What every reader of Hugging Face `datasets` here shares: its log lines kept off our one-line errors."""

import contextlib
from typing import Iterator


@contextlib.contextmanager
def quiet() -> Iterator[None]:
  """datasets' own error lines (its handler and absl's, one fault over many lines) off: our one line says it."""
  import datasets  # pylint: disable=g-import-not-at-top  (slow to import)

  level = datasets.logging.get_verbosity()
  datasets.logging.set_verbosity(datasets.logging.CRITICAL + 1)
  try:
    yield
  finally:
    datasets.logging.set_verbosity(level)
