"""A new objective is one module: registered here, it trains, benchmarks, compiles and exports.

The toy objective is flat MLM with every selected token replaced by [MASK] (no 80/10/10) and an
untied linear decoder in a section of its own (`toy`). Nothing in the package changes for it:
the config, the trainer, bench's timing, the pre-flight compile and the Hugging Face export all
reach it through the two registries: its spec (core/objectives.py) and its training half
(training/objectives).
"""

import importlib.util
import math
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from crossbert_jax import export as export_cli
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.core import objectives as specs
from crossbert_jax.core.errors import UserError
from crossbert_jax.model import layers
from crossbert_jax.model.encoder import Encoder, EncoderSpec
from crossbert_jax.perf import aot
from crossbert_jax.perf import benchmark as bench
from crossbert_jax.run import resume, trainer
from crossbert_jax.training import flops, masking, objectives

NAME = "toy_mask_only_mlm"


class MaskOnlyMlm(nn.Module):
  """Encoder on the corrupted row, then a plain linear decoder D -> V on the masked slots."""
  spec: EncoderSpec
  decoder_init_std: float

  @nn.compact
  def __call__(self, tokens_BxL, positions_BxL, segment_ids_BxL, mask_idx_BxM, *, return_hidden=False):
    x_BxLxD = Encoder(self.spec, name="encoder")(tokens_BxL, positions_BxL, segment_ids_BxL)
    x_BxMxD = jnp.take_along_axis(x_BxLxD, mask_idx_BxM[:, :, None], axis=1)
    w_DxV = self.param("decoder",
                       nn.with_logical_partitioning(nn.initializers.normal(self.decoder_init_std), ("embed", "vocab")),
                       (self.spec.embed_dim, self.spec.vocab_size), jnp.float32)
    return (x_BxMxD, (w_DxV, None)) if return_hidden else layers.vocab_logits(x_BxMxD, w_DxV, None)


def _configure(c):
  c.masking.ratio = 0.2
  c.toy = ml_collections.ConfigDict({"decoder_init_std": 0.02})


def _validate(c):
  if c.masking.views != 1:
    raise UserError("config masking.views: the toy objective uses one view")
  if not c.toy.decoder_init_std > 0:
    raise UserError(f"config toy.decoder_init_std: must be positive, got {c.toy.decoder_init_std}")


class MaskOnlyMlmObjective:
  """The toy objective's training half (`objectives.Objective`), its spec beside it."""

  spec = specs.ObjectiveSpec(name=NAME, config_file="configs/toy.py", sections=("toy",), exports_mlm_head=False,
                             card_title="mask-only MLM encoder (linear decoder discarded)", configure=_configure,
                             validate=_validate, card_training=lambda c: ", every selected token [MASK]")

  def build_model(self, c):
    return MaskOnlyMlm(EncoderSpec.from_config(c.model), c.toy.decoder_init_std)

  def init_inputs(self, c, batch):
    return (masking.mlm_masks(jax.random.key(0), batch["segment_ids"], c.masking.ratio).mask_idx_BxM,)

  def make_loss_fn(self, c, model, replacement_vocab, specials):
    def loss(params, batch, key):
      tokens_BxL, seg_BxL = batch["tokens"], batch["segment_ids"]
      masks = masking.mlm_masks(key, seg_BxL, c.masking.ratio,
                                objectives.targetable(tokens_BxL, seg_BxL, c.masking.exclude_special, specials))
      masked_BxL = masking.corrupt(key, tokens_BxL, masks, mask_prob=1.0, random_prob=0.0, mask_id=specials.mask,
                                   first_regular_id=0, vocab_size=1)
      hidden_BxMxD, head = model.apply({"params": params}, masked_BxL, batch["positions"], seg_BxL, masks.mask_idx_BxM,
                                       return_hidden=True)
      targets_BxM = jnp.take_along_axis(tokens_BxL, masks.mask_idx_BxM, axis=1)
      return objectives.chunked_cross_entropy(hidden_BxMxD, head, targets_BxM, masks.mask_valid_BxM, c.model.loss_chunk)

    return loss

  def encoder_shape(self, c):
    return 1, c.data.seq_len, round(c.masking.ratio * c.data.seq_len)

  def forward_flops(self, c):
    masked = round(c.masking.ratio * c.data.seq_len)
    return {
        "encoder": flops.encoder_forward_flops(c.model, c.data.seq_len), "reconstructor": 0.0,
        "head": float(2 * masked * c.model.embed_dim * c.model.vocab_size)}


