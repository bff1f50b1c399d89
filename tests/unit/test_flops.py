"""FLOP counts against a longhand count on tiny shapes; param counts; peak lookup and MFU."""

import math
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from crossbert_jax.core import config as config_lib
from crossbert_jax.core import plan as plan_lib
from crossbert_jax.training import flops
from crossbert_jax.training.objectives import crossbert

# Tiny shapes for every hand count below: d=8, H=2, I=16, N=2, V=32, L=8, batch=2;
# reconstructor dr=8, Ir=16, Nr=1 unless a test says otherwise.


def _tiny(objective: str, **overrides):
  c = config_lib.get_config(objective, "tiny")
  with c.unlocked():
    c.model.embed_dim, c.model.num_heads, c.model.mlp_dim = 8, 2, 16
    c.model.num_layers, c.model.vocab_size = 2, 32
    c.data.seq_len, c.train.batch_size, c.train.grad_accum = 8, 2, 1
    c.reconstructor.embed_dim, c.reconstructor.num_heads = 8, 2
    c.reconstructor.mlp_dim, c.reconstructor.num_layers = 16, 1
    for key, value in overrides.items():
      section, name = key.split("__")
      c[section][name] = value
  plan_lib.build(c)
  return c


def _encoder_layer(t):
  """One encoder layer on t tokens at d=8, I=16, written out term by term."""
  qkv = 2 * t * 8 * 24  # d -> 3d
  scores = 2 * t * t * 8
  weighted_sum = 2 * t * t * 8
  out = 2 * t * 8 * 8  # d -> d
  wi = 2 * t * 8 * 32  # d -> 2I
  wo = 2 * t * 16 * 8  # I -> d
  return qkv + scores + weighted_sum + out + wi + wo


def test_encoder_layer_longhand():
  # 2*T*(3d^2 + d^2 + 2dI + Id) + 4*T^2*d at T=4: 8*(192 + 64 + 256 + 128) + 4*16*8.
  assert _encoder_layer(4) == 5632
  c = _tiny("crossbert")
  assert flops.encoder_forward_flops(c.model, 4) == 2 * 5632


def test_local_attention_counts_as_global():
  c = _tiny("crossbert")
  dense = flops.encoder_forward_flops(c.model, 8)
  with c.unlocked():
    c.model.global_every, c.model.local_window = 2, 2
  assert flops.encoder_forward_flops(c.model, 8) == dense


def test_crossbert_two_views():
  c = _tiny("crossbert", masking__views=2, masking__ratio=0.5)
  assert crossbert.crossbert_shapes(c) == (2, 4, 4)  # K, visible, reconstructed
  # Per view: encoder on 4 visible tokens, two layers.
  encoder = 2 * (
      2 * 4 * 8 * 24  # QKV: 1536
      + 2 * 4 * 4 * 8  # scores: 256
      + 2 * 4 * 4 * 8  # weighted sum: 256
      + 2 * 4 * 8 * 8  # out: 512
      + 2 * 4 * 8 * 32  # Wi: 2048
      + 2 * 4 * 16 * 8  # Wo: 1024
  )  # = 2 * 5632 = 11264
  # Per view: one reconstructor block, R'=4 queries, 4 memory tokens.
  reconstructor = (
      2 * 4 * 8 * 8  # query proj dr -> dr: 512
      + 2 * 4 * 8 * 16  # K and V proj d -> dr each: 1024
      + 4 * 4 * 4 * 8  # cross-attn scores + weighted sum: 512
      + 2 * 4 * 8 * 8  # out proj: 512
      + 2 * 4 * 8 * 32  # Wi dr -> 2Ir: 2048
      + 2 * 4 * 16 * 8  # Wo Ir -> dr: 1024
  )  # = 5632
  head = 2 * 4 * 8 * 32  # dr -> V on 4 slots: 2048
  expected = {"encoder": 2 * encoder, "reconstructor": 2 * reconstructor, "head": 2 * head}
  assert expected == {"encoder": 22528, "reconstructor": 11264, "head": 4096}
  assert flops.forward_flops_breakdown(c) == expected
  assert flops.train_flops_per_sequence(c) == 3 * 37888
  assert flops.train_flops_per_step(c) == 2 * 3 * 37888


