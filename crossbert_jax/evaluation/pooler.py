"""Pooler-only training on a frozen encoder: the paper's "frozen" embedding protocol.

The encoder embeds every training sentence once; only a small pooler (mean pooling then a
learned linear map, or a learned-query attention pooler then the linear map) is trained, with
an in-batch-negatives contrastive loss (plus hard negatives), on those cached outputs. The
encoder's params are not an input of the loss, so no gradient can reach them. The mean pooler
caches the mean-pooled vectors (mean pooling is linear: the same as pooling cached token
states); the attention pooler caches token states. Both poolers start as the identity on the
plain mean-pooled embedding (zero query, identity kernel when the widths match).
The CLI is `crossbert_jax.pooler`. Shape letters: B batch, L length, D encoder width,
E pooler width, N sentences, T training triples.
"""

import dataclasses
import functools
import hashlib
import json
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import safetensors.numpy
from etils import epath

from crossbert_jax.core.errors import UserError
from crossbert_jax.evaluation import embedder as embedder_lib
from crossbert_jax.evaluation import generic
from crossbert_jax.model import inference

KINDS = ("mean", "attention")
PARAMS_FILE, CONFIG_FILE = "pooler.safetensors", "pooler.json"
CHUNK = 2048  # Sentences per token-state chunk when the attention pooler embeds.


class Pooler(nn.Module):
  """Pools BxLxD token states (mask BxL) to BxE: mean or learned-query attention, then Dense."""
  kind: str
  out_dim: int

  @nn.compact
  def __call__(self, hidden_BxLxD, mask_BxL):
    d = hidden_BxLxD.shape[-1]
    hidden_BxLxD = hidden_BxLxD.astype(jnp.float32)
    valid_BxL = mask_BxL > 0
    if self.kind == "attention":
      query_D = self.param("query", nn.initializers.zeros, (d,))  # Zero: uniform weights, the mean.
      logits_BxL = jnp.einsum("bld,d->bl", hidden_BxLxD, query_D) / np.sqrt(d)
      logits_BxL = jnp.where(valid_BxL, logits_BxL, jnp.finfo(jnp.float32).min)
      w_BxL = jax.nn.softmax(logits_BxL, axis=-1) * valid_BxL  # All-pad rows pool to zero.
    else:
      w_BxL = valid_BxL / jnp.maximum(valid_BxL.sum(-1, keepdims=True), 1)
    pooled_BxD = jnp.einsum("bld,bl->bd", hidden_BxLxD, w_BxL)
    init = (lambda key, shape, dtype=jnp.float32: jnp.eye(*shape, dtype=dtype)) if self.out_dim == d \
        else nn.initializers.lecun_normal()
    return nn.Dense(self.out_dim, kernel_init=init, name="dense")(pooled_BxD)


def contrastive_loss(anchor_BxE, positive_BxE, negative_BxE=None, scale: float = 20.0):
  """In-batch-negatives InfoNCE on cosine similarities (sentence-transformers' MNRL)."""
  unit = lambda x: x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
  cands_CxE = positive_BxE if negative_BxE is None else jnp.concatenate([positive_BxE, negative_BxE])
  logits_BxC = scale * unit(anchor_BxE) @ unit(cands_CxE).T
  labels_B = jnp.arange(anchor_BxE.shape[0])
  return optax.softmax_cross_entropy_with_integer_labels(logits_BxC, labels_B).mean()


# ----------------------------------------------------------------------------- frozen features


@dataclasses.dataclass
class Features:
  """Cached frozen-encoder outputs: token states NxLxD (L = 1 for the mean pooler) and mask NxL."""
  hidden_NxLxD: np.ndarray
  mask_NxL: np.ndarray


@functools.lru_cache(maxsize=8)
def _encode_fn(spec):
  return inference.make_encode_fn(spec)


