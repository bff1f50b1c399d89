"""Pod data paths: names with commas, per-host reads, elastic iterator, `prepare` shards."""

import pytest

from crossbert_jax.core.errors import UserError
from crossbert_jax.data import sources


def test_path_with_commas_is_taken_whole(tmp_path, shared_data):
  book = shared_data / "gutenberg" / "Benjamin Franklin___Autobiography of Benjamin Franklin, Version 1.txt"
  assert [str(p) for p in sources.resolve_paths(str(book))] == [str(book)]
  other = tmp_path / "a.txt"
  other.write_text("one\n")
  # Not a path as a whole: split on commas, and the error says so.
  with pytest.raises(UserError, match=r"split on commas because it is not itself an existing path"):
    sources.resolve_paths(f"{tmp_path}/missing, part.txt")
  assert [p.name for p in sources.resolve_paths(f"{other},{other}")] == ["a.txt"]


def test_local_file_with_commas(tmp_path):
  path = tmp_path / "Address, given November 19, 1863.txt"
  path.write_text("Four score and seven years ago.\n\nNow we are engaged.\n")
  assert sources.read_text(sources.resolve_paths(str(path))[0], "paragraph")[1] == "Now we are engaged."