def test_crossbert_one_view_half_ratio_is_one_of_two_views():
  two = flops.forward_flops_breakdown(_tiny("crossbert", masking__views=2, masking__ratio=0.5))
  one = flops.forward_flops_breakdown(_tiny("crossbert", masking__views=1, masking__ratio=0.5))
  assert one == {k: v / 2 for k, v in two.items()}


def test_crossbert_one_view_quarter_ratio():
  c = _tiny("crossbert", masking__views=1, masking__ratio=0.25)
  assert crossbert.crossbert_shapes(c) == (1, 6, 2)  # round(0.25 * 8) = 2 masked, 6 visible
  encoder = 2 * (
      2 * 6 * 8 * 24  # QKV: 2304
      + 4 * 6 * 6 * 8  # scores + weighted sum: 1152
      + 2 * 6 * 8 * 8  # out: 768
      + 2 * 6 * 8 * 32  # Wi: 3072
      + 2 * 6 * 16 * 8  # Wo: 1536
  )  # = 2 * 8832
  reconstructor = (
      2 * 2 * 8 * 8  # query proj on 2 slots: 256
      + 2 * 6 * 8 * 16  # K, V proj on 6 memory tokens: 1536
      + 4 * 2 * 6 * 8  # cross-attn: 384
      + 2 * 2 * 8 * 8  # out proj: 256
      + 2 * 2 * (8 * 32 + 16 * 8)  # GeGLU: 1536
  )  # = 3968
  head = 2 * 2 * 8 * 32  # 1024
  assert (encoder, reconstructor, head) == (17664, 3968, 1024)
  assert flops.forward_flops_breakdown(c) == {"encoder": encoder, "reconstructor": reconstructor, "head": head}


def test_reconstruct_ratio():
  c = _tiny("crossbert", masking__reconstruct_ratio=0.5)
  assert crossbert.crossbert_shapes(c) == (2, 4, 2)  # R' = round(0.5 * 4) = 2
  reconstructor = (
      2 * 2 * 8 * 8  # query proj on R'=2: 256
      + 2 * 4 * 8 * 16  # K, V proj on all 4 visible tokens: 1024
      + 4 * 2 * 4 * 8  # cross-attn: 256
      + 2 * 2 * 8 * 8  # out proj: 256
      + 2 * 2 * (8 * 32 + 16 * 8)  # GeGLU: 1536
  )  # = 3328
  got = flops.forward_flops_breakdown(c)
  assert got["encoder"] == 22528  # Unchanged: the encoder still sees every visible token.
  assert got["reconstructor"] == 2 * reconstructor == 6656
  assert got["head"] == 2 * (2 * 2 * 8 * 32) == 2048
  # At least one slot is always reconstructed: round(0.1 * 4) = 0 -> 1.
  c = _tiny("crossbert", masking__reconstruct_ratio=0.1)
  assert crossbert.crossbert_shapes(c) == (2, 4, 1)


def test_self_attention_and_feature_mixing():
  base = flops.forward_flops_breakdown(_tiny("crossbert"))["reconstructor"]
  self_attention = (
      2 * 4 * 8 * 24  # fused QKV dr -> 3dr on 4 queries: 1536
      + 4 * 4 * 4 * 8  # scores + weighted sum among queries: 512
      + 2 * 4 * 8 * 8  # out proj: 512
  )  # = 2560 per view
  got = flops.forward_flops_breakdown(_tiny("crossbert", reconstructor__self_attention=True))
  assert got["reconstructor"] == base + 2 * self_attention == 16384
  mixing = 2 * 3 * 4 * 8  # N+1=3 encoder outputs, 4 visible tokens, d=8: 192 per view
  got = flops.forward_flops_breakdown(_tiny("crossbert", reconstructor__feature_mixing=True))
  assert got["reconstructor"] == base + 2 * mixing == 11648