def token_states(emb: embedder_lib.Embedder, texts: Sequence[str], pairs: Sequence[str] | None = None) -> Features:
  """Final-layer token states of a JAX embedder's encoder, padded to the longest text."""
  if not isinstance(emb, embedder_lib.JaxEmbedder):
    raise UserError("the attention pooler needs token states from a training run (--workdir); "
                    "use --kind=mean with --hf")
  seqs = inference.tokenize(emb.tok, texts, pairs, max_length=emb.options.max_length)
  length = max([len(s) for s in seqs] + [1])
  hidden_NxLxD = np.zeros((len(seqs), length, emb.spec.embed_dim), np.float32)
  mask_NxL = np.zeros((len(seqs), length), np.int32)
  order = np.argsort([len(s) for s in seqs], kind="stable")
  buckets = [b for b in embedder_lib.BUCKETS if b < length] + [length]
  i = 0
  while i < len(order):  # Length buckets, as JaxEmbedder: few compiled shapes.
    bucket = next(b for b in buckets if b >= len(seqs[order[i]]))
    idx = [j for j in order[i:i + max(1, emb.tokens_per_batch // bucket)] if len(seqs[j]) <= bucket]
    batch = inference.pad_batch([seqs[j] for j in idx], bucket, emb.tok.special_ids.pad)
    out_BxLxD = _encode_fn(emb.spec)(emb.params, batch["tokens"], batch["positions"], batch["segment_ids"])
    hidden_NxLxD[idx, :bucket] = np.asarray(out_BxLxD)
    mask_NxL[idx, :bucket] = batch["segment_ids"]
    i += len(idx)
  return Features(hidden_NxLxD, mask_NxL)


def frozen_features(emb: embedder_lib.Embedder, kind: str, texts: Sequence[str],
                    pairs: Sequence[str] | None = None) -> Features:
  """What the pooler reads: mean-pooled vectors as length-1 sequences (mean), or token states."""
  if kind == "attention":
    return token_states(emb, texts, pairs)
  pooled_NxD = emb.embed(texts, pairs)
  return Features(pooled_NxD[:, None, :], np.ones((len(pooled_NxD), 1), np.int32))


# ----------------------------------------------------------------------------- training data


def read_pairs(path: str, split: str = "dev", columns: Sequence[str] = ("anchor", "positive", "negative")
              ) -> tuple[list[str], list[str], list[str] | None]:
  """(anchors, positives, negatives or None) from a SentEval NLI folder or a TSV/JSONL file.

  A SentEval NLI folder (s1.<split>, s2.<split>, labels.<split>, e.g. SNLI) gives, per premise,
  its first entailed hypothesis as the positive and its first contradiction as the hard negative
  (premises lacking either are dropped). A file names 2 or 3 columns: anchor, positive[, negative].
  """
  p = epath.Path(path)
  if p.is_dir():
    parts = []
    for name in ("s1", "s2", "labels"):
      if not (p / f"{name}.{split}").is_file():
        raise UserError(f"--pairs={path} holds no {name}.{split}: give a SentEval NLI folder (s1/s2/labels."
                        f"{split}, see --pairs_split) or a .tsv/.jsonl file")
      parts.append([l.strip() for l in generic.decode(str(p / f"{name}.{split}")).split("\n") if l.strip()])
    if len({len(x) for x in parts}) != 1:
      raise UserError(f"--pairs={path}: s1/s2/labels.{split} have different line counts; the folder is damaged")
    by_premise: dict[str, dict[str, str]] = {}
    for s1, s2, label in zip(*parts):
      by_premise.setdefault(s1, {}).setdefault(label, s2)
    triples = [(a, d["entailment"], d["contradiction"])
               for a, d in by_premise.items()
               if "entailment" in d and "contradiction" in d]
    if not triples:
      raise UserError(f"--pairs={path}: no premise has both an entailment and a contradiction in {split}")
    a, pos, neg = map(list, zip(*triples))
    return a, pos, neg
  if not 2 <= len(columns) <= 3:
    raise UserError(f"--pairs_columns={','.join(columns)}: name 2 or 3 columns: anchor,positive[,negative]")
  rows = generic.read_records(path, tuple(columns))
  cols = [[str(r[c]) for _, r in rows] for c in columns]
  return cols[0], cols[1], cols[2] if len(cols) == 3 else None


# ----------------------------------------------------------------------------- training


@dataclasses.dataclass(frozen=True)
class TrainOptions:
  """Pooler kind and width (0: the encoder's), optimisation and loss settings."""
  kind: str = "mean"
  out_dim: int = 0
  steps: int = 300
  batch_size: int = 64
  learning_rate: float = 1e-3
  scale: float = 20.0  # Cosine logits x 20 = temperature 0.05, as sentence-transformers' MNRL.
  hard_negatives: bool = True
  seed: int = 0

  def check(self) -> None:
    """Refuses settings that train nothing or nonsense (each names its CLI flag)."""
    if self.kind not in KINDS:
      raise UserError(f"--kind={self.kind!r}: use one of {', '.join(KINDS)}")
    if self.steps < 1:
      raise UserError(f"--steps={self.steps}: train at least 1 step (e.g. --steps=300)")
    if self.batch_size < 2:
      raise UserError(f"--batch_size={self.batch_size}: in-batch negatives need at least 2 pairs per step "
                      "(e.g. --batch_size=64)")
    if not 0 < self.learning_rate < float("inf"):
      raise UserError(f"--learning_rate={self.learning_rate}: must be positive and finite (e.g. 1e-3)")
    if not 0 < self.scale < float("inf"):
      raise UserError(f"--scale={self.scale}: the cosine logit scale must be positive and finite (e.g. 20)")
    if self.out_dim < 0:
      raise UserError(f"--out_dim={self.out_dim}: use a positive width, or 0 for the encoder's width")


def pooler_loss(model: Pooler, params: dict, hidden_KxBxLxD, mask_KxBxL, scale: float):
  """Contrastive loss of anchors (k = 0), positives (1) and negatives (2) pooled from cached states.

  Its only params are the pooler's: the frozen encoder's outputs enter as data, so no gradient
  can flow to the encoder (tests/integration/test_evaluate.py checks the gradient tree).
  """
  out = [model.apply({"params": params}, hidden_KxBxLxD[k], mask_KxBxL[k]) for k in range(hidden_KxBxLxD.shape[0])]
  return contrastive_loss(*out, scale=scale)


def train_pooler(features: Features, triples_Tx3: np.ndarray, opts: TrainOptions,
                 log=print) -> tuple[dict, list[float]]:
  """(pooler params, loss per step): AdamW with cosine decay on the cached frozen features.

  `triples_Tx3` indexes `features` (anchor, positive, negative; negative -1 when absent).
  """
  opts.check()
  t = len(triples_Tx3)
  if t < 2:
    raise UserError(f"{t} training pair(s): in-batch negatives need at least 2")
  batch = min(opts.batch_size, t)
  use_neg = opts.hard_negatives and bool((triples_Tx3[:, 2] >= 0).all())
  model = Pooler(opts.kind, opts.out_dim or features.hidden_NxLxD.shape[-1])
  params = model.init(jax.random.key(opts.seed), features.hidden_NxLxD[:1], features.mask_NxL[:1])["params"]
  tx = optax.adamw(
      optax.warmup_cosine_decay_schedule(0.0, opts.learning_rate, max(1, opts.steps // 10), max(2, opts.steps)),
      weight_decay=0.0)
  opt_state = tx.init(params)

  @jax.jit
  def step(params, opt_state, hidden_KxBxLxD, mask_KxBxL):
    loss, grads = jax.value_and_grad(pooler_loss, argnums=1)(model, params, hidden_KxBxLxD, mask_KxBxL, opts.scale)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  rng = np.random.default_rng(opts.seed)
  order, pos, losses = rng.permutation(t), 0, []
  cols = 3 if use_neg else 2
  for i in range(opts.steps):
    if pos + batch > t:  # A new epoch: reshuffle.
      order, pos = rng.permutation(t), 0
    idx_BxK = triples_Tx3[order[pos:pos + batch], :cols]
    pos += batch
    params, opt_state, loss = step(params, opt_state, features.hidden_NxLxD[idx_BxK.T], features.mask_NxL[idx_BxK.T])
    losses.append(float(loss))
    if log and (i + 1) % max(1, opts.steps // 5) == 0:
      log(f"  step {i + 1}/{opts.steps}: loss {np.mean(losses[-max(1, opts.steps // 5):]):.4f}")
  return jax.device_get(params), losses


def triples_from(anchors: Sequence[str], positives: Sequence[str],
                 negatives: Sequence[str] | None) -> tuple[list[str], np.ndarray]:
  """(unique texts, Tx3 indices into them; -1 where there is no negative)."""
  texts: dict[str, int] = {}
  index = lambda s: texts.setdefault(s, len(texts))
  rows = [(index(a), index(p), index(negatives[i]) if negatives is not None else -1)
          for i, (a, p) in enumerate(zip(anchors, positives))]
  return list(texts), np.array(rows, np.int64).reshape(-1, 3)


# ----------------------------------------------------------------------------- saving, using


def _flat(tree: Any, prefix: str = "") -> dict[str, np.ndarray]:
  out = {}
  for k, v in tree.items():
    out.update(_flat(v, f"{prefix}{k}/") if hasattr(v, "items") else {f"{prefix}{k}": np.asarray(v, np.float32)})
  return out


def save_pooler(out_dir: str, params: dict, meta: dict) -> None:
  """Writes pooler.safetensors (param paths such as dense/kernel) and pooler.json (kind, source, ...)."""
  out = epath.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  (out / PARAMS_FILE).write_bytes(safetensors.numpy.save(_flat(params)))
  (out / CONFIG_FILE).write_text(json.dumps(meta, indent=1) + "\n")


@dataclasses.dataclass
class LoadedPooler:
  """A saved pooler: kind, params (nested dicts), metadata and a digest of its weights."""
  kind: str
  params: dict
  meta: dict
  digest: str


def load_pooler(path: str) -> LoadedPooler:
  """A pooler saved by `save_pooler` (the folder, as `--pooler=DIR`)."""
  folder = epath.Path(path)
  if not (folder / PARAMS_FILE).is_file() or not (folder / CONFIG_FILE).is_file():
    raise UserError(f"--pooler={path} holds no {PARAMS_FILE} + {CONFIG_FILE}: train one with "
                    "`python -m crossbert_jax.pooler --workdir=RUN --pairs=...`")
  data = (folder / PARAMS_FILE).read_bytes()
  params: dict = {}
  for key, x in safetensors.numpy.load(data).items():
    *parents, leaf = key.split("/")
    node = params
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = x
  meta = json.loads((folder / CONFIG_FILE).read_text())
  return LoadedPooler(meta["kind"], params, meta, hashlib.sha256(data).hexdigest()[:16])


class PoolerEmbedder(embedder_lib.Embedder):
  """A frozen encoder's embedder followed by a trained pooler (final layer, mean or attention)."""
  def __init__(self, base: embedder_lib.Embedder, pooler: LoadedPooler):
    if base.options.layers != (-1,) or base.options.pooling != "mean":
      raise UserError("a pooler reads the final layer's tokens: build its encoder with --layers=-1 --pooling=mean")
    self.base, self.pooler, self.options, self.progress = base, pooler, base.options, base.progress
    self.identity = f"{base.identity}+pooler:{pooler.digest}"
    out_dim = pooler.params["dense"]["kernel"].shape[-1]
    model = Pooler(pooler.kind, out_dim)
    self._apply = jax.jit(lambda p, h, m: model.apply({"params": p}, h, m))

  def _embed(self, texts, pairs):
    outs = []
    for start in range(0, len(texts), CHUNK):  # Token states of a chunk at a time: bounded memory.
      chunk_pairs = None if pairs is None else pairs[start:start + CHUNK]
      feats = frozen_features(self.base, self.pooler.kind, texts[start:start + CHUNK], chunk_pairs)
      outs.append(np.asarray(self._apply(self.pooler.params, feats.hidden_NxLxD, feats.mask_NxL)))
    return np.concatenate(outs) if outs else np.zeros((0, self.pooler.params["dense"]["kernel"].shape[-1]), np.float32)
