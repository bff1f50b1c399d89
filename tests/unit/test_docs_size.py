"""README.md stays a front page: under 10,000 characters (the manual is docs/)."""

from tests.helpers import ROOT

README_LIMIT = 10_000


def test_readme_is_under_its_limit():
  size = len((ROOT / "README.md").read_text(encoding="utf-8"))
  assert size < README_LIMIT, (f"README.md is {size:,} characters (limit {README_LIMIT:,}): move detail into "
                               "docs/ and link it")
