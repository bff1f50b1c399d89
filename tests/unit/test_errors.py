"""The commands' shared preamble (core/errors.py): their one-line refusals of positional arguments and of
missing required flags, word for word as each command has always printed them."""

import pytest
from absl import flags

from crossbert_jax.core.errors import UserError, no_positional, require, unexpected_arguments


def test_positional_arguments_are_refused_in_either_spelling():
  no_positional(["prog"], ": use --flag=value")  # The program name alone passes.
  with pytest.raises(UserError) as e:
    no_positional(["prog", "a", "b"], ": use --flag=value")
  assert str(e.value) == "unexpected arguments ['a', 'b']: use --flag=value"
  with pytest.raises(UserError) as e:
    no_positional(("prog", "a", "b"), "; every option is a --flag", joined=True)
  assert str(e.value) == "unexpected arguments a b; every option is a --flag"
  assert str(unexpected_arguments(["import", "x"], ": use no command (export) or `import`")) == \
      "unexpected arguments ['import', 'x']: use no command (export) or `import`"


@pytest.fixture(name="two_flags")
def _two_flags():
  fv = flags.FLAGS
  for name in ("preamble_test_a", "preamble_test_b"):
    if name not in fv:
      flags.DEFINE_string(name, None, "test only")
  fv["preamble_test_a"].value, fv["preamble_test_b"].value = None, None
  yield fv
  fv["preamble_test_a"].value, fv["preamble_test_b"].value = None, None


def test_required_flags_are_named_together(two_flags):
  with pytest.raises(UserError) as e:
    require("preamble_test_a", advice=": the run directory")
  assert str(e.value) == "--preamble_test_a is required: the run directory"
  two_flags["preamble_test_a"].value = "x"
  require("preamble_test_a", advice=": the run directory")
  two_flags["preamble_test_b"].value = ""  # Empty is missing too.
  with pytest.raises(UserError) as e:
    require("preamble_test_a", "preamble_test_b", advice=", e.g. --preamble_test_a=x --preamble_test_b=y")
  assert str(e.value) == ("--preamble_test_a and --preamble_test_b are required, e.g. --preamble_test_a=x "
                          "--preamble_test_b=y")
