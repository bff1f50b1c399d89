"""The built-in corpus: English prose from the docstrings of the installed Python and packages.

Why: every Python install ships megabytes of license-clean, human-written English in its
docstrings, so the quick start (tokenizer + a tiny pretraining run) needs no download. The
harvest never imports anything: it finds source directories (`sysconfig`, `find_spec`), walks
`*.py` files in sorted order, parses them with `ast` and keeps module / class / function
docstrings. Each docstring is split into paragraphs; only paragraphs that read like English
sentences survive (no doctests, code blocks, parameter tables or reST markup). One document
per docstring: its surviving paragraphs, each unwrapped to one line, joined with "\\n".
Paragraphs seen before (boilerplate such as "Return self==value.") are dropped, so the result
is deterministic for a given install.

Harvesting parses ~30 MB of source (~15-30 s on 2 cores), so the result is cached in-process
and on disk (~/.cache/crossbert_jax/, keyed by this file and every input file's size and mtime).
"""

from collections.abc import Sequence
import ast
import concurrent.futures
import functools
import hashlib
import importlib.util
import json
import multiprocessing
import os
import re
import sysconfig

# Top-level packages harvested after the standard library (skipped when not installed).
PACKAGES = (
    "numpy",
    "scipy",
    "jax",
    "flax",
    "optax",
    "orbax",
    "grain",
    "ml_collections",
    "absl",
    "etils",
    "array_record",
    "pyarrow",
    "tensorstore",
    "chex",
    "treescope",
    "tqdm",
    "pip",
    "packaging",
    "_pytest",
    "pluggy",
    "fsspec",
    "yaml",
    "markdown_it",
    "humanize",
    "msgpack",
    "simplejson",
    "psutil",
    "tensorboardX",
    "sentencepiece",
)
# Directory names never walked: tests, vendored code, tools, and the stdlib's own site-packages.
_SKIP_DIRS = frozenset({
    "test",
    "tests",
    "testing",
    "idlelib",
    "lib2to3",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "_vendor",
    "vendor",
    "turtledemo",
    "ensurepip",
    "pydoc_data",
    "Tools",
    "tkinter",
    "_examples",
    "examples",
    "benchmarks",})
_MIN_WORDS = 5
_PROSE_CHARS = re.compile(r"[A-Za-z ,.;:'\"()\-?!_`]")
_BAD_MARKERS = (">>>", "...:", "::", "``", "--", "==", "|", "{", "}", "[", "]", "<", ">", "=", "\\", "http", "$", "#",
                "@", "*", "~~")


def _source_roots() -> list[str]:
  """Stdlib first, then each installed package, in a fixed order."""
  roots = [sysconfig.get_paths()["stdlib"]]
  for name in PACKAGES:
    try:
      spec = importlib.util.find_spec(name)  # Top-level lookup: imports nothing.
    except (ImportError, ValueError):
      continue
    if spec is None:
      continue
    if spec.submodule_search_locations:
      roots.extend(sorted(spec.submodule_search_locations))
    elif spec.origin and spec.origin.endswith(".py"):
      roots.append(spec.origin)
  return roots


def _python_files(root: str) -> list[str]:
  """All *.py files under `root` in sorted order, skipping test and vendored dirs."""
  if os.path.isfile(root):
    return [root]
  out = []
  for dirpath, dirnames, filenames in os.walk(root):
    # Sorting in place fixes os.walk's traversal order.
    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
    out.extend(os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py") and not f.startswith("test_"))
  return out


def _docstrings(path: str) -> list[str]:
  """Module, class and function docstrings of one file, in source order."""
  try:
    with open(path, "rb") as f:
      tree = ast.parse(f.read(), filename=path)
  except (SyntaxError, ValueError, OSError, UnicodeDecodeError, RecursionError):
    return []
  nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
  nodes.sort(key=lambda n: getattr(n, "lineno", 0))
  out = []
  for node in nodes:
    doc = ast.get_docstring(node, clean=True)
    if doc:
      out.append(doc)
  return out


def _prose_paragraph(lines: list[str]) -> str | None:
  """The paragraph unwrapped to one line if it reads like English sentences, else None."""
  if any(line[:1].isspace() for line in lines):
    return None  # Indented lines are code blocks, argument lists or tables.
  text = " ".join(line.strip() for line in lines)
  if len(text.split()) < _MIN_WORDS or not text[0].isupper() or text[-1] not in ".!?:)":
    return None
  if any(m in text for m in _BAD_MARKERS):
    return None
  if text.count("(") != text.count(")") or text.count("`") % 2:
    return None
  prose = len(_PROSE_CHARS.findall(text))
  if prose < 0.97 * len(text):
    return None
  letters = sum(c.isalpha() for c in text)
  if letters < 0.75 * len(text):
    return None
  return text


def _paragraphs(doc: str) -> list[list[str]]:
  paras, cur = [], []
  for line in doc.splitlines():
    if line.strip():
      cur.append(line.rstrip())
    elif cur:
      paras.append(cur)
      cur = []
  if cur:
    paras.append(cur)
  return paras


def _file_paragraphs(path: str) -> list[list[str]]:
  """Per docstring of one file, its prose paragraphs (not yet deduplicated)."""
  out = []
  for doc in _docstrings(path):
    kept = [p for p in map(_prose_paragraph, _paragraphs(doc)) if p is not None]
    if kept:
      out.append(kept)
  return out


def _harvest(files: Sequence[str]) -> list[str]:
  """Documents of `files`, in order, with paragraphs seen before dropped."""
  workers = min(os.cpu_count() or 1, 8)
  if workers > 1 and len(files) > 100:
    # Parsing is CPU-bound (~25 s of ast.parse on one core). `spawn` because the caller may
    # hold threads (JAX), which makes fork unsafe; `map` keeps results in file order.
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
      per_file = list(pool.map(_file_paragraphs, files, chunksize=32))
  else:
    per_file = [_file_paragraphs(f) for f in files]
  seen: set[str] = set()
  docs = []
  for file_docs in per_file:
    for paras in file_docs:
      kept = [p for p in paras if not (p in seen or seen.add(p))]
      if kept:
        docs.append("\n".join(kept))
  return docs


def _cache_path(files: Sequence[str]) -> str:
  """A per-user cache file keyed by this module's source and every input file's size and mtime."""
  h = hashlib.sha256()
  with open(__file__, "rb") as f:
    h.update(f.read())
  for path in files:
    st = os.stat(path)
    h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "crossbert_jax", f"builtin_corpus-{h.hexdigest()[:16]}.json")


def _load() -> list[str]:
  """The corpus from the disk cache when the installed files are unchanged, else harvested."""
  files = [f for root in _source_roots() for f in _python_files(root)]
  cache = _cache_path(files)
  try:
    with open(cache, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    pass
  docs = _harvest(files)
  try:  # The cache only saves time; a read-only home directory is fine.
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    tmp = f"{cache}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(docs, f)
    os.replace(tmp, cache)
  except OSError:
    pass
  return docs


@functools.lru_cache(maxsize=1)
def _documents() -> tuple[str, ...]:
  return tuple(_load())


def builtin_documents() -> list[str]:
  """The built-in corpus: one English document per harvested docstring (cached)."""
  return list(_documents())


if __name__ == "__main__":
  _docs = builtin_documents()
  print(f"{len(_docs)} documents, {sum(len(d) for d in _docs):,} characters")