CONFIG_FILE = textwrap.dedent(f'''\
    """The toy objective's configs (what configs/*.py are for the built-in ones)."""
    from crossbert_jax.core import config as config_lib


    def get_config(variant="tiny"):
      return config_lib.get_config("{NAME}", variant)
''')


@pytest.fixture
def toy(tmp_path, spm_model, monkeypatch):
  """The toy objective registered (for this test only) and its tiny config, loaded from its own file."""
  toy_objective = MaskOnlyMlmObjective()
  monkeypatch.setitem(specs._SPECS, NAME, toy_objective.spec)  # pylint: disable=protected-access
  monkeypatch.setitem(objectives._REGISTRY, NAME, toy_objective)  # pylint: disable=protected-access
  (tmp_path / "toy.py").write_text(CONFIG_FILE)
  spec = importlib.util.spec_from_file_location("toy_config", tmp_path / "toy.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config("tiny")
  with c.unlocked():
    c.data.tokenizer = spm_model
    c.train.steps, c.train.warmup_steps, c.checkpoint.every_steps = 4, 1, 2
    c.metrics.progress_bar = c.metrics.tensorboard = False
  return c


def test_toy_objective_trains_benchmarks_compiles_and_exports(toy, tmp_path):
  c = toy
  assert c.objective == NAME and c.toy.decoder_init_std == 0.02 and c.masking.ratio == 0.2
  plan_lib.build(c)
  bad = ml_collections.ConfigDict(c.to_dict())
  bad.toy.decoder_init_std = 0.0
  with pytest.raises(UserError, match="toy.decoder_init_std"):
    plan_lib.build(bad)
  assert resume._refused("toy.decoder_init_std")  # pylint: disable=protected-access

  result = trainer.run(plan_lib.build(c), str(tmp_path / "run"))
  assert result["status"] == "finished" and math.isfinite(result["loss"])
  assert 0 < result["loss"] < 2 * math.log(c.model.vocab_size)

  bench_cfg = bench.case_config(c, lambda unused: None, 0)
  row = bench.case_summary(bench_cfg, bench.time_case(bench_cfg, steps=1, warmup=0))
  masked = round(0.2 * c.data.seq_len)
  assert (row["views"], row["encoder_tokens_per_view"], row["predicted_slots_per_view"]) == (1, 64, masked)
  assert row["reconstructor_embed_dim"] is None and np.isfinite(row["loss"])
  assert row["train_flops_per_step"] == 3 * c.train.batch_size * sum(MaskOnlyMlmObjective().forward_flops(c).values())

  report = aot.compile_train_step(plan_lib.build(c))
  assert report["objective"] == NAME
  decoder = [r for r in report["params"]["table"] if r["path"] == "decoder"]
  assert decoder and decoder[0]["logical"] == ["embed", "vocab"]

  out = tmp_path / "hf"
  checked = export_cli.export_run(str(tmp_path / "run"), str(out), do_verify=True)
  assert checked["hidden_max_abs_diff"] <= 1e-4 and checked["sentence_max_abs_diff"] <= 1e-4
  card = (out / "README.md").read_text()
  assert "# mask-only MLM encoder" in card and f"`{NAME}`, masking ratio 0.2, every selected token [MASK]" in card
