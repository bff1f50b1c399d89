r"""Fetches the datasets the docs use into one folder, in the layout of the shared data root.

  python tools/fetch_data.py                                        # the Hugging Face Hub -> ../shared/data
  python tools/fetch_data.py --source=local --from=/mnt/shared/data --output=../shared/data [--link]

The tour, the sweep specs, `evaluate --data_dir` and the tests (CROSSBERT_DATA) read this folder:
wikitext-2/ (the tour's tokenizer, shards and sweep), glue/, senteval/, sts/ and beir/scifact/ (the
frozen probes, GLUE, MTEB's STSBenchmark and SciFact), gutenberg/ (the CPU ladders and the feed
benchmark: a local source only, the Lahiri subset has no Hub copy).

--source=hub reads each dataset through `datasets.load_dataset` at the revision pinned in HUB below
and writes the files the readers read (crossbert_jax/evaluation/tasks.py, retrieval.py) in the shared
layout; columns a reader does not use are left empty, so the files are not byte copies of the
originals. --source=local copies (or --link symlinks) the files of a local copy such as ../shared/data,
checked against its MANIFEST.tsv (sha256). Either way the output gets MANIFEST.tsv (path, bytes,
lines, sha256) and SOURCES.md (where each dataset came from). A file already there with the same
bytes is kept; one with other bytes is refused unless --force. Every failure is one `error:` line,
exit 2.
"""

import argparse
import dataclasses
import hashlib
import json
import os
import pathlib
import sys
from typing import Any, Callable

# dataset -> the files its readers need (relative to the root); gutenberg/: every *.txt of the source.
DATASETS = {
    "wikitext-2": ("wikitext-2/valid.txt", "wikitext-2/test.txt"),
    "glue":
        ("glue/CoLA/raw/in_domain_train.tsv", "glue/CoLA/raw/in_domain_dev.tsv", "glue/CoLA/raw/out_of_domain_dev.tsv",
         "glue/STS-B/train.tsv", "glue/STS-B/dev.tsv", "glue/QNLI/dev.tsv", "glue/RTE/train.tsv", "glue/RTE/dev.tsv"),
    "senteval": tuple(f"senteval/downstream/SST/{k}/sentiment-{s}" for k in ("binary", "fine")
                      for s in ("train", "dev", "test")) + ("senteval/downstream/MRPC/msr_paraphrase_train.txt",
                                                            "senteval/downstream/MRPC/msr_paraphrase_test.txt") +
                tuple(f"senteval/downstream/SNLI/{p}.{s}" for p in ("s1", "s2", "labels") for s in ("dev", "test")),
    "sts": tuple(f"sts/STSBenchmark/sts-{s}.csv" for s in ("train", "dev", "test")),
    "beir-scifact": ("beir/scifact/corpus.jsonl", "beir/scifact/queries.jsonl", "beir/scifact/qrels/train.tsv",
                     "beir/scifact/qrels/test.tsv"),
    "gutenberg": (),}
PREFIX = {"gutenberg": "gutenberg/", "beir-scifact": "beir/scifact/"}
DEFAULT = ("wikitext-2", "glue", "senteval", "sts", "beir-scifact")

# dataset -> ((repo, revision), ...): what --source=hub reads, pinned.
HUB = {
    "wikitext-2": (("Salesforce/wikitext", "b08601e04326c79dfdd32d625aee71d232d685c3"),),
    "glue": (("nyu-mll/glue", "bcdcba79d07bc864c1c254ccfcedcce55bcc9a8c"),),
    "senteval": (("nyu-mll/glue", "bcdcba79d07bc864c1c254ccfcedcce55bcc9a8c"),
                 ("SetFit/sst5", "e51bdcd8cd3a30da231967c1a249ba59361279a3"),
                 ("stanfordnlp/snli", "cdb5c3d5eed6ead6e5a341c8e56e669bb666725b")),
    "sts": (("mteb/stsbenchmark-sts", "b0fddb56ed78048fa8b90373c8a3cfc37b684831"),),
    "beir-scifact": (("mteb/scifact", "d56462d0e63a25450459c4f213e49ffdb866f7f9"),),}
