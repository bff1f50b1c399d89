"""Every relative link in README.md and docs/**/*.md points at a file that exists, and a `#anchor`
at a heading of the file it names (GitHub's heading slugs)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# [text](target) and [text](target "title"); images too. Code spans are removed first.
_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def _markdown_files() -> list[pathlib.Path]:
  return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _slug(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
  text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
  return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: pathlib.Path) -> set[str]:
  text = _CODE.sub("", path.read_text(encoding="utf-8"))
  slugs, seen = set(), {}
  for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
    slug = _slug(heading)
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    slugs.add(slug if n == 0 else f"{slug}-{n}")
  return slugs


def _broken(md: pathlib.Path) -> list[str]:
  bad = []
  for target in _LINK.findall(_CODE.sub("", md.read_text(encoding="utf-8"))):
    if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
      continue
    file_part, _, anchor = target.partition("#")
    dest = (md.parent / file_part).resolve() if file_part else md
    if not dest.exists():
      bad.append(f"{target}: no such file")
    elif anchor and dest.suffix == ".md" and anchor.lower() not in _anchors(dest):
      bad.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
  return bad


@pytest.mark.parametrize("md", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(md):
  bad = _broken(md)
  assert not bad, f"broken links in {md.relative_to(ROOT)} (fix the path or the heading):\n" + "\n".join(bad)


def test_the_checker_finds_a_broken_file_and_anchor(tmp_path):
  (tmp_path / "a.md").write_text("# Real heading\n\n[ok](#real-heading) [gone](missing.md) [bad](#nope)\n"
                                 "`[code](not-a-link.md)`\n")
  assert sorted(b.split(":")[0] for b in _broken(tmp_path / "a.md")) == ["#nope", "missing.md"]
