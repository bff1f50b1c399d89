"""Which MTEB tasks can run (local data, the Hub, or a filled HF cache), and running them with resume.

A task runs from `--data_dir/<TaskName>/` when that folder exists, else from the Hugging Face Hub
when it is reachable, else (HF_HUB_OFFLINE=1) from the local HF cache when it holds the task's
dataset repository. The rest are skipped, named in one line before any work. Each task is one
`mteb.evaluate` call whose result mteb's `ResultCache` keeps in results/<model>/<revision>/<Task>.json;
a rerun loads those files ("only-missing") instead of embedding again, `force` redoes them.
"""

import contextlib
import dataclasses
import logging
import os
import socket
import time
import warnings
from typing import Callable, Iterator

from crossbert_jax.core.errors import UserError
from crossbert_jax.evaluation import mteb_data

HUB_HOST = "huggingface.co"


@dataclasses.dataclass
class TaskPlan:
  """The tasks to run (mteb objects, local ones already filled) and those skipped, with the reason."""
  tasks: list
  local: set[str]
  skipped: dict[str, str]


def select_tasks(benchmark: str, names: list[str]) -> list:
  """mteb task objects of a benchmark (narrowed by names) or of names alone."""
  import mteb  # Local: slow to import.

  if benchmark:
    try:
      tasks = list(mteb.get_benchmark(benchmark).tasks)
    except (KeyError, ValueError) as e:
      raise UserError(f"--benchmark={benchmark!r}: {str(e).splitlines()[0][:200]}; see mteb.get_benchmarks() "
                      "for names, e.g. 'MTEB(eng, v2)'") from None
    if names:
      known = {t.metadata.name for t in tasks}
      unknown = [n for n in names if n not in known]
      if unknown:
        raise UserError(f"--tasks: {unknown[0]!r} is not in --benchmark={benchmark!r}; drop it or the benchmark")
      tasks = [t for t in tasks if t.metadata.name in names]
    return tasks
  if not names:
    raise UserError("no tasks: pass --benchmark='MTEB(eng, v2)' and/or --tasks=STSBenchmark,SciFact")
  try:
    return list(mteb.get_tasks(tasks=names))
  except (KeyError, ValueError) as e:
    raise UserError(f"--tasks: {str(e).splitlines()[0][:200]}; see mteb.get_tasks() for names") from None


def hub_reachable(timeout: float = 3.0) -> bool:
  """False when HF_HUB_OFFLINE is set or the Hub's host cannot be reached (one short connect)."""
  if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
    return False
  try:
    socket.create_connection((HUB_HOST, 443), timeout=timeout).close()
    return True
  except OSError:
    return False


def _cached_dataset_repos() -> set[str]:
  """Dataset repositories the local Hugging Face cache holds (the HF_HUB_OFFLINE recipe)."""
  try:
    import huggingface_hub

    return {r.repo_id for r in huggingface_hub.scan_cache_dir().repos if r.repo_type == "dataset"}
  except Exception:  # No cache folder, or one scan_cache_dir cannot read: nothing cached.  # noqa: BLE001
    return set()


def plan(tasks: list, data_dir: str, online: bool | None = None) -> TaskPlan:
  """Fill the tasks with local data; keep Hub tasks when online or cached; the rest are skipped."""
  online = hub_reachable() if online is None else online
  cached = set() if online else _cached_dataset_repos()
  out = TaskPlan([], set(), {})
  for task in tasks:
    name = task.metadata.name
    if mteb_data.has_local_data(task, data_dir):
      out.tasks.append(mteb_data.fill_local(task, data_dir))
      out.local.add(name)
    elif online or task.metadata.dataset.get("path") in cached:
      out.tasks.append(task)
    else:
      out.skipped[name] = "no local data" + ("" if not data_dir else f" in {data_dir}") + ", Hub unreachable"
  return out


SUPERSEDED = "is superseded by"


