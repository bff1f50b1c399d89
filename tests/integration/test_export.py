"""Hugging Face export/import: bitwise round trips, transformers / sentence-transformers parity,
tokenizer parity, the CLI on a real tiny run, and safe writing.

Parity runs on torch CPU in fp32 against a randomly initialised tiny encoder whose params are all
perturbed (so a swapped norm or transposed kernel cannot hide behind an init of ones / zeros).
"""

import json
import pathlib

import jax
import numpy as np
import pytest

from crossbert_jax import export
from crossbert_jax.core import config as config_lib
from crossbert_jax.core.errors import UserError
from crossbert_jax.data import corpus, tokenizer
from crossbert_jax.hf import convert, files as hf_files, mapping as hf_mapping
from crossbert_jax.model import inference
from crossbert_jax.model.encoder import EncoderSpec
from crossbert_jax.training import objectives
from tests.helpers import run_command, run_module

VOCAB = 512
LOCAL_WINDOW = 8  # +-4 tokens: far below the verify sentences' lengths, so local != global.


@pytest.fixture(scope="module")
def tok_path(spm_model) -> str:
  """The session's SentencePiece model (conftest's spm_model: 512 pieces of the built-in corpus)."""
  return spm_model


@pytest.fixture(scope="module")
def tok(tok_path) -> tokenizer.Tokenizer:
  return tokenizer.Tokenizer.load(tok_path)


@pytest.fixture(scope="module", autouse=True)
def real_run(tiny_bert_run):
  """The session's tiny flat-BERT run (conftest's tiny_bert_run: it compiles faster than CrossBERT and
  its export exercises the MLM head too), started at module set-up so its compile overlaps the
  in-process tests; the CLI tests wait for it. Read-only."""
  return tiny_bert_run


def _config(objective="crossbert", global_every=1, scan_layers=False):
  c = config_lib.get_config(objective, "tiny")
  c.unlock()
  c.model.vocab_size = VOCAB
  c.model.num_layers = 4  # global_every=3: global, local, local, global.
  c.model.global_every = global_every
  c.model.local_window = LOCAL_WINDOW
  c.model.scan_layers = scan_layers
  c.lock()
  return c


def _params(c, seed=0):
  """Random params of `c`'s model shapes (numpy-filled from eval_shape: no init compile).

  Every leaf is random (norm scales around 1, the MLM bias too), so a swapped norm or a transposed
  kernel cannot hide behind an init of ones or zeros.
  """
  abstract = jax.eval_shape(lambda k: objectives.init_params(c, k), jax.random.key(0))
  rng = np.random.default_rng(seed)

  def fill(path, x):
    shape = x.value.shape if hasattr(x, "value") else x.shape
    noise = rng.standard_normal(shape).astype(np.float32)
    is_scale = getattr(path[-1], "key", None) == "scale"
    return (1.0 + 0.1 * noise) if is_scale else 0.05 * noise

  return jax.tree_util.tree_map_with_path(fill, abstract, is_leaf=lambda x: hasattr(x, "value"))


def _assert_bitwise(a: dict, b: dict):
  fa, fb = convert.flatten(a), convert.flatten(b)
  assert fa.keys() == fb.keys(), f"param paths differ: {sorted(fa.keys() ^ fb.keys())}"
  for k in fa:
    assert fa[k].dtype == fb[k].dtype and fa[k].shape == fb[k].shape, k
    np.testing.assert_array_equal(fa[k], fb[k], err_msg=f"{k} changed in the round trip")