REVISION = {repo: rev for pins in HUB.values() for repo, rev in pins}

# load(repo, config, split) -> rows (a list of dicts): the Hub through `datasets`, or a test's local rows.
Loader = Callable[[str, "str | None", str], list[dict[str, Any]]]


class FetchError(Exception):
  """A bad input or an unreachable source: the message is the whole error line."""


def hub_loader(repo: str, config: str | None, split: str) -> list[dict[str, Any]]:
  """One split of a Hub dataset at its pinned revision, through `datasets.load_dataset`."""
  import datasets  # Local: slow to import.

  try:
    return datasets.load_dataset(repo, config, revision=REVISION[repo], split=split).to_list()
  except Exception as e:  # noqa: BLE001  (network, offline mode, a moved file: all one line)
    reason = " ".join(f"{type(e).__name__}: {e}".split())[:200]
    offline = [v for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if os.environ.get(v, "0") not in ("", "0")]
    hint = f" ({'/'.join(offline)} is set)" if offline else ""
    raise FetchError(f"--source=hub: {repo}@{REVISION[repo][:8]} {config or ''} {split} could not be loaded from the "
                     f"Hugging Face Hub{hint}: {reason}; check the network, or copy a local copy with "
                     "--source=local --from=DIR") from None


def _f(text: Any) -> str:
  """A field of a tab-separated line: no tab or newline inside."""
  return " ".join(str(text).replace("\t", " ").splitlines()).strip()


def _tsv(rows: list[list[Any]], header: list[str] | None = None) -> bytes:
  lines = (["\t".join(header)] if header else []) + ["\t".join(_f(x) for x in r) for r in rows]
  return ("\n".join(lines) + "\n").encode("utf-8")


def wikitext(load: Loader) -> dict[str, bytes]:
  """valid.txt and test.txt: the Hub's rows are the original lines, newlines included."""
  return {
      f"wikitext-2/{name}.txt": "".join(r["text"] for r in load("Salesforce/wikitext", "wikitext-2-v1", split)
                                       ).encode("utf-8") for name, split in (("valid", "validation"), ("test", "test"))}


def glue(load: Loader) -> dict[str, bytes]:
  """CoLA (its validation is GLUE's dev: in_domain_dev's 527 rows, then out_of_domain_dev's), STS-B, QNLI dev
  and RTE."""
  g = lambda config, split: load("nyu-mll/glue", config, split)
  cola = lambda rows: _tsv([["hub", r["label"], "" if r["label"] else "*", r["sentence"]] for r in rows])
  dev = g("cola", "validation")
  stsb = lambda split: _tsv(
      [[r["idx"], "", "", "", "", "", "", r["sentence1"], r["sentence2"], r["label"]] for r in g("stsb", split)], [
          "index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2", "score"])
  rte = lambda split: _tsv([[r["sentence1"], r["sentence2"], r["label"], r["idx"]]
                            for r in g("rte", split)], ["sentence1", "sentence2", "label", "idx"])
  qnli = [[r["idx"], r["question"], r["sentence"], ("entailment", "not_entailment")[r["label"]]]
          for r in g("qnli", "validation")]
  return {
      "glue/CoLA/raw/in_domain_train.tsv": cola(g("cola", "train")), "glue/CoLA/raw/in_domain_dev.tsv": cola(dev[:527]),
      "glue/CoLA/raw/out_of_domain_dev.tsv": cola(dev[527:]), "glue/STS-B/train.tsv": stsb("train"),
      "glue/STS-B/dev.tsv": stsb("validation"), "glue/QNLI/dev.tsv": _tsv(qnli,
                                                                          ["index", "question", "sentence", "label"]),
      "glue/RTE/train.tsv": rte("train"), "glue/RTE/dev.tsv": rte("validation")}


