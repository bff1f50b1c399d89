"""gs:// end to end, offline: tokenizer -> train -> SIGTERM -> resume -> export -> evaluate on a local GCS.

The data, the tokenizer, the workdir (checkpoints, metrics segments, TensorBoard, compilation
cache), the export and the evaluation cache and results all live in an in-memory GCS emulator
(tests/gcs_emulator.py); gcsfs reaches it through STORAGE_EMULATOR_HOST and Orbax's tensorstore
through TENSORSTORE_GCS_HTTP_URL.
"""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from etils import epath

from crossbert_jax.core.errors import UserError
from crossbert_jax.data import corpus, tokenizer
from crossbert_jax.run import lock as lock_lib
from tests.helpers import cpu_env, run_module, users_cache_env
from tests.integration.test_reliability import check_two_breakers_of_one_dead_lease

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUCKET = "crossbert-test"
GS = f"gs://{BUCKET}"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
  """(environment for subprocesses, emulator URL) of a fresh in-memory GCS with one bucket."""
  port = _free_port()
  url = f"http://localhost:{port}"
  # The emulator logs every request: to a file, since a pipe nobody reads would fill and block it.
  log = tmp_path_factory.mktemp("gcs") / "emulator.log"
  with log.open("w") as f:
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "gcs_emulator.py"),
                             str(port), BUCKET], stdout=f, stderr=subprocess.STDOUT)
  for _ in range(200):
    try:
      urllib.request.urlopen(url + "/", timeout=1).close()
      break
    except OSError:
      assert proc.poll() is None, f"the GCS emulator exited: {log.read_text()[-2000:]}"
      time.sleep(0.1)
  env = cpu_env(
      STORAGE_EMULATOR_HOST=url,
      TENSORSTORE_GCS_HTTP_URL=url,
      # array_record's reader (riegeli on google-cloud-cpp) has its own variable.
      CLOUD_STORAGE_EMULATOR_ENDPOINT=url,
      # No credentials lookups: tensorstore takes this token, google-auth skips the metadata server.
      GOOGLE_AUTH_TOKEN_FOR_TESTING="test",
      NO_GCE_CHECK="True")
  env = users_cache_env(env)  # The default cache under the gs:// workdir, not the suite's shared one.
  yield env, url
  proc.terminate()
  proc.wait(timeout=30)


def _objects(url: str, prefix: str) -> list[str]:
  """Object names under `prefix`, straight from the emulator's JSON API (no client caches)."""
  query = urllib.parse.urlencode({"prefix": prefix})
  with urllib.request.urlopen(f"{url}/storage/v1/b/{BUCKET}/o?{query}", timeout=10) as r:
    return [item["name"] for item in json.load(r).get("items", [])]


def _put(url: str, name: str, data: bytes, **preconditions) -> None:
  query = urllib.parse.urlencode({"uploadType": "media", "name": name, **preconditions})
  urllib.request.urlopen(
      urllib.request.Request(f"{url}/upload/storage/v1/b/{BUCKET}/o?{query}", data=data, method="POST"),
      timeout=10).close()


def _get(url: str, name: str) -> bytes:
  with urllib.request.urlopen(f"{url}/storage/v1/b/{BUCKET}/o/{urllib.parse.quote(name, safe='')}?alt=media",
                              timeout=10) as r:
    return r.read()


def _cli(env, *args, check=True, wait=True):
  return run_module(args, env=env, check=check, wait=wait, timeout=300)


def _saved_steps(url: str) -> set[int]:
  names = _objects(url, "run/checkpoints/")
  # A step is complete once Orbax has written its commit marker into the step folder.
  return {int(n.split("/")[2]) for n in names if n.split("/")[2].isdigit() and n.endswith("_CHECKPOINT_METADATA")}