def superseded_note(tasks: list, benchmark: str) -> str:
  """The one line naming the tasks mteb marks superseded, when named by --tasks (empty under --benchmark:
  the benchmark fixes its tasks, so mteb's advice to switch is noise there, as mteb's own words say)."""
  old = [(t.metadata.name, t.superseded_by) for t in tasks if getattr(t, "superseded_by", None)]
  if benchmark or not old:
    return ""
  names = ", ".join(f"{name} superseded (by {new})" for name, new in old)
  return (f"note: mteb marks {names}: name the newer task in --tasks, unless you compare with scores of the "
          "older one")


class _DropSuperseded(logging.Filter):
  def filter(self, record: logging.LogRecord) -> bool:
    return SUPERSEDED not in record.getMessage()


@contextlib.contextmanager
def _superseded_quiet() -> Iterator[None]:
  """mteb's superseded warning off (a log line and a UserWarning at every evaluate call, so twice per model and
  task): mteb_eval says it once, before any work (superseded_note)."""
  logger, drop = logging.getLogger("mteb.abstasks.abstask"), _DropSuperseded()
  logger.addFilter(drop)
  try:
    with warnings.catch_warnings():
      warnings.filterwarnings("ignore", message=f".*{SUPERSEDED}", category=UserWarning)
      yield
  finally:
    logger.removeFilter(drop)


def _result_exists(cache, encoder, name: str) -> bool:
  return cache.get_task_result_path(name, encoder.name, encoder.revision).is_file()


def run_tasks(encoder, task_plan: TaskPlan, cache, *, force: bool,
              log: Callable[[str], None] = print) -> tuple[dict[str, float], dict[str, str]]:
  """{task: main score} of every task run or loaded, and {task: error} of Hub tasks that failed to load.

  A progress line per task (documents embedded, tokens/s, time, ETA from the tasks embedded so far).
  """
  import mteb

  emb = encoder.embedder
  scores, failed = {}, {}
  todo = [force or not _result_exists(cache, encoder, t.metadata.name) for t in task_plan.tasks]
  spent, embedded_tasks = 0.0, 0
  for i, task in enumerate(task_plan.tasks, 1):
    name = task.metadata.name
    seen, tokens, start = emb.sentences_seen, getattr(emb, "tokens_seen", 0), time.perf_counter()
    try:
      with _superseded_quiet():
        result = mteb.evaluate(encoder, task, cache=cache, overwrite_strategy="always" if force else "only-missing",
                               show_progress_bar=False, raise_error=True)
    except UserError:
      raise
    except Exception as e:  # A Hub task mteb cannot load (offline cache gaps): named, the run goes on.  # noqa: BLE001
      if name in task_plan.local:
        raise
      failed[name] = f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"
      log(f"[{i}/{len(task_plan.tasks)}] {name}: FAILED to load ({failed[name]})")
      continue
    seconds = time.perf_counter() - start
    docs, toks = emb.sentences_seen - seen, getattr(emb, "tokens_seen", 0) - tokens
    del result  # The score is read back from the file mteb wrote: a resumed run's table is the same bitwise.
    saved = cache.load_task_result(name, encoder.name, encoder.revision, raise_if_not_found=True)
    scores[name] = float(saved.get_score())
    if docs:
      spent, embedded_tasks = spent + seconds, embedded_tasks + 1
    left = sum(todo[i:])  # Tasks after this one still to embed.
    eta = f", ETA {spent / embedded_tasks * left / 60:.1f} min ({left} tasks)" if embedded_tasks and left else ""
    status = "cached" if not docs else f"{docs} docs, {toks / max(seconds, 1e-9):,.0f} tokens/s"
    log(f"[{i}/{len(task_plan.tasks)}] {name}: {scores[name]:.5f} ({status}, {seconds:.1f} s{eta})")
  return scores, failed


def task_types(tasks: list) -> dict[str, str]:
  """{task name: mteb task type} in the benchmark's order."""
  return {t.metadata.name: t.metadata.type for t in tasks}


def summary_line(task_plan: TaskPlan) -> str:
  """The one line naming the skipped tasks (empty when none)."""
  if not task_plan.skipped:
    return ""
  return (f"skipping {len(task_plan.skipped)} task(s) with no local data and no reachable Hub: "
          f"{', '.join(task_plan.skipped)}")