def senteval(load: Loader) -> dict[str, bytes]:
  """SST-2 (GLUE's train and dev; its labelled test is SST-5's test without the neutral class), SST-5,
  MRPC (MSR train = GLUE train + validation, MSR test = GLUE test) and SNLI dev/test (gold labels only)."""
  out, sst = {}, "senteval/downstream/SST/"
  for name, split in (("train", "train"), ("dev", "validation")):
    out[f"{sst}binary/sentiment-{name}"] = _tsv([[r["sentence"], r["label"]]
                                                 for r in load("nyu-mll/glue", "sst2", split)])
  fine = {
      name: load("SetFit/sst5", None, split)
      for name, split in (("train", "train"), ("dev", "validation"), ("test", "test"))}
  for name, rows in fine.items():
    out[f"{sst}fine/sentiment-{name}"] = "".join(f"{r['label']} {_f(r['text'])}\n" for r in rows).encode("utf-8")
  out[f"{sst}binary/sentiment-test"] = _tsv([[r["text"], int(r["label"] > 2)] for r in fine["test"] if r["label"] != 2])
  header = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
  for name, splits in (("train", ("train", "validation")), ("test", ("test",))):
    rows = [r for s in splits for r in load("nyu-mll/glue", "mrpc", s)]
    if any(r["label"] not in (0, 1) for r in rows):
      raise FetchError(f"--source=hub: nyu-mll/glue mrpc {'/'.join(splits)} has rows without a label; copy MRPC "
                       "from a local copy (--source=local --from=DIR)")
    out[f"senteval/downstream/MRPC/msr_paraphrase_{name}.txt"] = _tsv([
        [r["label"], f"{r['idx']}a", f"{r['idx']}b", r["sentence1"], r["sentence2"]] for r in rows], header)
  for name, split in (("dev", "validation"), ("test", "test")):
    rows = [r for r in load("stanfordnlp/snli", "plain_text", split) if r["label"] in (0, 1, 2)]
    for part, key in (("s1", "premise"), ("s2", "hypothesis")):
      out[f"senteval/downstream/SNLI/{part}.{name}"] = "".join(_f(r[key]) + "\n" for r in rows).encode("utf-8")
    labels = ("entailment", "neutral", "contradiction")
    out[f"senteval/downstream/SNLI/labels.{name}"] = "".join(labels[r["label"]] + "\n" for r in rows).encode("utf-8")
  return out


def sts(load: Loader) -> dict[str, bytes]:
  """STS Benchmark train/dev/test: genre, file, year, id, score, sentence1, sentence2 (no header)."""
  return {
      f"sts/STSBenchmark/sts-{name}.csv": _tsv(
          [["hub", "mteb", "", f"{i:04d}", r["score"], r["sentence1"], r["sentence2"]]
           for i, r in enumerate(load("mteb/stsbenchmark-sts", None, split))
          ]) for name, split in (("train", "train"), ("dev", "validation"), ("test", "test"))}


def scifact(load: Loader) -> dict[str, bytes]:
  """BEIR SciFact: corpus.jsonl, queries.jsonl, qrels/{train,test}.tsv."""
  jsonl = lambda rows, keys: "".join(json.dumps({**{k: r[k] for k in keys}, "metadata": {}}) + "\n" for r in rows
                                    ).encode("utf-8")
  out = {
      "beir/scifact/corpus.jsonl": jsonl(load("mteb/scifact", "corpus", "corpus"), ("_id", "title", "text")),
      "beir/scifact/queries.jsonl": jsonl(load("mteb/scifact", "queries", "queries"), ("_id", "text"))}
  for split in ("train", "test"):
    out[f"beir/scifact/qrels/{split}.tsv"] = _tsv([
        [r["query-id"], r["corpus-id"], r["score"]] for r in load("mteb/scifact", "default", split)],
                                                  ["query-id", "corpus-id", "score"])
  return out


CONVERT: dict[str, Callable[[Loader], dict[
    str, bytes]]] = {"wikitext-2": wikitext, "glue": glue, "senteval": senteval, "sts": sts, "beir-scifact": scifact}