@pytest.mark.slow  # Over 75 s on 2 idle cores: `make test-slow` and CI run it.
def test_gcs_end_to_end(gcs, tmp_path):
  env, url = gcs
  docs = corpus.builtin_documents()[:3000]
  # A name with commas, taken whole as data.path would take it.
  _put(url, "data/part 0, of two.txt", "\n\n".join(docs[0::2]).encode())
  _put(url, "data/part1.txt", "\n\n".join(docs[1::2]).encode())
  tok = f"{GS}/tok/spm.model"
  _cli(env, "crossbert_jax.tokenizer", f"--input={GS}/data", "--vocab_size=512", f"--output={tok}")

  train = [
      "crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={GS}/run",
      f"--config.data.path={GS}/data", f"--config.data.tokenizer={tok}", "--config.model.vocab_size=512",
      "--config.checkpoint.every_steps=2", "--config.metrics.progress_bar=False"]
  proc = _cli(env, *train, "--config.train.steps=100000", wait=False)
  deadline = time.time() + 240
  while not _saved_steps(url):  # Stop once a checkpoint is on GCS: the run is mid-way.
    assert proc.poll() is None, f"training exited early:\n{proc.stderr.read()[-3000:]}"
    assert time.time() < deadline, "no checkpoint on GCS after 240 s"
    time.sleep(0.5)
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=120)
  assert "Traceback" not in stderr and "error:" not in stderr, stderr[-3000:]
  stopped = max(_saved_steps(url))
  from crossbert_jax.run import metrics  # pylint: disable=g-import-not-at-top
  os.environ.update({k: env[k] for k in ("STORAGE_EMULATOR_HOST", "GOOGLE_AUTH_TOKEN_FOR_TESTING", "NO_GCE_CHECK")})
  rows = metrics.read_metrics(f"{GS}/run")
  assert [r["step"] for r in rows] == list(range(1, stopped + 1)), "metrics of the stopped run, flushed at exit"

  _cli(env, *train, f"--config.train.steps={stopped + 2}", "--config.metrics.tensorboard=False",
       f"--config.profile.start_step={stopped + 2}", "--config.profile.steps=1")
  assert [n for n in _objects(url, "run/profile/plugins/profile/") if n.endswith(".xplane.pb")], "a trace on GCS"
  assert json.loads(_get(url, "run/profile/profiled.json"))["steps"] == [stopped + 2]
  assert [a["status"] for a in json.loads(_get(url, "run/goodput.json"))["attempts"]] == ["stopped", "finished"]
  segments = [n for n in _objects(url, "run/metrics.") if n.endswith("Z.jsonl")]
  assert len(segments) == 2, f"one metrics segment per start, got {segments}"
  steps = [r["step"] for r in metrics.read_metrics(f"{GS}/run")]
  assert steps == list(range(1, stopped + 3)), f"merged metrics of both starts: {steps}"
  assert _objects(url, "run/tensorboard/events.out.tfevents"), "TensorBoard events on GCS"
  assert _objects(url, "run/compilation_cache/"), "the compilation cache is under the gs:// workdir"

  _cli(env, "crossbert_jax.export", f"--workdir={GS}/run", f"--output={GS}/hf")
  assert json.loads(_get(url, "hf/config.json"))["vocab_size"] == 512
  assert _objects(url, "hf/model.safetensors")

  rows = ["text\tlabel"] + [f"{' '.join(d[:200].split())}\t{i % 2}" for i, d in enumerate(docs[:80])
                           ]  # One line per row.
  _put(url, "eval/train.tsv", ("\n".join(rows) + "\n").encode())
  _cli(env, "crossbert_jax.evaluate", f"--workdir={GS}/run", f"--generic_train={GS}/eval/train.tsv", "--tasks=",
       "--max_length=32", "--noprogress", f"--output={GS}/results/eval.json")
  result = json.loads(_get(url, "results/eval.json"))
  assert list(result["models"]) == [f"run@{stopped + 2}"], result["models"].keys()
  assert result["models"][f"run@{stopped + 2}"]["source"]["path"] == f"{GS}/run"
  assert _objects(url, "run/eval_cache/"), "embeddings cached in the gs:// run"


@pytest.mark.slow
def test_arrayrecord_shards_on_gcs(gcs, tmp_path):
  """`prepare` writes ArrayRecord shards to gs://, and training reads them from there."""
  env, url = gcs
  docs = corpus.builtin_documents()[:2000]
  _put(url, "raw/docs.txt", "\n\n".join(docs).encode())
  _cli(env, "crossbert_jax.prepare", f"--input={GS}/raw/docs.txt", f"--output={GS}/corpus", "--shards=2")
  assert len([n for n in _objects(url, "corpus/") if n.endswith(".arrayrecord")]) == 2, _objects(url, "corpus/")
  spm = tmp_path / "spm.model"
  tokenizer.train_tokenizer(docs, 512, spm)
  proc = _cli(env, "crossbert_jax.train", "--config=configs/crossbert.py:tiny", f"--workdir={tmp_path / 'run'}",
              f"--config.data.path={GS}/corpus", f"--config.data.tokenizer={spm}", "--config.model.vocab_size=512",
              "--config.train.steps=2", "--config.metrics.progress_bar=False")
  assert "done: step 2" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


