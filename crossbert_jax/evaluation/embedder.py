"""Sentence embeddings from a frozen encoder: our JAX checkpoints, or a local Hugging Face folder.

Both read the same representation: the mean over non-pad tokens (CLS and SEP included) of the
final hidden states, or of another layer, or the average of several layers' means. A pair is
one sequence `[CLS] a [SEP] b [SEP]` ("joint", the paper's default) or SentEval features
[u, v, |u-v|, u*v] of separately embedded sides ("senteval").

The JAX embedder packs texts of up to PACK_LENGTH tokens several to a row (each its own segment
id, positions from 0: the encoder's attention never crosses segments, so a text's states are
those it has alone) and pools each segment; longer texts run one per row at a few bucket
lengths. Every batch has one of a few fixed shapes, so a whole data set compiles at most
len(BUCKETS) + 1 programs, and packing spends little compute on padding (SST-2's 67k short
phrases: about 1.3M tokens packed against 2.6M padded to the 32-token bucket). Embeddings are cached on disk as .npy,
keyed by (model identity, task, split, layers, pooling, max length, pair mode, texts).
Shape letters: B batch, L length, D embed, N texts.
"""

import dataclasses
import functools
import hashlib
import inspect
import itertools
import os
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from etils import epath
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from crossbert_jax.core.errors import UserError
from crossbert_jax.data import tokenizer as tokenizer_lib
from crossbert_jax.model import inference
from crossbert_jax.model.encoder import EncoderSpec

BUCKETS = (32, 64, 128, 256, 512)
TOKENS_PER_BATCH = 4096  # Measured best on CPU: attention cost grows with length.
# On CPU a long bucket's batch keeps its dense attention scores (rows x heads x L^2 float32) under this:
# XLA:CPU's softmax over larger score tensors runs far slower (docs/evaluation.md, the embedder's speed).
CPU_SCORES_BYTES = 8 << 20
PACK_LENGTH = 128  # Texts up to this long share rows of this length (attention cost grows with it).
PACK_SLOTS = 64  # Texts per packed row at most (each has at least 2 tokens: CLS, SEP).
POOLINGS = inference.POOLINGS
PAIR_MODES = ("joint", "senteval")


@dataclasses.dataclass(frozen=True)
class Options:
  """How text becomes one vector: layers (-1 = final; several are averaged), pooling, max length."""
  layers: tuple[int, ...] = (-1,)
  pooling: str = "mean"
  max_length: int = 512
  pair_mode: str = "joint"

  def __post_init__(self):
    if self.pooling not in POOLINGS:
      raise UserError(f"--pooling={self.pooling!r}: use one of {', '.join(POOLINGS)}")
    if self.pair_mode not in PAIR_MODES:
      raise UserError(f"--pair_mode={self.pair_mode!r}: use one of {', '.join(PAIR_MODES)}")
    if self.max_length < 8:
      raise UserError(f"--max_length={self.max_length}: use at least 8 tokens")
    if not self.layers:
      raise UserError("--layers is empty: give layer indices such as -1 (final) or 1,2")

  @property
  def tag(self) -> str:
    return f"L{'_'.join(map(str, self.layers))}-{self.pooling}-{self.max_length}"


def parse_layers(text: str) -> tuple[int, ...]:
  """'-1' or '1,2' -> layer indices (0 = embedding output, num_layers or -1 = final)."""
  try:
    return tuple(int(t) for t in text.split(",") if t.strip())
  except ValueError:
    raise UserError(f"--layers={text!r}: give comma-separated integers, e.g. -1 or 1,2") from None


def _pool(hidden_BxLxD, segment_ids_BxL, pooling):
  return inference.pool(hidden_BxLxD, segment_ids_BxL, pooling)


