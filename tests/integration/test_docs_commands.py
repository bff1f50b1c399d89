"""The ```bash blocks of docs/**/*.md: every command runs as written, in order, or is skipped here for
a stated reason (SKIP), and then its flags are still checked against the command's definitions.

The slow test runs the runnable ones in the session's clone after the README tour (`tour_clone`,
tests/tour.py: its tokenizer, shards and runs), after `make demo`'s recipe, which the docs also
assume was run first, each with the flags in SMALLER appended (fewer steps and examples: the same
path through the code, less work). The fast tests check that every command is classified, that no
skip rule is stale, that every block parses (`bash -n`), and that every `--flag` of a
`python -m crossbert_jax.X` / `python tools/X.py` command is one that command defines.
"""

import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from tests import tour

ROOT = pathlib.Path(__file__).resolve().parents[2]

# (doc, a substring of the command) -> why the command does not run here.
SKIP = {
    ("docs/accelerator.md", "tools/accelerator_check.sh"): "needs an NVIDIA GPU (the prepared device check)",
    ("docs/accelerator.md", "pip download"): "downloads wheels from PyPI",
    ("docs/benchmarks.md", "configs/crossbert.py:small"): "a timing of `small`: minutes per case, meant for idle cores",
    ("docs/benchmarks.md", "bench --data"): "a 2-minute timing of the input pipeline, meant for idle cores",
    ("docs/benchmarks.md", "tools/contrast_bench.py"): "a timing of `small`'s contrastive step: minutes, for idle cores",
    ("docs/benchmarks.md", "import contrast_bench"): "a timing of `small`'s contrastive step at two lengths: a minute",
    ("docs/data.md", "--input=PATH"): "a placeholder: your text files",
    ("docs/data.md", "gs://BUCKET"): "a placeholder bucket on Google Cloud Storage",
    ("docs/evaluation.md", "--generic_train=sts_train.tsv"): "your own task files (sts_train.tsv, sts_test.tsv)",
    ("docs/evaluation.md", "--task_file=tasks.json"): "your own task file (tasks.json)",
    ("docs/evaluation.md", "--output_dir=runs/demo/glue"): "reads nyu-mll/glue from the Hub (or its datasets cache)",
    ("docs/evaluation.md", "--data_dir=data/glue"): "reads a copy of nyu-mll/glue that `hf download` makes (the Hub)",
    ("docs/benchmarks.md", "--output_dir=runs/ft_cpu"): "a timing of one epoch of every GLUE task (about 40 min on CPU)",
    ("docs/evaluation.md", "--output_dir=runs/ft"): "reads nyu-mll/glue from the Hub (or its datasets cache)",
    ("docs/evaluation.md", "--hf=models/ModernBERT-base"): "a published ModernBERT, downloaded from the Hub",
    ("docs/evaluation.md", "runs/ft/trials/"): "exports a trial of the Hub-reading command before it",
    ("docs/evaluation.md", "tools/finetune_peer.py"): "a measurement: 3 seeds of two fine-tunings each (minutes)",
    ("docs/evaluation.md", "--executor=ray"): "needs a Ray cluster (tests/slow/test_finetune_ray.py starts one)",
    ("docs/evaluation.md", "--executor=slurm"): "needs a SLURM cluster (tests/slow/test_finetune_slurm.py starts one)",
    ("docs/launch.md", ".venv-tpu"): "needs libtpu (`make setup-tpu`; `make test-tpu` runs the compile)",
    ("docs/launch.md", "TPU="): "creates Cloud TPU VMs (gcloud)",
    ("docs/launch.md", "launch/tpu.sh"): "creates and drives Cloud TPU VMs (gcloud)",
    ("docs/launch.md", "slurm_gpu.sbatch"): "needs a SLURM cluster with GPUs",
    ("docs/pod.md", "gs://BUCKET"): "a placeholder bucket on Google Cloud Storage",
    ("docs/pod.md", "--input=corpus/"): "a placeholder: your corpus",
    ("docs/results/", ""): "reproduces a stored, dated result (hours on CPU, or an old checkout)",
    ("docs/scaling.md", "make setup-tpu"): "installs the TPU stack (`make test-tpu`)",
    ("docs/scaling.md", ".venv-tpu"): "needs libtpu (`make setup-tpu`; `make test-tpu` runs the compile)",
    ("docs/scaling.md", "tools/roofline_table.py"): "reads the compile outputs of the line before (libtpu)",
    ("docs/scaling_sweeps.md", "--spec=SPEC"): "a placeholder spec and root",
    ("docs/scaling_sweeps.md", "--executor=ray"): "needs a Ray cluster (tests/slow/test_sweep_ray.py starts one)",
    ("docs/testing.md", "make "): "the test suites themselves",
    ("docs/training.md", "'corpus/*.jsonl'"): "a placeholder corpus and tokenizer; `small` is accelerator-sized",
    ("docs/training.md", "pip install"): "installs the trace viewer and starts its web server",}

