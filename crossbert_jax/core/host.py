"""What machine this process runs on, in words: for results that are only comparable on one machine."""

import os
import platform

from etils import epath


def cpu_model() -> str:
  """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` knows, else 'unknown'."""
  try:
    for line in epath.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"


def describe() -> str:
  """'<CPU model>, <n> CPUs': two runs with different descriptions ran on different kinds of machine.

  This names the host, not an accelerator on it; on accelerator hosts the host type stands for it.
  """
  return f"{cpu_model()}, {os.cpu_count()} CPUs"