def test_reconstructor_wider_than_encoder():
  c = _tiny("crossbert", reconstructor__embed_dim=16, reconstructor__mlp_dim=32)
  reconstructor = (
      2 * 4 * 16 * 16  # query proj dr -> dr: 2048
      + 2 * 4 * 8 * (2 * 16)  # K, V proj d=8 -> dr=16: 2048
      + 4 * 4 * 4 * 16  # cross-attn at width dr: 1024
      + 2 * 4 * 16 * 16  # out proj: 2048
      + 2 * 4 * (16 * 64 + 32 * 16)  # GeGLU dr -> 2Ir, Ir -> dr: 12288
  )  # = 19456
  got = flops.forward_flops_breakdown(c)
  assert got == {"encoder": 22528, "reconstructor": 2 * reconstructor, "head": 2 * (2 * 4 * 16 * 32)}


def test_mlm():
  c = _tiny("mlm", masking__ratio=0.25)
  encoder = 2 * (
      2 * 8 * 8 * 24  # QKV: 3072
      + 4 * 8 * 8 * 8  # scores + weighted sum on all 8 tokens: 2048
      + 2 * 8 * 8 * 8  # out: 1024
      + 2 * 8 * 8 * 32  # Wi: 4096
      + 2 * 8 * 16 * 8  # Wo: 2048
  )  # = 2 * 12288
  head = 2 * 2 * 8 * 8 + 2 * 2 * 8 * 32  # dense + decoder on round(0.25 * 8) = 2 positions
  assert (encoder, head) == (24576, 1280)
  assert flops.forward_flops_breakdown(c) == {"encoder": encoder, "reconstructor": 0.0, "head": head}
  assert flops.train_flops_per_step(c) == 2 * 3 * (24576 + 1280)


def test_param_counts():
  sds = jax.ShapeDtypeStruct
  params = {
      "token_embed": {"embedding": nn.LogicallyPartitioned(sds((32, 8), jnp.float32), ("vocab", "embed"))},
      "layer_0": {
          "qkv": {"kernel": nn.Partitioned(sds((8, 24), jnp.float32), (None, "tensor"))},
          "norm": {"scale": sds((8,), jnp.float32)},},
      "head": {"kernel": jnp.zeros((8, 32)), "bias": jnp.zeros((32,))},}
  # 32*8 embedding + 8*24 + 8 + 8*32 + 32.
  assert flops.param_counts(params) == {"total": 256 + 192 + 8 + 256 + 32, "non_embedding": 488}


def _device(platform, kind):
  return types.SimpleNamespace(platform=platform, device_kind=kind)


def test_peak_lookup():
  assert flops.peak_tflops_per_device(jax.devices()[0], "float32", 0.1) == 0.1
  assert flops.peak_tflops_per_device(_device("gpu", "NVIDIA H100 80GB HBM3"), "bfloat16", 0.1) == 989
  assert flops.peak_tflops_per_device(_device("gpu", "NVIDIA H100 PCIe"), "bfloat16", 0.1) == 756
  assert flops.peak_tflops_per_device(_device("gpu", "NVIDIA H200"), "float32", 0.1) == 494
  assert flops.peak_tflops_per_device(_device("gpu", "NVIDIA A100-SXM4-80GB"), "float32", 0.1) == 156
  assert flops.peak_tflops_per_device(_device("tpu", "TPU v5 lite"), "bfloat16", 0.1) == 197
  assert flops.peak_tflops_per_device(_device("tpu", "TPU v5"), "bfloat16", 0.1) == 459
  assert flops.peak_tflops_per_device(_device("tpu", "TPU v6 lite"), "bfloat16", 0.1) == 918


def test_unknown_device_warns_once(monkeypatch):
  warnings = []
  monkeypatch.setattr(flops.logging, "warning", lambda *args: warnings.append(args))
  device = _device("gpu", "Imaginary X9000")
  assert flops.peak_tflops_per_device(device, "bfloat16", 0.1) is None
  assert flops.peak_tflops_per_device(device, "float32", 0.1) is None
  assert len(warnings) == 1
  assert math.isnan(flops.mfu(1e12, 1.0, 1, None))


def test_mfu():
  # 1e15 FLOPs in 2 s on 4 devices of 250 TFLOP/s: 5e14 / 1e15 = 0.5.
  assert flops.mfu(1e15, 2.0, 4, 250.0) == pytest.approx(0.5)
  assert flops.achieved_tflops_per_device(1e15, 2.0, 4) == pytest.approx(125.0)
  assert math.isnan(flops.mfu(1e15, 0.0, 4, 250.0))
