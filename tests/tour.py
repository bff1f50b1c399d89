"""The README's tour run as written, in a folder laid out like a fresh clone: what the README tour test checks and
what the docs commands test goes on from (the docs assume the tour ran first).

Each command is the README's own line; only the flags in SMALLER are appended (fewer steps and examples: the same
path through the code, less work), so a renamed flag, a config that refuses the tokenizer or a missing input fails.
The TPU set-up and compile lines run in `make test-tpu` (tests/unit/test_compile.py), where libtpu is installed.
"""

import pathlib
import shlex
import subprocess
import sys

from tests.helpers import ROOT, cpu_env

# Appended to the README's command of each module: the same path through the code, less work.
SMALLER = {
    "crossbert_jax.train": [
        "--config.train.steps=12", "--config.train.warmup_steps=2", "--config.metrics.progress_bar=False"],
    "crossbert_jax.evaluate": ["--max_examples=60", "--retrieval_max_docs=100", "--noprogress"],
    "crossbert_jax.sweep": ["--flops_scale=0.2"],}
# What a clone's root holds that the tour and the docs' commands read (linked, not copied).
CLONE_LINKS = ("configs", "experiments", "tools", "launch", "requirements-profile.txt")


def tour_commands(readme: str) -> list[str]:
  """The tour's commands: the first bash block after '## A tour', continuation lines joined."""
  block = readme.split("## A tour", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
  return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip() and not c.lstrip().startswith("#")]


def module_of(argv: list[str]) -> str:
  """`python -m M ...` -> M; `python tools/x.py ...` -> tools/x.py."""
  return argv[2] if argv[:2] == ["python", "-m"] else argv[1] if argv[0] == "python" else argv[0]


def clone_env() -> dict[str, str]:
  """The commands' environment: offline (Hub, datasets, W&B), one CPU device, the suite's XLA flags."""
  return cpu_env(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="offline", WANDB_SILENT="true")


def make_clone(tmp: pathlib.Path, shared_data: pathlib.Path) -> pathlib.Path:
  """tmp/clone, laid out like a fresh clone, beside tmp/shared/data (../shared/data, as here)."""
  clone = tmp / "clone"
  clone.mkdir()
  for name in CLONE_LINKS:
    (clone / name).symlink_to(ROOT / name)
  (tmp / "shared").mkdir()
  (tmp / "shared" / "data").symlink_to(shared_data)
  return clone


def run_in(clone: pathlib.Path, argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
  """Runs argv in the clone; a failure shows `what` and the command's output."""
  proc = subprocess.run(argv, cwd=clone, env=env or clone_env(), capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, f"{what}\n{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}"


def run_tour(tmp: pathlib.Path, shared_data: pathlib.Path) -> pathlib.Path:
  """A clone after every `python` line of the README's tour ran in it, in order; returns the clone."""
  clone = make_clone(tmp, shared_data)
  for command in tour_commands((ROOT / "README.md").read_text()):
    if not command.startswith("python "):
      continue  # `source`, and the TPU set-up and compile (tests/unit/test_compile.py).
    argv = shlex.split(command)
    run_in(clone, [sys.executable, *argv[1:], *SMALLER.get(module_of(argv), [])], command)
  return clone
