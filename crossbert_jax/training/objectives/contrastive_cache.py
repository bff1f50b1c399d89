"""GradCache (Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup"):
the gradient of a loss over a batch's embeddings, with only one chunk's activations live at a time.

1. Embed all M texts in chunks without gradients (a scan: one compiled chunk program).
2. The loss of the M x D embeddings and its gradient w.r.t. them (small: M x D).
3. Re-run each chunk under jax.vjp with its slice of that gradient as the cotangent, and add up the
   param gradients (a second scan). By the chain rule the sum is the plain loss's gradient exactly;
   only the summation order differs (float rounding).

Chunks take strided rows (chunk k holds rows k, k + n, k + 2n, ... of the n chunks), so a batch
sharded over ("data", "fsdp") keeps its sharding in every chunk: each device embeds its own rows of
every chunk. The last rows may be padding (the batch padded to n chunks); they get a zero cotangent.
`embed_fn` must be pure in (params, chunk, key): step 3 must recompute step 1's embeddings exactly
(the same dropout key per chunk). Shape letters: M texts, n chunks, c rows per chunk, D width.
"""

from typing import Any, Callable

import jax
import jax.numpy as jnp

Array = jax.Array
# (params, chunk of inputs with leading axis c, key or None) -> c x D embeddings.
EmbedFn = Callable[[Any, Any, Array | None], Array]
# (M x D embeddings) -> (scalar loss, aux).
LossOfEmbeddings = Callable[[Array], tuple[Array, Any]]


def _chunked(inputs: Any, chunk_size: int) -> tuple[Any, int, int]:
  """(leaves as n x c x ..., n, M): rows padded with copies of row 0 to n * c, chunk k = rows k, k + n, ..."""
  m = jax.tree.leaves(inputs)[0].shape[0]
  c = min(chunk_size, m)
  n = -(-m // c)

  def split(a):
    if a.shape[0] != m:
      raise ValueError(f"every input needs the same leading (row) axis: {a.shape[0]} != {m}")
    if n * c > m:  # Real rows (row 0) as padding: a pad token row could embed to zero or NaN-free garbage alike.
      a = jnp.concatenate([a, jnp.broadcast_to(a[:1], (n * c - m,) + a.shape[1:])], axis=0)
    return jnp.moveaxis(a.reshape((c, n) + a.shape[1:]), 1, 0)

  return jax.tree.map(split, inputs), n, m


def _unchunked(x_nxcxD: Array, m: int) -> Array:
  """The inverse of _chunked for one array: n x c x ... -> M x ... in the original row order."""
  x = jnp.moveaxis(x_nxcxD, 0, 1)
  return x.reshape((-1,) + x.shape[2:])[:m]


def _rechunked(x_MxD: Array, n: int) -> Array:
  """M x ... -> n x c x ... as _chunked lays rows out (padding rows zero)."""
  c = -(-x_MxD.shape[0] // n)
  x = jnp.pad(x_MxD, [(0, n * c - x_MxD.shape[0])] + [(0, 0)] * (x_MxD.ndim - 1))
  return jnp.moveaxis(x.reshape((c, n) + x.shape[1:]), 1, 0)


def _chunk_key(key: Array | None, i: Array) -> Array | None:
  return None if key is None else jax.random.fold_in(key, i)


def embed_chunked(embed_fn: EmbedFn, params: Any, inputs: Any, chunk_size: int, key: Array | None = None) -> Array:
  """M x D embeddings of `inputs` (leaves M x ...), `chunk_size` rows at a time, no gradient kept."""
  chunks, n, m = _chunked(inputs, chunk_size)
  params = jax.lax.stop_gradient(params)

  def body(_, xs):
    i, chunk = xs
    return None, embed_fn(params, chunk, _chunk_key(key, i))

  _, emb_nxcxD = jax.lax.scan(body, None, (jnp.arange(n), chunks))
  return _unchunked(emb_nxcxD, m)


def cached_value_and_grad(embed_fn: EmbedFn, loss_of_embeddings: LossOfEmbeddings, params: Any, inputs: Any,
                          chunk_size: int, key: Array | None = None, *,
                          loss_reads_params: bool = False) -> tuple[tuple[Array, Any], Any]:
  """((loss, aux), d loss / d params) of loss_of_embeddings(embed(params, inputs)), GradCache's way.

  inputs: a pytree of arrays with a leading row axis M (e.g. tokens, positions and segment ids of the
  anchors, positives and negatives stacked); chunk_size: rows embedded at once (its activations are
  the only ones live). The same result as jax.value_and_grad over one embed_fn call on all rows,
  except that with a `key` each chunk gets fold_in(key, chunk index) rather than one key for all.
  loss_reads_params: the loss is loss_of_embeddings(embeddings, params) (e.g. a learnable temperature);
  its direct gradient w.r.t. the params is added to the encoder's.
  """
  emb_MxD = embed_chunked(embed_fn, params, inputs, chunk_size, key)
  if loss_reads_params:
    (loss, aux), (g_MxD, direct) = jax.value_and_grad(loss_of_embeddings, argnums=(0, 1), has_aux=True)(emb_MxD, params)
  else:
    (loss, aux), g_MxD = jax.value_and_grad(loss_of_embeddings, has_aux=True)(emb_MxD)
    direct = None
  chunks, n, _ = _chunked(inputs, chunk_size)
  cotangents = _rechunked(g_MxD.astype(emb_MxD.dtype), n)

  def body(grads, xs):
    i, chunk, g_cxD = xs
    _, vjp = jax.vjp(lambda p: embed_fn(p, chunk, _chunk_key(key, i)), params)
    return jax.tree.map(jnp.add, grads, vjp(g_cxD)[0]), None

  zeros = jax.tree.map(jnp.zeros_like, params) if direct is None else direct
  grads, _ = jax.lax.scan(body, zeros, (jnp.arange(n), chunks, cotangents))
  return (loss, aux), grads