def _pool_segments(hidden_BxLxD, segment_ids_BxL, positions_BxL, pooling, slots):
  """BxSxD: per segment id 1..S of each row, the mean of its states (or its first, CLS, state)."""
  take_BxL = segment_ids_BxL > 0
  if pooling == "cls":
    take_BxL &= positions_BxL == 0
  one_hot_BxLxS = (segment_ids_BxL[..., None] == jnp.arange(1, slots + 1)[None, None]) & take_BxL[..., None]
  one_hot_BxLxS = one_hot_BxLxS.astype(jnp.float32)
  summed_BxSxD = jnp.einsum("bld,bls->bsd", hidden_BxLxD.astype(jnp.float32), one_hot_BxLxS)
  return summed_BxSxD / jnp.maximum(one_hot_BxLxS.sum(1), 1.0)[..., None]


@functools.lru_cache(maxsize=16)
def _pooled_fn(spec: EncoderSpec, layers: tuple[int, ...], pooling: str, slots: int = 0):
  """jitted (params, tokens, positions, segment_ids) -> pooled embeddings (cached per spec).

  slots 0: one text per row, BxD; slots S: packed rows, BxSxD (segment s + 1 in slot s).
  """
  final_only = layers in ((-1,), (spec.num_layers,))
  encode = inference.make_encode_fn(spec, all_layers=not final_only)
  for l in layers:
    if not -spec.num_layers - 1 <= l <= spec.num_layers:
      raise UserError(f"--layers: {l} is out of range; this encoder has layers 0 (embeddings) .. "
                      f"{spec.num_layers} (final, also -1)")

  def pool(hidden, positions_BxL, segment_ids_BxL):
    if slots:
      return _pool_segments(hidden, segment_ids_BxL, positions_BxL, pooling, slots)
    return _pool(hidden, segment_ids_BxL, pooling)

  def fn(params, tokens_BxL, positions_BxL, segment_ids_BxL):
    hidden = encode(params, tokens_BxL, positions_BxL, segment_ids_BxL)
    if final_only:
      return pool(hidden, positions_BxL, segment_ids_BxL)
    return jnp.stack([pool(hidden[l], positions_BxL, segment_ids_BxL) for l in layers]).mean(0)

  return jax.jit(fn)


def pack_rows(lengths_N: np.ndarray, row_length: int, slots: int) -> list[list[int]]:
  """Indices of texts (each at most row_length tokens) per packed row, in O(N).

  Sorted by length, each row takes the longest text left, then the shortest ones while they fit
  (at most `slots` texts per row).
  """
  order = np.argsort(lengths_N, kind="stable")
  rows, lo, hi = [], 0, len(order) - 1
  while lo <= hi:
    row, used = [order[hi]], lengths_N[order[hi]]
    hi -= 1
    while lo <= hi and len(row) < slots and used + lengths_N[order[lo]] <= row_length:
      row.append(order[lo])
      used += lengths_N[order[lo]]
      lo += 1
    rows.append(row)
  return rows


def _scatter(flat_T, starts_N, lengths_N, idx_M, row_M, slot_M, n_rows, length, pad_id) -> dict[str, np.ndarray]:
  """tokens / segment_ids (slot + 1; 0 pad) / positions [n_rows, length] for texts idx_M placed at
  (row_M, slot_M), texts of a row in slot order, all in numpy (no Python loop over texts)."""
  tokens = np.full((n_rows, length), pad_id, np.int32)
  segment_ids = np.zeros((n_rows, length), np.int32)
  positions = np.zeros((n_rows, length), np.int32)
  lens_M = lengths_N[idx_M]
  ends_M = np.cumsum(lens_M)
  row_first_M = np.r_[True, row_M[1:] != row_M[:-1]] if len(row_M) else np.zeros(0, bool)
  row_base_M = np.maximum.accumulate(np.where(row_first_M, ends_M - lens_M, 0)) if len(row_M) else ends_M
  pos_T = np.arange(int(lens_M.sum())) - np.repeat(ends_M - lens_M, lens_M)
  rows_T, cols_T = np.repeat(row_M, lens_M), np.repeat(ends_M - lens_M - row_base_M, lens_M) + pos_T
  tokens[rows_T, cols_T] = flat_T[np.repeat(starts_N[idx_M], lens_M) + pos_T]
  segment_ids[rows_T, cols_T] = np.repeat(slot_M + 1, lens_M)
  positions[rows_T, cols_T] = pos_T
  return {"tokens": tokens, "segment_ids": segment_ids, "positions": positions}


