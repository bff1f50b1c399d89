r"""Writes SNLI-style triplets from SentEval's NLI files as a pair file for the contrastive stage.

  python tools/nli_triplets.py --data_dir=../shared/data --split=dev --out=runs/snli_dev_triplets.jsonl

Each row is {"anchor": premise, "positive": an entailed hypothesis, "negative": a contradiction of the
same premise} (`data/pairs.nli_triplets` on `read_senteval_nli(DATA_DIR/senteval/downstream/SNLI, SPLIT)`;
dev: 3,172 triplets). Then `python -m crossbert_jax.contrast --config=configs/contrast.py:tiny_pairs
--config.data.path=OUT ...` trains on them (docs/embedding.md).
"""

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from crossbert_jax.core.errors import UserError  # noqa: E402  (after the path set-up)
from crossbert_jax.data import pairs  # noqa: E402


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data_dir", required=True, help="Root of the shared data (holds senteval/).")
  parser.add_argument("--split", default="dev", help="SentEval SNLI split: dev or test (train is not shared).")
  parser.add_argument("--out", required=True, help="The .jsonl file to write.")
  args = parser.parse_args()
  try:
    rows = pairs.nli_triplets(
        pairs.read_senteval_nli(pathlib.Path(args.data_dir) / "senteval" / "downstream" / "SNLI", args.split))
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(
      "".join(json.dumps({"anchor": p.anchor, "positive": p.positive, "negative": p.negative}) + "\n" for p in rows),
      encoding="utf-8")
  print(f"{len(rows)} triplets -> {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