@pytest.mark.parametrize("scan_layers", [False, True])
@pytest.mark.parametrize("global_every", [1, 3])
def test_round_trip_is_bitwise(global_every, scan_layers):
  """import(export(params)) == params, through the table and a config round trip."""
  c = _config("mlm", global_every, scan_layers)
  params = _params(c)
  flat = {k: v for k, v in convert.flatten(params).items() if k.startswith(("encoder/", "head/"))}
  spec = EncoderSpec.from_config(c.model)
  hf = hf_mapping.to_hf(flat, spec, with_head=True)
  assert sorted(hf) == sorted(hf_mapping.hf_names(spec, with_head=True))
  assert hf["model.layers.1.attn.Wqkv.weight"].shape == (3 * 64, 64)
  assert hf["model.layers.1.mlp.Wi.weight"].shape == (2 * 128, 64)
  assert "model.layers.0.attn_norm.weight" not in hf  # ModernBERT: Identity on layer 0.
  hf_cfg = hf_files.hf_config(c)
  back_model = hf_mapping.from_hf_config(hf_cfg)
  assert back_model == {k: c.model[k] for k in back_model}, "config round trip changed model.*"
  _assert_bitwise(convert.unflatten(hf_mapping.from_hf(hf, spec, with_head=True)),
                  {"encoder": params["encoder"], "head": params["head"]})


def test_round_trip_through_files_and_scan_relayout(tmp_path, tok):
  """Files written by export and read by import are bitwise; scan <-> per-layer relayouts too."""
  c = _config("crossbert", 3, scan_layers=True)
  params = _params(c, seed=1)
  convert.export(c, params, tok, tmp_path / "hf")
  back_cfg, back = convert.read_hf(tmp_path / "hf", scan_layers=True)
  _assert_bitwise(back, {"encoder": params["encoder"]})
  assert back_cfg.model.to_dict() == c.model.to_dict()
  _, flat_layout = convert.read_hf(tmp_path / "hf", scan_layers=False)
  assert "layers_3" in flat_layout["encoder"] and "layers" not in flat_layout["encoder"]
  convert.import_hf(str(tmp_path / "hf"), str(tmp_path / "imported"), scan_layers=True)
  cfg2, params2 = convert.load_imported(tmp_path / "imported")
  _assert_bitwise(params2, {"encoder": params["encoder"]})
  assert cfg2.model.global_every == 3 and cfg2.model.scan_layers