@dataclasses.dataclass
class Written:
  path: str
  data: bytes | None  # None: linked or copied from `src` by size.
  src: pathlib.Path | None = None


def read_manifest(root: pathlib.Path) -> dict[str, list[str]]:
  """MANIFEST.tsv as {path: [bytes, lines, sha256]} ({} when absent)."""
  path = root / "MANIFEST.tsv"
  if not path.is_file():
    return {}
  rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]
  bad = [i + 2 for i, r in enumerate(rows) if len(r) != 4]
  if bad:
    raise FetchError(f"{path}: line {bad[0]} is not 'path<TAB>bytes<TAB>lines<TAB>sha256'; fix or delete it")
  return {r[0]: r[1:] for r in rows}


def _sha(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def local_files(name: str, src: pathlib.Path) -> list[str]:
  """The files of dataset `name` in the local copy `src`: its manifest's rows under the dataset's
  folder (or, without a manifest, the files there), or the readers' files."""
  manifest = read_manifest(src)
  if name in PREFIX:
    listed = sorted(p for p in manifest if p.startswith(PREFIX[name]))
    if not listed:
      folder = src / PREFIX[name]
      listed = sorted(str(p.relative_to(src)) for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
    if not listed:
      raise FetchError(f"--from={src}: no {PREFIX[name]} files there (dataset {name}); give the shared data root")
    return listed
  return list(DATASETS[name])


def check_local(src: pathlib.Path, rel: str, manifest: dict[str, list[str]]) -> None:
  """The local file exists and, when the manifest lists it, has its size and sha256."""
  path = src / rel
  if not path.is_file():
    raise FetchError(f"--from={src}: {rel} is missing; give a complete copy of the shared data root")
  if rel in manifest:
    size, _, sha = manifest[rel]
    if path.stat().st_size != int(size) or _sha(path.read_bytes()) != sha:
      raise FetchError(f"--from={src}: {rel} does not match its MANIFEST.tsv sha256 (damaged or changed): "
                       "copy it again from its origin (SOURCES.md)")


def write(out: pathlib.Path, files: list[Written], force: bool, link: bool) -> list[list[str]]:
  """Writes (or links) every file, each through a temporary name; returns their manifest rows.
  Refuses, before writing anything, a file already there with other bytes (unless `force`)."""
  rows, todo = [], []
  for w in files:
    data = w.data if w.data is not None else w.src.read_bytes()
    dest = out / w.path
    if dest.is_file() and not dest.is_symlink() and dest.read_bytes() != data and not force:
      raise FetchError(f"--output={out}: {w.path} is already there with other bytes; move it away or pass --force")
    rows.append([w.path, str(len(data)), str(data.count(b"\n")), _sha(data)])
    todo.append((w, data, dest))
  for w, data, dest in todo:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if (dest.is_file() and dest.read_bytes() == data and not (link and not dest.is_symlink())):
      continue
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.unlink(missing_ok=True)
    if link and w.src is not None:
      tmp.symlink_to(w.src.resolve())
    else:
      tmp.write_bytes(data)
    os.replace(tmp, dest)
  return rows


def fetch(names: list[str], out: pathlib.Path, source: str, src: pathlib.Path | None = None, load: Loader = hub_loader,
          force: bool = False, link: bool = False, log: Callable[[str], None] = print) -> dict[str, list[str]]:
  """Fetches `names` into `out`; returns the output's manifest (also written to out/MANIFEST.tsv)."""
  manifest = read_manifest(out) if out.is_dir() else {}
  notes = []
  for name in names:
    if source == "local":
      src_manifest = read_manifest(src)
      rels = local_files(name, src)
      for rel in rels:
        check_local(src, rel, src_manifest)
      rows = write(out, [Written(r, None, src / r) for r in rels], force, link)
      where = f"copied from {src.resolve()}" + (" (symlinks)" if link else "") + (", checked against its MANIFEST.tsv"
                                                                                  if src_manifest else "")
    else:
      if name not in CONVERT:
        raise FetchError(f"--datasets: {name} has no Hub copy (the Lahiri Gutenberg subset); copy it with "
                         "--source=local --from=DIR")
      rows = write(out, [Written(p, d) for p, d in CONVERT[name](load).items()], force, link=False)
      where = "the Hugging Face Hub: " + ", ".join(f"{r}@{v}" for r, v in HUB[name])
    manifest.update({r[0]: r[1:] for r in rows})
    size = sum(int(r[1]) for r in rows)
    notes.append(f"- `{name}`: {len(rows)} files, {size / 1e6:.1f} MB, {where}")
    log(f"{name}: {len(rows)} files, {size / 1e6:.1f} MB -> {out}")
  lines = ["path\tbytes\tlines\tsha256"] + ["\t".join([p, *manifest[p]]) for p in sorted(manifest)]
  (out / "MANIFEST.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
  sources = out / "SOURCES.md"
  old = sources.read_text(encoding="utf-8") if sources.is_file() else (
      "# Data fetched by tools/fetch_data.py\n\nThe files the readers need, in the shared data layout; "
      "MANIFEST.tsv lists each (path, bytes, lines, sha256).\n\n")
  sources.write_text(old + "\n".join(notes) + "\n", encoding="utf-8")
  return manifest


def check_layout(root: pathlib.Path, names: list[str]) -> list[str]:
  """The readers' files of `names` missing under `root` (empty when the layout is complete)."""
  missing = [rel for n in names for rel in DATASETS[n] if not (root / rel).is_file()]
  missing += [PREFIX[n] for n in names if n == "gutenberg" and not any((root / PREFIX[n]).glob("*.txt"))]
  return missing


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--output", default="../shared/data",
                      help="The data root to write (the docs read ../shared/data).")
  parser.add_argument("--source", default="hub", choices=("hub", "local"), help="The Hub (pinned) or a local copy.")
  parser.add_argument("--from", dest="src", default="", help="--source=local: the local copy's root (e.g. a mount).")
  parser.add_argument("--datasets", default=",".join(DEFAULT),
                      help=f"Comma-separated, of {','.join(DATASETS)} (gutenberg: local only, 136 MB); or 'all'.")
  parser.add_argument("--link", action="store_true", help="--source=local: symlink the files instead of copying them.")
  parser.add_argument("--force", action="store_true", help="Replace files already there with other bytes.")
  args = parser.parse_args(argv)
  try:
    names = list(DATASETS) if args.datasets.strip() == "all" else [
        n.strip() for n in args.datasets.split(",") if n.strip()]
    unknown = [n for n in names if n not in DATASETS]
    if not names or unknown:
      raise FetchError(f"--datasets={args.datasets}: give any of {','.join(DATASETS)} or 'all'")
    out = pathlib.Path(args.output)
    if out.exists() and not out.is_dir():
      raise FetchError(f"--output={out} is a file: give a folder")
    src = pathlib.Path(args.src) if args.src else None
    if args.source == "local" and (src is None or not src.is_dir()):
      raise FetchError(f"--source=local needs --from=DIR, an existing copy of the shared data root (got {args.src!r})")
    if args.source == "hub" and (args.src or args.link):
      raise FetchError("--from and --link are for --source=local; drop them, or add --source=local")
    if args.source == "hub" and "gutenberg" in names:
      raise FetchError(
          "--datasets: gutenberg has no Hub copy (the Lahiri subset); fetch it with --source=local --from=DIR")
    if src is not None and out.resolve() == src.resolve():
      raise FetchError(f"--output={out} is --from itself: give another folder")
    out.mkdir(parents=True, exist_ok=True)
    fetch(names, out, args.source, src, force=args.force, link=args.link)
    missing = check_layout(out, names)
    if missing:
      raise FetchError(f"--output={out}: {missing[0]} is still missing after the fetch")
  except FetchError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"done: {out} holds {', '.join(names)} (MANIFEST.tsv, SOURCES.md)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
