"""model.attention="cudnn": its mask and keyless-query zeroing against the dense reference, on the CPU
through the same function's XLA implementation (cuDNN itself runs on a GPU: the accelerator check)."""

import jax
import jax.numpy as jnp
import pytest

from crossbert_jax.model import attention as attn
from crossbert_jax.model import attention_cudnn
from tests.unit.test_attention import _check, _qkv, _run, _self_case, _spec


@pytest.mark.parametrize("window", [None, 8], ids=["global", "local"])
@pytest.mark.parametrize("gathered", [False, True], ids=["packed", "gathered_positions"])
def test_self_attention_matches_dense(window, gathered):
  seg, pos = _self_case(gathered=gathered)
  q, k, v, dout = _qkv(40, 40, seed=4)
  ref = lambda q, k, v: attn.dense(q, k, v, attn.mask(seg, seg, pos, pos, window))
  fn = lambda q, k, v: attn.attention(q, k, v, seg, spec=_spec("cudnn"), q_pos_BxT=pos, window=window)
  want, got = jax.jit(lambda *a: (_run(ref, *a), _run(fn, *a)))(q, k, v, dout)
  _check(got, want, f"cudnn (xla implementation) self-attention window={window}")
  assert float(jnp.max(jnp.abs(got[0][seg == 0]))) == 0.0, "pad queries must output zeros"
  assert float(jnp.max(jnp.abs(got[2][seg == 0]))) == 0.0, "pad keys must get no gradient"


def test_cross_attention_matches_dense():
  """T=24 queries, S=40 keys; a query segment with no key and pad queries output zeros."""
  kv_seg, _ = _self_case(gathered=False)
  q_seg = jnp.asarray([[1] * 8 + [2] * 6 + [3] * 4 + [0] * 6, [3] * 10 + [1] * 10 + [0] * 4], jnp.int32)
  q, k, v, dout = _qkv(24, 40, seed=5)
  ref = lambda q, k, v: attn.dense(q, k, v, attn.mask(q_seg, kv_seg))
  fn = lambda q, k, v: attn.attention(q, k, v, q_seg, kv_seg, spec=_spec("cudnn"))
  want, got = jax.jit(lambda *a: (_run(ref, *a), _run(fn, *a)))(q, k, v, dout)
  _check(got, want, "cudnn (xla implementation) cross-attention")
  assert float(jnp.max(jnp.abs(got[0][0, 14:]))) == 0.0, "keyless and pad queries must output zeros"


def test_cudnn_only_on_a_gpu_in_bf16():
  assert attention_cudnn.implementation("gpu", jnp.bfloat16) == "cudnn"
  assert attention_cudnn.implementation("gpu", jnp.float32) == "xla"
  assert attention_cudnn.implementation("cpu", jnp.bfloat16) == "xla"
  # Off a GPU and not in the tests' interpret mode: the chunked kernel, as splash and gpu_flash.
  assert attn.resolve_backend(attn.AttentionSpec("cudnn"), 40, 40) == "chunked"
