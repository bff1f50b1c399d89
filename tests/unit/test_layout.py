"""The package layering: a module imports only from its own package or the layers below it."""

import ast
import os
import pathlib
import subprocess
import sys

import pytest

import crossbert_jax

ROOT = pathlib.Path(crossbert_jax.__file__).parent
# Lowest first. Packages on one rank do not import each other; the top-level modules are commands.
RANK = {
    "core": 0, "data": 1, "model": 2, "evaluation": 3, "hf": 3, "training": 4, "perf": 5, "run": 5, "scaling": 6,
    "finetuning": 6}
TOP = 7
MAX_LINES = 400


def _layer(module: str) -> tuple[str, int]:
  parts = module.split(".")
  if len(parts) > 2 or parts[1] in RANK:
    return parts[1], RANK[parts[1]]
  return parts[1], TOP


def _imports(path: pathlib.Path) -> list[str]:
  """Every crossbert_jax module imported anywhere in `path` (function-local imports too)."""
  out = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("crossbert_jax"):
      if node.module == "crossbert_jax":
        out += [f"crossbert_jax.{a.name}" for a in node.names]
      else:
        out.append(node.module)
    elif isinstance(node, ast.Import):
      out += [a.name for a in node.names if a.name.startswith("crossbert_jax.")]
  return out


def _modules():
  for path in sorted(ROOT.rglob("*.py")):
    rel = path.relative_to(ROOT.parent).with_suffix("")
    name = ".".join(rel.parts).removesuffix(".__init__")
    if name != "crossbert_jax":
      yield name, path


def test_no_import_from_a_higher_or_sibling_layer():
  bad = []
  for name, path in _modules():
    pkg, rank = _layer(name)
    for imported in _imports(path):
      other_pkg, other_rank = _layer(imported)
      if other_pkg != pkg and (other_rank > rank or (other_rank == rank and rank != TOP)):
        bad.append(f"{name} imports {imported}")
  assert not bad, "layering broken (RANK above; docs/layout.md):\n" + "\n".join(bad)


def test_the_run_imports_no_evaluation():
  """run/ (the loop) knows no evaluation code: the train command adds the probe hook (train.standard_hooks)."""
  bad = [
      f"{name} imports {imp}" for name, path in _modules() if name.startswith("crossbert_jax.run.")
      for imp in _imports(path) if imp.startswith("crossbert_jax.evaluation")]
  assert not bad, "\n".join(bad)


def test_commands_do_not_import_each_other():
  bad = [
      f"{name} imports {imp}" for name, path in _modules() if _layer(name)[1] == TOP for imp in _imports(path)
      if _layer(imp)[1] == TOP]
  assert not bad, "\n".join(bad)


def test_commands_share_one_preamble():
  """Positional arguments are refused by core/errors.py's no_positional (or unexpected_arguments), not by a
  copy of its message in each command."""
  copies = [name for name, path in _modules() if _layer(name)[1] == TOP and "unexpected arguments" in path.read_text()]
  assert not copies, f"commands spelling out the positional-argument error: {copies}"


def test_modules_stay_small():
  big = {name: n for name, path in _modules() if (n := len(path.read_text().splitlines())) > MAX_LINES}
  assert not big, f"modules over {MAX_LINES} lines (split them by concern): {big}"


def test_functions_stay_short():
  """No function over 80 lines; in training/ and run/ (the step and the loop) none over 60."""
  long = {}
  for name, path in _modules():
    limit = 60 if name.split(".")[1] in ("training", "run") else 80
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= limit:
        long[f"{name}.{node.name}"] = node.end_lineno - node.lineno + 1
  assert not long, f"functions over their limit (split them): {long}"


def test_only_the_registry_branches_on_the_objective():
  """Everything that depends on the objective asks core/objectives.py's registry."""
  branching = [
      f"{name}:{i + 1}" for name, path in _modules() if name != "crossbert_jax.core.objectives"
      for i, line in enumerate(path.read_text().splitlines())
      if "objective ==" in line or "objective !=" in line or "objective in (" in line]
  assert not branching, f"objective tested outside the registry: {branching}"


def _is_main_guard(node: ast.stmt) -> bool:
  return isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"


def test_commands_share_one_skeleton():
  """Every command: `main` wrapped by exit_on_user_error (a UserError is one line, exit 2), run by
  `app.run(main, flags_parser=parse_flags_or_exit)` (a bad flag is one line too)."""
  bad = []
  for name, path in _modules():
    if _layer(name)[1] != TOP:
      continue
    tree = ast.parse(path.read_text())
    mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    if not mains or "exit_on_user_error" not in [ast.unparse(d) for d in mains[0].decorator_list]:
      bad.append(f"{name}: no `@exit_on_user_error def main(argv)`")
    guards = [n for n in tree.body if _is_main_guard(n)]
    if not guards or ast.unparse(guards[0].body[-1]) != "app.run(main, flags_parser=parse_flags_or_exit)":
      bad.append(f"{name}: the __main__ block does not end in app.run(main, flags_parser=parse_flags_or_exit)")
  assert not bad, "\n".join(bad)


@pytest.mark.integration  # A fresh interpreter's modules: the process boundary is the point.
def test_the_export_imports_no_training_code():
  """hf/ reads an objective's spec (core/objectives.py), never its training half: a fresh process
  that imports the converter and builds both objectives' configs holds no crossbert_jax.training module."""
  code = ("import sys\nimport crossbert_jax.hf.convert, crossbert_jax.hf.files\n"
          "from crossbert_jax.core import config\n"
          "for name in ('crossbert', 'mlm'): config.validate(config.get_config(name, 'tiny'))\n"
          "print(sorted(m for m in sys.modules if m.startswith('crossbert_jax.training')))")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.stdout.strip() == "[]", proc.stdout


def test_the_config_is_validated_and_expanded_in_one_place():
  """Below the commands nothing validates a config or expands its phases again: core/plan.build does it
  once (and `plan.of_saved` expands a saved config); every module then reads the typed RunPlan."""
  where = {}
  for name, path in _modules():
    for node in ast.walk(ast.parse(path.read_text())):
      if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and
          isinstance(node.func.value, ast.Name) and (node.func.value.id, node.func.attr) in {("phases_lib", "expand"),
                                                                                             ("phases", "expand"),
                                                                                             ("config_lib", "validate"),
                                                                                             ("config", "validate")}):
        where.setdefault(node.func.attr, set()).add(name)
  assert where == {"expand": {"crossbert_jax.core.plan"}, "validate": {"crossbert_jax.core.plan"}}, where


def test_only_the_config_front_end_imports_ml_collections():
  """The commands read config files and flags; below them only core's front end (config, phases, mixture
  and the objectives' configure/validate hooks) sees a ConfigDict."""
  front_end = {
      "crossbert_jax.core.config", "crossbert_jax.core.phases", "crossbert_jax.core.mixture",
      "crossbert_jax.core.objectives"}
  bad = []
  for name, path in _modules():
    if _layer(name)[1] == TOP or name in front_end:
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      names = ([a.name for a in node.names]
               if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
      bad += [f"{name} imports {n}" for n in names if n.split(".")[0] == "ml_collections"]
  assert not bad, "\n".join(bad)
