"""A data format added to core/formats.py's FORMAT_TABLE is accepted everywhere a format is named.

The format here is tab-separated values with a header row (the column is data.text_field), read
from GLUE RTE's dev.tsv: config validation, a mixture source, the training pipeline's documents,
and the `tokenizer` and `prepare` commands (in subprocesses whose interpreters, spawned workers
included, add the format at start-up through a `sitecustomize` module).
"""

import importlib
import sys
import textwrap

import pytest

from crossbert_jax.core import config as config_lib, formats
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import sources
from tests import helpers

TSV_MODULE = textwrap.dedent('''\
    """Tab-separated values with a header row: one document per row, the text_field column."""
    import csv
    import io

    from crossbert_jax.core import formats


    def read_tsv(path, text_field, unused_text_unit, unused_part):  # A whole file (not splittable).
      rows = csv.DictReader(io.StringIO(path.read_text(encoding="utf-8")), delimiter="\\t", quoting=csv.QUOTE_NONE)
      return [row[text_field].strip() for row in rows if row[text_field].strip()]


    FORMAT = formats.Format((".tsv",), read_tsv, splittable=False)  # The header row is in one part only.
''')


@pytest.fixture
def tsv_format(tmp_path, monkeypatch):
  """The tsv format's module (importable, and registered at start-up of any child interpreter) and its folder."""
  plugin = tmp_path / "plugin"
  plugin.mkdir()
  (plugin / "tsv_format.py").write_text(TSV_MODULE)
  (plugin / "sitecustomize.py").write_text("import tsv_format\nfrom crossbert_jax.core import formats\n"
                                           "formats.FORMAT_TABLE['tsv'] = tsv_format.FORMAT\n")
  monkeypatch.syspath_prepend(str(plugin))
  module = importlib.import_module("tsv_format")
  yield module, plugin
  sys.modules.pop("tsv_format", None)


def _config(**data):
  c = config_lib.get_config("crossbert", "tiny")
  for key, value in data.items():
    c.data[key] = value
  return c


def test_added_format_is_accepted_by_validate_and_read_by_the_pipeline(shared_data, tsv_format, monkeypatch):
  rte = shared_data / "glue" / "RTE" / "dev.tsv"
  c = _config(path=str(rte), format="tsv", text_field="sentence1")
  mixed = _config(path="", mixture=({"path": str(rte), "weight": 1.0, "format": "tsv", "text_field": "sentence2"},))
  for cfg in (c, mixed):
    with pytest.raises(UserError, match="format"):  # Not in the table yet: refused, naming the key.
      plan_lib.build(cfg)
  monkeypatch.setitem(formats.FORMAT_TABLE, "tsv", tsv_format[0].FORMAT)
  plan_lib.build(c)
  plan_lib.build(mixed)
  assert sources.file_format(rte) == "tsv"  # data.format=auto reads it by its extension.
  docs = sources.document_source(c.data)
  assert len(docs) == 277 and docs[0].startswith("Dana Reeve, the widow of the actor Christopher Reeve")


def test_added_format_reaches_the_tokenizer_and_prepare_commands(shared_data, tsv_format, tmp_path):
  rte, sts = shared_data / "glue" / "RTE" / "dev.tsv", shared_data / "glue" / "STS-B" / "dev.tsv"
  env = helpers.cpu_env(PYTHONPATH=f"{tsv_format[1]}:{helpers.ROOT}")
  spm = tmp_path / "spm.model"
  helpers.run_module([
      "crossbert_jax.tokenizer", f"--input={rte}", "--format=tsv", "--text_field=sentence1", "--vocab_size=600",
      f"--output={spm}"], env=env)
  assert spm.stat().st_size > 0
  out = helpers.run_module([
      "crossbert_jax.prepare", f"--input={rte},{sts}", "--format=tsv", "--text_field=sentence2",
      f"--output={tmp_path / 'shards'}", "--shards=2", "--workers=2", "--noprogress"], env=env)
  assert "wrote 2 shards, 1777 documents (277-1500 per shard)" in out.stdout  # Each file whole, in its shard.
  refused = helpers.run_module([
      "crossbert_jax.prepare", f"--input={rte}", "--format=tsv", "--shards=2", f"--output={tmp_path / 'other'}"],
                               check=False)  # Without the plugin.
  assert refused.returncode != 0 and "tsv" in refused.stderr