class _GatedLock(lock_lib.WorkdirLock):
  """A lease whose first look (in `acquire`) meets the other's at `met`, then waits for `go`:
  both trainers have seen no lease before either writes one."""
  def __init__(self, workdir, met: threading.Barrier, go: threading.Event):
    super().__init__(workdir, warn=lambda msg: None)
    self._met, self._go, self._looked = met, go, False

  def _read(self):
    held = super()._read()
    if not self._looked:
      self._looked = True
      self._met.wait(timeout=30)
      assert self._go.wait(timeout=30)
    return held


def _race(workdir: str, one_after_the_other: bool) -> tuple[list, list[str]]:
  """Two leases on `workdir` started together: (those taken, the refusals' messages)."""
  met, go = threading.Barrier(2), [threading.Event(), threading.Event()]
  locks = [_GatedLock(workdir, met, go[i]) for i in range(2)]
  held, refused = [], []

  def start(i: int) -> None:
    try:
      held.append(locks[i].acquire())
    except UserError as e:
      refused.append(str(e))
    finally:
      go[1].set()  # Ordered: the second writes once the first has finished taking its lease.

  go[0].set()
  if not one_after_the_other:
    go[1].set()
  threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=60)
  for lease in held:
    lease.release()
  return held, refused


def test_gcs_lease_has_exactly_one_holder_when_two_trainers_start_together(gcs, monkeypatch):
  """The gs:// lease is an exclusive create (ifGenerationMatch=0): of two trainers that both saw no
  lease, one takes it and the other is refused in one line, however their writes interleave
  (the old write, settle, read back let the later writer take it too once the first had checked)."""
  env, url = gcs
  for key in ("STORAGE_EMULATOR_HOST", "GOOGLE_AUTH_TOKEN_FOR_TESTING", "NO_GCE_CHECK"):
    monkeypatch.setenv(key, env[key])
  _put(url, "pre/object", b"first", ifGenerationMatch="0")  # The emulator honours the precondition.
  with pytest.raises(urllib.error.HTTPError, match="412"):
    _put(url, "pre/object", b"second", ifGenerationMatch="0")
  assert _get(url, "pre/object") == b"first"

  for round_, ordered in enumerate([True, False, False, False]):
    workdir = f"{GS}/race{round_}"
    held, refused = _race(workdir, one_after_the_other=ordered)
    assert len(held) == 1 and len(refused) == 1, (ordered, held, refused)
    assert "is in use by" in refused[0] and "\n" not in refused[0], refused[0]
    assert not _objects(url, f"race{round_}/"), "the holder's release deletes the lease"
  with lock_lib.WorkdirLock(f"{GS}/race0"):  # Released: the workdir is free again.
    assert json.loads(_get(url, "race0/lock.json"))["pid"] == os.getpid()


def test_gcs_lease_of_two_breakers_of_a_dead_one_has_one_holder(gcs, monkeypatch):
  """Breaking deletes only the generation that was judged dead (ifGenerationMatch on the delete)."""
  env, url = gcs
  for key in ("STORAGE_EMULATOR_HOST", "GOOGLE_AUTH_TOKEN_FOR_TESTING", "NO_GCE_CHECK"):
    monkeypatch.setenv(key, env[key])
  _put(url, "del/object", b"v1")
  stale = lock_lib._gcs_generation(epath.Path(f"{GS}/del/object"))  # pylint: disable=protected-access
  _put(url, "del/object", b"v2")
  assert not lock_lib._delete_on_gcs(epath.Path(f"{GS}/del/object"), stale)  # pylint: disable=protected-access
  assert _get(url, "del/object") == b"v2", "the emulator honours the delete's precondition"
  check_two_breakers_of_one_dead_lease(f"{GS}/breakers", lambda text: _put(url, "breakers/lock.json", text.encode()))
  assert not _objects(url, "breakers/")
