"""A local GCS for tests: gcp-storage-emulator (PyPI), plus the `x-goog-generation` download header,
`objects.moveTo` and the `ifGenerationMatch` precondition of uploads and deletes.

Real GCS sends `x-goog-generation` with every object download; the emulator does not, and
tensorstore (Orbax's OCDBT checkpoints) then fails with "Malformed StorageGeneration". Real GCS
also has `objects.moveTo`, which gcsfs tries first for every rename; the emulator answers 501,
which gcsfs retries with backoff for ~45 s before it falls back to copy + delete. The emulator
also ignores `ifGenerationMatch=0` on uploads (create only if absent: the workdir lease's
exclusive create), which real GCS answers with 412 when the object exists, and on deletes
(delete only the generation that was read: breaking a dead lease); other upload generations
are still ignored. This launcher adds these and
otherwise runs the emulator unchanged, in memory, with one thread per connection and every request's
handler under one lock (so a precondition's check and its write are atomic, while responses are
written concurrently):
  python tests/gcs_emulator.py PORT BUCKET
Clients reach it through STORAGE_EMULATOR_HOST (gcsfs, google-cloud-storage) and
TENSORSTORE_GCS_HTTP_URL (tensorstore), both http://localhost:PORT.
"""

import http
import http.server
import sys
import threading

from gcp_storage_emulator import server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_download = objects.download
_insert = objects.insert
_delete = objects.delete


def download(request, response, storage, *args, **kwargs):
  """The emulator's download, with the object's generation headers that real GCS sends."""
  _download(request, response, storage, *args, **kwargs)
  if response.status in (http.HTTPStatus.OK, http.HTTPStatus.PARTIAL_CONTENT):
    obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    response["x-goog-generation"] = str(obj["generation"])
    response["x-goog-metageneration"] = str(obj["metageneration"])


def move(request, response, storage, *args, **kwargs):
  """objects.moveTo within a bucket: copy, then delete the source."""
  del args, kwargs
  bucket, source, dest = (request.params[k] for k in ("bucket_name", "object_id", "dest_object_id"))
  try:
    obj = objects._copy(request.base_url, storage, bucket, source, bucket, dest)  # pylint: disable=protected-access
  except NotFound:
    response.status = http.HTTPStatus.NOT_FOUND
    return
  objects._delete(storage, bucket, source)  # pylint: disable=protected-access
  response.json(obj)


def insert(request, response, storage, *args, **kwargs):
  """The emulator's upload, refused with 412 under `ifGenerationMatch=0` when the object exists."""
  if request.query.get("ifGenerationMatch") == ["0"]:
    if "name" in request.query:
      name = request.query["name"][0]
    else:  # Multipart: the name is in the metadata part; resumable: in the JSON body.
      name = (request.data.get("meta") or request.data).get("name") if isinstance(request.data, dict) else None
    try:
      storage.get_file_obj(request.params["bucket_name"], name)
    except NotFound:
      pass
    else:
      _precondition_failed(response)
      return
  _insert(request, response, storage, *args, **kwargs)


def _precondition_failed(response) -> None:
  response.status = http.HTTPStatus.PRECONDITION_FAILED
  response.json({
      "error": {
          "code": 412, "message": "At least one of the pre-conditions you specified did not hold.",
          "errors": [{"reason": "conditionNotMet", "message": "Precondition Failed"}]}})


def delete(request, response, storage, *args, **kwargs):
  """The emulator's delete, refused with 412 when `ifGenerationMatch` names another generation."""
  want = request.query.get("ifGenerationMatch")
  if want:
    try:
      obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except NotFound:
      response.status = http.HTTPStatus.NOT_FOUND
      return
    if str(obj["generation"]) != want[0]:
      _precondition_failed(response)
      return
  _delete(request, response, storage, *args, **kwargs)


def main(port: int, bucket: str) -> None:
  objects.download = download  # `objects.get(alt=media)` looks the name up at call time.
  objects.insert = insert  # The router's fallback for uploads without /upload looks it up too.
  for _, handlers in server.HANDLERS:
    for method, handler in list(handlers.items()):
      if handler is _download:
        handlers[method] = download
      elif handler is _insert:
        handlers[method] = insert
      elif handler is _delete:
        handlers[method] = delete
  move_route = (r"^/storage/v1/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)/moveTo/o/"
                r"(?P<dest_object_id>.*[^/]+)$", {"POST": move})
  server.HANDLERS = (move_route, *server.HANDLERS)  # The router reads the global at each request.
  # One thread per connection, each request's handler under one lock: the storage is read and changed by one
  # request at a time (a precondition's check and its write stay atomic), while the responses are written
  # concurrently. One server thread for everything stalled every client behind a reader that holds a ranged
  # download open without reading it (array_record's gs:// reader): 45-125 s for a 2-step run's reads.
  lock = threading.RLock()
  server.HANDLERS = tuple((route, {method: _locked(lock, handler)
                                   for method, handler in handlers.items()})
                          for route, handlers in server.HANDLERS)
  server.server.HTTPServer = _ThreadingServer  # gcp_storage_emulator's `from http import server`.
  server.create_server("localhost", port, in_memory=True, default_bucket=bucket).run()


class _ThreadingServer(http.server.ThreadingHTTPServer):
  daemon_threads = True  # A client that never closes its connection does not keep the emulator alive.


def _locked(lock: threading.RLock, handler):
  def handle(*args, **kwargs):
    with lock:
      return handler(*args, **kwargs)

  return handle


if __name__ == "__main__":
  main(int(sys.argv[1]), sys.argv[2])