# Appended to each module's command: the same path through the code, less work.
SMALLER = {
    **tour.SMALLER,
    "crossbert_jax.pooler": ["--steps=5", "--batch_size=8"],
    "crossbert_jax.contrast": ["--config.train.steps=12", "--config.metrics.progress_bar=False"],
    # SciFact's 5,183 abstracts encoded at 128 tokens, not 512 (its command took 73 s of the test at 512).
    "crossbert_jax.mteb_eval": ["--max_length=128"],}
# A traced window must stay inside the run: a command that sets one (training.md's: steps 20-22) trains past it.
TRACED_STEPS = ["--config.train.steps=30", "--config.train.warmup_steps=2", "--config.metrics.progress_bar=False"]


def bash_blocks() -> list[tuple[str, str]]:
  """(doc, block) for every ```bash block of docs/**/*.md, docs in path order."""
  out = []
  for md in sorted((ROOT / "docs").rglob("*.md")):
    doc = str(md.relative_to(ROOT))
    out += [(doc, b) for b in re.findall(r"^```bash\n(.*?)^```", md.read_text(encoding="utf-8"), re.S | re.M)]
  return out


def commands(block: str) -> list[str]:
  """A block's commands: continuation lines joined, comment-only and blank lines dropped."""
  return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip() and not c.lstrip().startswith("#")]


def skip_reason(doc: str, command: str) -> str | None:
  for (where, part), why in SKIP.items():
    if (doc == where or where.endswith("/") and doc.startswith(where)) and part in command:
      return why
  return None


def all_commands() -> list[tuple[str, str, str | None]]:
  return [(doc, c, skip_reason(doc, c)) for doc, block in bash_blocks() for c in commands(block)]


def argv_of(command: str) -> tuple[dict[str, str], list[str]]:
  """(env assignments, argv) of a command as written; `[optional]` parts dropped, comments cut."""
  words = [w for w in shlex.split(command, comments=True) if not (w.startswith("[") and w.endswith("]"))]
  env = {}
  while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
    k, _, v = words.pop(0).partition("=")
    env[k] = v
  return env, words


def defined_flags(module: str) -> set[str] | None:
  """The flags a command defines (absl DEFINE_* or argparse), read from its source; None: not ours."""
  path = ROOT / (module.replace(".", "/") + ".py" if module.startswith("crossbert_jax.") else module)
  if path.suffix != ".py" or not path.is_file():
    return None
  text = path.read_text(encoding="utf-8")
  if "command.define_flags(" in text:  # The training commands' shared flags (run/command.py).
    text += (ROOT / "crossbert_jax/run/command.py").read_text(encoding="utf-8")
  names = set(re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", text)) | set(re.findall(r"add_argument\(\s*\"--(\w+)\"", text))
  names |= {f"no{n}" for n in names}
  if "config_flags" in text or "config_lib.define" in text or "DEFINE_config" in text:
    names.add("config")
  return names