def _flatten(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """All token ids in one array, each text's start and length."""
  lengths_N = np.fromiter(map(len, seqs), np.int64, len(seqs))
  flat_T = np.fromiter(itertools.chain.from_iterable(seqs), np.int32, int(lengths_N.sum()))
  return flat_T, np.cumsum(lengths_N) - lengths_N, lengths_N


def packed_batch(seqs: Sequence[Sequence[int]], rows: Sequence[Sequence[int]], length: int,
                 pad_id: int = tokenizer_lib.PAD_ID) -> dict[str, np.ndarray]:
  """tokens / segment_ids (1, 2, ... per text; 0 pad) / positions (from 0 per text), [len(rows), length]."""
  flat_T, starts_N, lengths_N = _flatten(seqs)
  idx_M, row_M, slot_M = _placement(rows)
  return _scatter(flat_T, starts_N, lengths_N, idx_M, row_M, slot_M, len(rows), length, pad_id)


def _placement(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(text index, row, slot) per text of packed rows, row-major."""
  counts = np.fromiter(map(len, rows), np.int64, len(rows))
  idx_M = np.fromiter(itertools.chain.from_iterable(rows), np.int64, int(counts.sum()))
  row_M = np.repeat(np.arange(len(rows)), counts)
  slot_M = np.arange(len(idx_M)) - np.repeat(np.cumsum(counts) - counts, counts)
  return idx_M, row_M, slot_M


def local_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A 1-D ("rows",) mesh over this host's devices: embedding batches are split by rows, params replicated."""
  return Mesh(np.asarray(list(devices or jax.local_devices())), ("rows",))


class Embedder:
  """Base: `embed(texts, pairs)` -> NxD float32, with an identity string for the cache."""
  identity: str = ""
  options: Options = Options()
  progress: bool = False
  sentences_seen: int = 0
  tokens_seen: int = 0
  seconds: float = 0.0

  def _embed(self, texts: Sequence[str], pairs: Sequence[str] | None) -> np.ndarray:
    raise NotImplementedError

  def embed(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> np.ndarray:
    """NxD embeddings of texts (or of joint pairs); timing is accumulated for sentences/s."""
    start = time.perf_counter()
    out = self._embed(list(texts), None if pairs is None else list(pairs))
    self.seconds += time.perf_counter() - start
    self.sentences_seen += len(texts)
    return out

  def _bar(self, total: int, desc: str):
    return tqdm.tqdm(total=total, desc=desc, disable=not self.progress, unit="seq", leave=False)


class JaxEmbedder(Embedder):
  """A CrossBERT/BERT encoder from our checkpoints, run jitted on packed rows (and length buckets).

  pack_length 0 runs every text in a row of its own (the reference the packed rows must match).
  """
  def __init__(self, spec: EncoderSpec, encoder_params, tok: tokenizer_lib.Tokenizer, options: Options = Options(),
               identity: str = "", progress: bool = False, tokens_per_batch: int = TOKENS_PER_BATCH,
               pack_length: int = PACK_LENGTH, devices: Sequence[jax.Device] | None = None):
    self.spec, self.tok, self.options = spec, tok, options
    self.identity, self.progress, self.tokens_per_batch = identity, progress, tokens_per_batch
    self.pack_length = pack_length
    mesh = local_mesh(devices)
    self._rows, self._n = NamedSharding(mesh, PartitionSpec("rows")), mesh.size
    # Replicated over the mesh; on one device the params stay as given (no copy).
    self.params = encoder_params if self._n == 1 else jax.device_put(encoder_params, NamedSharding(
        mesh, PartitionSpec()))
    self._fn = _pooled_fn(spec, options.layers, options.pooling)
    self._packed = _pooled_fn(spec, options.layers, options.pooling, PACK_SLOTS)

  def _batch_rows(self, rows: int) -> int:
    """rows rounded up to a multiple of the device count (each device gets the same share)."""
    return -(-max(1, rows) // self._n) * self._n

  def _run(self, fn, batch: dict[str, np.ndarray]) -> np.ndarray:
    args = [jax.device_put(batch[k], self._rows) for k in ("tokens", "positions", "segment_ids")]
    return np.asarray(fn(self.params, *args))

  def _embed(self, texts, pairs):
    seqs = inference.tokenize(self.tok, texts, pairs, max_length=self.options.max_length)
    flat_T, starts_N, lengths_N = _flatten(seqs)
    self.tokens_seen += int(lengths_N.sum())
    out_NxD = np.zeros((len(seqs), self.spec.embed_dim), np.float32)
    pack = min(self.pack_length, self.options.max_length)
    short = np.flatnonzero(lengths_N <= pack)
    with self._bar(len(seqs), "embed") as bar:
      rows = pack_rows(lengths_N[short], pack, PACK_SLOTS)
      per_batch = self._batch_rows(self.tokens_per_batch // max(pack, 1))
      for start in range(0, len(rows), per_batch):
        idx_M, row_M, slot_M = _placement(rows[start:start + per_batch])
        idx_M = short[idx_M]
        batch = _scatter(flat_T, starts_N, lengths_N, idx_M, row_M, slot_M, per_batch, pack, self.tok.special_ids.pad)
        out_NxD[idx_M] = self._run(self._packed, batch)[row_M, slot_M]
        bar.update(len(idx_M))
      self._embed_long((flat_T, starts_N, lengths_N), np.flatnonzero(lengths_N > pack), out_NxD, bar)
    return out_NxD

  def _long_rows(self, length: int) -> int:
    """Rows per batch of a long bucket: the token budget, on CPU also the attention scores' budget."""
    rows = self.tokens_per_batch // length
    if jax.default_backend() == "cpu":
      rows = min(rows, CPU_SCORES_BYTES // (4 * self.spec.num_heads * length * length))
    return max(1, rows)

  def _embed_long(self, flat, long_idx, out_NxD, bar):
    """Texts longer than the pack length: one per row, batches of a fixed shape per bucket length."""
    lengths_N = flat[2]
    order = long_idx[np.argsort(lengths_N[long_idx], kind="stable")]
    buckets = [b for b in BUCKETS if b < self.options.max_length] + [self.options.max_length]
    i = 0
    while i < len(order):
      length = next(b for b in buckets if b >= lengths_N[order[i]])
      batch = self._batch_rows(self._long_rows(length))
      # Every row of this batch fits the bucket (sorted), so the batch shape is fixed per bucket.
      idx = order[i:i + batch]
      idx = idx[lengths_N[idx] <= length]
      rows = np.arange(len(idx))
      padded = _scatter(*flat, idx, rows, np.zeros_like(rows), batch, length, self.tok.special_ids.pad)
      out_NxD[idx] = self._run(self._fn, padded)[:len(idx)]
      i += len(idx)
      bar.update(len(idx))


class HFEmbedder(Embedder):
  """A local Hugging Face encoder folder (transformers AutoModel on torch CPU), same pooling."""
  def __init__(self, path: str, options: Options = Options(), progress: bool = False, batch_size: int = 64):
    import torch  # Local: only --hf needs torch.
    import transformers

    if not epath.Path(path).exists():
      raise UserError(f"--hf={path} does not exist: give a local folder saved with save_pretrained()")
    try:
      self.model = transformers.AutoModel.from_pretrained(path).eval()
      self.hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
      raise UserError(f"--hf={path} is not a loadable transformers model + tokenizer folder: "
                      f"{str(e).splitlines()[0]}") from None
    self.torch, self.options, self.progress, self.batch_size = torch, options, progress, batch_size
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    self.num_layers = self.model.config.num_hidden_layers
    self._takes_token_types = "token_type_ids" in inspect.signature(self.model.forward).parameters
    for l in options.layers:
      if not -self.num_layers - 1 <= l <= self.num_layers:
        raise UserError(f"--layers: {l} is out of range; {path} has layers 0 (embeddings) .. "
                        f"{self.num_layers} (final, also -1)")
    self.identity = f"hf:{os.path.abspath(path)}"

  def _embed(self, texts, pairs):
    torch, opts = self.torch, self.options
    lengths = [len(t) + (len(pairs[i]) if pairs else 0) for i, t in enumerate(texts)]
    order = np.argsort(lengths, kind="stable")
    out = [None] * len(texts)
    final_only = opts.layers in ((-1,), (self.num_layers,))
    with self._bar(len(texts), "embed"), torch.no_grad():
      for start in range(0, len(order), self.batch_size):
        idx = order[start:start + self.batch_size]
        enc = self.hf_tok([texts[j] for j in idx], [pairs[j] for j in idx] if pairs else None, padding=True,
                          truncation=True, max_length=opts.max_length, return_tensors="pt")
        if not self._takes_token_types:
          enc.pop("token_type_ids", None)
        self.tokens_seen += int(enc["attention_mask"].sum())
        res = self.model(**enc, output_hidden_states=not final_only)
        mask = enc["attention_mask"].unsqueeze(-1).float()
        # The last entry of hidden_states may precede the final norm: use last_hidden_state, as ours.
        hiddens = [
            res.last_hidden_state if l % (self.num_layers + 1) == self.num_layers else res.hidden_states[l]
            for l in opts.layers]
        pooled = [h[:, 0] if opts.pooling == "cls" else (h * mask).sum(1) / mask.sum(1).clamp(min=1.0) for h in hiddens]
        emb = torch.stack(pooled).mean(0).float().numpy()
        for row, j in enumerate(idx):
          out[j] = emb[row]
    return np.stack(out).astype(np.float32) if out else np.zeros((0, self.model.config.hidden_size), np.float32)


def cache_path(cache_dir: str | epath.Path, embedder: Embedder, task: str, split: str, part: str, texts: Sequence[str],
               pairs: Sequence[str] | None) -> epath.Path:
  """The .npy file for these embeddings (the key includes a hash of the texts themselves)."""
  h = hashlib.sha256()
  for t in (embedder.identity, embedder.options.tag, task, split, part):
    h.update(t.encode() + b"\0")
  for t in texts:
    h.update(t.encode() + b"\n")
  for t in pairs or ():
    h.update(t.encode() + b"\n")
  return epath.Path(str(cache_dir)) / f"{task}-{split}-{part}-{embedder.options.tag}-{h.hexdigest()[:16]}.npy"


def embed_cached(embedder: Embedder, texts: Sequence[str], pairs: Sequence[str] | None = None, *,
                 cache_dir: str | epath.Path | None = None, task: str = "", split: str = "",
                 part: str = "text") -> np.ndarray:
  """embedder.embed, read from / written to `cache_dir` when given."""
  if cache_dir is None:
    return embedder.embed(texts, pairs)
  path = cache_path(cache_dir, embedder, task, split, part, texts, pairs)
  if path.exists():
    with path.open("rb") as f:
      return np.load(f)
  out = embedder.embed(texts, pairs)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.parent / (path.name + ".tmp")
  with tmp.open("wb") as f:
    np.save(f, out)
  tmp.rename(path)
  return out


def pair_features(embedder: Embedder, texts: Sequence[str], pairs: Sequence[str], **cache) -> np.ndarray:
  """Probe inputs for a pair task: the joint sequence, or SentEval's [u, v, |u-v|, u*v]."""
  if embedder.options.pair_mode == "joint":
    return embed_cached(embedder, texts, pairs, part="joint", **cache)
  u = embed_cached(embedder, texts, part="a", **cache)
  v = embed_cached(embedder, pairs, part="b", **cache)
  return np.concatenate([u, v, np.abs(u - v), u * v], axis=-1)