def test_imports_legacy_config_and_bf16_weights(tmp_path, tok):
  """A transformers-4.x style config (global_attn_every_n_layers, *_rope_theta) and bf16 weights."""
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  import safetensors.torch  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  c = _config("crossbert", 3)
  c.unlock()
  c.model.rope_theta, c.model.local_rope_theta = 80_000.0, 5_000.0
  c.lock()
  params = _params(c, seed=4)
  convert.export(c, params, tok, tmp_path / "hf")
  cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
  for key in ("layer_types", "rope_parameters"):
    del cfg[key]
  (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
  tensors = convert._load_float_tensors((tmp_path / "hf" / "model.safetensors").read_bytes(), "test")
  safetensors.torch.save_file({k: torch.from_numpy(np.array(v)).to(torch.bfloat16) for k, v in tensors.items()},
                              str(tmp_path / "hf" / "model.safetensors"))
  back_cfg, back = convert.read_hf(tmp_path / "hf")
  assert back_cfg.model.to_dict() == c.model.to_dict()
  rounded = jax.tree.map(lambda x: x.astype(ml_dtypes.bfloat16).astype(np.float32), params["encoder"])
  _assert_bitwise(back, {"encoder": rounded})


@pytest.mark.parametrize("objective,global_every", [("crossbert", 3), ("mlm", 1)])
def test_transformers_and_sentence_transformers_parity(tmp_path, tok, objective, global_every):
  """last_hidden_state at non-pad positions, MLM logits (BERT baseline as ModernBertForMaskedLM)
  and SentenceTransformer.encode within 1e-4 of JAX, for alternating local/global and all-global."""
  c = _config(objective, global_every)
  params = _params(c, seed=2)
  result = convert.export(c, params, tok, tmp_path / "hf", do_verify=True)
  print(f"{objective} global_every={global_every}: {result}")
  assert result["hidden_max_abs_diff"] <= 1e-4 and result["sentence_max_abs_diff"] <= 1e-4
  hf_cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
  if objective == "mlm":
    assert result["mlm_logits_max_abs_diff"] <= 1e-4
    assert hf_cfg["architectures"] == ["ModernBertForMaskedLM"]
  else:
    assert hf_cfg["architectures"] == ["ModernBertModel"]
  assert hf_cfg["layer_types"] == hf_mapping.layer_types(4, global_every)
  assert hf_cfg["local_attention"] == LOCAL_WINDOW
  if global_every > 1:  # The local layers must really differ from global ones on these sentences.
    ids = inference.tokenize(tok, convert.VERIFY_SENTENCES, max_length=c.data.seq_len)
    assert len({len(x) for x in ids}) > 1, "the verify batch must need padding"
    b = inference.pad_batch(ids, max(map(len, ids)))
    run = lambda spec: np.asarray(
        inference.make_encode_fn(spec)(params["encoder"], b["tokens"], b["positions"], b["segment_ids"]))
    spec = convert.inference_spec(c.model)
    all_global = EncoderSpec(**{**spec.__dict__, "global_every": 1})
    assert np.abs(run(spec) - run(all_global)).max() > 1e-2, "local window too wide to matter"


UNUSUAL = [
    "  leading,   inner   and trailing spaces  ",
    "tabs\tand\nnewlines\r\nmixed",
    "\u00a0non-breaking\u00a0space",
    "\u3000ideographic space",
    "zero\u200bwidth joiner\u200d",
    "café naïve résumé Ångström façade",
    "e\u0301 combining",
    "Ελληνικά, русский, 中文, 日本語, العربية",
    "emoji 😀🎉👍🏽 👨‍👩‍👧 flags 🇫🇷",
    "ﬁ ligature ① ＡＢＣ full-width",
    "",
    " ",
    "\t",
    "a" * 300,
    "1,234.56 $ € £ ¥ % @ # & * ( ) [ ] { } < > / \\ | ~ `",]


def test_tokenizer_parity(tok, shared_data):
  """HF tokenizer ids == inference.tokenize on 500 Gutenberg lines and unusual text."""
  books = sorted((shared_data / "gutenberg").glob("*.txt"))
  lines = []
  for book in books:
    lines += [ln for ln in book.read_text(errors="replace").splitlines() if ln.strip()][200:230]
    if len(lines) >= 500:
      break
  texts = lines[:500] + UNUSUAL
  assert len(lines) >= 500
  fast = hf_files.hf_tokenizer(tok)
  ours = inference.tokenize(tok, texts, max_length=10_000)
  theirs = [e.ids for e in fast.encode_batch(texts)]
  bad = [(t, a, b) for t, a, b in zip(texts, ours, theirs) if a != b]
  assert not bad, f"{len(bad)} texts differ, first: {bad[0]}"


def test_special_token_strings_in_raw_text(tok):
  """Deliberate difference: HF reads "[MASK]" etc. in raw text as the special token; SentencePiece as text."""
  fast = hf_files.hf_tokenizer(tok)
  ids = fast.encode("fill [MASK] here").ids
  assert ids.count(tokenizer.MASK_ID) == 1 and ids[0] == tokenizer.CLS_ID and ids[-1] == tokenizer.SEP_ID
  assert fast.encode("[SEP]").ids == [tokenizer.CLS_ID, tokenizer.SEP_ID, tokenizer.SEP_ID]


def test_a_transformers_without_the_exact_converter_is_one_line(tok, monkeypatch):
  """transformers 5.17 (the lent H200's image) builds a converter with no whitespace rules or merges:
  its ids would differ, so export refuses it and names the version to install."""
  from transformers.convert_slow_tokenizer import SpmConverter  # pylint: disable=g-import-not-at-top

  def before_5_24(proto, vocab, merges=None):  # 5.17's signature: no `legacy`.
    raise AssertionError("must not be called")

  monkeypatch.setattr(SpmConverter, "build_tokenizer_from_spm_proto", staticmethod(before_5_24))
  with pytest.raises(UserError, match=r"install transformers==5\.24\.0") as err:
    hf_files.hf_tokenizer(tok)
  assert "\n" not in str(err.value)


def test_refuses_non_empty_output_unless_force(tmp_path, tok):
  c = _config()
  params = _params(c)
  out = tmp_path / "hf"
  out.mkdir()
  (out / "keep.txt").write_text("user data")
  with pytest.raises(UserError, match="not empty.*--force"):
    convert.export(c, params, tok, out)
  assert (out / "keep.txt").exists()
  convert.export(c, params, tok, out, force=True)
  assert (out / "model.safetensors").exists() and not (out / "keep.txt").exists()
  assert [p.name for p in tmp_path.iterdir()] == ["hf"], "a temporary folder was left behind"


def test_failed_verify_leaves_no_folder(tmp_path, tok, monkeypatch):
  """A broken mapping fails --verify with one line, and nothing is left on disk."""
  c = _config()
  real = hf_mapping.to_hf

  def broken(flat, spec, with_head=False):
    out = real(flat, spec, with_head)
    out["embeddings.norm.weight"] = out["embeddings.norm.weight"] * 1.01
    return out

  monkeypatch.setattr(hf_mapping, "to_hf", broken)
  with pytest.raises(UserError, match="last_hidden_state differs") as e:
    convert.export(c, _params(c), tok, tmp_path / "hf", do_verify=True)
  assert "\n" not in str(e.value)
  assert list(tmp_path.iterdir()) == []


def _cli(module_args, check=True, wait=True):
  return run_module(module_args, check=check, wait=wait)


def _finished(real_run):
  """The real run's workdir, once its training has finished."""
  return real_run.finished()


def test_cli_real_run_exports_verifies_and_imports(tmp_path, real_run):
  """A real run exports with --verify through the CLI and imports back bitwise; make demo's last
  step (evaluate --word_order) scores it against its random init. The export is the command's subprocess smoke
  test; evaluate and the import, commands reading what it wrote, run in process."""
  run = _finished(real_run)
  out = tmp_path / "hf"
  proc = _cli(["crossbert_jax.export", f"--workdir={run}", f"--output={out}", "--verify"])
  assert "verified" in proc.stdout, proc.stdout
  probe = run_command("crossbert_jax.evaluate", f"--workdir={run}", "--word_order", check=True).stdout
  assert "run@2 " in probe and "random init (its step 0) " in probe and "chance " in probe, probe
  assert "tokens seen: 2,048" in (out / "README.md").read_text()
  assert json.loads((out / "config.json").read_text())["layer_types"] == hf_mapping.layer_types(2, 2)
  with pytest.raises(UserError, match="--output .* not empty"):
    export.export_run(str(run), str(out))
  run_command("crossbert_jax.export", "import", f"--hf={out}", f"--output={tmp_path / 'imported'}", "--objective=mlm",
              check=True)
  from crossbert_jax.run import load  # pylint: disable=g-import-not-at-top
  _, params, _ = load.load_run(run)
  _, imported = convert.load_imported(tmp_path / "imported")
  _assert_bitwise(imported, {k: jax.tree.map(np.asarray, params[k]) for k in ("encoder", "head")})


def test_export_refuses_a_tokenizer_the_run_was_not_trained_with(tmp_path, real_run, tok_path):
  """--tokenizer is checked against the checkpoint's record: another model is one line and no folder; the
  same file elsewhere exports. In process (run_command)."""
  run = _finished(real_run)
  other = tokenizer.train_tokenizer(corpus.builtin_documents()[4000:6000], 400, tmp_path / "other.model")
  out = tmp_path / "hf"
  proc = run_command("crossbert_jax.export", f"--workdir={run}", f"--output={out}", f"--tokenizer={other}")
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
  assert f"was trained with the tokenizer {tok_path}" in lines[0] and f"--tokenizer={other} differs" in lines[0]
  assert not out.exists()
  copy = tmp_path / "copy.model"
  copy.write_bytes(pathlib.Path(tok_path).read_bytes())
  run_command("crossbert_jax.export", f"--workdir={run}", f"--output={out}", f"--tokenizer={copy}", check=True)
  assert (out / "tokenizer.json").is_file()