def test_every_docs_command_is_run_or_skipped_for_a_reason():
  every = all_commands()
  assert len(every) > 40
  runnable = [(d, c) for d, c, why in every if why is None]
  bad = [f"{d}: {c}" for d, c in runnable if argv_of(c)[1][:1] != ["python"]]
  assert not bad, "commands neither runnable here (python ...) nor in SKIP:\n" + "\n".join(bad)
  used = {(where, part)
          for (where, part) in SKIP
          for d, c, _ in every
          if (d == where or where.endswith("/") and d.startswith(where)) and part in c}
  assert used == set(SKIP), f"stale SKIP rules: {set(SKIP) - used}"


@pytest.mark.parametrize("doc,block", bash_blocks(), ids=lambda x: x if x.startswith("docs/") else "")
def test_every_block_parses(doc, block):
  proc = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True)
  assert proc.returncode == 0, f"{doc}:\n{block}\n{proc.stderr}"


def test_every_python_command_uses_defined_flags():
  bad = []
  for doc, command, _ in all_commands():
    if "python" not in command:
      continue
    _, argv = argv_of(command[command.index("python"):].split("&&")[-1].strip())
    if not argv or argv[0] not in ("python", "python3") or len(argv) < 2:
      continue
    names = defined_flags(tour.module_of(argv))
    if names is None:
      continue
    for word in argv[2:]:
      if word.startswith("--") and not word.startswith("--config."):
        name = word[2:].split("=", 1)[0]
        if name not in names and name != "help":
          bad.append(f"{doc}: {tour.module_of(argv)} has no flag --{name}")
  assert not bad, "\n".join(bad)


def _as_run(argv: list[str]) -> list[str]:
  module = tour.module_of(argv)
  extra = SMALLER.get(module, [])
  if module == "crossbert_jax.train" and any(a.startswith("--config.profile.start_step") for a in argv):
    extra = TRACED_STEPS
  if module == "crossbert_jax.train" and any(a.startswith("--config=") and a.endswith("_recipe") for a in argv):
    extra = ["--config.metrics.progress_bar=False"]  # Its phases are its steps: run as written (200 tiny steps).
  if "--word_order" in argv:  # Built-in data, its own fixed size: it refuses the subset flags.
    extra = []
  return [sys.executable, *argv[1:], *extra]


@pytest.mark.slow
@pytest.mark.xdist_group("tour_clone")  # One worker makes the session's clone for both.
def test_docs_commands_run_as_written(tour_clone):
  """In the session's clone after the README tour (its tokenizer, shards and runs: runs/tok, runs/tokens, runs/cb,
  runs/bert), `make demo`'s recipe (runs/demo/crossbert), then every runnable docs command, in order; one that
  repeats a command already run here (its optional parts dropped) is not run twice."""
  makefile = (ROOT / "Makefile").read_text()
  demo = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ").splitlines()[1:]
  prelude = [l.strip().replace("$(PY)", "python").replace("$(RUN)", "runs/demo") for l in demo]
  ran = set()  # (env, argv as run): a command the clone already ran as written is not run again.
  for command in [l for l in prelude if l.startswith("python")]:
    argv = _as_run(shlex.split(command))
    ran.add(((), tuple(argv)))
    tour.run_in(tour_clone, argv, f"make demo: {command}")
  for doc, command, why in all_commands():
    if why is not None:
      continue
    extra_env, argv = argv_of(command)
    argv = _as_run(argv)
    key = (tuple(sorted(extra_env.items())), tuple(argv))
    if key in ran:
      continue
    ran.add(key)
    tour.run_in(tour_clone, argv, f"{doc}: {command}", {**tour.clone_env(), **extra_env})
  assert any((tour_clone / "runs" / "obs" / "profile").rglob("*.xplane.pb"))
  assert (tour_clone / "runs" / "obs" / "wandb").is_dir()
  assert '"step": 200' in (tour_clone / "runs" / "recipe" / "metrics.jsonl").read_text()
