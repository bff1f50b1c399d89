"""A local GCS for tests: gcp-storage-emulator (PyPI), plus the `x-goog-generation` download header.

Real GCS sends `x-goog-generation` with every object download; the emulator does not, and
tensorstore (Orbax's OCDBT checkpoints) then fails with "Malformed StorageGeneration". Real GCS
also has `objects.moveTo`, which gcsfs tries first for every rename; the emulator answers 501,
which gcsfs retries with backoff for ~45 s before it falls back to copy + delete. This launcher
adds both and otherwise runs the emulator unchanged, in memory:
  python tests/gcs_emulator.py PORT BUCKET
Clients reach it through STORAGE_EMULATOR_HOST (gcsfs, google-cloud-storage) and
TENSORSTORE_GCS_HTTP_URL (tensorstore), both http://localhost:PORT.
"""

import http
import sys

from gcp_storage_emulator import server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_download = objects.download


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


def main(port: int, bucket: str) -> None:
  objects.download = download  # `objects.get(alt=media)` looks the name up at call time.
  for _, handlers in server.HANDLERS:
    for method, handler in list(handlers.items()):
      if handler is _download:
        handlers[method] = download
  move_route = (r"^/storage/v1/b/(?P<bucket_name>[-.\w]+)/o/(?P<object_id>.*[^/]+)/moveTo/o/"
                r"(?P<dest_object_id>.*[^/]+)$", {"POST": move})
  server.HANDLERS = (move_route, *server.HANDLERS)  # The router reads the global at each request.
  server.create_server("localhost", port, in_memory=True, default_bucket=bucket).run()


if __name__ == "__main__":
  main(int(sys.argv[1]), sys.argv[2])
